"""The configuration of a deployment on several machines: ``python -m devtools.hosts_config``.

docs/deployment.md ("Several hosts") is the procedure; this writes every file it needs, fresh
secrets included, into one directory on the operator's machine:

- ``ca.crt`` / ``ca.key``: a certificate authority made for the deployment (``ca.key`` never
  leaves the operator's machine);
- ``machines/<name>/``: one folder per machine, copied to ``<dir>/config`` on it
  (``/srv/agent/config`` by default): ``host.env`` (the environment of its processes and its
  roles), ``ca.crt``, ``server.crt``/``server.key`` (its TLS certificate: its address and name),
  and per role ``redis.conf`` + ``users.acl`` (Redis: TLS only, ACL users, replication),
  ``sentinel.conf`` (Sentinel: TLS only, a password), ``prometheus.yml`` (the workers of every
  machine);
- ``operator.env``: the control plane from the operator's machine (``CONTROL_REDIS_URL``, the
  Sentinels, the CA), Flower's and the API's addresses.

Every machine runs ``redis``, ``sentinel``, ``worker`` (both pools: a turn node and a tools node
with its own homes disk) and ``beat`` (redbeat's lock keeps one running); the first machine also
runs ``api``, ``flower`` and ``prometheus`` (``--ops`` chooses another). The first machine's Redis
starts as the primary, the others as its replicas; Sentinel (quorum 2 of 3) promotes one when the
primary goes. With ``--objectstore NAME=ADDRESS`` a SeaweedFS S3 server is configured on a
machine of its own (or on one of the three, by naming it), its credentials made here; otherwise
``--s3-endpoint`` names the provider's and ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` come
from this environment. The model's key comes from ``OPENAI_API_KEY`` in this environment.

Nothing secret is printed; every file holding one is mode 0600. ``devtools.host`` reads the
folder on each machine and runs its roles.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from devtools.certificates import make_ca, make_cert
from devtools.redis_configs import (
    MASTER_NAME,
    REDIS_PORT,
    SENTINEL_PORT,
    RedisMachine,
    acl_text,
    redis_conf,
    sentinel_conf,
)

DEFAULT_DIR = Path("/srv/agent")
METRICS_PORT = 9808  # the I/O pool; the tools pool serves on the next port (devtools.workers.pool_env)
API_PORT = 8700
FLOWER_PORT = 5555
PROMETHEUS_PORT = 9090
S3_PORT = 8333
ROLES = ("redis", "sentinel", "worker", "beat", "api", "flower", "prometheus", "objectstore")
DEFAULT_ROLES = ("redis", "sentinel", "worker", "beat")
OPS_ROLES = ("api", "flower", "prometheus")
BUCKET = "agent-snapshots"

_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")


class ConfigError(ValueError):
    """A machine, address or option the configuration cannot be made from (the message says which)."""


@dataclass(frozen=True)
class MachineSpec:
    """One machine: its name (a hostname-like label), its private address and its roles."""

    name: str
    address: str
    roles: tuple[str, ...]

    def has(self, role: str) -> bool:
        return role in self.roles


@dataclass
class Secrets:
    """The deployment's passwords and keys (hex, fresh for each ``init``)."""

    worker: str = field(default_factory=lambda: secrets.token_hex(24))
    control: str = field(default_factory=lambda: secrets.token_hex(24))
    replica: str = field(default_factory=lambda: secrets.token_hex(24))
    sentinel_user: str = field(default_factory=lambda: secrets.token_hex(24))
    sentinel: str = field(default_factory=lambda: secrets.token_hex(24))  # the Sentinels' requirepass
    flower: str = field(default_factory=lambda: secrets.token_hex(16))
    snapshot_key: str = field(default_factory=lambda: secrets.token_hex(32))
    s3_access_key: str = field(default_factory=lambda: "agent" + secrets.token_hex(8))
    s3_secret_key: str = field(default_factory=lambda: secrets.token_hex(24))

    def values(self) -> list[str]:
        """Every secret (to check that none reaches an output)."""
        return [str(v) for v in vars(self).values()]


@dataclass(frozen=True)
class ObjectStore:
    """Where snapshots go: ``endpoint`` (an https URL), the bucket, and whether this deployment runs
    the server itself (SeaweedFS on ``machine``; its credentials then come from ``Secrets``)."""

    endpoint: str
    bucket: str = BUCKET
    prefix: str = "homes"
    machine: MachineSpec | None = None
    region: str = "us-east-1"


@dataclass(frozen=True)
class Deployment:
    """What ``init`` writes from: the machines (the first starts as Redis's primary), the object
    store, the model endpoint and where the deployment lives on each machine (``base``)."""

    machines: tuple[MachineSpec, ...]
    store: ObjectStore
    model_url: str
    model: str
    base: Path = DEFAULT_DIR
    otlp_endpoint: str = ""
    home_quota_mb: int | None = None  # AGENT_HOME_QUOTA_MB of the tools nodes (None: the product's default)

    @property
    def config_dir(self) -> Path:
        return self.base / "config"

    @property
    def data_nodes(self) -> list[MachineSpec]:
        return [m for m in self.machines if m.has("redis")]

    @property
    def sentinels(self) -> list[MachineSpec]:
        return [m for m in self.machines if m.has("sentinel")]

    @property
    def primary(self) -> MachineSpec:
        return self.data_nodes[0]

    def one(self, role: str) -> MachineSpec | None:
        return next((m for m in self.machines if m.has(role)), None)

    def validate(self) -> None:
        """Raise ``ConfigError`` for a deployment Sentinel cannot fail over or a role placed twice."""
        names = [m.name for m in self.machines]
        if len(set(names)) != len(names):
            raise ConfigError(f"machine names must differ: {names}")
        addresses = [m.address for m in self.machines]
        if len(set(addresses)) != len(addresses):
            raise ConfigError(f"machine addresses must differ: {addresses}")
        if len(self.sentinels) < 3:
            raise ConfigError("three Sentinels at least (on three machines): a quorum of 2 must survive one machine")
        if len(self.data_nodes) < 2:
            raise ConfigError("two Redis at least (a primary and a replica)")
        for role in ("worker", "beat"):
            if self.one(role) is None:
                raise ConfigError(f"no machine runs {role}")
        for role in (*OPS_ROLES, "objectstore"):
            if sum(m.has(role) for m in self.machines) > 1:
                raise ConfigError(f"{role} runs on one machine only")


def parse_machine(text: str, roles: tuple[str, ...] = DEFAULT_ROLES) -> MachineSpec:
    """``name=address`` -> ``MachineSpec``. Raises ``ConfigError`` for a bad name or address."""
    name, sep, address = text.partition("=")
    if not sep or not _NAME.fullmatch(name):
        raise ConfigError(f"--machine {text!r}: expected NAME=ADDRESS, NAME like m1 (a-z, 0-9, -)")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(f"--machine {text!r}: {address!r} is not an IP address") from None
    if ip.is_loopback or ip.is_unspecified:
        raise ConfigError(f"--machine {text!r}: the machine's address on the network the others reach, not {ip}")
    return MachineSpec(name, str(ip), roles)


# -- the files ---------------------------------------------------------------------------------


def prometheus_yml(dep: Deployment) -> str:
    """Prometheus's configuration: both pools of every worker machine by address (static targets,
    labelled with the machine and the pool), and the example alert rules."""
    targets = []
    for m in dep.machines:
        if m.has("worker"):
            targets.append(
                f'      - targets: ["{m.address}:{METRICS_PORT}"]\n        labels: {{machine: {m.name}, pool: io}}'
            )
            targets.append(
                f'      - targets: ["{m.address}:{METRICS_PORT + 1}"]\n'
                f"        labels: {{machine: {m.name}, pool: tools}}"
            )
    return (
        "# Prometheus for the agent runtime on several machines (python -m devtools.hosts_config).\n"
        "# Each worker machine serves its I/O pool's metrics on 9808 and its tools pool's on 9809,\n"
        "# on its own address (AGENT_METRICS_ADDR): add a machine here when you add one.\n"
        "global:\n  scrape_interval: 10s\n"
        f"rule_files: [{dep.config_dir / 'alerts.yml'}]\n"
        "scrape_configs:\n  - job_name: agent-workers\n    static_configs:\n" + "\n".join(targets) + "\n"
    )


def _sentinel_list(dep: Deployment) -> str:
    return ",".join(f"{m.address}:{SENTINEL_PORT}" for m in dep.sentinels)


def redis_env(dep: Deployment, s: Secrets, ca_file: Path) -> dict[str, str]:
    """The Redis client settings every process shares (docs/deployment.md): TLS through the Sentinels."""
    return {
        "AGENT_REDIS_SENTINELS": _sentinel_list(dep),
        "AGENT_REDIS_SENTINEL_MASTER": MASTER_NAME,
        "AGENT_REDIS_SENTINEL_PASSWORD": s.sentinel,
        "AGENT_REDIS_TLS_CA_FILE": str(ca_file),
    }


def redis_url(dep: Deployment, user: str, password: str) -> str:
    """``rediss://user:password@<primary>:6379/0``: with ``AGENT_REDIS_SENTINELS`` set, clients find
    the primary through the Sentinels and use only the URL's scheme, user, password and db."""
    return f"rediss://{user}:{password}@{dep.primary.address}:{REDIS_PORT}/0"


def host_env(dep: Deployment, m: MachineSpec, s: Secrets, model_key: str, s3_keys: tuple[str, str]) -> dict[str, str]:
    """The environment of machine ``m`` (``host.env``): its roles, and what each needs.
    ``devtools.host`` gives each process only its share (docs/deployment.md)."""
    conf = dep.config_dir
    env: dict[str, str] = {
        "AGENT_HOST_NAME": m.name,
        "AGENT_HOST_ADDRESS": m.address,
        "AGENT_HOST_ROLES": ",".join(m.roles),
        "AGENT_HOST_DIR": str(dep.base),
    }
    if m.has("objectstore"):  # devtools.object_store: the bucket, and the one identity it accepts
        env |= {
            "AGENT_SNAPSHOT_STORE": f"s3://{dep.store.bucket}/{dep.store.prefix}",
            "AWS_ACCESS_KEY_ID": s3_keys[0],
            "AWS_SECRET_ACCESS_KEY": s3_keys[1],
        }
    if not any(m.has(r) for r in ("worker", "beat", "api", "flower")):
        return env
    env |= redis_env(dep, s, conf / "ca.crt")
    env["REDIS_URL"] = redis_url(dep, "worker", s.worker)
    if m.has("api"):
        env["CONTROL_REDIS_URL"] = redis_url(dep, "control", s.control)
        env |= {"AGENT_API_HOST": m.address, "AGENT_API_PORT": str(API_PORT)}
    if m.has("flower"):
        env["FLOWER_BASIC_AUTH"] = f"ops:{s.flower}"
    if m.has("worker"):
        env |= {
            "AGENT_HOMES_ROOT": str(dep.base / "homes"),
            "AGENT_METRICS_ADDR": m.address,
            "AGENT_METRICS_PORT": str(METRICS_PORT),
            "OPENAI_BASE_URL": dep.model_url,
            "OPENAI_MODEL": dep.model,
            "OPENAI_API_KEY": model_key,
            "AGENT_SNAPSHOT_STORE": f"s3://{dep.store.bucket}/{dep.store.prefix}",
            "AGENT_SNAPSHOT_ENDPOINT_URL": dep.store.endpoint,
            "AGENT_SNAPSHOT_KEY": s.snapshot_key,
            "AWS_ACCESS_KEY_ID": s3_keys[0],
            "AWS_SECRET_ACCESS_KEY": s3_keys[1],
            "AWS_DEFAULT_REGION": dep.store.region,
        }
        if dep.home_quota_mb is not None:
            env["AGENT_HOME_QUOTA_MB"] = str(dep.home_quota_mb)
        if dep.otlp_endpoint:
            env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": dep.otlp_endpoint, "OTEL_SERVICE_NAME": "agent-worker"}
    return env


def operator_env(dep: Deployment, s: Secrets, out: Path) -> dict[str, str]:
    """The operator's environment (``operator.env``): the control plane's Redis user through the
    Sentinels, and where the API, Flower and Prometheus answer."""
    env = {"CONTROL_REDIS_URL": redis_url(dep, "control", s.control), **redis_env(dep, s, out.resolve() / "ca.crt")}
    if (api := dep.one("api")) is not None:
        env["AGENT_API_URL"] = f"http://{api.address}:{API_PORT}"
    if (flower := dep.one("flower")) is not None:
        env |= {"FLOWER_URL": f"http://{flower.address}:{FLOWER_PORT}", "FLOWER_BASIC_AUTH": f"ops:{s.flower}"}
    if (prom := dep.one("prometheus")) is not None:
        env["PROMETHEUS_URL"] = f"http://{prom.address}:{PROMETHEUS_PORT}"
    return env


def env_text(values: dict[str, str], title: str) -> str:
    """``KEY=value`` lines (readable by systemd's ``EnvironmentFile=``, ``set -a; . file`` and
    ``devtools.host.read_env``). Raises ``ConfigError`` for a value that needs quoting."""
    lines = [f"# {title}"]
    for key, value in values.items():
        if re.search(r"[\s'\"\\$`#;&|<>()]", value):
            raise ConfigError(f"{key}: the value holds a character an env file would need quoted")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str | bytes, mode: int = 0o600) -> None:
    # Folders 0700: a machine's folder is copied with its mode (tar over ssh), so its config folder is too.
    for folder in reversed([p for p in path.parents if not p.exists()]):
        folder.mkdir(mode=0o700)  # (mkdir's parents=True would make the parents 0755)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def write_deployment(
    dep: Deployment, out: Path, model_key: str = "", s3_keys: tuple[str, str] | None = None
) -> Secrets:
    """Write every file (module docstring) into ``out``, which must not exist yet. Returns the
    secrets (the caller must not print them). ``s3_keys``: the provider's key pair when the
    deployment runs no object store of its own. Raises ``ConfigError`` for a bad deployment."""
    dep.validate()
    if dep.store.machine is None and s3_keys is None:
        raise ConfigError("no object store: give --objectstore NAME=ADDRESS, or --s3-endpoint with AWS_* keys")
    if out.exists():
        raise ConfigError(f"{out} exists: init never overwrites a deployment's secrets; choose another folder")
    s = Secrets()
    keys = s3_keys or (s.s3_access_key, s.s3_secret_key)
    out.mkdir(parents=True, mode=0o700)
    ca_key, ca_cert = make_ca()
    _write(out / "ca.key", ca_key)
    _write(out / "ca.crt", ca_cert, 0o644)
    machines = list(dep.machines)
    if dep.store.machine is not None and dep.store.machine not in machines:
        machines.append(dep.store.machine)
    alerts = (Path(__file__).resolve().parent.parent / "deploy" / "alerts.yml").read_text()
    for m in machines:
        folder = out / "machines" / m.name
        _write(folder / "ca.crt", ca_cert, 0o644)
        if m.has("redis") or m.has("sentinel"):
            # What clients and Sentinels dial (its address, its name), and tools on the machine itself.
            key, cert = make_cert(ca_key, ca_cert, m.name, (m.address, "127.0.0.1", m.name, "localhost"))
            _write(folder / "server.crt", cert, 0o644)
            _write(folder / "server.key", key)
        _write(folder / "host.env", env_text(host_env(dep, m, s, model_key, keys), f"{m.name}: devtools.host reads it"))
        files = RedisMachine(m.name, m.address, dep.config_dir, dep.base, dep.primary.address)
        if m.has("redis"):
            _write(folder / "redis.conf", redis_conf(files, s.replica))
            _write(folder / "users.acl", acl_text(s.worker, s.control, s.replica, s.sentinel_user))
        if m.has("sentinel"):
            _write(folder / "sentinel.conf", sentinel_conf(files, s.sentinel, s.sentinel_user))
        if m.has("prometheus"):
            _write(folder / "prometheus.yml", prometheus_yml(dep), 0o644)
            _write(folder / "alerts.yml", alerts, 0o644)
    _write(out / "operator.env", env_text(operator_env(dep, s, out), "the operator's machine: set -a; . operator.env"))
    return s


def build_deployment(args: argparse.Namespace) -> tuple[Deployment, tuple[str, str] | None]:
    """The ``Deployment`` the command line describes, and the provider's S3 keys (None: our own store)."""
    machines = [parse_machine(text) for text in args.machine]
    if len(machines) < 3:
        raise ConfigError("three --machine at least (Sentinel's quorum must survive the loss of one)")
    ops = args.ops or machines[0].name
    if ops not in {m.name for m in machines}:
        raise ConfigError(f"--ops {ops!r} is not one of the machines")
    machines = [MachineSpec(m.name, m.address, m.roles + OPS_ROLES) if m.name == ops else m for m in machines]
    store_machine: MachineSpec | None = None
    if args.objectstore:
        name, _, address = args.objectstore.partition("=")
        same = [m for m in machines if m.name == name]
        if same and address in ("", same[0].address):
            store_machine = MachineSpec(name, same[0].address, same[0].roles + ("objectstore",))
            machines = [store_machine if m.name == name else m for m in machines]
        else:
            store_machine = parse_machine(args.objectstore, ("objectstore",))
        # Plain HTTP on the private network: snapshots are signed (AGENT_SNAPSHOT_KEY), not encrypted.
        store = ObjectStore(f"http://{store_machine.address}:{S3_PORT}", machine=store_machine)
        keys = None
    elif args.s3_endpoint:
        access, secret = os.environ.get("AWS_ACCESS_KEY_ID", ""), os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        if not access or not secret:
            raise ConfigError("--s3-endpoint needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment")
        bucket, _, prefix = (args.s3_bucket or BUCKET).partition("/")
        store = ObjectStore(args.s3_endpoint, bucket, prefix or "homes", region=args.s3_region)
        keys = (access, secret)
    else:
        raise ConfigError("snapshots need an object store: --objectstore NAME=ADDRESS or --s3-endpoint URL")
    dep = Deployment(
        tuple(machines),
        store,
        args.model_url,
        args.model,
        Path(args.dir),
        otlp_endpoint=args.otlp_endpoint or "",
        home_quota_mb=getattr(args, "home_quota_mb", None),
    )
    dep.validate()
    return dep, keys


def main(argv: list[str] | None = None) -> None:
    """``python -m devtools.hosts_config --out DIR --machine m1=ADDR --machine m2=ADDR --machine m3=ADDR
    [--ops m1] (--objectstore NAME=ADDR | --s3-endpoint URL [--s3-bucket B/PREFIX]) --model-url URL
    --model NAME``: write a deployment's configuration (module docstring)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="a new folder (never overwritten)")
    parser.add_argument(
        "--machine",
        action="append",
        default=[],
        help="NAME=ADDRESS; three at least; the first starts as Redis's primary",
    )
    parser.add_argument("--ops", help="the machine that also runs the API, Flower and Prometheus (default: the first)")
    parser.add_argument(
        "--objectstore", help="NAME=ADDRESS: run SeaweedFS's S3 there (a machine of its own, or one of the --machine)"
    )
    parser.add_argument(
        "--s3-endpoint", help="your provider's S3 endpoint (keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
    )
    parser.add_argument("--s3-bucket", help=f"BUCKET[/PREFIX] at --s3-endpoint (default {BUCKET}/homes)")
    parser.add_argument("--s3-region", default="us-east-1")
    parser.add_argument(
        "--model-url", required=True, help="the Responses endpoint (OPENAI_BASE_URL); its key from OPENAI_API_KEY"
    )
    parser.add_argument("--model", required=True, help="OPENAI_MODEL")
    parser.add_argument(
        "--dir", default=str(DEFAULT_DIR), help=f"where the deployment lives on each machine ({DEFAULT_DIR})"
    )
    parser.add_argument("--otlp-endpoint", help="OTEL_EXPORTER_OTLP_ENDPOINT of the workers (a trace collector)")
    parser.add_argument(
        "--home-quota-mb",
        type=int,
        help="each agent's home quota (AGENT_HOME_QUOTA_MB; the homes' disk must hold them)",
    )
    args = parser.parse_args(argv)
    try:
        dep, keys = build_deployment(args)
        write_deployment(dep, args.out, os.environ.get("OPENAI_API_KEY", ""), keys)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    for m in dep.machines + (
        (dep.store.machine,) if dep.store.machine and dep.store.machine not in dep.machines else ()
    ):
        print(
            f"{m.name} ({m.address}): {', '.join(m.roles)}: copy {args.out / 'machines' / m.name} to {dep.config_dir}"
        )
    print(f"operator: set -a; . {args.out / 'operator.env'}; set +a   (keep {args.out / 'ca.key'} here)")


if __name__ == "__main__":
    main()
