"""What the deploy/ tests share: the files of deploy/, and the settings the Kubernetes pod
runs with (the ConfigMap's TOML, the image's ENV, the container's env, the Secret's values),
read by wsmode's own loader."""

from __future__ import annotations

import base64
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from dockerfile_parse import DockerfileParser
from wsmode.config import ConfigError, Settings, load_settings

ROOT = Path(__file__).parents[1]
K8S = ROOT / "deploy" / "kubernetes"
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
NGINX_CONF = ROOT / "deploy" / "nginx" / "wsmode.conf"
CADDYFILE = ROOT / "deploy" / "caddy" / "Caddyfile"

# ---------------------------------------------------------------- reading the manifests


def documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def resource(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"deploy/kubernetes has {len(found)} {kind} {name}"
    return found[0]


def wsmode_container() -> dict[str, Any]:
    pod = resource("Deployment", "wsmode")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "wsmode"]
    return container


def named_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def probe_port(container: dict[str, Any], probe: str) -> int:
    port = container[probe]["httpGet"]["port"]
    return named_port(container, port) if isinstance(port, str) else int(port)


# ---------------------------------------------------------------- the deployed settings

# until the pool/store merge: config keys other branches add in parallel (upstream pool,
# Redis store). Once they are in the tree, delete this set, `_without` and the loop
# in `deployed_toml`: every test then loads the ConfigMap's TOML as it is.
PENDING_KEYS = frozenset(
    {
        *("upstream.urls", "upstream.affinity"),
        *("store.backend", "store.redis_url", "store.redis_timeout"),
    }
)

# values for the pod's Secret references (the real Secret is never committed)
SECRET_VALUES = {
    ("wsmode", "compaction-key"): base64.b64encode(bytes(range(32))).decode(),
    ("wsmode", "upstream-api-key"): "sk-model-server",
}


def configmap_toml() -> str:
    text = resource("ConfigMap", "wsmode-config")["data"]["wsmode.toml"]
    assert isinstance(text, str)
    return text


def pod_env() -> dict[str, str]:
    """The environment `wsmode serve` starts with in the pod: the image's ENV, then the
    container's own variables, Secret references filled in."""
    env = dict(DockerfileParser(str(ROOT / "Dockerfile")).envs)
    for var in wsmode_container().get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = SECRET_VALUES[(ref["name"], ref["key"])]
    return env


def load(toml_text: str, tmp_path: Path) -> Settings:
    path = tmp_path / "wsmode.toml"
    path.write_text(toml_text)
    return load_settings(path, pod_env())


def pending_key(exc: ConfigError) -> str | None:
    match = re.fullmatch(r"unknown config key (\S+)", str(exc))
    return match[1] if match and match[1] in PENDING_KEYS else None


def _without(toml_text: str, keys: set[str]) -> str:
    """The TOML minus `keys` (flat tables of strings, numbers and lists: what JSON writes is
    TOML for those)."""
    lines: list[str] = []
    for section, table in tomllib.loads(toml_text).items():
        lines.append(f"[{section}]")
        for key, value in table.items():
            if f"{section}.{key}" not in keys:
                lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def deployed_toml(tmp_path: Path) -> str:
    """The ConfigMap's TOML as this tree's loader takes it: all of it, or without those of
    the pending keys it does not know yet (until the pool/store merge)."""
    text, unknown = configmap_toml(), set[str]()
    while True:
        try:
            load(text, tmp_path)
            return text
        except ConfigError as exc:
            key = pending_key(exc)
            if key is None or key in unknown:
                raise
            unknown.add(key)
            text = _without(configmap_toml(), unknown)  # until the pool/store merge


def deployed_settings(tmp_path: Path) -> Settings:
    return load(deployed_toml(tmp_path), tmp_path)
