"""The inventory's model: the console's settings, regions, hosts, the provisioner's settings,
and each job's spec and placement, as they are once loaded (``load``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from protocol.spec import JOB_NAME_PATTERN, JobSpec

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
