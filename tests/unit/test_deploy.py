"""deploy/: the Kubernetes manifests and the HAProxy and nginx configs, checked against the
wsmode configuration they deploy (the ConfigMap's TOML, read by wsmode's own loader, with the
image's and the pod's environment on top, as `wsmode serve` reads them in the pod). The
configs' own tools (`haproxy -c`, `nginx -t`, `caddy adapt`) run in
tests/integration/test_deploy_configs.py: this tier starts no process."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import crossplane
import kubernetes_validate
import pytest
import yaml
from wsmode.config import ENV_ALIASES

from tests.support.deploy_files import (
    HAPROXY_CFG,
    K8S,
    NGINX_CONF,
    ROOT,
    SECRET_VALUES,
    configmap_toml,
    container_args,
    container_env,
    deployed_settings,
    documents,
    load,
    named_port,
    nginx_wrapper,
    pod_env,
    probe_port,
    redis_container,
    resource,
    wsmode_container,
)

# the oldest Kubernetes the manifests are written for (policy/v1 PDBs, current probe fields)
KUBERNETES = "1.30.0"
GiB = 1024**3
# the interpreter, sockets and per-connection state: what no wsmode budget counts
UNCOUNTED_BYTES = 1 * GiB


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity; the binary suffixes the manifests use, or none."""
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", quantity)
    assert match, f"memory quantity {quantity!r}: write it as an integer with Ki/Mi/Gi/Ti"
    return int(match[1]) * units.get(match[2] or "", 1)


# ---------------------------------------------------------------- Kubernetes


def test_every_manifest_is_a_valid_kubernetes_object() -> None:
    """Against the API's own schema, strictly: a misspelt field is an error, not ignored."""
    seen = 0
    for path, doc in documents():
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{path.name}: {doc['kind']} {where}: {exc.message}")
        seen += 1
    kinds = sorted({d["kind"] for _, d in documents()})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
    ], kinds
    assert seen == 7  # wsmode's four, Redis's Deployment, Service and NetworkPolicy


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files


def test_the_configmap_toml_loads_with_wsmodes_loader(tmp_path: Path) -> None:
    """The whole file, pool and store keys included: nothing in it is unknown to the loader."""
    settings = load(configmap_toml(), tmp_path)
    assert len(settings.upstream.urls) == 2
    assert settings.upstream.affinity == "conversation"
    assert settings.store.backend == "redis"
    password = SECRET_VALUES[("wsmode-redis", "password")]
    assert settings.store.redis_url == f"redis://:{password}@wsmode-redis:6379/0"


def test_the_configmap_points_at_two_model_servers_and_the_example_redis() -> None:
    """Read from the TOML itself, so it runs before the pool/store keys are in the loader;
    the store URL is the pod's (it carries the Secret's password, so it is not in the TOML)."""
    doc = tomllib.loads(configmap_toml())
    urls = doc["upstream"]["urls"]
    assert len(urls) == 2 and len(set(urls)) == 2
    assert all(u.startswith("http://") and u.endswith("/v1") for u in urls)
    assert doc["upstream"]["affinity"] == "conversation"
    assert doc["store"]["backend"] == "redis"
    assert "redis_url" not in doc["store"]  # the environment's would win over it anyway
    url = pod_env()["WSMODE_STORE_REDIS_URL"]
    match = re.fullmatch(r"redis://:([^@]+)@([^:/]+):(\d+)/\d+", url)
    assert match, url
    service = resource("Service", match[2])
    assert int(match[3]) in [p["port"] for p in service["spec"]["ports"]]
    redis = resource("Deployment", match[2])
    assert service["spec"]["selector"] == redis["spec"]["template"]["metadata"]["labels"]


def test_redis_wants_the_password_wsmodes_store_url_carries() -> None:
    """One Secret key: Redis starts with --requirepass from it, and wsmode's URL is built
    from the same key (so rotating it changes both)."""
    redis, wsmode = redis_container(), wsmode_container()
    args = container_args(redis)
    password = args[args.index("--requirepass") + 1]
    assert password == SECRET_VALUES[("wsmode-redis", "password")]
    # the value is a Secret reference, not written in the manifest
    assert "$(" in str(redis["args"][redis["args"].index("--requirepass") + 1])
    refs = {
        v["valueFrom"]["secretKeyRef"]["name"] + "/" + v["valueFrom"]["secretKeyRef"]["key"]
        for c in (redis, wsmode)
        for v in c["env"]
        if "valueFrom" in v and v["valueFrom"]["secretKeyRef"]["name"] == "wsmode-redis"
    }
    assert refs == {"wsmode-redis/password"}
    assert f":{password}@" in pod_env()["WSMODE_STORE_REDIS_URL"]
    # the readiness probe's redis-cli authenticates (it reads REDISCLI_AUTH)
    assert container_env(redis)["REDISCLI_AUTH"] == password
    assert redis["readinessProbe"]["exec"]["command"][0] == "redis-cli"
    # no password anywhere in the committed files
    assert password not in "".join(p.read_text() for p in K8S.glob("*.yaml"))


def test_only_wsmodes_pods_reach_redis() -> None:
    policy = resource("NetworkPolicy", "wsmode-redis")["spec"]
    redis = resource("Deployment", "wsmode-redis")
    wsmode = resource("Deployment", "wsmode")
    redis_labels = redis["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_labels.items()
    assert policy["podSelector"]["matchLabels"]  # not every pod of the namespace
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]  # one peer: no namespaceSelector or ipBlock beside it
    assert set(source) == {"podSelector"}
    wsmode_labels = wsmode["spec"]["template"]["metadata"]["labels"]
    assert source["podSelector"]["matchLabels"].items() <= wsmode_labels.items()
    # ...and it is not matched by Redis's own pods or any other Deployment's
    for _, doc in documents():
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] != "wsmode":
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert not source["podSelector"]["matchLabels"].items() <= labels.items()
    (port,) = rule["ports"]
    assert port["protocol"] == "TCP"
    assert port["port"] in [p["name"] for p in redis_container()["ports"]]


def test_no_pod_mounts_a_service_account_token() -> None:
    for _, doc in documents():
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            assert pod.get("automountServiceAccountToken") is False, doc["metadata"]["name"]


def test_every_image_is_pinned_by_digest() -> None:
    """`name:tag@sha256:<64 hex>`: the digest decides what runs, the tag tells the reader."""
    for _, doc in documents():
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            assert re.fullmatch(r"[^@\s]+:[\w.-]+@sha256:[0-9a-f]{64}", c["image"]), c["image"]
    # the docs say how to put the real digests in place of the placeholders
    docs = (ROOT / "docs" / "deployment.md").read_text()
    assert "Pinning images" in docs and "@sha256:" in docs


def test_redis_has_no_pdb_and_its_single_point_is_documented() -> None:
    """A budget on a one-replica Redis blocks every node drain; its absence is said instead."""
    pdbs = [d for _, d in documents() if d["kind"] == "PodDisruptionBudget"]
    redis_labels = resource("Deployment", "wsmode-redis")["spec"]["template"]["metadata"]
    for pdb in pdbs:
        selector = pdb["spec"]["selector"]["matchLabels"].items()
        assert not selector <= redis_labels["labels"].items(), pdb["metadata"]["name"]
    assert resource("Deployment", "wsmode-redis")["spec"]["replicas"] == 1
    docs = (ROOT / "docs" / "deployment.md").read_text()
    assert "single point of failure" in docs
    assert "single point of failure" in (K8S / "redis.yaml").read_text()


def test_probes_ask_the_port_wsmode_listens_on(tmp_path: Path) -> None:
    settings = deployed_settings(tmp_path)
    container = wsmode_container()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe_port(container, probe) == settings.server.port, probe
    # reachable from the kubelet and the Service: not a loopback address
    assert settings.server.host == "0.0.0.0"
    # the TOML agrees with the image's WSMODE_PORT, which would win over it in the pod
    assert tomllib.loads(configmap_toml())["server"]["port"] == settings.server.port
    service = resource("Service", "wsmode")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http" and named_port(container, "http") == settings.server.port


def test_termination_grace_outlasts_the_prestop_pause_and_the_drain(tmp_path: Path) -> None:
    settings = deployed_settings(tmp_path)
    pod = resource("Deployment", "wsmode")["spec"]["template"]["spec"]
    container = wsmode_container()
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    pause = float(command[1])
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > pause + settings.server.drain_grace_seconds
    # /healthz answers 503 for the whole drain: the liveness probe must not give up first
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= grace
    # the image drains on SIGTERM, the signal the kubelet sends
    assert "STOPSIGNAL SIGTERM" in (ROOT / "Dockerfile").read_text()


def test_the_pdb_and_the_service_select_the_deployments_pods() -> None:
    deployment = resource("Deployment", "wsmode")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    pdb = resource("PodDisruptionBudget", "wsmode")
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    # one pod drained at a time, and never all of them
    assert pdb["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
    assert resource("Service", "wsmode")["spec"]["selector"] == selector
    # a rolling update starts a new pod before it drains an old one
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_the_memory_limit_holds_every_process_budget(tmp_path: Path) -> None:
    s = deployed_settings(tmp_path)
    resources = wsmode_container()["resources"]
    limit = memory_bytes(resources["limits"]["memory"])
    assert memory_bytes(resources["requests"]["memory"]) == limit
    # the caches and the store fit in the budget, so they never crowd out queued creates
    assert s.cache.process_max_bytes + s.store.max_bytes <= s.limits.process_max_bytes
    # every worker has its own budget and its own caches outside it
    per_process = (
        s.limits.process_max_bytes
        + s.compaction.expansion_cache_bytes
        + s.chat.translation_cache_bytes
        + UNCOUNTED_BYTES
    )
    assert s.server.workers * per_process <= limit


def test_secret_references_reach_their_config_keys(tmp_path: Path) -> None:
    settings = deployed_settings(tmp_path)
    assert settings.compaction.key == SECRET_VALUES[("wsmode", "compaction-key")]
    assert settings.upstream.api_key == SECRET_VALUES[("wsmode", "upstream-api-key")]
    # no secret in the ConfigMap itself
    doc = tomllib.loads(configmap_toml())
    assert "key" not in doc.get("compaction", {}) and "api_key" not in doc["upstream"]
    # WSMODE_CONFIG is the ConfigMap's file where the pod mounts it; the proxy keys' digest
    # file is the Secret's item where the pod mounts that
    container, pod = wsmode_container(), resource("Deployment", "wsmode")["spec"]["template"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (config,) = [n for n, v in volumes.items() if "configMap" in v]
    assert volumes[config]["configMap"]["name"] == "wsmode-config"
    assert pod_env()["WSMODE_CONFIG"] == f"{mounts[config]}/wsmode.toml"
    (secret,) = [n for n, v in volumes.items() if "secret" in v]
    items = {i["path"] for i in volumes[secret]["secret"]["items"]}
    hashes = Path(settings.auth.api_key_hashes_file)
    assert str(hashes.parent) == mounts[secret] and hashes.name in items


def test_the_pod_environment_names_only_known_settings(tmp_path: Path) -> None:
    """A misspelt WSMODE_* variable is an error in wsmode's loader; here every one the pod
    sets is also one the loader reads into a field (not only accepted)."""
    settings = deployed_settings(tmp_path)
    for name in pod_env():
        if not name.startswith("WSMODE_") or name in ("WSMODE_CONFIG", "WSMODE_BASE_CONFIG"):
            continue
        section, key = ENV_ALIASES.get(name) or name.removeprefix("WSMODE_").lower().split("_", 1)
        assert hasattr(getattr(settings, section), key), name


# ---------------------------------------------------------------- Prometheus

PROMETHEUS = ROOT / "deploy" / "prometheus"


def test_the_pods_metrics_need_a_key_the_scrapers_send(tmp_path: Path) -> None:
    """Proxy auth is on in the example, so /metrics needs a key: the pods get a metrics key
    from the Secret, and both scrape examples send that same Secret item as a bearer token,
    to the container port the Deployment names `http`."""
    settings = deployed_settings(tmp_path)
    assert settings.auth.api_key_hashes_file  # auth on: /metrics is not open
    metrics_key = ("wsmode", "metrics-api-key")
    assert settings.auth.metrics_api_keys == (SECRET_VALUES[metrics_key],)
    named_port(wsmode_container(), "http")
    (job,) = yaml.safe_load((PROMETHEUS / "scrape.yaml").read_text())["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"].endswith("/metrics-api-key")
    keep = {
        tuple(r["source_labels"]): r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    selector = resource("Deployment", "wsmode")["spec"]["selector"]["matchLabels"]
    labels = tuple(
        "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9]", "_", k) for k in selector
    )
    assert keep[labels] == ";".join(selector.values())
    assert keep[("__meta_kubernetes_pod_container_port_name",)] == "http"
    monitor = yaml.safe_load((PROMETHEUS / "servicemonitor.yaml").read_text())
    assert monitor["kind"] == "ServiceMonitor"
    assert (
        monitor["spec"]["selector"]["matchLabels"]
        == resource("Service", "wsmode")["metadata"]["labels"]
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    service_ports = {p["name"] for p in resource("Service", "wsmode")["spec"]["ports"]}
    assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
    credentials = endpoint["authorization"]["credentials"]
    assert (credentials["name"], credentials["key"]) == metrics_key


# ---------------------------------------------------------------- HAProxy


def haproxy_sections() -> dict[str, list[list[str]]]:
    """`section name` -> its keyword lines, split on blanks, comments left out."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] = []
    for raw in HAPROXY_CFG.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if not raw[0].isspace():  # a section header starts in the first column
            current = sections.setdefault(" ".join(words), [])
        else:
            current.append(words)
    return sections


def haproxy_seconds(value: str) -> float:
    """An HAProxy time: milliseconds unless a unit says otherwise."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    match = re.fullmatch(r"(\d+)(us|ms|s|m|h|d)?", value)
    assert match, value
    return int(match[1]) * units[match[2] or "ms"]


def haproxy_timeouts() -> dict[str, float]:
    return {
        words[1]: haproxy_seconds(words[2])
        for words in haproxy_sections()["defaults"]
        if words[0] == "timeout"
    }


def test_haproxy_keeps_sockets_as_long_as_wsmode_does(tmp_path: Path) -> None:
    lifetime = deployed_settings(tmp_path).server.connection_lifetime_seconds
    timeouts = haproxy_timeouts()
    # the tunnel after a 101, and each side of a plain HTTP answer (SSE or a silent wait)
    for name in ("tunnel", "client", "server"):
        assert timeouts[name] >= lifetime, f"timeout {name}"
    assert [w for w in haproxy_sections()["defaults"] if w[0] == "mode"] == [["mode", "http"]]


def test_haproxy_checks_readiness_and_balances_by_open_sockets(tmp_path: Path) -> None:
    settings = deployed_settings(tmp_path)
    backend = haproxy_sections()["backend wsmode"]
    assert ["option", "httpchk"] in backend
    assert ["http-check", "send", "meth", "GET", "uri", "/readyz"] in backend
    assert ["http-check", "expect", "status", "200"] in backend
    assert ["balance", "leastconn"] in backend
    (defaults,) = [w for w in backend if w[0] == "default-server"]
    assert "check" in defaults
    assert int(defaults[defaults.index("maxconn") + 1]) <= settings.server.max_connections
    servers = [w for w in backend if w[0] == "server"]
    assert len(servers) >= 2
    # the front takes as many connections as the replicas together
    ((_, front),) = [w for w in haproxy_sections()["global"] if w[0] == "maxconn"]
    assert int(front) >= len(servers) * int(defaults[defaults.index("maxconn") + 1])
    # a draining replica's 503 is retried on another, but never a POST's
    ((_, *retry_on),) = [w for w in backend if w[0] == "retry-on"]
    assert "503" in retry_on and "conn-failure" in retry_on
    assert ["http-request", "disable-l7-retry", "if", "METH_POST"] in backend
    # nothing that would hold a streamed answer back, nor cut a draining replica's sockets
    text = HAPROXY_CFG.read_text()
    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    assert not [line for line in lines if "http-buffer-request" in line]
    assert not [line for line in lines if "shutdown-sessions" in line]


# ---------------------------------------------------------------- nginx


def nginx_http_block(tmp_path: Path) -> list[dict[str, Any]]:
    """The reference file's directives, as crossplane parses them inside the wrapper (its
    include followed, every directive checked against the context it stands in)."""
    parsed = crossplane.parse(str(nginx_wrapper(tmp_path)), comments=False)
    errors = [e for f in parsed["config"] for e in f["errors"]]
    assert parsed["status"] == "ok" and not errors, errors
    (included,) = [f for f in parsed["config"] if f["file"] == str(NGINX_CONF)]
    return list(included["parsed"])


def directives(block: list[dict[str, Any]], name: str) -> list[list[str]]:
    return [d["args"] for d in block if d["directive"] == name]


def nginx_seconds(value: str) -> float:
    """An nginx time: seconds unless a unit says otherwise."""
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d)?", value)
    assert match, value
    return int(match[1]) * units[match[2] or "s"]


def nginx_bytes(value: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    match = re.fullmatch(r"(\d+)([kKmMgG])?", value)
    assert match, value
    return int(match[1]) * units.get((match[2] or "").lower(), 1)


def test_nginx_upgrades_websockets_and_streams_unbuffered(tmp_path: Path) -> None:
    settings = deployed_settings(tmp_path)
    http = nginx_http_block(tmp_path)
    (server,) = [d["block"] for d in http if d["directive"] == "server"]
    (location,) = [
        d["block"] for d in server if d["directive"] == "location" and d["args"] == ["/"]
    ]
    assert directives(location, "proxy_http_version") == [["1.1"]]
    headers = {args[0].lower(): args[1] for args in directives(location, "proxy_set_header")}
    assert headers["upgrade"] == "$http_upgrade"
    # Connection: `upgrade` when the client asked for one (a `map` of $http_upgrade)
    (mapping,) = [d for d in http if d["directive"] == "map" and d["args"][0] == "$http_upgrade"]
    assert headers["connection"] == mapping["args"][1]
    cases = {d["directive"]: d["args"] for d in mapping["block"]}
    assert cases["default"] == ["upgrade"]
    lifetime = settings.server.connection_lifetime_seconds
    for timeout in ("proxy_read_timeout", "proxy_send_timeout"):
        ((value,),) = directives(location, timeout)
        assert nginx_seconds(value) >= lifetime, timeout
    assert directives(location, "proxy_buffering") == [["off"]]
    assert directives(location, "proxy_request_buffering") == [["off"]]
    ((body,),) = directives(server, "client_max_body_size")
    assert nginx_bytes(body) >= settings.server.max_message_bytes
    # every server of the upstream group the location proxies to
    (target,) = directives(location, "proxy_pass")
    name = target[0].removeprefix("http://")
    (group,) = [d["block"] for d in http if d["directive"] == "upstream" and d["args"] == [name]]
    assert len(directives(group, "server")) >= 2
    assert directives(group, "least_conn") == [[]]
