"""Multi-host restart, torchrun's side: four nodes in network namespaces, one SIGKILLed mid-run.

The subject is benchmarks/ddp_plain.py (DDP, gloo on the CPU, a checkpoint every 20 steps in
each node's own folder, resuming from the newest step any node holds). Four routed network
namespaces (tests/netbed.py) stand in for four hosts: gloo and the rendezvous cross the same
veth links a partition would cut. On each node an agent runs inside its namespace::

    torchrun --nnodes 3:4 --nproc-per-node 1 --rdzv-backend c10d
        --rdzv-endpoint NODE0:29400 --rdzv-conf ...,is_host=(node 0) --local-addr NODE
        --max-restarts 3 ddp_plain.py ...

so the c10d store lives in node 0's agent, as torchrun places it. Each trial runs two
scenarios from a fresh start, each SIGKILLing one node's whole process tree (its agent and
every process under it, by the pids recorded at that moment) once step ``--kill-at`` is done:

- ``worker``: a node that does not host the store (node 3). Figure: seconds from the kill to
  the first step completed by a worker started after it, and the world size it came back at.
- ``store``: node 0, the rendezvous store's host. Figure: whether the job survives (a step
  after the kill) or every other agent exits, and when.

Everything is read from outside torchrun: the kill time is taken just before the SIGKILL;
steps, world sizes and the step resumed from come from the script's own timestamped lines.

torchrun's rendezvous timeouts default to join 600 s, last call 30 s, close 30 s, and a dead
node leaves the rendezvous after keep_alive_interval (5 s) x keep_alive_max_attempt (3); the
run uses shorter ones (``--rdzv-conf``, printed with the figures), ``--torchrun-defaults``
torchrun's own. Workers get TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (``--share-store``: not).
``measure(settings, trials, folder)`` returns the outcomes, so another side (hotspare with a
spare) can be measured in the same run and printed beside them.

    python benchmarks/multihost_torchrun.py [--trials 3] [--quick] [--json] [--keep DIR]
        [--only worker,store] [--kill-at 60] [--steps 100] [--step-time 0.05]
        [--rdzv-conf join_timeout=60,...] [--torchrun-defaults] [--share-store]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
sys.path[:0] = [str(ROOT / "tests")]

from common import Figure, emit  # noqa: E402
from support import netbed  # noqa: E402

SCRIPT = HERE / "ddp_plain.py"
SCENARIOS = ("worker", "store")
LABEL = {"worker": "a non-store node killed", "store": "the rendezvous-store node killed"}
STORE_PORT = 29400
RDZV_KEYS = (
    "join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval",
    "keep_alive_max_attempt",
)  # fmt: skip
RDZV_SHORT = dict(zip(RDZV_KEYS, (60, 2, 5, 1, 3), strict=True))
RDZV_DEFAULTS = dict(zip(RDZV_KEYS, (600, 30, 30, 5, 3), strict=True))
"""torchrun's own: join 600 s, last call 30 s, close 30 s, a dead node dropped after 5 s x 3."""
POLL_S = 0.01
LINE = re.compile(r"^(?P<text>.*) pid=(?P<pid>\d+) t=(?P<t>[0-9.]+)$")


@dataclass(frozen=True)
class Settings:
    steps: int = 100
    kill_at: int = 60
    save_every: int = 20
    step_time: float = 0.05
    nodes: int = 4
    min_nodes: int = 3
    max_restarts: int = 3
    rdzv: dict[str, int] = field(default_factory=lambda: dict(RDZV_SHORT))
    start_timeout_s: float = 120.0
    """From the agents' start to step ``kill_at``."""
    restart_timeout_s: float = 90.0
    """From the kill to a step again, or to every other agent gone."""
    share_store: bool = False
    """torchrun's default: workers bootstrap from the agents' shared TCPStore, which outlives
    a round, so a restarted worker can read the previous round's gloo addresses and fail
    (pytorch #135712); off, each round's rank 0 worker hosts a fresh store."""

    def rdzv_conf(self, is_host: bool | None = None) -> str:
        pairs = [f"{k}={v}" for k, v in self.rdzv.items()]
        return ",".join(pairs + ([] if is_host is None else [f"is_host={int(is_host)}"]))

    def describe(self) -> str:
        """The setup in one line, for the figures' notes."""
        own = " (torchrun's defaults)" if self.rdzv == RDZV_DEFAULTS else ""
        return (
            f"{self.nodes} nodes in routed network namespaces; torchrun --nnodes "
            f"{self.min_nodes}:{self.nodes} --nproc-per-node 1 --max-restarts "
            f"{self.max_restarts}, c10d store on node 0, --rdzv-conf {self.rdzv_conf()}{own}, "
            f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE={0 if self.share_store else 1}; ddp_plain.py: "
            f"gloo, CPU, global batch 12, {self.steps} steps of >= {self.step_time:g} s, a "
            f"checkpoint every {self.save_every} per node; SIGKILL of a node's process tree "
            f"once step {self.kill_at} is done"
        )

    def script_args(self) -> list[str]:
        return [
            "--steps", str(self.steps), "--save-every", str(self.save_every),
            "--step-time", str(self.step_time),
        ]  # fmt: skip


@dataclass
class Outcome:
    scenario: str
    killed_node: int
    killed_rank: int | None
    killed_step: int
    """The last step the killed node completed."""
    kill_t: float
    world_before: int
    seconds: float | None = None
    """Kill -> the first step a worker started after the kill completed; None: none came."""
    world_after: int | None = None
    resumed_step: int | None = None
    finished: bool = False
    """The job ran to its last step and every surviving agent exited 0."""
    agents_gone_s: float | None = None
    """Kill -> every surviving agent exited, when they all did before a step came back."""
    exit_codes: list[int | None] = field(default_factory=list)

    @property
    def survived(self) -> bool:
        return self.seconds is not None


@dataclass(frozen=True)
class Line:
    text: str
    pid: int
    t: float

    def field(self, key: str) -> int | None:
        m = re.search(rf"\b{key}=(\d+)", self.text)
        return int(m.group(1)) if m else None


def read_log(path: Path) -> list[Line]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    found = (LINE.match(raw) for raw in text.split("\n")[:-1])  # the last part: unfinished
    return [Line(m["text"], int(m["pid"]), float(m["t"])) for m in found if m]


def steps(lines: list[Line]) -> list[Line]:
    return [ln for ln in lines if ln.text.startswith("step ")]


def step_of(line: Line) -> int:
    return int(line.text.split()[1])


# ------------------------------------------------------------------ the nodes


@dataclass
class Node:
    index: int
    ns: netbed.NetNs
    folder: Path
    agent: subprocess.Popen[bytes] | None = None
    exited_t: float | None = None

    @property
    def log(self) -> Path:
        return self.folder / "steps.log"

    def lines(self) -> list[Line]:
        return read_log(self.log)

    def alive(self) -> bool:
        if self.agent is None or self.agent.poll() is not None:
            if self.exited_t is None:
                self.exited_t = time.time()
            return False
        return True


def start_agent(node: Node, store: Node, settings: Settings, run_id: str) -> None:
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", f"{settings.min_nodes}:{settings.nodes}", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{store.ns.address}:{STORE_PORT}",
        "--rdzv-id", run_id, "--rdzv-conf", settings.rdzv_conf(node is store),
        "--local-addr", node.ns.address, "--max-restarts", str(settings.max_restarts),
        str(SCRIPT), "--checkpoint-dir", str(node.folder / "ckpt"),
        "--step-log", str(node.log), *settings.script_args(),
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "GLOO_SOCKET_IFNAME": node.ns.inside,  # the node's one link, not the hostname's address
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0" if settings.share_store else "1",
    }
    with open(node.folder / "agent.out", "wb") as out:
        node.agent = subprocess.Popen(
            node.ns.argv(*argv), stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=node.folder, start_new_session=True,
        )  # fmt: skip


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_node(node: Node) -> tuple[float, list[int]]:
    """SIGKILL the node's agent and every process under it; (the kill time, their pids)."""
    assert node.agent is not None
    tree = process_tree(node.agent.pid)  # torchrun starts each worker in a session of its own
    t = time.time()
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    node.agent.wait(timeout=30)
    psutil.wait_procs(tree, timeout=30)
    return t, [p.pid for p in tree]


def end_node(node: Node) -> None:
    """Whatever of this node still runs: its agent's tree, and every worker its log names
    (one whose agent died before it), if that pid still runs this node's script."""
    if node.agent is not None and node.agent.poll() is None:
        kill_node(node)
    for pid in {ln.pid for ln in node.lines()}:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if str(node.log) in proc.cmdline():
                proc.kill()
                proc.wait(timeout=30)


# --------------------------------------------------------------- one scenario


def _wait_for_step(nodes: list[Node], settings: Settings) -> None:
    deadline = time.monotonic() + settings.start_timeout_s
    while not any(step_of(s) >= settings.kill_at for n in nodes for s in steps(n.lines())):
        if not all(n.alive() for n in nodes):
            dead = [n.index for n in nodes if not n.alive()]
            raise RuntimeError(f"agent(s) of node {dead} exited before step {settings.kill_at}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no step {settings.kill_at} within {settings.start_timeout_s} s")
        time.sleep(POLL_S)


def _first_step_after(survivors: list[Node], kill_t: float, before: set[int]) -> Line | None:
    fresh = [s for n in survivors for s in steps(n.lines()) if s.t > kill_t and s.pid not in before]
    return min(fresh, key=lambda s: s.t, default=None)


def run_scenario(scenario: str, folder: Path, settings: Settings) -> Outcome:
    with netbed.routed_namespaces(settings.nodes) as spaces:
        nodes = [Node(i, ns, folder / f"node{i}") for i, ns in enumerate(spaces)]
        try:
            for n in nodes:
                n.folder.mkdir(parents=True)
                start_agent(n, nodes[0], settings, f"bench-{scenario}")
            _wait_for_step(nodes, settings)
            victim = nodes[0] if scenario == "store" else nodes[-1]
            before = {ln.pid for n in nodes for ln in n.lines()}
            kill_t, killed = kill_node(victim)
            mine = steps(victim.lines())
            outcome = Outcome(
                scenario, victim.index, mine[-1].field("rank") if mine else None,
                max((step_of(s) for s in mine), default=0), kill_t,
                max((s.field("world") or 0 for n in nodes for s in steps(n.lines())), default=0),
            )  # fmt: skip
            survivors = [n for n in nodes if n is not victim]
            _watch(outcome, survivors, before | set(killed), settings)
            return outcome
        finally:
            for n in nodes:
                end_node(n)


def _watch(outcome: Outcome, survivors: list[Node], before: set[int], settings: Settings) -> None:
    """Until a step comes back (then on to the job's end), every survivor exits, or the
    deadline; fills in ``outcome``."""
    deadline = time.monotonic() + settings.restart_timeout_s
    while time.monotonic() < deadline:
        if outcome.seconds is None and (
            first := _first_step_after(survivors, outcome.kill_t, before)
        ):
            outcome.seconds = first.t - outcome.kill_t
            outcome.world_after = first.field("world")
            loaded = [
                ln for n in survivors for ln in n.lines()
                if ln.pid == first.pid and ln.text.startswith("loaded ")
            ]  # fmt: skip
            outcome.resumed_step = loaded[-1].field("step") if loaded else None
        if not any(n.alive() for n in survivors):
            break
        time.sleep(POLL_S)
    outcome.exit_codes = [n.agent.poll() if n.agent else None for n in survivors]
    gone = [n.exited_t for n in survivors]
    if outcome.seconds is None and all(t is not None for t in gone):
        outcome.agents_gone_s = max(t for t in gone if t is not None) - outcome.kill_t
    last = max((step_of(s) for n in survivors for s in steps(n.lines())), default=0)
    outcome.finished = last >= settings.steps and outcome.exit_codes == [0] * len(survivors)


def measure(
    settings: Settings, trials: int, folder: Path, scenarios: tuple[str, ...] = SCENARIOS
) -> list[Outcome]:
    """Every scenario ``trials`` times, each from a fresh start in a folder of its own."""
    if why := netbed.unavailable() or netbed.forward_blocked():
        raise RuntimeError(f"cannot make routed namespaces here: {why}")
    found = []
    for r in range(trials):
        for scenario in scenarios:
            t0 = time.monotonic()
            outcome = run_scenario(scenario, folder / f"{scenario}-{r}", settings)
            found.append(outcome)
            print(
                f"trial {r + 1}: {LABEL[scenario]}: {verdict(outcome)} "
                f"({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return found


# ------------------------------------------------------------------- output


def verdict(o: Outcome) -> str:
    if o.seconds is not None:
        end = "ran to the end" if o.finished else f"did not finish (exit {o.exit_codes})"
        return f"first step after {o.seconds:.2f} s at world size {o.world_after}; {end}"
    if o.agents_gone_s is not None:
        return f"job dead: every agent exited within {o.agents_gone_s:.1f} s (exit {o.exit_codes})"
    return f"job stuck: no step and agents still up (exit {o.exit_codes})"


def table(outcomes: list[Outcome], side: str = "torchrun --nnodes 3:4") -> str:
    rows = [
        "| side | scenario | killed | at step | kill -> first step | world | resumed from "
        "| outcome |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        rank = "" if o.killed_rank is None else f" (rank {o.killed_rank})"
        secs = "" if o.seconds is None else f"{o.seconds:.2f} s"
        world = f"{o.world_before} -> {o.world_after or '-'}"
        resumed = "" if o.resumed_step is None else str(o.resumed_step)
        rows.append(
            f"| {side} | {LABEL[o.scenario]} | node {o.killed_node}{rank} | {o.killed_step} "
            f"| {secs} | {world} | {resumed} | {verdict(o)} |"
        )
    return "\n".join(rows)


def figures(outcomes: list[Outcome]) -> list[Figure]:
    out = []
    if worker := [o for o in outcomes if o.scenario == "worker"]:
        secs = [o.seconds for o in worker if o.seconds is not None]
        worlds = [o.world_after for o in worker if o.world_after is not None]
        what = "torchrun, non-store node killed"
        med = statistics.median(secs) if secs else math.nan
        out.append(Figure(f"{what}: kill -> first step (median)", med, "s"))
        out.append(Figure(f"{what}: world size after", min(worlds, default=math.nan), "ranks"))
    if store := [o for o in outcomes if o.scenario == "store"]:
        alive = sum(o.survived for o in store)
        what = "torchrun, store node killed: trials the job survived"
        out.append(Figure(what, alive, f"of {len(store)}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 trial")
    ap.add_argument("--only", default=",".join(SCENARIOS), help="of: " + ", ".join(SCENARIOS))
    ap.add_argument("--steps", type=int, default=Settings.steps)
    ap.add_argument("--kill-at", type=int, default=Settings.kill_at)
    ap.add_argument("--save-every", type=int, default=Settings.save_every)
    ap.add_argument("--step-time", type=float, default=Settings.step_time)
    ap.add_argument("--rdzv-conf", help="key=value,... over the short defaults (no is_host)")
    ap.add_argument("--torchrun-defaults", action="store_true", help="torchrun's own timeouts")
    ap.add_argument(
        "--share-store",
        action="store_true",
        help="leave TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset (pytorch #135712: restarts fail)",
    )
    ap.add_argument("--keep", type=Path, help="work in this new folder and keep it (logs)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    trials = 1 if args.quick else args.trials
    chosen = tuple(s.strip() for s in args.only.split(",") if s.strip())
    if not chosen or any(s not in SCENARIOS for s in chosen):
        ap.error(f"--only: pick from {', '.join(SCENARIOS)}")
    if not 0 < args.kill_at < args.steps or trials < 1:
        ap.error("need 0 < --kill-at < --steps and --trials >= 1")
    rdzv = dict(RDZV_DEFAULTS if args.torchrun_defaults else RDZV_SHORT)
    for pair in filter(None, (args.rdzv_conf or "").split(",")):
        key, _, value = pair.partition("=")
        if key not in rdzv or not value.isdigit():
            ap.error(f"--rdzv-conf: {pair!r}: keys are {', '.join(rdzv)}, values whole seconds")
        rdzv[key] = int(value)
    settings = Settings(
        args.steps, args.kill_at, args.save_every, args.step_time, rdzv=rdzv,
        share_store=args.share_store,
    )  # fmt: skip
    try:
        with contextlib.ExitStack() as stack:
            if args.keep:
                args.keep.mkdir(parents=True)
                d = args.keep
            else:
                base = os.environ.get("HOTSPARE_BENCH_DIR")
                d = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mht-", dir=base)))
            outcomes = measure(settings, trials, d, chosen)
    except (OSError, RuntimeError, TimeoutError) as e:
        print(f"multihost_torchrun: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(table(outcomes))
    print()
    notes = f"{trials} trial(s); {settings.describe()}; {os.cpu_count()} CPUs"
    emit("multihost_torchrun", figures(outcomes), notes, args.json)


if __name__ == "__main__":
    main()
