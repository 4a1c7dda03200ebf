"""The wire contract: every message the console and an executor exchange.

Two tagged unions, one per direction. The tag field is ``kind`` on the wire and in
the executor's ``--json`` output, so a line of JSON and a frame carry the same record.
Adding an optional field is compatible; anything else bumps ``PROTOCOL_VERSION``.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from protocol.faults import FaultKind, StopReason
from protocol.spec import CheckpointManifest, JobSpec

PROTOCOL_VERSION = 6


class ExecutorState(StrEnum):
    """What an executor is doing, as reported in Hello and Heartbeat."""

    IDLE = "idle"
    """Serving, waiting for Start."""
    TRAINING = "training"
    STOPPING = "stopping"
    """A stop, drain or lease end is being honoured at the next step boundary."""
    FAULTED = "faulted"
    """The training process died (a crash, a hang); the executor stays, waiting for a Start at a
    higher epoch to restart it in place, a Stop, or the end of its lease."""
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


class LogLevel(StrEnum):
    """What a Log line is: the executor's own (info, warning, error), or a line of a wrapped
    command's output (stdout, stderr)."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    STDOUT = "stdout"
    STDERR = "stderr"


class Backend(StrEnum):
    """The torch.distributed backend of a multi-host job's epoch."""

    GLOO = "gloo"
    NCCL = "nccl"


class _Msg(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=False):
    pass


# ----------------------------------------------------------------- console -> executor


class ConsoleHello(_Msg, tag="hello"):
    """First frame from the console; the executor answers with its own Hello."""

    version: int
    console_id: str = ""
    term: int = 0
    """The controller's term (``executors/fencing/term.py``): every order on this link is
    refused once a higher one has been seen; 0 without standby controllers."""


class Rendezvous(msgspec.Struct, kw_only=True):
    """Where the ranks of a multi-host job meet for one epoch: decided by the console, sent in
    Start, the same for every member but ``node_rank``. Nothing of it outlives the epoch: the
    store lives in rank 0's process and the next epoch gets a new port."""

    node_rank: int
    """This host's place in the group (0 .. nnodes-1); its ranks are ``node_rank *
    procs_per_host + local rank``."""
    addresses: list[str]
    """Every member's data address, by node rank; rank 0's is the master address."""
    master_port: int
    procs_per_host: int = 1
    backend: Backend = Backend.GLOO
    resume_step: int | None = None
    """The newest step every member committed (two-phase commit, decided by the console): the
    only step a member may load. None: start from step 0, whatever lies in the workdir."""
    timeout_s: float = 30.0
    """How long a collective may wait for a peer before it raises: a member that died without
    closing its sockets (a partition, a SIGSTOP) ends the others' run within this."""
    join_timeout_s: float = 300.0
    """How long each rank waits for every rank of the epoch to join the group before the run
    fails: the slowest rank's start (a local rank's process spawned, torch imported, CUDA set
    up), which on a loaded host or a slow filesystem takes far longer than a collective may
    (the console's collective timeout, 10 s by default, failed groups whose ranks were still
    importing torch). A member lost before it joined is the console's to see (its link); a
    survivor still waiting for it then is left to its lease."""
    logical_ranks: int | None = None
    """Elastic data parallelism (the torch kind): the job's data-parallel work is this many
    logical ranks whatever the number of members; each member runs its contiguous block of
    them by gradient accumulation, so the global batch, the data order and the optimizer steps
    are the planned run's at any world size (a shrunk group) and any member's shard loads on
    any other. None: one logical rank per rank (a fixed-size group)."""
    deterministic_reduce: bool = False
    """With ``logical_ranks``: gradients are gathered per logical rank and summed in logical
    order on every member, so the result does not depend on the world size (bit-exact across
    shrinks and grows; it costs bandwidth). Off: one all-reduce of each member's sum (the
    global batch is kept; the last bits may differ after a world-size change)."""

    @property
    def nnodes(self) -> int:
        return len(self.addresses)

    @property
    def master_addr(self) -> str:
        return self.addresses[0]

    @property
    def world_size(self) -> int:
        return self.nnodes * self.procs_per_host

    @property
    def address(self) -> str:
        """This member's own data address."""
        return self.addresses[self.node_rank]


class Start(_Msg, tag="start"):
    """Run ``spec`` in this workdir under ``epoch``, resuming from the newest valid checkpoint.

    ``lease_s`` > 0 turns on fencing: training continues only while a lease is held.
    """

    spec: JobSpec
    epoch: int = 0
    lease_s: float = 0.0
    lease_anchor: float | None = None
    """An executor clock reading the first lease runs from (see Lease)."""
    rank: int = 0
    world_size: int = 1
    rendezvous: Rendezvous | None = None
    """A multi-host job: where this epoch's ranks meet, and the committed step to resume."""
    run_id: str = ""
    """The job's one training run across restarts, failovers and consoles (``HOTSPARE_RUN_ID``
    for the workload or command); "" from a console that keeps none."""


class Lease(_Msg, tag="lease"):
    """Grant or renew the right to train under ``epoch`` until ``anchor + ttl_s``.

    ``anchor`` is a reading of the *executor's* clock (the ``clock`` of a Hello or Heartbeat
    the console had received before it sent this lease), so the lease runs from an instant
    before the console's send on both machines' monotonic clocks: a lease delayed in a
    buffer (a partition that heals) cannot outlive what the console counted on, and no wall
    clock is compared with another. Without ``anchor`` the lease runs from receipt.
    """

    epoch: int
    ttl_s: float
    anchor: float | None = None


class CheckpointNow(_Msg, tag="checkpoint_now"):
    reason: str = "operator"


class Stop(_Msg, tag="stop"):
    """Stop training; with ``checkpoint`` write one at the current step first."""

    reason: StopReason = StopReason.OPERATOR
    checkpoint: bool = True


class Drain(_Msg, tag="drain"):
    """Planned migration: checkpoint at the current step, report it, then stop (0 lost steps)."""

    reason: StopReason = StopReason.DRAIN


class Ping(_Msg, tag="ping"):
    nonce: int = 0


class Prepare(_Msg, tag="prepare"):
    """To an idle executor: ``spec`` may be started here next (a failover's target while the
    old lease runs out, a warm standby). Ready what its start will need without training:
    the command kind's zygote importing the command's modules, the newest checkpoint read into
    memory. A Start may follow, or a Stop; an executor already given a Start ignores it."""

    spec: JobSpec


class Abandon(_Msg, tag="abandon"):
    """To a member of a multi-host job: ``epoch``'s group will not form (a member's run ended
    before it had). A run still joining that group ends at once, as a failed join does
    (``RunEnded``: the executor stays, warm, for the next epoch) instead of waiting out the
    join's timeout; a run past its join, or of another epoch, goes on as it was."""

    epoch: int


ConsoleMessage = (
    ConsoleHello | Start | Lease | CheckpointNow | Stop | Drain | Ping | Prepare | Abandon
)


# ----------------------------------------------------------------- executor -> console


class ExecutorHello(_Msg, tag="hello"):
    """The executor's answer to ConsoleHello: who it is and where it stands."""

    version: int
    executor: str
    pid: int
    hostname: str
    workdir: str
    state: ExecutorState
    job: str | None = None
    epoch: int = 0
    step: int = 0
    clock: float = 0.0
    """The executor's monotonic clock (CLOCK_BOOTTIME: it counts through a suspend) at send."""


class Heartbeat(_Msg, tag="heartbeat"):
    seq: int
    t: float
    state: ExecutorState
    step: int
    epoch: int
    lease_left_s: float | None = None
    nonce: int | None = None
    clock: float = 0.0
    """The executor's monotonic clock at send: what a Lease is anchored to."""
    lease_low_s: float | None = None
    """The least time that was left on the lease when a renewal landed since the previous
    heartbeat (<= 0: it landed after the lease had ended); None: none landed. How close the
    renewals cut it, seen where the lease is enforced."""


class GpuHealth(msgspec.Struct, kw_only=True, gc=False):
    """One GPU as NVML reports it; None where the device does not support a counter.

    ``Health`` and ``GpuHealth`` are plain data that can hold no cycle: tuples, and structs the
    garbage collector does not track (``gc=False``), so a console that keeps the last samples of
    a thousand hosts gives the collector nothing to scan for them (lists made each sample
    26 tracked objects, promoted into the oldest generation by the thousand a second).
    """

    index: int
    name: str = ""
    util_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    throttle: tuple[str, ...] = ()
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_replays: int | None = None
    xids: tuple[int, ...] = ()
    lost: bool = False  # NVML says the device fell off the bus / needs a reset; fields are None


class Health(_Msg, tag="health", gc=False):
    """One sample of the host as seen from the executor; rates are per second since the last."""

    t: float
    cpu_pct: float
    mem_used_pct: float
    mem_available_mb: float
    disk_free_mb: float
    disk_total_mb: float
    disk_read_bps: float = 0.0
    disk_write_bps: float = 0.0
    net_rx_bps: float = 0.0
    net_tx_bps: float = 0.0
    gpu_status: str = "no GPU"
    gpus: tuple[GpuHealth, ...] = ()
    containment: str = ""
    """What would contain a run started here: ``cgroup`` (a cgroup v2 of its own, killed with
    ``cgroup.kill``) or ``fence: WHY`` (its fence process alone, and why no cgroup); ``""``: not
    said (an executor older than the field)."""


class Progress(_Msg, tag="progress"):
    step: int
    steps: int
    loss: float
    steps_per_s: float
    tokens_per_s: float = 0.0
    eta_s: float | None = None
    micro_batch: int = 0
    accumulation: int = 1
    epoch: int = 0
    global_batch: int = 0
    """Rows of each optimizer step over the whole group (0: not said)."""
    world_size: int = 1
    """Ranks the step was trained on (a shrunk elastic group has fewer than planned)."""


class CheckpointSaved(_Msg, tag="checkpoint"):
    """A checkpoint is complete on disk (data file and manifest both renamed into place)."""

    manifest: CheckpointManifest
    path: str
    manifest_path: str
    write_s: float
    stall_s: float


class Resumed(_Msg, tag="resumed"):
    """Training state was restored; ``step`` is the next step to run from."""

    step: int
    checkpoint: str | None
    epoch: int
    load_s: float


class Fault(_Msg, tag="fault"):
    """Something went wrong. ``fault`` names the class (see executors.faults.FaultKind)."""

    fault: FaultKind
    message: str
    step: int = 0
    fatal: bool = False


class Log(_Msg, tag="log"):
    level: LogLevel
    text: str


class Finished(_Msg, tag="finished", omit_defaults=True):
    step: int
    params_sha256: str
    warnings: list[str] = []
    """Why the finish is not clean (no checkpoint was ever taken, no params digest): the
    console alerts, its report says so, and ``hotspare run`` exits 4."""


class Stopped(_Msg, tag="stopped"):
    """The executor stopped before the last step; ``checkpoint_step`` is where it can resume."""

    step: int
    reason: StopReason
    checkpoint_step: int | None = None
    exit_code: int = 0


class RunEnded(_Msg, tag="run_ended"):
    """The training process ended with a fault, and the executor did not: it waits, at state
    ``faulted``, for a Start at a higher epoch (a restart in place: no new process), a Stop, or
    the end of its lease. ``fault`` is the class (``crash``, ``hang``), ``message`` the why."""

    step: int
    fault: FaultKind
    message: str
    exit_code: int
    checkpoint_step: int | None = None


ExecutorMessage = (
    ExecutorHello
    | Heartbeat
    | Health
    | Progress
    | CheckpointSaved
    | Resumed
    | Fault
    | Log
    | Finished
    | Stopped
    | RunEnded
)
