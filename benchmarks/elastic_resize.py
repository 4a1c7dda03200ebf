"""Elastic jobs at the console: a 3-host job with no spare loses a host, trains on 2 with the
same global batch, gets a host added and grows back to 3; plain reduce and
``deterministic_reduce`` side by side, and torchrun ``--nnodes 2:3`` on the same loss.

hotspare: local demo hosts a, b, c (tests/fleetbed.py ``local_host``) and the console
(``Controller``, ``Policy.AUTO``) in this process, as tests/console/supervise/group/test_elastic_group.py runs
them. One job: ``hosts = [a, b, c]``, ``min_hosts = 2``, no spare, the torch kind training
charlm (``CONFIG``: 3 logical ranks of 4 rows, global batch 12). Once step ``P`` is done, b
is killed (``Controller.kill_host``: its executor SIGKILLed, the host unreachable); the console
waits out b's lease and shrinks the group to a and c (a runs logical rank 0, c ranks 1 and 2
by gradient accumulation). Once the shrunk group reaches step ``2P``, host d is added
(``Controller.add_host``) and the group grows back to 3 at its next step, a planned stop with
a checkpoint; it trains to step ``3P``. Each reduce also runs the same job uninterrupted on 3
hosts: its final ``params_sha256`` is the reference, its rate the uninterrupted one.

Every figure is read from evidence the console did not make: the executors' own record,
``events.jsonl`` on the host of the group's rank 0 (a Progress line per step, with step, epoch,
world size and global batch; a ``resumed`` line per epoch; ``finished`` with the parameters'
digest), each line stamped by a thread of this process with ``time.time()`` when it first
appears in the file (polled every ``POLL_S``); the kill and the add are stamped just before
they are made. steps/s per epoch: from the stamped step lines, after the epoch's first
``--settle`` seconds. The journal's incidents (console/records/incidents.py) give each
incident's class, size change, lost steps and phases, printed beside.

torchrun: benchmarks/multihost_torchrun.py's nodes (routed network namespaces, one agent per
node, c10d store on node 0, its short rendezvous timeouts) running benchmarks/ddp_plain.py with
``--nnodes 2:3``; node 2 (not the store) is SIGKILLed once step ``--torchrun-kill-at`` is done,
and once the survivors have trained ``--torchrun-grow-after`` steps a fresh agent starts in
node 2's namespace with an empty folder (a host added): torchrun's scale-up. Figures from the
script's own step lines, as multihost_torchrun.py reads them.

    python benchmarks/elastic_resize.py [--quick] [--json] [--phase-steps P] [--settle S]
        [--fast-console] [--no-torchrun] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shlex
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import multihost_torchrun as mht  # noqa: E402
import tomli_w  # noqa: E402
import torch  # noqa: E402
from common import Figure, emit, fmt_value  # noqa: E402
from ddp_plain import GLOBAL_BATCH as DDP_GLOBAL_BATCH  # noqa: E402
from support import netbed  # noqa: E402
from support.fleetbed import FAST_CONSOLE, job_table, local_host  # noqa: E402

from console.controller import Controller  # noqa: E402
from console.inventory import ConsoleSettings, load  # noqa: E402
from console.records.incidents import Incident, incidents  # noqa: E402
from console.records.journal import Event, Kind, read  # noqa: E402
from console.states import JobState  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402

JOB = "j"
MEMBERS = ("a", "b", "c")
VICTIM, ADDED = "b", "d"
LOGICAL = 3
CONFIG = {
    "n_layer": 4,
    "n_head": 6,
    "n_embd": 192,
    "block_size": 64,
    "global_batch": 12,
    "micro_batch": 4,
    "dropout": 0.1,
    "corpus_chars": 50_000,
}
"""charlm scaled up from tests/helpers.py TINY_CONFIG so a step's compute dominates: 3 logical
ranks of 4 rows (one micro-batch each)."""
CHECKPOINT_EVERY = 20
EXECUTOR_ENV = {"OMP_NUM_THREADS": "1", "HOTSPARE_PROGRESS_S": "0"}
"""One thread per executor (3 executors on this machine's cores); a Progress line every step."""
POLL_S = 0.005
RUN_TIMEOUT_S = 420.0
SIZES = (("3 hosts", 1), ("2 hosts (shrunk)", 2), ("3 hosts again (grown)", 3))
MODES = ((False, "plain reduce"), (True, "deterministic_reduce"))


# ------------------------------------------------------------- the executors' own record


class Stamps:
    """Every line the executors append to their ``events.jsonl``, with the ``time.time()`` at
    which this thread first saw it complete in the file."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.lines: dict[str, list[tuple[float, dict[str, Any]]]] = {h: [] for h in files}
        self._offsets = dict.fromkeys(files, 0)
        self._rest = dict.fromkeys(files, b"")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stamps", daemon=True)

    def __enter__(self) -> Stamps:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()  # whatever came last

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self._poll()

    def _poll(self) -> None:
        for host, path in self.files.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[host])
                    data = f.read()
            except FileNotFoundError:
                continue
            if not data:
                continue
            now = time.time()
            self._offsets[host] += len(data)
            *whole, self._rest[host] = (self._rest[host] + data).split(b"\n")
            for raw in whole:
                if raw.strip():
                    self.lines[host].append((now, json.loads(raw)))

    def dump(self, path: Path) -> None:
        """Every stamped line, for a look afterwards (``--keep``)."""
        with open(path, "w") as f:
            for host, lines in self.lines.items():
                for t, e in lines:
                    f.write(json.dumps({"host": host, "seen_t": t, **e}) + "\n")

    def of(self, host: str, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in list(self.lines[host]) if e.get("kind") == kind]

    def top_step(self, host: str, epoch: int | None = None) -> int:
        return max(
            (e["step"] for _, e in self.of(host, "progress") if epoch in (None, e["epoch"])),
            default=0,
        )


# ------------------------------------------------------------------------- hotspare


@dataclass(frozen=True)
class Plan:
    phase_steps: int
    settle_s: float
    fast_console: bool

    @property
    def steps(self) -> int:
        return 3 * self.phase_steps

    def console(self) -> dict[str, Any]:
        return dict(FAST_CONSOLE) if self.fast_console else {}

    def lease_s(self) -> float:
        return float(self.console().get("lease_s", ConsoleSettings().lease_s))


def job(plan: Plan, det: bool) -> dict[str, Any]:
    table = job_table(steps=plan.steps, checkpoint_every_steps=CHECKPOINT_EVERY, config=CONFIG)
    return {
        "hosts": list(MEMBERS),
        "spares": [],
        "min_hosts": 2,
        "deterministic_reduce": det,
        **table,
    }


def write_inventory(folder: Path, plan: Plan, det: bool) -> Path:
    folder.mkdir(parents=True)
    data = {
        "console": {**plan.console(), "state_dir": str(folder / "state")},
        "regions": {"r1": {"priority": 1}},
        "hosts": {h: local_host(folder / h) for h in MEMBERS},
        "jobs": {JOB: job(plan, det)},
    }
    path = folder / "inventory.toml"
    path.write_text(tomli_w.dumps(data))
    return path


@dataclass
class Epoch:
    """One epoch of the group, from rank 0's host's own lines."""

    number: int
    members: list[str]
    world: set[int] = field(default_factory=set)
    global_batch: set[int] = field(default_factory=set)
    first_t: float = math.nan
    first_step: int = 0
    last_step: int = 0
    resumed_step: int | None = None
    rate: float = math.nan
    timed_steps: int = 0


@dataclass
class Run:
    det: bool
    elastic: bool
    seconds: float = 0.0
    finished: bool = False
    why: str = ""
    epochs: list[Epoch] = field(default_factory=list)
    sha: str = ""
    console_sha: str = ""
    kill_t: float | None = None
    add_t: float | None = None
    incidents: list[Incident] = field(default_factory=list)

    def epoch(self, n: int) -> Epoch | None:
        return next((e for e in self.epochs if e.number == n), None)

    def recovery(self, n: int, at: float | None) -> tuple[float, int | None]:
        """(``at`` -> epoch ``n``'s first step line, steps of epoch n - 1 not kept)."""
        e, before = self.epoch(n), self.epoch(n - 1)
        if e is None or at is None or before is None:
            return math.nan, None
        lost = None if e.resumed_step is None else max(0, before.last_step - e.resumed_step)
        return e.first_t - at, lost


def _journal(inv: Path) -> list[Event]:
    return list(read(inv.parent / "state" / "journal.jsonl"))


def _epochs(journal: list[Event]) -> list[tuple[int, list[str]]]:
    return [
        (int(e.data["epoch"]), list(e.data["members"]))
        for e in journal
        if e.kind is Kind.EXECUTOR and "epoch" in e.data and "port" in e.data
    ]


def rate(lines: list[tuple[float, int]], settle_s: float) -> tuple[float, int]:
    """Steps/s over the step lines after the first ``settle_s`` seconds; (rate, steps timed)."""
    if not lines:
        return math.nan, 0
    kept = [(t, s) for t, s in lines if t >= lines[0][0] + settle_s]
    if len(kept) < 2 or kept[-1][0] <= kept[0][0]:
        return math.nan, 0
    return (kept[-1][1] - kept[0][1]) / (kept[-1][0] - kept[0][0]), kept[-1][1] - kept[0][1]


def analyse(out: Run, stamps: Stamps, journal: list[Event], settle_s: float) -> None:
    for number, members in _epochs(journal):
        e = Epoch(number, members)
        host = members[0]  # the group's rank 0
        steps = sorted(
            (t, p["step"]) for t, p in stamps.of(host, "progress") if p["epoch"] == number
        )
        for _, p in stamps.of(host, "progress"):
            if p["epoch"] == number:
                e.world.add(p["world_size"])
                e.global_batch.add(p["global_batch"])
        if steps:
            e.first_t, e.first_step, e.last_step = steps[0][0], steps[0][1], steps[-1][1]
        resumed = [r for _, r in stamps.of(host, "resumed") if r["epoch"] == number]
        e.resumed_step = resumed[0]["step"] if resumed else (0 if number == 1 else None)
        e.rate, e.timed_steps = rate(steps, settle_s)
        out.epochs.append(e)
    if out.epochs:
        last = out.epochs[-1].members[0]
        done = stamps.of(last, "finished")
        out.sha = done[-1][1]["params_sha256"] if done else ""
    out.incidents = incidents(journal)


async def _until(predicate: Any, task: asyncio.Task[Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if task.done():
            raise RuntimeError(f"the console's run ended before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        await asyncio.sleep(0.02)


def _kill_leftovers(folder: Path) -> None:
    """Executors this run started that still run after a failure (the pid files they wrote)."""
    for pidfile in folder.glob("*/jobs/*/*.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)


async def hotspare(folder: Path, plan: Plan, det: bool, elastic: bool) -> Run:
    """One job of ``plan``; ``elastic``: kill b at step P, add d at step 2P (else uninterrupted)."""
    inv = write_inventory(folder, plan, det)
    hosts = (*MEMBERS, ADDED)
    ctl = Controller(load(inv), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in hosts})
    sup = ctl.jobs[JOB]
    files = {h: folder / h / "jobs" / JOB / "events.jsonl" for h in hosts}
    out = Run(det, elastic)
    t0 = time.monotonic()
    with Stamps(files) as stamps:
        task = asyncio.create_task(ctl.run())
        try:
            if elastic:
                p = plan.phase_steps
                await _until(lambda: stamps.top_step("a") >= p, task, 300, f"step {p}")
                out.kill_t = time.time()
                ctl.kill_host(VICTIM)
                await _until(
                    lambda: stamps.top_step("a", 2) >= 2 * p, task, 300, f"step {2 * p} on 2"
                )
                out.add_t = time.time()
                ctl.add_host(ADDED, local_host(folder / ADDED))
            await asyncio.wait_for(asyncio.shield(task), RUN_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as e:
            out.why = f"{type(e).__name__}: {e}"
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await ctl.close()
            if sup.state is not JobState.FINISHED:
                _kill_leftovers(folder)
    out.seconds = time.monotonic() - t0
    out.finished = sup.state is JobState.FINISHED
    out.console_sha = sup.sha256 or ""
    if not out.finished and not out.why:
        out.why = f"{sup.state.value}: {sup.live.why}"
    stamps.dump(folder / "stamped-events.jsonl")
    analyse(out, stamps, _journal(inv), plan.settle_s)
    return out


# -------------------------------------------------------------------------- torchrun


@dataclass
class Peer:
    """torchrun --nnodes 2:3, one node killed, a fresh one started later."""

    killed_step: int = 0
    world_before: int = 0
    shrink_s: float | None = None
    world_shrunk: int | None = None
    shrink_resumed: int | None = None
    grow_s: float | None = None
    world_grown: int | None = None
    grow_last: int = 0
    grow_resumed: int | None = None
    finished: bool = False
    why: str = ""


def _first_fresh(nodes: list[mht.Node], after: float, before: set[int], world: int | None):  # type: ignore[no-untyped-def]
    fresh = [
        s
        for n in nodes
        for s in mht.steps(n.lines())
        if s.t > after and s.pid not in before and world in (None, s.field("world"))
    ]
    return min(fresh, key=lambda s: s.t, default=None)


def _loaded(nodes: list[mht.Node], pid: int) -> int | None:
    found = [
        ln.field("step")
        for n in nodes
        for ln in n.lines()
        if ln.pid == pid and ln.text.startswith("loaded ")
    ]
    return found[-1] if found else None


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        time.sleep(mht.POLL_S)
    return value


def torchrun(folder: Path, settings: mht.Settings, grow_after: int) -> Peer:
    out = Peer()
    with netbed.routed_namespaces(settings.nodes) as spaces:
        nodes = [mht.Node(i, ns, folder / f"node{i}") for i, ns in enumerate(spaces)]
        added: mht.Node | None = None
        try:
            for n in nodes:
                n.folder.mkdir(parents=True)
                mht.start_agent(n, nodes[0], settings, "elastic-resize")
            at = settings.kill_at
            _wait(
                lambda: any(mht.step_of(s) >= at for n in nodes for s in mht.steps(n.lines())),
                settings.start_timeout_s,
                f"step {at}",
            )
            victim, survivors = nodes[-1], nodes[:-1]
            before = {ln.pid for n in nodes for ln in n.lines()}
            mine = mht.steps(victim.lines())
            out.killed_step = max((mht.step_of(s) for s in mine), default=0)
            out.world_before = max(
                (s.field("world") or 0 for n in nodes for s in mht.steps(n.lines())), default=0
            )
            kill_t, killed = mht.kill_node(victim)
            before |= set(killed)
            first = _wait(
                lambda: _first_fresh(survivors, kill_t, before, None),
                settings.restart_timeout_s,
                "step after the kill",
            )
            out.shrink_s, out.world_shrunk = first.t - kill_t, first.field("world")
            out.shrink_resumed = _loaded(survivors, first.pid)
            target = mht.step_of(first) + grow_after
            _wait(
                lambda: any(
                    mht.step_of(s) >= target for n in survivors for s in mht.steps(n.lines())
                ),
                settings.restart_timeout_s,
                f"step {target} on the survivors",
            )
            before = {ln.pid for n in survivors for ln in n.lines()}
            added = mht.Node(victim.index, victim.ns, folder / f"node{victim.index}-added")
            added.folder.mkdir(parents=True)
            add_t = time.time()
            mht.start_agent(added, nodes[0], settings, "elastic-resize")
            grown = [*survivors, added]
            again = _wait(
                lambda: _first_fresh(grown, add_t, before, 3),
                settings.restart_timeout_s,
                "step at world size 3 after the add",
            )
            out.grow_s, out.world_grown = again.t - add_t, again.field("world")
            out.grow_last = max(
                (
                    mht.step_of(s)
                    for n in survivors
                    for s in mht.steps(n.lines())
                    if s.pid in before
                ),
                default=0,
            )
            out.grow_resumed = _loaded(grown, again.pid)
            _wait(
                lambda: not any(n.alive() for n in grown),
                settings.restart_timeout_s,
                "the agents' exit",
            )
            last = max((mht.step_of(s) for n in grown for s in mht.steps(n.lines())), default=0)
            codes = [n.agent.poll() if n.agent else None for n in grown]
            out.finished = last >= settings.steps and codes == [0] * len(grown)
            if not out.finished:
                out.why = f"last step {last}, exit codes {codes}"
        except (OSError, RuntimeError, TimeoutError) as e:
            out.why = f"{type(e).__name__}: {e}"
        finally:
            for n in [*nodes, *([added] if added else [])]:
                mht.end_node(n)
    return out


# --------------------------------------------------------------------------- output


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def _num(v: float | int | None, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{fmt_value(float(v))}{unit}"


def _of(run: Run, n: int, name: str) -> str:
    """Epoch ``n``'s values of ``name`` (world, global_batch), or -."""
    e = run.epoch(n)
    return "/".join(str(v) for v in sorted(getattr(e, name))) if e else "-"


@dataclass
class Row:
    name: str
    cells: dict[str, str]
    meaning: str


def _same(a: Run, ref: Run | None) -> str:
    if ref is None or not ref.sha or not a.sha:
        return "-"
    return "yes" if a.sha == ref.sha else "no"


def rows(runs: dict[bool, Run], refs: dict[bool, Run], peer: Peer | None, plan: Plan) -> list[Row]:
    out: list[Row] = []

    def row(name: str, meaning: str, each: Any, tr: str = "") -> None:
        cells = {label: each(det) for det, label in MODES if det in runs}
        cells["torchrun"] = tr
        out.append(Row(name, cells, meaning))

    for name, n in SIZES:
        row(
            f"steps/s at {name}",
            f"rank 0's step lines of epoch {n}, after its first {plan.settle_s:g} s",
            lambda det, n=n: _num((e := runs[det].epoch(n)) and e.rate),
        )
    row(
        "steps/s uninterrupted 3-host run",
        "the reference run's single epoch, read alike",
        lambda det: _num((e := refs[det].epoch(1)) and e.rate) if det in refs else "-",
    )
    for name, n in SIZES:
        row(
            f"det/plain at {name}",
            "steps/s with deterministic_reduce over the plain reduce's",
            lambda det, n=n: _ratio(runs, n) if det else "",
        )
    tr = peer or Peer()
    row(
        "shrink: kill -> first step",
        f"kill of {VICTIM} -> rank 0's first step line at 2 hosts (it waits out {VICTIM}'s "
        f"lease, lease_s {plan.lease_s():g} s from its last renewal); torchrun: -> first step of a worker started after the kill",
        lambda det: _num(runs[det].recovery(2, runs[det].kill_t)[0], " s"),
        _num(tr.shrink_s, " s") if peer else "",
    )
    row(
        "shrink: lost steps",
        "last step before the kill - the step the shrunk group resumed from",
        lambda det: _num(runs[det].recovery(2, runs[det].kill_t)[1]),
        _num(tr.killed_step - tr.shrink_resumed) if tr.shrink_resumed is not None else "",
    )
    row(
        "shrink: world size",
        "ranks after the shrink (step lines)",
        lambda det: _of(runs[det], 2, "world"),
        _num(tr.world_shrunk),
    )
    row(
        "grow: order -> first step",
        f"add_host({ADDED}) -> rank 0's first step line at 3 hosts; torchrun: fresh agent "
        "started -> first step at world size 3",
        lambda det: _num(runs[det].recovery(3, runs[det].add_t)[0], " s"),
        _num(tr.grow_s, " s") if peer else "",
    )
    row(
        "grow: lost steps",
        "last step at 2 hosts - the step the grown group resumed from (0 expected)",
        lambda det: _num(runs[det].recovery(3, runs[det].add_t)[1]),
        _num(tr.grow_last - tr.grow_resumed) if tr.grow_resumed is not None else "",
    )
    gb = lambda w: DDP_GLOBAL_BATCH // w * w if w else None  # noqa: E731
    row(
        "global batch at 3 / 2 / 3",
        "rows per optimizer step (Progress global_batch; torchrun: by ddp_plain.py's rule, "
        f"{DDP_GLOBAL_BATCH} rows split over the world, i.e. 4 -> 6 rows per rank at 2; a "
        "script with a fixed per-rank batch would train 8 at 2)",
        lambda det: " / ".join(_of(runs[det], n, "global_batch") for _, n in SIZES),
        " / ".join(_num(gb(w)) for w in (tr.world_before, tr.world_shrunk, tr.world_grown))
        if peer
        else "",
    )
    row(
        "final params = uninterrupted 3-host run's",
        "rank 0's finished params_sha256 against the same reduce's uninterrupted run",
        lambda det: _same(runs[det], refs.get(det)),
        "not measured (ddp_plain.py prints no digest)" if peer else "",
    )
    row(
        "ran to the end",
        "the job FINISHED (torchrun: last step reached, agents exit 0)",
        lambda det: "yes" if runs[det].finished else f"no: {runs[det].why}",
        ("yes" if tr.finished else f"no: {tr.why}") if peer else "",
    )
    return out


def _ratio(runs: dict[bool, Run], n: int) -> str:
    if False not in runs or True not in runs:
        return "-"
    plain, det = runs[False].epoch(n), runs[True].epoch(n)
    if plain is None or det is None or not plain.rate:
        return "-"
    return _num(det.rate / plain.rate, "x")


def print_table(found: list[Row], peer: bool) -> None:
    cols = [label for _, label in MODES] + (["torchrun --nnodes 2:3"] if peer else [])
    print("| figure | " + " | ".join(cols) + " | what it is |")
    print("|---" * (len(cols) + 2) + "|")
    for r in found:
        cells = [r.cells.get(label, "") for _, label in MODES]
        if peer:
            cells.append(r.cells.get("torchrun", ""))
        print(f"| {r.name} | " + " | ".join(cells) + f" | {r.meaning} |")


def print_incidents(runs: dict[bool, Run]) -> None:
    """The journal's own account, each phase after the last (from the kill / the add)."""
    phases = ("detect", "decide", "transfer", "start", "load", "first step")
    print(
        "| journal incident | class (cause) | size | lost steps | "
        + " | ".join(phases)
        + " | total |"
    )
    print("|---" * (len(phases) + 5) + "|")
    for det, label in MODES:
        run = runs.get(det)
        if run is None:
            continue
        for inc in run.incidents:
            at = run.kill_t if inc.fault_class == "shrunk" else run.add_t
            if at is not None:
                inc.fault_at = at
            parts = inc.breakdown()
            size = (
                f"{inc.size['from']} -> {inc.size['to']} of {inc.size['planned']}"
                if inc.size
                else ""
            )
            cause = f" ({inc.cause})" if inc.cause else ""
            cells = [f"{parts[p]:.2f}" if p in parts else "" for p in phases]
            total = f"{sum(parts.values()):.2f}" if parts else ""
            print(
                f"| {label}: {inc.id} | {inc.fault_class}{cause} | {size} "
                f"| {_num(inc.lost_steps)} | " + " | ".join(cells) + f" | {total} |"
            )


def figures(runs: dict[bool, Run], refs: dict[bool, Run], peer: Peer | None) -> list[Figure]:
    out = []
    for det, label in MODES:
        run = runs.get(det)
        if run is None:
            continue
        for name, n in SIZES:
            e = run.epoch(n)
            out.append(Figure(f"{label}: steps/s at {name}", e.rate if e else math.nan, "steps/s"))
        ref = refs.get(det)
        e = ref.epoch(1) if ref else None
        out.append(
            Figure(f"{label}: steps/s uninterrupted 3 hosts", e.rate if e else math.nan, "steps/s")
        )
        s, lost = run.recovery(2, run.kill_t)
        out.append(Figure(f"{label}: shrink, kill -> first step at 2", s, "s"))
        out.append(
            Figure(f"{label}: shrink, lost steps", math.nan if lost is None else lost, "steps")
        )
        g, glost = run.recovery(3, run.add_t)
        out.append(Figure(f"{label}: grow, add -> first step at 3", g, "s"))
        ok = glost == 0
        out.append(
            Figure(
                f"{label}: grow, lost steps",
                math.nan if glost is None else glost,
                "steps",
                "= 0",
                ok,
            )
        )
        batches = set().union(*(e.global_batch for e in run.epochs)) if run.epochs else set()
        same_batch = batches == {CONFIG["global_batch"]} and len(run.epochs) == 3
        out.append(
            Figure(
                f"{label}: global batch at 3, 2, 3 hosts",
                next(iter(batches)) if len(batches) == 1 else math.nan,
                "rows",
                f"= {CONFIG['global_batch']} at every size",
                same_batch,
            )
        )
        same = _same(run, ref)
        out.append(
            Figure(
                f"{label}: final params = uninterrupted run's",
                {"yes": 1.0, "no": 0.0}.get(same, math.nan),
                "(1: equal)",
                "= 1" if det else "",
                (same == "yes") if det else None,
            )
        )
    for n in (1, 2, 3):
        r = _ratio(runs, n)
        if r != "-":
            out.append(
                Figure(
                    f"det/plain steps/s at {SIZES[n - 1][0]}",
                    runs[True].epoch(n).rate / runs[False].epoch(n).rate,  # type: ignore[union-attr]
                    "x",
                )
            )
    if peer is not None:
        out += [
            Figure("torchrun: world size after the kill", peer.world_shrunk or math.nan, "ranks"),
            Figure("torchrun: kill -> first step", peer.shrink_s or math.nan, "s"),
            Figure(
                "torchrun: global batch after the kill (ddp_plain.py)",
                DDP_GLOBAL_BATCH // peer.world_shrunk * peer.world_shrunk
                if peer.world_shrunk
                else math.nan,
                "rows",
            ),
            Figure("torchrun: add -> first step at 3", peer.grow_s or math.nan, "s"),
            Figure(
                "torchrun: grow, lost steps",
                peer.grow_last - peer.grow_resumed if peer.grow_resumed is not None else math.nan,
                "steps",
            ),
        ]
    return out


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-steps", type=int, default=130, help="P: kill at P, add at 2P, end 3P")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of each epoch not timed")
    ap.add_argument("--fast-console", action="store_true", help="the tests' console (lease 3 s)")
    ap.add_argument("--quick", action="store_true", help="P 30, settle 1 s, the tests' console")
    ap.add_argument("--no-torchrun", action="store_true", help="hotspare only")
    ap.add_argument("--torchrun-kill-at", type=int, default=70)
    ap.add_argument("--torchrun-grow-after", type=int, default=60)
    ap.add_argument("--keep", type=Path, help="work in this new folder and keep it")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    if args.quick:
        args.phase_steps, args.settle, args.fast_console = 30, 1.0, True
    if args.phase_steps <= CHECKPOINT_EVERY:
        ap.error(f"--phase-steps must be over {CHECKPOINT_EVERY} (a checkpoint in each phase)")
    plan = Plan(args.phase_steps, args.settle, args.fast_console)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )
    print("command: " + shlex.join(["python", "benchmarks/elastic_resize.py", *sys.argv[1:]]))
    print()
    t0, load0 = time.monotonic(), _load()
    runs: dict[bool, Run] = {}
    refs: dict[bool, Run] = {}
    peer: Peer | None = None
    tr_settings = mht.Settings(
        steps=args.torchrun_kill_at + args.torchrun_grow_after + 100,
        kill_at=args.torchrun_kill_at,
        nodes=3,
        min_nodes=2,
    )
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True)
            d = args.keep
        else:
            base = os.environ.get("HOTSPARE_BENCH_DIR")
            d = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ers-", dir=base)))
        for det, label in MODES:
            for elastic in (False, True):
                t = time.monotonic()
                where = d / f"{'det' if det else 'plain'}-{'elastic' if elastic else 'ref'}"
                run = asyncio.run(hotspare(where, plan, det, elastic))
                (runs if elastic else refs)[det] = run
                what = "3 -> 2 -> 3 hosts" if elastic else "uninterrupted, 3 hosts"
                state = "finished" if run.finished else f"FAILED: {run.why}"
                if run.sha and run.sha != run.console_sha:
                    state += f" (the console's digest {run.console_sha[:12]} differs)"
                rates = ", ".join(_num(e.rate) for e in run.epochs)
                print(
                    f"hotspare, {label}, {what}: {state}; steps/s per epoch {rates} "
                    f"({time.monotonic() - t:.0f} s; load average {_load()})",
                    file=sys.stderr,
                    flush=True,
                )
        if not args.no_torchrun:
            if why := netbed.unavailable() or netbed.forward_blocked():
                print(f"torchrun: not run: {why}", file=sys.stderr)
            else:
                t = time.monotonic()
                peer = torchrun(d / "torchrun", tr_settings, args.torchrun_grow_after)
                print(
                    f"torchrun --nnodes 2:3: shrink {_num(peer.shrink_s, ' s')} to world "
                    f"{peer.world_shrunk}, grow {_num(peer.grow_s, ' s')} to world "
                    f"{peer.world_grown}; {'finished' if peer.finished else peer.why} "
                    f"({time.monotonic() - t:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    took = time.monotonic() - t0
    print_table(rows(runs, refs, peer, plan), peer is not None)
    print()
    print_incidents(runs)
    print()
    console = "the tests' (FAST_CONSOLE)" if plan.fast_console else "the shipped defaults"
    notes = (
        f"hotspare: 3 local demo hosts a, b, c, no spare, min_hosts 2, console settings "
        f"{console} (lease {plan.lease_s():g} s), Policy.AUTO; torch kind, charlm "
        f"{CONFIG['n_layer']}x{CONFIG['n_embd']} block {CONFIG['block_size']}, global batch "
        f"{CONFIG['global_batch']} = {LOGICAL} logical ranks x {CONFIG['micro_batch']} rows, "
        f"{plan.steps} steps (kill {VICTIM} at {plan.phase_steps}, add {ADDED} at "
        f"{2 * plan.phase_steps}), a checkpoint every {CHECKPOINT_EVERY}, executors "
        f"OMP_NUM_THREADS=1 sharing {os.cpu_count()} CPUs (3 executors on 2 cores run slower "
        "per executor than 2: compare the reduces, not the sizes); figures from rank 0's "
        f"events.jsonl stamped on arrival (poll {POLL_S * 1000:g} ms)"
        + (
            f"; torchrun: {tr_settings.describe()}, a fresh agent on node 2's namespace after "
            f"{args.torchrun_grow_after} steps at 2; its steps are a paced MLP, not charlm"
            if peer is not None
            else "; torchrun: not run"
        )
        + f"; {took:.0f} s in all; 1-min load average {load0} at the start, {_load()} at the "
        "end (the machine is shared: rates move with its load)"
    )
    emit("elastic_resize", figures(runs, refs, peer), notes, args.json)


if __name__ == "__main__":
    main()
