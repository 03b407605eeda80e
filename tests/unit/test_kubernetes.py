"""deploy/kubernetes/ checked offline (no cluster runs here: docs/deployment.md "Kubernetes").

- Kubernetes' own kinds are validated by ``kubernetes-validate`` (pinned in the test extra), in
  strict mode (unknown fields refused), against the schemas of Kubernetes ``MIN_VERSION`` (the
  oldest release whose fields the manifests use: ``appArmorProfile`` is 1.30's) and the newest the
  validator ships. A missing validator fails the test.
- KEDA's ``ScaledObject`` (a custom resource) is validated against a JSON Schema written for this
  project from KEDA's documented fields (tests/fixtures/keda/scaledobject.schema.json says which
  pages), not KEDA's own CRD.
- What the manifests must mean is checked too: Secrets referenced and never inline, the Secrets
  the docs tell you to create are exactly those referenced, resources and security contexts on
  every container, the tools worker's confinement as in compose.yaml (its per-agent limits off,
  as the docs say), the workers' pools as in compose.yaml, and the
  NetworkPolicies evaluated as a cluster would, pod to pod, against compose's networks.
"""

from __future__ import annotations

import copy
import functools
import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
KEDA_SCHEMA = ROOT / "tests" / "fixtures" / "keda" / "scaledobject.schema.json"
MIN_VERSION = "1.30.0"
PINNED = "1.37.0"  # pyproject.toml's kubernetes-validate pin; its newest schemas are Kubernetes 1.37's
VERSIONS = (MIN_VERSION, PINNED)
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
SECRET_DOC = ROOT / "docs" / "deployment.md"


def documents() -> list[dict[str, Any]]:
    """Every object of the kustomization's resources, in order, with ``_file`` added (a fresh copy)."""
    return copy.deepcopy(_documents())


@functools.lru_cache(maxsize=1)
def _documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    out = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((KUBE / name).read_text()):
            if doc:
                out.append({**doc, "_file": name})
    return out


def core(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "_file"}


def of_kind(*kinds: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] in kinds]


def workloads() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in of_kind(*WORKLOAD_KINDS)}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


# -- the validators ----------------------------------------------------------------------------


def test_the_validator_is_installed_and_pinned() -> None:
    from importlib.metadata import version

    import kubernetes_validate

    assert version("kubernetes-validate") == PINNED
    pin = re.search(r'"kubernetes-validate==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin and pin.group(1) == PINNED, "pyproject.toml pins another kubernetes-validate than this test states"
    assert callable(kubernetes_validate.validate)


def test_the_kustomization_lists_every_manifest_and_only_those() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    on_disk = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(on_disk)
    # Only what needs no kustomize to be read as it is: the files are the objects applied.
    assert set(kustomization) <= {"apiVersion", "kind", "namespace", "resources"}
    namespaces = [d["metadata"]["name"] for d in of_kind("Namespace")]
    assert namespaces == [kustomization["namespace"]]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_kubernetes_object_validates_strictly(version: str) -> None:
    import kubernetes_validate

    checked = []
    for doc in documents():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        try:
            kubernetes_validate.validate(core(doc), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['_file']}: {doc['kind']} {doc['metadata']['name']} at {version}: {exc.message}")
        checked.append(doc["kind"])
    assert {"StatefulSet", "Deployment", "Service", "NetworkPolicy", "ConfigMap"} <= set(checked)


def test_the_validator_refuses_what_a_cluster_would() -> None:
    """Negative controls: misspelled fields (nested too), a wrong type and a missing required field are
    refused. (Kubernetes' schemas carry no enums: a wrong value of a known field, ``procMount: Open``,
    passes; the tests below check the values that matter.)"""
    import kubernetes_validate

    tools = core(workloads()["worker-tools"])
    for mutate in (
        lambda d: d["spec"].__setitem__("replica", 2),  # misspelled
        lambda d: d["spec"].__setitem__("replicas", "two"),  # wrong type
        lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"),  # required
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].__setitem__(
            "procmount", "Unmasked"
        ),
    ):
        bad = copy.deepcopy(tools)
        mutate(bad)
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, PINNED, strict=True)


def keda_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(KEDA_SCHEMA.read_text())
    return schema


def test_scaled_objects_follow_kedas_documented_fields() -> None:
    scaled = of_kind("ScaledObject")
    assert {d["metadata"]["name"] for d in scaled} == {"worker-turns", "worker-tools"}
    validator = jsonschema.Draft202012Validator(keda_schema())
    for doc in scaled:
        errors = [e.message for e in validator.iter_errors(core(doc))]
        assert not errors, f"{doc['metadata']['name']}: {errors}"


def test_the_keda_schema_refuses_what_keda_would() -> None:
    validator = jsonschema.Draft202012Validator(keda_schema())
    good = core(of_kind("ScaledObject")[0])
    assert validator.is_valid(good)
    for mutate in (
        lambda d: d["spec"].__setitem__("minReplicas", 1),  # an HPA field, not KEDA's
        lambda d: d["spec"]["triggers"][0]["metadata"].pop("query"),  # the prometheus trigger needs it
        lambda d: d["spec"]["triggers"][0]["metadata"].__setitem__("threshold", 50),  # metadata values are strings
        lambda d: d["spec"].pop("scaleTargetRef"),
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert not validator.is_valid(bad)


def test_scaled_objects_scale_the_nodes_on_their_own_queues_backlog() -> None:
    loads = workloads()
    for doc in of_kind("ScaledObject"):
        ref = doc["spec"]["scaleTargetRef"]
        target = loads[ref["name"]]
        assert (ref["apiVersion"], ref["kind"]) == (target["apiVersion"], target["kind"])
        (queue,) = re.findall(
            r'agent_queue_backlog\{queue="([a-z]+)"\}', doc["spec"]["triggers"][0]["metadata"]["query"]
        )
        command = containers(target)[0]["command"]
        assert command[command.index("-Q") + 1] == queue
        assert doc["spec"]["minReplicaCount"] >= 1, "a node kind scaled to zero leaves its queue unserved"


# -- what the manifests mean -------------------------------------------------------------------


def referenced_secrets() -> set[str]:
    names = set()
    for doc in documents():
        for node in walk(doc):
            if isinstance(node, dict):
                if "secretKeyRef" in node:
                    names.add(node["secretKeyRef"]["name"])
                if "secretRef" in node:
                    names.add(node["secretRef"]["name"])
                if "secretName" in node:
                    names.add(node["secretName"])
    return names


def test_secrets_are_referenced_never_inline() -> None:
    assert not of_kind("Secret"), "a Secret object in the manifests would put its values in git"
    for doc in of_kind(*WORKLOAD_KINDS):
        for c in containers(doc):
            for env in c.get("env", []):
                value = env.get("value", "")
                name = env["name"]
                if re.search(r"PASSWORD|SECRET|KEY|TOKEN|AUTH", name) and "valueFrom" not in env:
                    pytest.fail(f"{doc['metadata']['name']}: {name} has an inline value")
                if "://" in value and "@" in value:  # a URL with credentials: only through $(VAR)
                    assert re.search(r"://[a-z]+:\$\([A-Z_]+\)@", value), f"{name}={value}"
    for cm in of_kind("ConfigMap"):
        for key in cm["data"]:
            assert not re.search(r"PASSWORD|SECRET_ACCESS|API_KEY|SNAPSHOT_KEY", key), f"{key} in a ConfigMap"


def kubernetes_section() -> str:
    text = SECRET_DOC.read_text()
    start = text.index("\n## Kubernetes")
    end = text.find("\n## ", start + 5)
    return text[start : end if end > 0 else len(text)]


def test_the_docs_create_exactly_the_secrets_the_manifests_reference() -> None:
    section = kubernetes_section()
    created = set(re.findall(r"kubectl -n agent-runtime create secret \w+ ([a-z0-9-]+)", section))
    assert created == referenced_secrets()
    assert "kubernetes-validate" in section and PINNED in section and MIN_VERSION.rsplit(".", 1)[0] in section


def referenced_keys() -> dict[str, set[str]]:
    """Secret name -> the keys the manifests read from it (``secretKeyRef`` keys, and for a Secret
    mounted as files, the files the start scripts and settings open under its mount path)."""
    keys: dict[str, set[str]] = {}
    maps = {d["metadata"]["name"]: json.dumps(d["data"]) for d in of_kind("ConfigMap")}
    for doc in of_kind(*WORKLOAD_KINDS):
        pod = doc["spec"]["template"]["spec"]
        used = {n["configMapRef"]["name"] for n in walk(doc) if isinstance(n, dict) and "configMapRef" in n}
        used |= {v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
        texts = json.dumps(core(doc)) + " ".join(maps[m] for m in used)
        for node in walk(doc):
            if isinstance(node, dict) and "secretKeyRef" in node:
                keys.setdefault(node["secretKeyRef"]["name"], set()).add(node["secretKeyRef"]["key"])
        for vol in pod.get("volumes", []):
            if "secret" in vol:
                mount = next(
                    m["mountPath"] for c in containers(doc) for m in c["volumeMounts"] if m["name"] == vol["name"]
                )
                files = set(re.findall(re.escape(mount) + r"/([a-z.]+)", texts))
                keys.setdefault(vol["secret"]["secretName"], set()).update(files)
    return keys


def test_the_docs_secret_block_makes_what_the_pods_read(tmp_path: Path) -> None:
    """Runs the docs' block with a stand-in kubectl that records each Secret; checks the keys, and
    the certificate's names against every address a client or Sentinel dials, with openssl."""
    section = kubernetes_section()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "create secret" in b)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "kubectl.jsonl"
    (bindir / "kubectl").write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    (bindir / "kubectl").chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "OPENAI_API_KEY": "sk-test", "HOME": str(tmp_path)}
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    made: dict[str, set[str]] = {}
    for line in record.read_text().splitlines():
        argv = json.loads(line)
        if argv[2:4] == ["create", "secret"]:
            values = [a.split("=", 1)[1] for a in argv if a.startswith("--from-")]
            made[argv[5]] = {v.split("=", 1)[0] for v in values}
            for a in argv:
                if a.startswith("--from-file="):
                    assert (tmp_path / a.split("=", 1)[1]).is_file(), a
                if a.startswith("--from-literal=") and a.split("=", 2)[1] not in (
                    "OPENAI_API_KEY",
                    "AWS_ACCESS_KEY_ID",
                ):
                    assert len(a.split("=", 2)[2]) >= 32, f"{a.split('=', 2)[1]}: a password of 32 characters at least"
    assert made == referenced_keys()
    config = next(d for d in of_kind("ConfigMap") if d["metadata"]["name"] == "agent-config")["data"]
    dialled = [a.split(":")[0] for a in config["AGENT_REDIS_SENTINELS"].split(",")]
    dialled += [f"redis-{i}.redis.agent-runtime.svc.cluster.local" for i in range(3)]  # what Sentinel announces
    dialled += [f"sentinel-{i}.sentinel.agent-runtime.svc.cluster.local" for i in range(3)]
    for name in dialled:
        check = subprocess.run(
            ["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname", name, "tls.crt"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, f"{name}: {check.stdout}{check.stderr}"
    wrong = subprocess.run(
        ["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname", "redis-9.redis", "tls.crt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert wrong.returncode != 0, "openssl accepted a name the certificate does not hold: the check above is void"


def test_every_container_has_resources_and_a_locked_down_security_context() -> None:
    for doc in of_kind(*WORKLOAD_KINDS):
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
        assert pod.get("automountServiceAccountToken") is False, doc["metadata"]["name"]
        for c in containers(doc):
            where = f"{doc['metadata']['name']}/{c['name']}"
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), where
            assert "memory" in c["resources"]["limits"], where
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], where
            assert sc.get("privileged") is not True, where
            seccomp = sc.get("seccompProfile") or pod["securityContext"].get("seccompProfile")
            assert seccomp and seccomp["type"] in ("RuntimeDefault", "Localhost"), where


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return data


def test_the_tools_worker_has_composes_confinement_and_says_its_limits_are_off() -> None:
    tools = workloads()["worker-tools"]
    pod = tools["spec"]["template"]["spec"]
    sc = containers(tools)[0]["securityContext"]
    # Compose runs the per-agent limits (root, capabilities); this base cannot, and must say so
    # rather than claim compose's grants.
    env = {e["name"]: e.get("value") for e in containers(tools)[0]["env"]}
    assert env["AGENT_HOME_QUOTA_MB"] == "0" and env["AGENT_COMMAND_MEMORY_CGROUP"] == "0"
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    composed = compose()["services"]["worker-tools"]
    assert composed.get("user") == "root" and "SYS_ADMIN" in composed["cap_add"]
    assert "**The per-agent limits are off in this base, unlike compose.**" in (ROOT / "docs/deployment.md").read_text()
    seccomp_file = next(
        o.split("=", 1)[1] for o in compose()["services"]["worker-tools"]["security_opt"] if o.startswith("seccomp=")
    )
    assert sc["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": f"profiles/agent-{Path(seccomp_file).name}",
    }
    assert "apparmor=unconfined" in compose()["services"]["worker-tools"]["security_opt"]
    assert sc["appArmorProfile"] == {"type": "Unconfined"}
    assert sc["procMount"] == "Unmasked" and pod["hostUsers"] is False
    # Every other workload keeps the runtime's default confinement.
    for name, doc in workloads().items():
        if name != "worker-tools":
            for c in containers(doc):
                assert "procMount" not in c["securityContext"] and "appArmorProfile" not in c["securityContext"], name


def test_tools_nodes_have_a_volume_each_and_beat_runs_once() -> None:
    loads = workloads()
    tools = loads["worker-tools"]
    assert tools["kind"] == "StatefulSet"
    (claim,) = tools["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in containers(tools)[0]["volumeMounts"]}
    config = next(d for d in of_kind("ConfigMap") if d["metadata"]["name"] == "agent-config")
    assert mounts[claim["metadata"]["name"]] == config["data"]["AGENT_HOMES_ROOT"]
    for name in ("worker-turns", "worker-background", "worker-workflow", "api", "flower"):
        assert loads[name]["kind"] == "Deployment"
    assert loads["beat"]["spec"]["replicas"] == 1 and loads["beat"]["spec"]["strategy"]["type"] == "Recreate"
    for name in ("redis", "sentinel"):
        assert loads[name]["kind"] == "StatefulSet" and loads[name]["spec"]["replicas"] == 3


def _pool(argv: list[str]) -> tuple[str, str, str | None]:
    """The queue, the pool and its size (None: a solo pool's one)."""
    size = argv[argv.index("-c") + 1] if "-c" in argv else None
    return argv[argv.index("-Q") + 1], argv[argv.index("--pool") + 1], size


def test_the_workers_run_the_pools_compose_runs() -> None:
    services = compose()["services"]
    for name in ("worker-turns", "worker-tools", "worker-background", "worker-workflow"):
        assert _pool(containers(workloads()[name])[0]["command"]) == _pool(services[name]["command"]), name
    # The queues that wait on the model run their steps on the consumer's thread, as
    # devtools.workers runs them by default (bench/README.md, "Worker CPU per turn, third pass").
    for name in ("worker-turns", "worker-background", "worker-workflow"):
        assert _pool(services[name]["command"])[1:] == ("solo", None), name


def test_services_select_the_pods_they_name() -> None:
    labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in workloads().items()}
    for svc in of_kind("Service"):
        selector = svc["spec"]["selector"]
        chosen = [n for n, lab in labels.items() if selector.items() <= lab.items()]
        assert chosen == [svc["metadata"]["name"]], f"Service {svc['metadata']['name']} selects {chosen}"
        ports = {p["name"] for c in containers(workloads()[chosen[0]]) for p in c.get("ports", [])}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
    for doc in of_kind("StatefulSet"):
        assert doc["spec"]["serviceName"] in {s["metadata"]["name"] for s in of_kind("Service")}


def test_the_start_scripts_are_valid_shell() -> None:
    scripts = next(d for d in of_kind("ConfigMap") if d["metadata"]["name"] == "redis-scripts")
    for name, text in scripts["data"].items():
        run = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
        assert run.returncode == 0, f"{name}: {run.stderr}"
        assert "CONF\n" in text and re.search(r"^CONF$", text, re.M), f"{name}: its heredoc must end at column 0"


# -- NetworkPolicies, evaluated ----------------------------------------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for k, v in selector.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] != "In":
            raise AssertionError(f"the evaluator knows In only: {expr}")
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


# A peer: a pod of ours (its labels), a pod of another namespace, or an address outside the cluster.
Peer = tuple[str, dict[str, str] | str]
NAMESPACE = "agent-runtime"


def _peer_matches(rule_peer: dict[str, Any], peer: Peer) -> bool:
    kind, what = peer
    if "ipBlock" in rule_peer:
        if kind != "ip":
            return False
        assert isinstance(what, str)
        ip = ipaddress.ip_address(what)
        block = rule_peer["ipBlock"]
        if ip not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(ip in ipaddress.ip_network(e) for e in block.get("except", []))
    if kind == "ip":
        return False
    ns_sel = rule_peer.get("namespaceSelector")
    pod_sel = rule_peer.get("podSelector")
    if kind == "pod":
        assert isinstance(what, dict)
        return ns_sel is None and pod_sel is not None and _selects(pod_sel, what)
    # a pod of another namespace, named by the namespace
    return ns_sel is not None and _selects(ns_sel, {"kubernetes.io/metadata.name": str(what)}) and pod_sel is None


def _allowed(direction: str, labels: dict[str, str], peer: Peer, port: int) -> bool:
    """Whether the policies selecting a pod (``labels``) allow ``direction`` traffic with ``peer`` on ``port``."""
    kind = "Ingress" if direction == "ingress" else "Egress"
    policies = [
        p
        for p in of_kind("NetworkPolicy")
        if _selects(p["spec"]["podSelector"], labels) and kind in p["spec"]["policyTypes"]
    ]
    if not policies:
        return True  # not isolated in that direction
    for pol in policies:
        for rule in pol["spec"].get(direction, []):
            peers = rule.get("from" if direction == "ingress" else "to")
            ports = rule.get("ports")
            if ports is not None and not any(p["port"] == port for p in ports):
                continue
            if peers is None or any(_peer_matches(rp, peer) for rp in peers):
                return True
    return False


def reaches(src: str, dst: str, port: int) -> bool:
    """Pod of workload ``src`` to pod of workload ``dst`` on ``port``: egress of one and ingress of the other."""
    labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in workloads().items()}
    return _allowed("egress", labels[src], ("pod", labels[dst]), port) and _allowed(
        "ingress", labels[dst], ("pod", labels[src]), port
    )


def test_network_policies_mirror_composes_networks() -> None:
    names = set(workloads())
    backend = {n for n, s in compose()["services"].items() if "backend" in (s.get("networks") or [])} - {"redis"}
    # compose's backend (Redis's clients) plus the Sentinels and the other Redis pods.
    expected = {n for n in names if n in backend or n.startswith("worker-")} | {"redis", "sentinel"}
    assert {n for n in names if reaches(n, "redis", 6379)} == expected
    assert {n for n in names if reaches(n, "sentinel", 26379)} == expected
    assert {n for n in names if reaches(n, "objectstore", 8333)} == {"worker-tools"}
    labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in workloads().items()}
    outside = ("ip", "203.0.113.7")  # an address on the internet (a model API, a web page)
    for name in names:
        out = _allowed("egress", labels[name], outside, 443)
        assert out == name.startswith("worker-"), f"{name} reaches the internet: {out}"
        for private in ("10.1.2.3", "169.254.169.254", "192.168.1.1"):  # the cluster, the cloud's metadata
            assert not _allowed("egress", labels[name], ("ip", private), 443), f"{name} reaches {private}"
    for name in names:
        ingress_metrics = _allowed("ingress", labels[name], ("namespace", "monitoring"), 9808)
        assert ingress_metrics == name.startswith("worker-"), name
        assert not _allowed("ingress", labels[name], ("namespace", "default"), 9808), name
    assert _allowed("ingress", labels["api"], ("namespace", "ingress-nginx"), 8700)
    assert not _allowed("ingress", labels["redis"], ("namespace", "ingress-nginx"), 6379)
