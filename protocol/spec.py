"""Job specification and checkpoint manifest: the records both ends agree on.

The same job keys sit in a standalone job TOML and under ``[jobs.NAME]`` of an
inventory; placement keys (host, region, spares, priority) belong to the console.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Literal

import msgspec

JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
PLACEMENT_KEYS = frozenset(
    {
        "host",
        "hosts",
        "procs_per_host",
        "backend",
        "min_hosts",
        "logical_ranks",
        "deterministic_reduce",
        "region",
        "spares",
        "priority",
        "warm_standby",
        "warm_twin",
    }
)

JobName = Annotated[str, msgspec.Meta(pattern=JOB_NAME_PATTERN)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
Argv = Annotated[list[str], msgspec.Meta(min_length=1)]
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _regex(key: str, pattern: str, groups: tuple[str, ...] = ()) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{key}: not a regular expression: {e}") from None
    missing = [g for g in groups if g not in compiled.groupindex]
    if missing:
        raise ValueError(f"{key}: needs a named group (?P<{missing[0]}>...), got {pattern!r}")
    return compiled


AUTO_PRELOAD = ("torch", "torch._dynamo")
"""What a Python command's zygote imports when ``preload`` is not set: a restart in place
then costs a fork, not an interpreter's start and ``import torch`` (benchmarks/
restart_vs_torchrun.py)."""


class CommandSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The ``[command]`` table of a job with ``executor = "command"``: any training command.

    Placeholders ``{checkpoint_dir}``, ``{resume_from}``, ``{step}``, ``{steps}``, ``{seed}``
    and ``{workdir}``, and the group's (from Start's rendezvous) ``{node_rank}``, ``{nnodes}``,
    ``{master_addr}``, ``{master_port}``, ``{rank}`` (this host's first global rank:
    node_rank * procs_per_host), ``{world_size}`` (nnodes * procs_per_host),
    ``{local_world_size}`` (procs_per_host), ``{backend}`` and ``{timeout_s}`` are replaced
    inside each ``argv`` element and each ``env`` value (once: a substituted value is never
    scanned again; any other ``{...}`` stays as written). Without a rendezvous (one host) the
    group's are 0, 1, 127.0.0.1, 29500, 0, 1, 1, gloo and 30; with one, ``{resume_from}`` is
    exactly the group's committed step. With nothing to resume from, ``{resume_from}`` is ""
    and ``{step}`` is 0, and every ``argv`` element containing ``{resume_from}`` is left out,
    with the element before it when that one starts with ``-`` and the left-out element is
    exactly ``{resume_from}``: both ``["--resume", "{resume_from}"]`` and
    ``["--resume={resume_from}"]`` vanish on a fresh start.

    ``{run_id}`` is the job's one run across restarts, failovers and consoles (kept by the
    console), ``{job}`` its name and ``{epoch}`` this start's epoch (it rises at every start):
    ``"--wandb-id={run_id}"``, ``"runs/{run_id}"``. The command's environment has them too, as
    ``HOTSPARE_RUN_ID``, ``HOTSPARE_JOB`` and ``HOTSPARE_EPOCH``, with
    ``HOTSPARE_RESUMED_FROM_STEP`` (``{step}``: 0 on a fresh start); ``env`` may override them.
    """

    argv: Argv
    """The program and its arguments, run directly (never through a shell)."""
    env: dict[str, str] = {}
    """Extra environment variables on top of the executor's; placeholders are replaced in values."""
    cwd: str | None = None
    """Working directory of the command; relative to the workdir (the default)."""
    layout: str | None = None
    """A framework's checkpoint layout by name (``"nanogpt"``, ``"lightning"``,
    ``"hf_trainer"``, ``"torchtitan"``): the keys it stands for, listed in
    ``protocol/layouts.py``, fill in those the table leaves out when the job is read."""
    checkpoint_dir: str = "ckpt"
    """Where the command writes its checkpoints; relative to the workdir. The job owns it: files
    matching ``checkpoint_glob`` that are not the restored checkpoint are removed at start."""
    checkpoint_glob: str = "*.pt"
    """Which files in ``checkpoint_dir`` are checkpoints (names starting with '.' never are). It
    may match folders (torch.distributed.checkpoint writes one per step): a folder of regular
    files is copied, listed in its manifest file by file, and restored whole."""
    step_regex: str = r"(?P<step>\d+)(?!.*\d)"
    """Reads the step from a checkpoint's file name (group ``step``); default: its last number.
    A file that matches ``checkpoint_glob`` but has no step in its name is a warning (once),
    never a checkpoint: name the file ``checkpoint_file`` if the command rewrites it in place."""
    checkpoint_file: str | None = None
    """One file the command rewrites in place (nanoGPT's ``ckpt.pt``), in ``checkpoint_dir``:
    each complete write of it is a checkpoint (``complete_marker`` or ``settle_s`` decide, as
    for numbered files), its step the newest progress step seen when it was written
    (``progress_regex`` or ``metrics_file`` is needed; a script that logs a step after saving
    it labels the file a step early). It is restored under this name. ``checkpoint_glob`` and
    ``step_regex`` are then not used."""
    prune: bool = True
    """The command's own checkpoints in ``checkpoint_dir`` older than the newest
    ``keep_checkpoints`` published ones are removed once newer ones are published (a script
    that keeps every file, Lightning's ``save_top_k=-1``, no longer fills the disk; the
    published copies are hard links where the filesystem allows). False: leave them."""
    resume_argv: Argv | None = None
    """Arguments added after ``argv`` only when resuming (nanoGPT's ``["--init_from=resume"]``);
    placeholders are replaced in them as in ``argv``."""
    complete_marker: str | None = None
    """A checkpoint is complete once this file exists in ``checkpoint_dir``, e.g. ``"{name}.done"``
    (``{name}``: the checkpoint's file name, ``{stem}``: without its suffix), and is no older
    than it. A folder's marker is beside it when the name uses ``{name}`` or ``{stem}``, else
    inside it (``".metadata"``, which torch.distributed.checkpoint writes last). Where the run's
    processes can be read, nothing of it may be open for writing by one of them, and none of
    them may have ended since just before the marker came (else ``settle_s`` with the marker);
    a marker older than the rest counts for nothing (``executors/kinds/command/command_watch.py``)."""
    settle_s: NonNegativeFloat = 2.0
    """The fallback: complete once size and mtime (a folder: every file's) stayed the same this
    long while the command ran, or at once when the command exits 0. A file on a local
    filesystem is taken sooner, as soon as it is closed: no process of the run holds it open
    for writing and none of them ended meanwhile (``executors/kinds/command/command_watch.py``)."""
    progress_regex: str | None = None
    """Searched in each output line (stdout or stderr); named group ``step``, optional ``loss``."""
    metrics_file: str | None = None
    """A JSON-lines file the command appends to, with ``"step"`` and optional ``"loss"``;
    relative to the workdir."""
    params_regex: str | None = None
    """Searched in each output line; the named group ``sha256`` of the last match is the
    ``params_sha256`` of Finished. Without it (or no match), that is the sha256 of the newest
    complete checkpoint file, which names the final state exactly but can differ between two
    runs with equal parameters (serialisers do not promise the same bytes)."""
    hang_timeout_s: PositiveFloat | None = None
    """No progress (a new step parsed, or a new complete checkpoint) for this long is a ``hang``
    fault: the command is killed and the executor exits non-zero, to be restarted in place."""
    startup_timeout_s: PositiveFloat | None = None
    """With ``hang_timeout_s``: how long the command may take to its first progress after it
    starts (imports, data loading); default: ``hang_timeout_s``."""
    grace_s: NonNegativeFloat = 10.0
    """On Stop, Drain, SIGTERM or the lease ending: SIGTERM to the process group, then SIGKILL
    after this many seconds."""
    preload: list[str] | None = None
    """Modules to import once in a zygote the executor keeps for the job, when ``argv`` is
    ``PYTHON script.py ...`` or ``PYTHON -m MODULE ...``: each run is forked from it, warm,
    instead of exec'd (executors/kinds/command/zygote.py), so a restart in place skips the interpreter's
    start and these imports. Unset (the default): ``AUTO_PRELOAD``, torch and torch._dynamo
    (torch imports the latter on a script's first optimizer), and an argv the zygote cannot
    run (torchrun, a shell), a host without cgroups for runs or an interpreter without torch
    starts the command with exec, said once as an info line. ``[]``: exec every run. Named
    modules: those, and each fallback to exec is a warning."""
    setup: Argv | None = None
    """Run before the command's first start on a host (``["rsync", "-a", "src:/data/", "data/"]``,
    ``["pip", "install", "-r", "requirements.txt"]``): in ``cwd``, with the command's
    environment and placeholders, never through a shell; its output is logged. It runs again
    only when it, the environment or ``cwd`` change (``WORKDIR/setup.done`` records what ran),
    and on a failover's target and a warm standby while they wait, before any Start. A
    non-zero exit (or past ``setup_timeout_s``) is a crash of the run: restarted, then moved,
    as any crash. It must be safe to run twice."""
    setup_timeout_s: PositiveFloat = 600.0
    needs: list[str] = []
    """Files or folders that must exist on every host the job may run on (its dataset, a
    tokenizer), relative to ``cwd`` or absolute: ``hotspare check`` looks for each (the
    executor does not). Placeholders are not filled in: an entry with ``{`` is not looked for.
    What ``setup`` makes is not there before its first run on a host: leave it out."""
    imports: list[str] = []
    """Modules the command's interpreter must find on every host the job may run on
    (``["torch", "lightning"]``): ``hotspare check`` looks for each one's top-level package
    with ``importlib.util.find_spec``, never importing it, using ``argv[0]`` when that is a
    python, else the host's ``python``."""

    @property
    def preloads(self) -> list[str]:
        """The modules the zygote imports: ``preload``, or ``AUTO_PRELOAD`` when unset."""
        return list(AUTO_PRELOAD) if self.preload is None else self.preload

    def __post_init__(self) -> None:
        _regex("step_regex", self.step_regex, ("step",))
        if self.progress_regex is not None:
            _regex("progress_regex", self.progress_regex, ("step",))
        if self.params_regex is not None:
            _regex("params_regex", self.params_regex, ("sha256",))
        if self.hang_timeout_s is not None and not (self.progress_regex or self.metrics_file):
            raise ValueError("hang_timeout_s needs progress_regex or metrics_file to see progress")
        for name in self.preload or []:
            if not MODULE_NAME.match(name):
                raise ValueError(f"preload: {name!r} is not a module name (like torch or a.b)")
        if self.preload is not None and len(set(self.preload)) != len(self.preload):
            raise ValueError(f"preload: a module is named twice in {self.preload!r}")
        for name in self.imports:
            if not MODULE_NAME.match(name):
                raise ValueError(f"imports: {name!r} is not a module name (like torch or a.b)")
        for i, path in enumerate(self.needs):
            if not path or "\0" in path:
                raise ValueError(
                    f"needs[{i}]: {'a NUL character' if path else 'empty'}, not a path"
                )
        if self.checkpoint_file is not None:
            name = self.checkpoint_file
            if not name or "/" in name or name.startswith(".") or "\0" in name:
                raise ValueError(
                    f"checkpoint_file: a file name in checkpoint_dir (no '/', not hidden), "
                    f"got {name!r}"
                )
            if not (self.progress_regex or self.metrics_file):
                raise ValueError(
                    "checkpoint_file needs progress_regex or metrics_file: a file rewritten in "
                    "place takes its step from the command's progress"
                )
        if not self.checkpoint_glob or "/" in self.checkpoint_glob:
            raise ValueError(
                f"checkpoint_glob: a file name pattern without '/', got {self.checkpoint_glob!r}"
            )


class JobSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What to train and how often to checkpoint it."""

    name: JobName
    """Job name; also a folder name, so letters, digits, '.', '_' and '-' only."""
    executor: str = "torch"
    """Executor kind (a plug-in of the ``hotspare.executors`` entry point group)."""
    workload: str = "charlm"
    """A built-in workload name or ``"module:factory"``."""
    steps: PositiveInt
    """Optimizer steps to run in all."""
    seed: int = 0
    checkpoint_every_steps: PositiveInt | None = None
    checkpoint_every_s: PositiveFloat | None = None
    """Either or both; with neither, a checkpoint every 30 s."""
    keep_checkpoints: PositiveInt = 3
    """How many complete checkpoints to keep on this host."""
    config: dict[str, Any] = {}
    """Workload settings (model size, global batch, micro-batch, learning rate, data)."""
    command: CommandSpec | None = None
    """For ``executor = "command"``: the command to run (other kinds ignore it)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """The torch kind's multi-host jobs: ``ddp``, the whole trainer state on every member (its
    gradients averaged); ``fsdp``, the model and optimizer sharded over the members (FSDP2) and
    checkpointed by torch.distributed.checkpoint, each member writing only its part."""

    def state_hash(self) -> str:
        """Hash of what decides the training state; a checkpoint from another hash is not loaded.

        ``steps`` and the checkpoint cadence are left out so a run can be extended. A kind
        other than ``torch`` is part of the hash (so a torch checkpoint never feeds a command);
        a command's argv is not, so its flags can change between runs.
        """
        key: dict[str, Any] = {"workload": self.workload, "seed": self.seed, "config": self.config}
        if self.executor != "torch":
            key["executor"] = self.executor
        if self.parallel != "ddp":  # a sharded part never loads as a whole copy, nor one as it
            key["parallel"] = self.parallel
        return hashlib.sha256(msgspec.json.encode(key, order="sorted")).hexdigest()[:16]


class FolderFile(msgspec.Struct, kw_only=True):
    """One file of a folder checkpoint, as its manifest lists it."""

    path: str
    """Relative to the folder, '/'-separated, without '.' or '..' parts."""
    size: int
    sha256: str


class Lineage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where a checkpoint came from, beyond the spec hash, code version and epoch of its
    manifest: what ``hotspare lineage`` prints (``executors.checkpoints.lineage`` says how each is found)."""

    host: str
    """The hostname of the machine that wrote it."""
    run_id: str | None = None
    """The job's run id (``HOTSPARE_RUN_ID``): the same for every checkpoint of one run."""
    code_hash: str | None = None
    """The torch kind: sha256 over the workload's source files (``code_files``)."""
    code_files: list[str] = []
    """The files ``code_hash`` covers, as module paths ('executors/kinds/torch/workloads/charlm.py')."""
    git_commit: str | None = None
    """The command kind: HEAD of the git repository the command ran in, if it ran in one."""
    git_dirty: bool | None = None
    """With ``git_commit``: tracked files differed from that commit."""
    data: str | None = None
    """The data it trained on, as the spec names it (``key=value`` pairs)."""
    parent_step: int | None = None
    """The checkpoint it descends from: the one this run resumed from for its first
    checkpoint, the one it wrote before for each later one; None after a fresh start."""
    parent_sha256: str | None = None


class CheckpointManifest(msgspec.Struct, kw_only=True):
    """Written beside a checkpoint after its data file is durable; the checkpoint's completion mark."""

    job: str
    step: int
    file: str
    size: int
    sha256: str
    epoch: int
    spec_hash: str
    code_version: str
    created_at: float
    format: int = 1
    source: str | None = None
    """The command kind: the checkpoint's file name in the command's ``checkpoint_dir``, so a
    restore puts it back under the name the command wrote."""
    node_rank: int | None = None
    """A multi-host job: the member (node rank) whose shard this is; None for one host."""
    nnodes: int = 1
    """How many members wrote shards of this step: a shard loads only at the same size."""
    files: list[FolderFile] | None = None
    """A folder checkpoint (the command kind; torch.distributed.checkpoint writes folders):
    every file in the folder ``file``. ``size`` is then their sum and ``sha256`` the sha256 of
    one line ``SHA256 SIZE PATH`` (a newline after each) per file in path order. None: ``file``
    is one file."""
    lineage: Lineage | None = None
    """Where it came from; None in a manifest written before lineage was recorded."""
