"""The Docker image's HEALTHCHECK: GET /healthz at the base URL `wsmode serve` wrote to
`server.listen_file` once it listened. Exit 0 when it answers 200, else 1 (503 while
draining, nothing written yet, nothing listening). TLS (server.tls_cert_file) is not
verified: this is the container talking to itself."""

import ssl
import sys
import urllib.request


def main(listen_file: str) -> int:
    try:
        with open(listen_file, encoding="utf-8") as f:
            base = f.read().strip().removesuffix("/v1")
        itself = ssl.create_default_context()
        itself.check_hostname = False
        itself.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(f"{base}/healthz", timeout=2, context=itself) as r:
            return 0 if r.status == 200 else 1
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/wsmode.listen"))
