"""The inventory: hosts grouped in regions, and the jobs to keep alive on them.

Decoded with msgspec (unknown keys refused, with a guess at what was meant). A bad file is
one ``ConfigError`` line naming the file, key path and line. The console never rewrites a
user's file: ``append_host`` adds a table at the end, so comments survive.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import tomli_w

from console.job_check import check_workload
from protocol.config import _key_path, _one_line, convert, find_line, read_toml
from protocol.errors import ConfigError
from protocol.layouts import expand
from protocol.spec import JOB_NAME_PATTERN, PLACEMENT_KEYS, JobSpec
from protocol.workdirs import job_dir, too_long

HostName = Annotated[str, msgspec.Meta(pattern=JOB_NAME_PATTERN)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
ETCD_ENDPOINT = r"^(https?://)?[A-Za-z0-9.:\[\]_-]+:[0-9]{1,5}$"


class HealthThresholds(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """When a health sample is a WARN (alert) or a FAIL (drain the host and fail over)."""

    fail_xids: list[int] = msgspec.field(default_factory=lambda: [48, 79, 95])
    """XIDs that mean the GPU is gone or its memory is corrupt."""
    temp_warn_c: float = 85.0
    pcie_replays_warn: int = 100
    """PCIe replays between two samples."""
    disk_free_warn_gb: float = 2.0
    warn_throttle: list[str] = msgspec.field(
        default_factory=lambda: ["hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"]
    )


class ConsoleSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    state_dir: str = ".hotspare"
    """Operator state and the journal; relative paths are beside the inventory."""
    heartbeat_s: Seconds = 1.0
    """How often executors send a heartbeat."""
    health_probe_s: Annotated[float, msgspec.Meta(ge=0.5)] = 10.0
    """How often a host no executor reports on (a spare, an idle host) is sampled by the light
    health probe; one that fails a health rule or the probe is not chosen as a target."""
    lease_s: Seconds = 10.0
    """How long a lease lasts; a host is declared down only after its lease has ended."""
    missed_heartbeats: Annotated[int, msgspec.Meta(ge=1)] = 3
    """A host is suspect after this many missed heartbeats (and suspect_after_s)."""
    suspect_after_s: Seconds = 3.0
    connect_timeout_s: Seconds = 10.0
    command_timeout_s: Seconds = 60.0
    keepalive_s: Seconds = 5.0
    restart_limit: Annotated[int, msgspec.Meta(ge=0)] = 3
    """Restarts in place after an executor crash before failing over."""
    min_free_disk_gb: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    webhook: str | None = None
    """A Slack-compatible URL that alerts are POSTed to."""
    clock_skew_s: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    """Assumed worst clock difference between console and hosts; added to every lease end."""
    unattended_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    """How long executors keep training after this console quits cleanly (a last lease that
    long, persisted): a console started within it reattaches with no incident. The price: that
    console waits out the rest of it before failing over a host it cannot reach. Never less
    than ``lease_s``."""
    replicas_kept: Annotated[int, msgspec.Meta(ge=1)] = 2
    tensorboard_dir: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    """Where the console writes each job's metrics as one TensorBoard run (``DIR/JOB``), across
    failovers and consoles; relative paths are beside the inventory. None: none written."""
    health: HealthThresholds = msgspec.field(default_factory=HealthThresholds)
    etcd: list[str] = []
    """Standby controllers: the etcd members' client addresses ("HOST:PORT" or
    "http://HOST:PORT"). Each controller of the inventory (its own state dir, on its own
    machine) campaigns; one leads, the others wait and take over within ``etcd_ttl_s`` of its
    end (``docs/standby.md``). Empty: one controller, and its files are the whole state."""
    etcd_ttl_s: Annotated[float, msgspec.Meta(ge=2)] | None = None
    """The leader's etcd lease: a standby takes over this long after the leader's last word at
    the latest. Default: a third of ``lease_s``, at least 2 s; less than ``lease_s``."""
    etcd_prefix: Annotated[str, msgspec.Meta(pattern=r"^/[A-Za-z0-9_./-]*$")] = "/hotspare"
    """The keys of this inventory's controllers in etcd (one prefix per fleet)."""

    @property
    def leader_ttl_s(self) -> float:
        """The leader's etcd lease, in seconds (``etcd_ttl_s`` or its default)."""
        return self.etcd_ttl_s if self.etcd_ttl_s is not None else max(2.0, self.lease_s / 3)


class Region(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    provider: str = ""
    priority: int = 100
    """Lower is tried first when a job must leave its region."""
    notes: str = ""


class Host(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    region: str
    transport: Literal["local", "ssh"] = "ssh"
    address: str | None = None
    addresses: list[str] = []
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    user: str | None = None
    identity: str | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None
    root: str
    """The host's folder for everything hotspare writes there."""
    python: str | None = None
    """The interpreter on the host; default: python3 over ssh, this console's own for local hosts."""
    gpus: Annotated[int, msgspec.Meta(ge=0)] = 0
    role: Literal["primary", "spare"] = "primary"
    priority: int = 100
    """Lower is chosen first as a spare."""
    tags: list[str] = []
    data_address: str | None = None
    """The address the other members of a multi-host job reach this host on for training
    traffic (gloo, NCCL), when it differs from the SSH address; default: the first SSH
    address (127.0.0.1 for a local host)."""
    authorized_keys: str | None = None
    """The file sshd reads this login's keys from (its AuthorizedKeysFile, usually
    ``~/.ssh/authorized_keys``): naming it lets the console add job-scoped keys there, each
    able only to receive one job's replicas (``console/replication/direct.py``), so other ssh hosts
    copy replicas here directly. None: replicas reach this host through the console."""

    def all_addresses(self) -> list[str]:
        return [self.address] if self.address else list(self.addresses)


class ProvisionerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[provisioner]``: how the console gets a host when a job needs one and none is free."""

    command: Annotated[list[str], msgspec.Meta(min_length=1)]
    """Run (argv, never through a shell) to make a host; prints its ``[hosts.X]`` table as one
    JSON object with a ``name`` on stdout."""
    release: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    """Run with the host's name appended, for a provisioned host idle past ``idle_release_s``."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    max_hosts: Annotated[int, msgspec.Meta(ge=1)] = 2
    """Provisioned hosts the fleet may hold at once."""
    idle_release_s: Annotated[float, msgspec.Meta(gt=0)] = 1800.0
    retry_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    """The first wait after a failure; doubled each failure in a row, up to ``retry_max_s``."""
    retry_max_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    min_spares: dict[str, Annotated[int, msgspec.Meta(ge=0)]] = {}
    """Region -> free hosts kept there (fit, no job training on them: a job's spare counts):
    fewer, and a host is provisioned for the region (the command gets ``HOTSPARE_REGION``);
    an idle provisioned host is not released while its region would drop below this."""


class Placement(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str | None = None
    hosts: list[str] = []
    """A multi-host job: its members in node-rank order (rank 0's host first); give ``host``
    or ``hosts``, not both."""
    procs_per_host: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Rank processes per member host (the ``command`` kind's ``{local_world_size}``); default:
    one per GPU of the members (the fewest any has), 1 without GPUs; the torch kind: 1."""
    backend: Literal["gloo", "nccl"] | None = None
    """torch.distributed backend of a multi-host job; default: nccl with GPUs, else gloo."""
    min_hosts: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """An elastic job (the torch kind): with a member lost and no spare free, it trains on
    while it has at least this many hosts, and grows back to ``hosts`` when a host is free.
    Default: all of ``hosts`` (no shrinking)."""
    logical_ranks: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The torch kind's data-parallel work, in logical ranks each member runs its share of by
    gradient accumulation (the global batch and data order stay the planned run's at any
    size); default: one per host of ``hosts``."""
    deterministic_reduce: bool = False
    """Sum gradients in a fixed logical order, so a run is bit-exact across shrinks and grows
    (costs bandwidth: every logical rank's gradient travels); off, only the last bits may
    differ after a change of size."""
    region: str | None = None
    spares: list[str] = []
    priority: int = 0
    """Higher may take a spare from a lower-priority job."""
    warm_standby: bool | None = None
    """Keep an idle executor on the first spare, readied for the job (torch imported and warmed
    up; a command's zygote with its modules imported), for a faster failover and a planned
    move of about a second; a group's member moved to that spare takes it. Default: on for a
    job on one host, off for a group (``standby``)."""
    warm_twin: bool = False
    """Keep an idle executor (a warm twin) beside the job's executor on its own host: a restart
    in place after the executor's process died is a Start to the twin, not a process start."""

    @property
    def standby(self) -> bool:
        """Does the job keep a warm standby? ``warm_standby`` as set, else for a job on one host."""
        return self.warm_standby if self.warm_standby is not None else not self.hosts


@dataclass(frozen=True)
class Job:
    spec: JobSpec
    placement: Placement

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Inventory:
    path: Path
    console: ConsoleSettings
    regions: dict[str, Region]
    hosts: dict[str, Host]
    jobs: dict[str, Job]
    provisioner: ProvisionerSettings | None = None

    @property
    def state_dir(self) -> Path:
        return (self.path.parent / self.console.state_dir).resolve()

    @property
    def tensorboard_dir(self) -> Path | None:
        d = self.console.tensorboard_dir
        return None if d is None else (self.path.parent / Path(d).expanduser()).resolve()

    def python(self, name: str) -> str:
        host = self.hosts[name]
        return host.python or (sys.executable if host.transport == "local" else "python3")

    def members(self, job: str) -> list[str]:
        """The hosts a job is placed on, in node-rank order: ``hosts``, or its one ``host``."""
        p = self.jobs[job].placement
        return list(p.hosts) if p.hosts else ([p.host] if p.host else [])

    def min_hosts(self, job: str) -> int:
        """The fewest members the job trains on (all of ``hosts`` unless it is elastic)."""
        p = self.jobs[job].placement
        return p.min_hosts if p.min_hosts is not None else len(self.members(job))

    def logical_ranks(self, job: str) -> int | None:
        """The logical ranks of a torch-kind multi-host job; None for any other job."""
        p, spec = self.jobs[job].placement, self.jobs[job].spec
        if not p.hosts or spec.executor != "torch":
            return None
        return p.logical_ranks or len(p.hosts) * (p.procs_per_host or 1)

    def multi_host(self, job: str) -> bool:
        return len(self.jobs[job].placement.hosts) > 1

    def data_address(self, name: str) -> str:
        """Where the other members of a multi-host job reach this host for training traffic."""
        host = self.hosts[name]
        if host.data_address:
            return host.data_address
        addresses = host.all_addresses()
        return addresses[0] if addresses else "127.0.0.1"

    def host_root(self, name: str) -> str:
        """The host's root as a path on that host (local roots resolve beside the inventory)."""
        host = self.hosts[name]
        if host.transport == "local":
            return str((self.path.parent / Path(host.root).expanduser()).resolve())
        return host.root


class _File(msgspec.Struct, forbid_unknown_fields=True):
    # Values stay ``Any`` here so that a table that is not a table is reported under its own
    # key path (``hosts.NAME``) when it is converted below, not as msgspec's ``hosts[...]``.
    console: dict[str, Any] = {}
    regions: dict[str, Any] = {}
    hosts: dict[str, Any] = {}
    jobs: dict[str, Any] = {}
    provisioner: dict[str, Any] | None = None


def load(path: Path) -> Inventory:
    """Read and validate an inventory; every problem is one ConfigError line."""
    data, text = read_toml(path)
    raw = convert(data, _File, file=path, text=text)

    def typed(table: dict[str, Any], tp: type, keys: list[str]) -> Any:
        return convert(table, tp, file=path, text=text, prefix=keys)

    console = typed(raw.console, ConsoleSettings, ["console"])
    regions = {n: typed(t, Region, ["regions", n]) for n, t in raw.regions.items()}
    hosts = {n: typed(t, Host, ["hosts", n]) for n, t in raw.hosts.items()}
    jobs = {n: _job(n, t, path, text) for n, t in raw.jobs.items()}
    provisioner = (
        None
        if raw.provisioner is None
        else typed(raw.provisioner, ProvisionerSettings, ["provisioner"])
    )
    inv = Inventory(
        path=path,
        console=console,
        regions=regions,
        hosts=hosts,
        jobs=jobs,
        provisioner=provisioner,
    )
    _cross_check(inv, text)
    return inv


def _job(name: str, table: dict[str, Any], path: Path, text: str) -> Job:
    keys = ["jobs", name]
    if not isinstance(table, dict):
        raise ConfigError(f"{_where(path, text, keys)}: {_key_path(keys)}: expected a table")
    if table.get("name", name) != name:
        raise ConfigError(
            f"{_where(path, text, [*keys, 'name'])}: {_key_path([*keys, 'name'])}: "
            "differs from the table's name"
        )
    place = {k: v for k, v in table.items() if k in PLACEMENT_KEYS}
    spec = {
        "name": name,
        **{k: v for k, v in table.items() if k not in PLACEMENT_KEYS and k != "name"},
    }
    job = Job(
        spec=convert(
            expand(spec, file=path, text=text, keys=keys),
            JobSpec,
            file=path,
            text=text,
            prefix=keys,
        ),
        placement=convert(place, Placement, file=path, text=text, prefix=keys),
    )
    check_workload(job.spec, file=path, text=text)
    return job


def _where(path: Path, text: str, keys: list[str]) -> str:
    line = find_line(text, keys)
    return f"{path}:{line}" if line else str(path)


def _fail(inv: Inventory, text: str, keys: list[str], what: str) -> None:
    raise ConfigError(f"{_where(inv.path, text, keys)}: {_key_path(keys)}: {_one_line(what)}")


def _known(kind: str, name: str, known: dict[str, Any]) -> str:
    have = ", ".join(sorted(known)) or "none"
    return f"unknown {kind} {name!r} (have: {have})"


def _cross_check(inv: Inventory, text: str) -> None:
    """What a schema cannot say: names that must refer to something, and per-transport rules."""
    for i, endpoint in enumerate(inv.console.etcd):
        if not re.fullmatch(ETCD_ENDPOINT, endpoint):
            _fail(
                inv,
                text,
                ["console", "etcd"],
                f"etcd[{i}] {endpoint!r} is not HOST:PORT or http(s)://HOST:PORT",
            )
    if inv.console.etcd and inv.console.leader_ttl_s >= inv.console.lease_s:
        _fail(
            inv,
            text,
            ["console", "etcd_ttl_s" if inv.console.etcd_ttl_s is not None else "lease_s"],
            f"the leader's etcd lease ({inv.console.leader_ttl_s:g} s) must be shorter than "
            f"lease_s ({inv.console.lease_s:g} s): a standby takes over before leases end",
        )
    for name in inv.hosts:
        if not re.fullmatch(JOB_NAME_PATTERN, name):
            _fail(
                inv,
                text,
                ["hosts", name],
                "a host name may hold only letters, digits, '.', '_' and '-'",
            )
    for name in inv.regions:
        if not re.fullmatch(JOB_NAME_PATTERN, name):
            _fail(
                inv,
                text,
                ["regions", name],
                "a region name may hold only letters, digits, '.', '_' and '-'",
            )
    if inv.provisioner is not None:
        for region in inv.provisioner.min_spares:
            if region not in inv.regions:
                keys = ["provisioner", "min_spares", region]
                _fail(inv, text, keys, _known("region", region, inv.regions))
    for name, host in inv.hosts.items():
        keys = ["hosts", name]
        if host.region not in inv.regions:
            _fail(inv, text, [*keys, "region"], _known("region", host.region, inv.regions))
        if host.address and host.addresses:
            _fail(inv, text, [*keys, "addresses"], "give `address` or `addresses`, not both")
        if host.transport == "ssh" and not host.all_addresses():
            _fail(inv, text, keys, "an ssh host needs `address` or `addresses`")
        if host.transport == "local" and (host.all_addresses() or host.port or host.proxy_jump):
            _fail(inv, text, keys, "a local host takes no address, port or proxy_jump")
        if not host.root.strip():
            _fail(inv, text, [*keys, "root"], "must not be empty")
        for field in msgspec.structs.fields(Host):
            value = getattr(host, field.name)
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and "\0" in v for v in values):
                # No argv, path or ssh option can hold one; it would fail later as a traceback.
                _fail(inv, text, [*keys, field.name], "must not contain a NUL character")
        if host.transport == "local":
            try:
                inv.host_root(name)
            except (RuntimeError, ValueError, OSError) as e:
                _fail(inv, text, [*keys, "root"], f"not a usable folder on this machine: {e}")
        _check_socket_paths(inv, text, name)
    for name, job in inv.jobs.items():
        keys = ["jobs", name]
        p = job.placement
        if p.host is not None and p.host not in inv.hosts:
            _fail(inv, text, [*keys, "host"], _known("host", p.host, inv.hosts))
        if p.host is not None and p.hosts:
            _fail(inv, text, [*keys, "hosts"], "give `host` or `hosts`, not both")
        if len(p.hosts) == 1:
            _fail(inv, text, [*keys, "hosts"], "a job on one host says `host = ...`")
        for member in p.hosts:
            if member not in inv.hosts:
                _fail(inv, text, [*keys, "hosts"], _known("host", member, inv.hosts))
        if len(set(p.hosts)) != len(p.hosts):
            _fail(inv, text, [*keys, "hosts"], "a host is named twice")
        if p.hosts and p.warm_twin:
            _fail(inv, text, keys, "warm_twin is for jobs on one host for now")
        _check_procs(inv, text, keys, job)
        _check_elastic(inv, text, keys, job)
        _check_parallel(inv, text, keys, job)
        if p.hosts and job.spec.executor not in ("torch", "command"):
            _fail(inv, text, [*keys, "hosts"], "only the torch and command kinds span hosts")
        if p.region is not None and p.region not in inv.regions:
            _fail(inv, text, [*keys, "region"], _known("region", p.region, inv.regions))
        for spare in p.spares:
            if spare not in inv.hosts:
                _fail(inv, text, [*keys, "spares"], _known("host", spare, inv.hosts))
            if spare == p.host or spare in p.hosts:
                _fail(inv, text, [*keys, "spares"], f"{spare!r} is one of the job's own hosts")


def _check_socket_paths(inv: Inventory, text: str, name: str) -> None:
    """Every job's executor sockets fit under host ``name``'s root (any job may fail over to
    any host). A root the host expands (``~``, relative) is left to the executor's own check,
    which fails the job at once with this reason."""
    root = inv.host_root(name)
    if not root.startswith("/"):
        return
    for job in inv.jobs:
        why = too_long(job_dir(root, job))
        if why is not None:
            _fail(
                inv,
                text,
                ["hosts", name, "root"],
                f"too deep for job {job!r}: {why}; use a shorter root",
            )


def _check_procs(inv: Inventory, text: str, keys: list[str], job: Job) -> None:
    """The torch kind's ``procs_per_host``: over several hosts, one GPU per rank on a GPU host."""
    p = job.placement
    procs = p.procs_per_host or 1
    if procs < 2 or job.spec.executor != "torch":
        return
    where = [*keys, "procs_per_host"]
    if not p.hosts:
        _fail(
            inv,
            text,
            where,
            "the torch kind runs more than one rank per host in a job on several `hosts` for "
            "now (one host trains one rank)",
        )
    for h in [*p.hosts, *p.spares]:
        gpus = inv.hosts[h].gpus if h in inv.hosts else 0
        if 0 < gpus < procs:
            _fail(
                inv,
                text,
                where,
                f"{procs} ranks per host take a GPU each; host {h} has {gpus} (or set "
                f"procs_per_host = {gpus})",
            )


def _check_parallel(inv: Inventory, text: str, keys: list[str], job: Job) -> None:
    """``parallel = "fsdp"``: the torch kind's, over several hosts, with the plain reduce."""
    if job.spec.parallel == "ddp":
        return
    where = [*keys, "parallel"]
    if job.spec.executor != "torch":
        _fail(inv, text, where, "fsdp is the torch kind's (a command shards its model itself)")
    if not job.placement.hosts:
        _fail(inv, text, where, "fsdp shards the model over a job's `hosts` (two or more)")
    if job.placement.deterministic_reduce:
        _fail(
            inv,
            text,
            where,
            "fsdp reduce-scatters in an order that cannot be fixed: deterministic_reduce needs "
            'parallel = "ddp"',
        )


def _check_elastic(inv: Inventory, text: str, keys: list[str], job: Job) -> None:
    p = job.placement
    elastic = {
        k: v
        for k, v in (
            ("min_hosts", p.min_hosts),
            ("logical_ranks", p.logical_ranks),
            ("deterministic_reduce", p.deterministic_reduce or None),
        )
        if v is not None
    }
    if not elastic:
        return
    key = next(iter(elastic))
    if not p.hosts:
        _fail(inv, text, [*keys, key], "elastic keys are for a job on several `hosts`")
    if job.spec.executor != "torch":
        _fail(
            inv,
            text,
            [*keys, key],
            "elastic jobs are the torch kind's for now (it keeps the global batch itself)",
        )
    if p.min_hosts is not None and p.min_hosts > len(p.hosts):
        _fail(
            inv, text, [*keys, "min_hosts"], f"{p.min_hosts} is more than the {len(p.hosts)} hosts"
        )
    if p.logical_ranks is not None and p.logical_ranks < len(p.hosts):
        _fail(
            inv,
            text,
            [*keys, "logical_ranks"],
            f"{p.logical_ranks} is fewer than the {len(p.hosts)} hosts (each runs one at least)",
        )


def append_host(path: Path, name: str, table: dict[str, Any]) -> Inventory:
    """Add ``[hosts.NAME]`` at the end of the file (comments and layout kept); validated first."""
    text, new_text = _appended(path, name, table)
    _must_load(path, new_text)
    with open(path, "a", encoding="utf-8") as f:
        f.write(new_text[len(text) :])
    return load(path)


def with_host(path: Path, name: str, table: dict[str, Any]) -> Inventory:
    """The inventory as it would be with ``[hosts.NAME]`` appended, the file untouched;
    ConfigError (naming ``path``) when it would not load."""
    return _must_load(path, _appended(path, name, table)[1])


def _appended(path: Path, name: str, table: dict[str, Any]) -> tuple[str, str]:
    """The file's text, and its text with ``[hosts.NAME]`` appended (no host of that name yet)."""
    if name in load(path).hosts:
        raise ConfigError(f"{path}: hosts.{name}: a host of that name already exists")
    text = path.read_text(encoding="utf-8")
    addition = tomli_w.dumps({"hosts": {name: table}})
    return text, text + ("" if text.endswith("\n") or not text else "\n") + "\n" + addition


def _must_load(path: Path, new_text: str) -> Inventory:
    """The inventory ``new_text`` loads as (beside ``path``, so relative paths mean the same);
    ConfigError naming ``path`` when it would not load."""
    candidate = path.with_name(f".{path.name}.candidate")
    candidate.write_text(new_text, encoding="utf-8")
    try:
        return dataclasses.replace(load(candidate), path=path)
    except ConfigError as e:
        raise ConfigError(str(e).replace(str(candidate), str(path))) from None
    finally:
        candidate.unlink(missing_ok=True)


def remove_host(path: Path, name: str) -> Inventory:
    """Take ``[hosts.NAME]`` out of the file (every other line kept), if what is left still
    loads (no job names the host); ConfigError otherwise, the file untouched."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    header = f"[hosts.{name}]"
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    if len(starts) != 1:
        raise ConfigError(f"{path}: hosts.{name}: no table [hosts.{name}] of its own to remove")
    start = end = starts[0]
    for i in range(start + 1, len(lines)):
        stripped = lines[i].strip()
        if stripped.startswith("["):
            break
        if stripped and not stripped.startswith("#"):
            end = i  # its last key: comments after it belong to what follows
    end += 1
    while start > 0 and not lines[start - 1].strip():
        start -= 1  # the blank lines before it went with it when it was appended
    new_text = "".join(lines[:start] + lines[end:])
    _must_load(path, new_text)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(path)
    return load(path)
