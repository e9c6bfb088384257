"""What the deploy/ tests share: the files of deploy/, and the settings the Kubernetes pod
runs with (the ConfigMap's TOML, the image's ENV, the container's env, the Secret's values),
read by wsmode's own loader."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from dockerfile_parse import DockerfileParser
from wsmode.config import Settings, load_settings

ROOT = Path(__file__).parents[2]
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

# values for the pod's Secret references (the real Secret is never committed)
SECRET_VALUES = {
    ("wsmode", "compaction-key"): base64.b64encode(bytes(range(32))).decode(),
    ("wsmode", "upstream-api-key"): "sk-model-server",
    ("wsmode", "metrics-api-key"): "0123456789abcdef" * 2,
    ("wsmode-redis", "password"): "0123456789abcdef" * 4,
}


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes's `$(NAME)` in an env value or an arg: the variable if defined (earlier in
    the container's env), else left as written; `$$` is a literal `$`."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
        value,
    )


def container_env(container: dict[str, Any], base: dict[str, str] | None = None) -> dict[str, str]:
    """A container's variables in order, Secret references filled in from SECRET_VALUES and
    `$(NAME)` expanded as the kubelet does (from the container's own earlier variables, not
    the image's), on top of `base`."""
    own: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            own[var["name"]] = expand(str(var["value"]), own)
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            own[var["name"]] = SECRET_VALUES[(ref["name"], ref["key"])]
    return {**(base or {}), **own}


def container_args(container: dict[str, Any]) -> list[str]:
    """A container's args as the kubelet passes them (`$(NAME)` from its env expanded)."""
    env = container_env(container)
    return [expand(str(a), env) for a in container.get("args", [])]


def redis_container() -> dict[str, Any]:
    pod = resource("Deployment", "wsmode-redis")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert isinstance(container, dict)
    return container


def configmap_toml() -> str:
    text = resource("ConfigMap", "wsmode-config")["data"]["wsmode.toml"]
    assert isinstance(text, str)
    return text


def pod_env() -> dict[str, str]:
    """The environment `wsmode serve` starts with in the pod: the image's ENV, then the
    container's own variables, Secret references filled in."""
    parser = DockerfileParser(str(ROOT / "Dockerfile"))
    env = dict(parser.envs)
    # a variable naming a file the image copies in from the repository: that file, here
    copied = {
        words[-1]: str(ROOT / words[-2])
        for i in parser.structure
        if i["instruction"] == "COPY" and len(words := i["value"].split()) == 2
    }
    env = {name: copied.get(value, value) for name, value in env.items()}
    return container_env(wsmode_container(), env)


def load(toml_text: str, tmp_path: Path) -> Settings:
    path = tmp_path / "wsmode.toml"
    path.write_text(toml_text)
    return load_settings(path, pod_env())


def deployed_toml(tmp_path: Path) -> str:
    """The ConfigMap's TOML, checked to load with wsmode's own loader."""
    text = configmap_toml()
    load(text, tmp_path)
    return text


def deployed_settings(tmp_path: Path) -> Settings:
    return load(deployed_toml(tmp_path), tmp_path)


# ---------------------------------------------------------------- the nginx config


def nginx_wrapper(tmp_path: Path) -> Path:
    """A whole nginx.conf around the reference file (which goes in an `http` block)."""
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"pid {tmp_path}/nginx.pid;\n"
        "events {}\n"
        f"http {{\n    access_log off;\n    include {NGINX_CONF};\n}}\n"
    )
    return conf
