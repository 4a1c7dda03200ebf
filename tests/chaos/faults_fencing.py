"""Faults aimed at the fencing: a trainer frozen past its lease and thawed, a console that
restarts while it cannot see the lease it granted, a second console on the same state dir,
the console's wall clock stepped. Each also checks what only it can see (``violations``)
and measures what the summary prints (``figures``)."""

from __future__ import annotations

import math
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from support.fleetbed import FAST_CONSOLE
from support.netbed import NsSshHost
from support.wait import wait_for

from chaos.faults import Injected, Target, _pid
from chaos.fencing import PROGRESS_S
from chaos.fleet import Fleet
from chaos.observe import events_size, job_view, json_lines
from chaos.torchrun import KIND as TORCHRUN
from console.records.journal import Kind, read

LEASE_S = float(FAST_CONSOLE["lease_s"])
SKEW_S = float(FAST_CONSOLE["clock_skew_s"])
THAW_WATCH_S = 10.0
"""How long a thawed executor is watched for a step or a publish (it should exit at once)."""
CLOCK_STEPS_S = (3600.0, -3600.0, 7200.0)
HOLDER = re.compile(r"another console holds this state dir \(pid (\d+) on (\S+) since ([^)]+)\)")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _last_progress(workdir: Path) -> dict[str, object]:
    """The newest progress line of the executor(s) there, {} if none."""
    try:
        lines = json_lines((workdir / "events.jsonl").read_bytes())
    except OSError:
        return {}
    return next((ev for ev in reversed(lines) if ev.get("kind") == "progress"), {})


def _rate_bound(workdir: Path, epoch: int) -> float:
    """A command job's step rate, bounded from its executor's last two progress lines of
    ``epoch`` (at least a progress interval apart): the rate the command kind reports is
    computed over metrics lines read in one batch, and is no rate (about 1e6 steps/s)."""
    try:
        lines = json_lines((workdir / "events.jsonl").read_bytes())
    except OSError:
        return math.inf
    steps = [
        int(ev.get("step", 0))
        for ev in lines
        if ev.get("kind") == "progress" and int(ev.get("epoch", 0)) == epoch
    ][-2:]
    return (steps[1] - steps[0]) / PROGRESS_S if len(steps) == 2 else math.inf


def _writing(folder: Path, timeout: float) -> bool:
    """Until a checkpoint is being written there (a temp file exists); False at the deadline.
    A busy poll on purpose: the write lasts milliseconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(n.startswith(".step-") and n.endswith(".tmp") for n in os.listdir(folder)):
                return True
        except OSError:
            return False
        time.sleep(0.001)
    return False


# ------------------------------------------------------------ sigstop_past_lease


def sigstop_past_lease(t: Target) -> Injected:
    """Freeze the trainer (SIGSTOP) and cut its host off, so no console can kill it; once the
    job trains under a newer epoch elsewhere and the lease is long over, continue it (SIGCONT)
    while still cut off. It must train no further step and publish nothing: its lease ended
    while it was frozen. Half the time it is frozen in the middle of a checkpoint write."""
    host = t.fleet.hosts[t.host]
    assert isinstance(host, NsSshHost)
    workdir = t.fleet.workdir(t.host, t.job)
    pid = _pid(t.fleet, t.host, t.job)
    mid_write = t.rng.random() < 0.5 and _writing(workdir / "checkpoints", 3.0)
    os.kill(pid, signal.SIGSTOP)
    at = time.time()
    host.netns.cut()
    last = _last_progress(workdir)
    epoch = int(last.get("epoch", 0) or 0)
    try:
        written = (workdir / "events.jsonl").stat().st_mtime
    except OSError:
        written = at
    rate = float(last.get("steps_per_s", 0.0) or 0.0)
    if any(j.name == t.job and j.kind == TORCHRUN for j in t.fleet.jobs):
        rate = min(rate, _rate_bound(workdir, epoch))
    allowed = int(last.get("step", 0) or 0) + int(rate * max(0.0, at - written)) + 2
    inj = Injected(
        "sigstop_past_lease",
        t.job,
        t.host,
        at,
        ("host_lost", "executor_hang"),
        note=f"pid {pid}, epoch {epoch}" + (", mid checkpoint write" if mid_write else ""),
    )

    def newer_epoch_running() -> bool:
        v = job_view(t.fleet.journal(), t.job)
        return v.state == "running" and v.epoch > epoch and time.time() > at + LEASE_S + SKEW_S

    def heal() -> None:
        if _alive(pid):
            _thaw(t.fleet, t.job, t.host, pid, epoch, allowed, inj)
        else:
            gone(inj, pid, epoch)
        host.netns.heal()

    inj.heal, inj.heal_when = heal, newer_epoch_running
    return inj


def gone(inj: Injected, pid: int, epoch: int) -> None:
    """The frozen executor was gone before it could be continued: what the fault is for (no
    step and no publish once continued past its lease) was never tried."""
    inj.note += "; gone before it could be continued"
    inj.inconclusive.append(
        f"sigstop_past_lease: pid {pid} (epoch {epoch}) on {inj.host} was gone before it could "
        "be continued: whether it trains or publishes past its lease was not checked"
    )


def _thaw(
    fleet: Fleet, job: str, host: str, pid: int, epoch: int, allowed: int, inj: Injected
) -> None:
    workdir = fleet.workdir(host, job)
    offset = events_size(workdir)
    os.kill(pid, signal.SIGCONT)
    cont = time.time()
    deadline = time.monotonic() + THAW_WATCH_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    fate = "exited" if not _alive(pid) else "still alive (idle or not: see the sampler)"
    inj.note += (
        f"; continued {cont - inj.t:.1f} s after the stop, {fate} {time.time() - cont:.2f} s later"
    )
    try:
        after = json_lines((workdir / "events.jsonl").read_bytes()[offset:])
    except OSError as e:
        after = []
        inj.inconclusive.append(
            f"sigstop_past_lease: {workdir}/events.jsonl unreadable after pid {pid} was "
            f"continued ({e}): its steps and reported checkpoints were not checked"
        )
    for ev in after:
        if ev.get("kind") == "checkpoint" and int(ev["manifest"]["epoch"]) == epoch:
            inj.violations.append(
                f"sigstop_past_lease: pid {pid} (epoch {epoch}) on {host}, continued past its "
                f"lease, reported checkpoint step {ev['manifest']['step']} written"
            )
        stale = ev.get("kind") == "progress" and int(ev.get("epoch", 0)) == epoch
        if stale and int(ev["step"]) > allowed:
            inj.violations.append(
                f"sigstop_past_lease: pid {pid} (epoch {epoch}) on {host}, continued past "
                f"its lease, reported step {ev['step']} (it was at step {allowed} at most "
                "when stopped)"
            )
    for manifest in (workdir / "checkpoints").glob("step-*.json"):
        try:
            mtime, body = manifest.stat().st_mtime, manifest.read_text()
        except OSError:
            continue
        if mtime >= cont and f'"epoch":{epoch},' in body.replace(" ", ""):
            inj.violations.append(
                f"sigstop_past_lease: {manifest} of epoch {epoch} published at {mtime:.3f}, "
                f"after pid {pid} was continued past its lease at {cont:.3f}"
            )


# ------------------------------------------------------- console_restart_partitioned


def console_restart_partitioned(t: Target) -> Injected:
    """Cut the job's host off, kill the console (SIGKILL) and start another at once while the
    host is still cut. The new console cannot see the lease; it must wait out the bound the
    one before persisted (state.json) plus the clock skew before it fails the job over.

    figures: ``extra_s``, the new epoch started this long after that bound (+ skew): what the
    restart costs over a console that never died, which fails over at about the bound (it
    readies the target during the wait). At most lease_s + clock_skew_s if the bound is read:
    a console that could not read it waits a whole lease from its start. ``wait_end_s``: when
    the console itself said the lease was over ("past its lease"), against the bound.
    """
    host = t.fleet.hosts[t.host]
    assert isinstance(host, NsSshHost)
    host.netns.cut()
    at = time.time()
    t.fleet.kill_console()
    killed = _boottime()
    rec = t.fleet.lease_record(t.job)
    t.fleet.start_console()
    started = time.time()
    inj = Injected(
        "console_restart_partitioned",
        t.job,
        t.host,
        at,
        ("host_lost", "console_restart"),
    )
    if rec is None or rec.get("host") != t.host:
        unmeasured(inj, rec)
        inj.heal = host.netns.heal
        return inj
    bound = time.time() + lease_bound(rec, killed) - _boottime() + SKEW_S  # as a wall time
    inj.figures["bound_left_s"] = bound - started
    inj.note = f"lease bound +skew {bound - started:.2f} s after the new console started"

    def heal() -> None:
        _judge_wait(t.fleet, t.job, int(rec["epoch"]), bound, inj)
        host.netns.heal()

    inj.heal = heal
    return inj


def unmeasured(inj: Injected, rec: dict[str, Any] | None) -> None:
    """The persisted lease is not the cut host's (the job was being moved: an overlapped
    fault), or none was persisted: the console may rightly start the job without waiting
    (it can reach the lease's host and find the executor gone), so its wait is not judged."""
    inj.note = f"the persisted lease is not {inj.host}'s ({rec}): the wait is not measured"
    inj.inconclusive.append(
        f"console_restart_partitioned: the persisted lease of {inj.job} is not the cut host "
        f"{inj.host}'s ({rec}): the restarted console's wait was not checked"
    )


def _boottime() -> float:
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


def lease_bound(rec: dict[str, Any], killed: float) -> float:
    """The latest a lease the killed console granted may end (CLOCK_BOOTTIME, skew not added):
    the bound it persisted, but no later than a whole lease (its epoch's longest ttl) from
    its death, since every lease runs from a reading that arrived before. A console may
    persist its bound ahead of the leases it grants (so that it writes less often); a console
    started after it waits the same min (JobLease.restore): the part ahead is no lease."""
    return min(float(rec["until"]), killed + float(rec["ttl_s"]))


def _judge_wait(fleet: Fleet, job: str, epoch: int, bound: float, inj: Injected) -> None:
    events = fleet.journal()
    start = next(
        (
            e.t
            for e in events
            if e.job == job
            and e.kind is Kind.JOB_STATE
            and e.data.get("to") == "running"
            and int(e.data.get("epoch", 0)) > epoch
        ),
        None,
    )
    if start is None:
        inj.note += "; no newer epoch started"
        inj.inconclusive.append(
            f"console_restart_partitioned: no epoch of {job} newer than {epoch} started before "
            f"{inj.host} was healed: the restarted console's wait was not checked"
        )
        return
    if start < bound - 0.05:
        inj.violations.append(
            f"console_restart_partitioned: epoch {epoch + 1} of {job} started at {start:.3f}, "
            f"{bound - start:.2f} s before the persisted lease bound (+skew) of epoch {epoch} "
            f"on {inj.host} ended ({bound:.3f})"
        )
    waited = next(
        (
            e.t
            for e in events
            if e.job == job
            and e.kind is Kind.EXECUTOR
            and inj.t <= e.t <= start
            and "past its lease" in e.msg
        ),
        None,
    )
    inj.figures["extra_s"] = start - bound
    if start - bound > LEASE_S + SKEW_S:
        inj.missed.append(
            f"console_restart_partitioned (MTTR bound, not safety): epoch {epoch + 1} of {job} "
            f"started {start - bound:.2f} s after the persisted lease bound (+skew), more than "
            f"lease_s + clock_skew_s = {LEASE_S + SKEW_S:.2f} s"
            + (
                f"; the console's lease wait ended {waited - bound:+.2f} s after it"
                if waited
                else ""
            )
        )
    inj.note += f"; epoch {epoch + 1} started {start - bound:+.2f} s after it"
    if waited is not None:
        inj.figures["wait_end_s"] = waited - bound
        inj.note += f" (the lease wait ended {waited - bound:+.2f} s after it)"


# ------------------------------------------------------------------- second_console


def holds_state_dir(state_dir: Path, pid: int) -> bool:
    """Has console ``pid`` taken the state dir (journalled that it started: only the holder
    writes the journal)? A second console started before that may win the lock instead (chaos
    seed 8 of the mixed run at bf695b3: overlapped on a console restart, it did, and the
    restarted console was refused)."""
    try:
        events = read(state_dir / "journal.jsonl", kinds={Kind.CONSOLE})
        return any(e.kind is Kind.CONSOLE and e.data.get("pid") == pid for e in events)
    except OSError:
        return False


def second_console(t: Target) -> Injected:
    """Start a second ``hotspare run`` on the same state dir while the first runs: refused
    (exit 2, one line on stderr naming the holder, nothing on stdout, nothing journalled),
    and the first goes on."""
    fleet = t.fleet
    first = fleet.console
    assert first is not None
    wait_for(  # a console just restarted may not hold the state dir yet: it would lose it
        lambda: first.poll() is not None or holds_state_dir(fleet.state_dir, first.pid),
        60,
        f"console pid {first.pid} to hold the state dir",
        interval=0.1,
    )
    assert first.poll() is None
    at = time.time()
    journal_size = (fleet.state_dir / "journal.jsonl").stat().st_size
    proc = fleet.spawn_console()
    out, err = fleet.console_output(fleet.console_starts)
    inj = Injected("second_console", t.job, t.host, at, ())
    try:
        rc = proc.wait(timeout=60)
    except Exception:
        proc.kill()
        proc.wait(timeout=30)
        inj.violations.append("second_console: still running after 60 s (not refused)")
        return inj
    lines = err.read_text(errors="replace").strip().splitlines()
    said = lines[0] if lines else ""
    inj.note = f"rc {rc}: {said[-160:]}"
    bad = []
    if rc != 2:
        bad.append(f"exit status {rc}, not 2")
    if len(lines) != 1:
        bad.append(f"{len(lines)} lines on stderr, not one: {lines[:5]}")
    m = HOLDER.search(said)
    if m is None:
        bad.append(f"stderr does not name the holder: {said!r}")
    elif int(m.group(1)) != first.pid:
        bad.append(f"it names pid {m.group(1)}, the holder is pid {first.pid}")
    if out.read_bytes().strip():
        bad.append("it printed on stdout")
    if first.poll() is not None:
        bad.append(f"the first console ended (exit {first.returncode})")
    mine = [
        e
        for e in read(fleet.state_dir / "journal.jsonl")
        if e.kind is Kind.CONSOLE and e.data.get("pid") == proc.pid
    ]
    if mine:
        bad.append("it journalled: " + "; ".join(e.msg for e in mine))
    if not bad:
        wait_for(
            lambda: (
                (fleet.state_dir / "journal.jsonl").stat().st_size > journal_size
                or fleet.console is None
                or fleet.console.poll() is not None
            ),
            30,
            "the first console to go on journalling",
            interval=0.1,
        )
    inj.violations += [f"second_console: {b}" for b in bad]
    return inj


# ------------------------------------------------------------------ wall_clock_step


def _set_offset(path: Path, seconds: float) -> None:
    """Write the console's clock offset by rename, so its mtime surely changes."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{seconds}\n")
    os.replace(tmp, path)


def wall_clock_step(t: Target) -> Injected:
    """Step the console's wall clock (its test hook) by an hour or two, forward or back, for
    two leases; then step it back. Nothing fences on the wall clock: no incident, no
    failover, no second trainer. The chaos run puts the journal's stepped times back
    (observe.unshift)."""
    fleet = t.fleet
    off = t.rng.choice(CLOCK_STEPS_S)
    fleet.clock_shifts.append(off)
    _set_offset(fleet.clock_offset_file, off)
    at = time.time()

    def stamped_stepped() -> bool:
        """The console has written an event on its stepped clock (it read the step)."""
        now = time.time()
        try:
            tail = list(read(fleet.state_dir / "journal.jsonl", tail_bytes=65536))
        except OSError:
            return False
        return any(abs(e.t - off - now) < 60 for e in tail)

    def two_leases_on() -> bool:
        if fleet.console is None or fleet.console.poll() is not None:
            return True  # every job ended: nothing more to watch
        return time.time() > at + 2 * (LEASE_S + SKEW_S) and stamped_stepped()

    return Injected(
        "wall_clock_step",
        t.job,
        t.host,
        at,
        (),
        note=f"{off:+.0f} s",
        solo=True,
        heal=lambda: _set_offset(fleet.clock_offset_file, 0.0),
        heal_when=two_leases_on,
    )


INJECTORS = {
    "sigstop_past_lease": sigstop_past_lease,
    "console_restart_partitioned": console_restart_partitioned,
    "second_console": second_console,
    "wall_clock_step": wall_clock_step,
}
NEEDS_NAMESPACE = {"sigstop_past_lease", "console_restart_partitioned"}
