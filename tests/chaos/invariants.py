"""The checks of a chaos run: each returns a list of violations (one line each); empty is good.

- every job finished, with its uninterrupted run's params_sha256;
- never two executors of one job training at once: see chaos.fencing (from /proc, from the
  disks, and from the journal where it can be trusted); here, from the executors' own
  records, no checkpoint of an epoch written after a later epoch started;
- no damaged checkpoint ever loaded, and every checkpoint loaded one some executor reported
  written whole (its manifest's sha256 that of a CheckpointSaved);
- every injected fault an incident in ``hotspare report``, with class, MTTR and lost steps.

A check that could not be made is *inconclusive*, never a pass: a fault's own
(``Injected.inconclusive``: its victim gone before the check, a scene it needs never set up, a
damaged file no loader met) or the episode's (``Result.inconclusive``: a load whose manifest
the disk watcher never saw, a torchrun epoch /proc never showed). Each is counted (per fault
kind in the summary, chaos.runner) and each fails the run (``inconclusive`` makes it a
violation), with one exception, on purpose: an inconclusive of an *overlapped* fault is counted
and listed but fails nothing. A fault that comes while another is being recovered from is aimed
at a job in motion (the host it is being started on, whose lease is not yet persisted; a
damaged replica of a spare the console may no longer fail over to), so the scene its own check
needs is by design often not there; such faults are matched loosely for the same reason
(``match_incidents``: absorbed), and every check of the episode that does not depend on the
fault's own scene (bit-exact finish, two trainers, stale epochs, loads whole) holds for them as
for any other. A fault alone has no such excuse.

MTTR targets a fault measured and missed (``Injected.missed``) are performance targets, not
safety: counted per kind and listed in the summary, they fail nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.disk import DiskWatch, Manifest
from chaos.faults import ARMED, Injected
from chaos.observe import executor_events, json_lines
from console.records.incidents import Incident, incidents
from console.records.journal import Event, Kind

MATCH_SLACK_S = 2.0
"""An incident may be detected this long before the injector returned (it acts first)."""
QUIET_WINDOW_S = 15.0
"""A blip must cause no incident on its job within this long."""
RECOVERY_SLACK_S = 5.0
"""An incident of a fault is detected by the time its job runs again (and this long after)."""
ABSORB_WINDOW_S = 30.0
"""An overlapped fault is absorbed by an incident open within this long of it (at most)."""
LOAD_SEEN_SLACK_S = 1.0
"""The manifest a Resumed line loaded may be seen up to this long after the line: the disk
watcher reads a host's manifests before its events.jsonl in each scan, so one published just
after a scan read the folder is seen the scan after the line. (A step's checkpoint is written
again on the same host only after a later resume from before it: never this soon.)"""


def inconclusive(faults: list[Injected]) -> list[str]:
    """The faults' inconclusives that fail the run (those of faults alone), as violations."""
    return [f"inconclusive: {i}" for f in faults if not f.overlapped for i in f.inconclusive]


def finished(events: list[Event], baselines: dict[str, str]) -> list[str]:
    got = {e.job: e.data.get("params_sha256") for e in events if e.kind is Kind.FINISHED}
    out = []
    for job, want in baselines.items():
        if job not in got:
            out.append(f"job {job} did not finish")
        elif got[job] != want:
            out.append(f"job {job}: params_sha256 {got[job]} != uninterrupted run's {want}")
    return out


def checkpoint_epochs(events: list[Event], workdirs: list[Path], job: str) -> list[str]:
    """No checkpoint of epoch e was written after epoch e+1 (or later) started training."""
    starts: dict[int, float] = {}
    for e in events:
        if e.job == job and e.kind is Kind.JOB_STATE and e.data.get("to") == "running":
            starts.setdefault(int(e.data.get("epoch", 0)), e.t)
    out = []
    for w in workdirs:
        for ev in executor_events(w):
            if ev.get("kind") != "checkpoint":
                continue
            m = ev["manifest"]
            later = [t for ep, t in starts.items() if ep > m["epoch"]]
            if later and m["created_at"] > min(later):
                out.append(
                    f"{job}: checkpoint step {m['step']} of epoch {m['epoch']} in {w} written at "
                    f"{m['created_at']:.3f}, after a later epoch started at {min(later):.3f}"
                )
    return out


def corrupt_loads(faults: list[Injected]) -> tuple[list[str], int]:
    """No executor loaded a damaged file (before something rewrote it); and how many damaged
    files a loader met and skipped. A command job resumes from a copy the executor restored
    into the command's own folder: there the damaged file's step is what names it.

    What an executor loaded is seen only through its own Resumed; around it the harness checks
    what it can itself, and a fault whose damaged file it cannot show was met is inconclusive
    (``Injected.inconclusive``): the damage took (the harness hashed the bytes after damaging
    them: they no longer match the sha256 their manifest vouches for); and the executor that
    next resumed from that folder met the damaged file: it reported skipping it, or loaded it
    (a violation). One that resumed without either, or none at all (the job went elsewhere),
    tried no damaged load. A load from another step is checked by ``loads_whole`` (its
    manifest, as the disk watcher saw it, that of a whole write), and the job's final params
    against the uninterrupted run's."""
    out, skipped = [], 0
    for f in faults:
        for host, path, offset in f.corrupted:
            hashes = f.damage.get(path)
            if hashes is None:
                f.inconclusive.append(
                    f"{f.kind}: {path} on {host}: its bytes or manifest could not be read after "
                    "the damage: that the damage took is not shown"
                )
            elif hashes[0] == hashes[1]:
                f.inconclusive.append(
                    f"{f.kind}: {path} on {host}: the damaged bytes still match the sha256 its "
                    f"manifest vouches for ({hashes[0][:12]}): no damaged load was tried"
                )
            workdir = Path(path).parent.parent
            data = (workdir / "events.jsonl").read_bytes()[offset:] if workdir.exists() else b""
            met, resumed, rewritten = False, None, False
            for ev in json_lines(data):
                kind = ev.get("kind")
                if kind == "checkpoint" and ev.get("path") == path:
                    rewritten = True
                    break  # written again, whole: loading it from now on is fine
                if kind == "fault" and Path(path).name in ev.get("message", ""):
                    skipped += 1
                    met = True
                if kind == "resumed" and _loaded(ev, path):
                    out.append(f"{f.kind}: {host} loaded the damaged {path}")
                    met = True
                    break
                if kind == "resumed" and resumed is None:
                    resumed = ev
                    if not met:
                        break  # the first load after the damage went past it unmet
            if met:
                continue
            if resumed is not None:
                why = (
                    f"the executor that resumed there after the damage (from step "
                    f"{resumed.get('step')}, {resumed.get('checkpoint')}) neither skipped nor "
                    "loaded it"
                )
            elif rewritten:
                why = "it was written again before any executor there resumed"
            else:
                why = "no executor resumed there after the damage"
            f.inconclusive.append(f"{f.kind}: damaged {path} on {host}: {why}: not tried")
    return out, skipped


def _loaded(resumed: dict[str, Any], path: str) -> bool:
    """Did this Resumed load the executor's checkpoint file ``path`` (``.../step-N.pt``)?"""
    loaded = resumed.get("checkpoint")
    if loaded == path:
        return True
    if not loaded or Path(loaded).parent == Path(path).parent:
        return False
    try:  # a command's restored copy: the step names it
        return int(Path(path).stem.removeprefix("step-")) == int(resumed.get("step", -1))
    except (TypeError, ValueError):
        return False


def loaded_manifest(
    disk: DiskWatch, host: str, job: str, step: int, seen: float
) -> Manifest | None:
    """The manifest an executor on ``host`` loaded for ``step``: its workdir's checkpoint of that
    step (a file of its own, or a replica a failover linked there) as the disk watcher saw it,
    the newest seen by the time its Resumed line was (``LOAD_SEEN_SLACK_S``). A command job's
    Resumed names the copy restored into the command's folder: the step names the file."""
    there = [
        m
        for m in disk.manifests
        if m.host == host
        and m.job == job
        and not m.replica
        and m.step == step
        and m.seen <= seen + LOAD_SEEN_SLACK_S
    ]
    return max(there, key=lambda m: m.seen, default=None)


def loads_whole(disk: DiskWatch, job: str) -> tuple[list[str], int, list[str]]:
    """Every checkpoint an executor loaded (a resume or a NaN rollback) is one an executor
    reported written whole (CheckpointSaved, which follows the manifest's rename): the manifest
    it loaded (``loaded_manifest``) vouches for the sha256 of a CheckpointSaved of that step by
    an executor on the same host (its own file), or, where that manifest is a replica's hard
    link (a failover promoted it), by any executor (the replica is a copy of one's file). Not
    merely a step some executor wrote somewhere. Also how many loads there were, and the
    inconclusive: a load whose manifest the watcher never saw, or whose sha256 is that of a
    write on another host though the watcher saw no replica it was linked from."""
    writers: dict[tuple[int, str], set[str]] = {}
    loads = []
    for ln in disk.lines:
        if ln.job != job:
            continue
        ev = ln.event
        if ev.get("kind") == "checkpoint":
            m = ev["manifest"]
            writers.setdefault((int(m["step"]), str(m["sha256"])), set()).add(ln.host)
        elif ev.get("kind") == "resumed" and ev.get("checkpoint"):
            loads.append(ln)
    replicas = disk.replica_inodes()
    bad, unsure = [], []
    for ln in loads:
        step, path = int(ln.event["step"]), ln.event["checkpoint"]
        m = loaded_manifest(disk, ln.host, job, step, ln.seen)
        if m is None:
            unsure.append(
                f"{job}: {ln.host} loaded {path} (step {step}), but the disk watcher never saw a "
                f"manifest of step {step} in its checkpoints: not checked"
            )
            continue
        by = writers.get((step, m.sha256), set())
        promoted = (m.host, m.ino) in replicas
        if ln.host in by or (promoted and by):
            continue
        if by:
            unsure.append(
                f"{job}: {ln.host} loaded {path} (step {step}, sha256 {m.sha256[:12]}), written "
                f"whole on {', '.join(sorted(by))}, but not on {ln.host}, and the watcher saw no "
                "replica it was linked from: not checked"
            )
            continue
        bad.append(
            f"{job}: {ln.host} loaded {path} (step {step}, its manifest's sha256 "
            f"{m.sha256[:12]}), which no executor reported written whole"
            + ("" if promoted else f" on {ln.host}, nor as a replica")
        )
    return bad, len(loads), unsure


@dataclass
class Match:
    fault: Injected
    incident: Incident | None
    ok: bool
    why: str = ""


def match_incidents(
    events: list[Event], faults: list[Injected], report: str
) -> tuple[list[Match], list[Incident], int]:
    """Pair each injected fault with the incident that records it; the incidents no fault
    explains; and how many incidents were put down to overlapping faults.

    A fault alone (nothing else open meanwhile) must have an incident of one of its classes,
    detected from ``MATCH_SLACK_S`` before it until ``RECOVERY_SLACK_S`` after its job was
    seen running again (or until a fault injected after that, if sooner); resolved, with lost steps, and in ``hotspare report``. A blip (no
    classes) must have none on its job from a second before it until ``QUIET_WINDOW_S`` after
    it or its recovery, whichever is later (or until the next fault).

    Overlapped faults are matched more loosely, and on purpose: a fault that comes while
    another is being recovered from may be folded by the console into the recovery under
    way (a second failure during a failover is one failover), so an overlapped fault with
    no incident of its own is *absorbed*: ok if an incident of its job was open when it
    came, with no MTTR and no lost steps of its own; its job must still finish bit-exact,
    and every fencing check holds for it as for any other. An overlapped blip is not
    checked for quiet (the other fault's incidents would be its noise). Incidents left over
    that were detected while an overlapped fault was open (from its injection until
    ``RECOVERY_SLACK_S`` after its job ran again) are put down to the overlap: neither
    unexplained nor false failovers.

    An elastic group's shrink (class ``shrunk``) records the fault its cause is a class of;
    its grows (``grown``, planned) explain no fault and are left out of the leftovers.

    A console restart (either kind) opens a console_restart incident for every job the
    console left running, a leader's kill a console_failover one (``FLEET_WIDE``): those of
    other jobs are its too. An armed NaN/OOM fires at its
    step in every process that trains that step: once more after a recovery that resumed
    from before it; those later incidents of its class on its job are its too.
    """
    found = incidents(events)
    free = list(found)
    starts = [e.t for e in events if e.kind is Kind.CONSOLE and "started" in e.msg]
    matches = []
    ordered = sorted(faults, key=lambda f: f.t)
    for n, f in enumerate(ordered):
        end = min((f.recovered_at or float("inf")) + RECOVERY_SLACK_S, _next_fault(f, ordered))
        if not f.expect:
            if f.overlapped:
                matches.append(Match(f, None, True, "overlapped blip: not checked for quiet"))
                continue
            quiet_end = max(f.t + QUIET_WINDOW_S, f.recovered_at or 0.0)
            last = min([quiet_end] + [g.t - 0.5 for g in ordered[n + 1 :]])
            noisy = [  # a NaN or an OOM comes from the training, never from a blip
                i
                for i in free
                if i.job == f.job
                and i.fault_class not in ARMED
                and f.t - 1 <= i.times.get("detected", 0) <= last
            ]
            why = f"incidents {[i.id for i in noisy]} after a blip" if noisy else ""
            matches.append(Match(f, None, not noisy, why))
            continue
        inc = next(
            (
                i
                for i in free
                if i.job == f.job
                and explains(i, f)
                and f.t - MATCH_SLACK_S <= i.times.get("detected", 0) <= _end(f, i, end, starts)
            ),
            None,
        )
        if inc is None and f.overlapped:
            # Absorbed by an incident open while this fault was being recovered from (one a
            # console restarted meanwhile may open 2 s after it: chaos seed 27 of the 200 run).
            until = min(end, f.t + ABSORB_WINDOW_S)
            open_then = [i for i in found if i.job == f.job and _open_during(i, f.t, until)]
            why = "" if open_then else f"no {'/'.join(f.expect)} incident, and none open then"
            matches.append(Match(f, None, not why, why or "absorbed"))
            continue
        if inc is None:
            matches.append(Match(f, None, False, f"no {'/'.join(f.expect)} incident"))
            continue
        free.remove(inc)
        why = ""
        if not inc.resolved and any(t > inc.times["detected"] for t in starts):
            why = (
                f"not resolved: incident {inc.id} was open when its console died, and the "
                "console after it never closed it"
            )
        elif not inc.resolved:
            why = "not resolved"
        elif inc.lost_steps is None:
            why = "no lost steps"
        elif f"| {inc.id} | {inc.job} | {inc.host} | {inc.fault_class} |" not in report:
            why = "not in the report"
        matches.append(Match(f, inc, not why, why))
    by_overlap = 0
    for f in ordered:
        end = (f.recovered_at or f.t) + RECOVERY_SLACK_S
        for i in list(free):
            detected = i.times.get("detected", 0)
            if not f.t - MATCH_SLACK_S <= detected <= end:
                continue
            if FLEET_WIDE.get(f.kind) == i.fault_class:
                free.remove(i)  # the same restart, seen by another job
                continue
            elif f.overlapped and i.job == f.job:
                free.remove(i)
                by_overlap += 1
    armed = {(f.job, f.kind) for f in faults if f.kind in ARMED}
    free = [i for i in free if (i.job, i.fault_class) not in armed and i.fault_class != GROWN]
    return matches, free, by_overlap


SHRUNK, GROWN = "shrunk", "grown"
"""An elastic group's size changes. A shrink is the recovery from a lost member, its class
``shrunk`` and its cause the class the loss had (host_lost, ...); a grow is a planned stop
when a host is free again: it explains no fault and is no false failover (it is no failure)."""


def _end(f: Injected, i: Incident, end: float, starts: list[float]) -> float:
    """The latest an incident may be detected to record ``f``. A console_restart incident is
    opened by the console that started after the fault, so it records a console restart only
    if opened by then (chaos seed 90 at 3a10194: an earlier overlapped restart's long window
    took the incident of a later one, which was then found without one). Its console starts
    after the fault's time (each injector notes the time before it starts a console or lets a
    standby take over): a start before it is an earlier restart's (chaos seed 49 of the
    200-fault torchrun run at a44d1cf: a restart 1.8 s before this one cut its window short)."""
    if FLEET_WIDE.get(f.kind) != i.fault_class:
        return end
    after = [t for t in starts if t >= f.t]
    return min(end, after[0] + MATCH_SLACK_S) if after else end


def _next_fault(f: Injected, ordered: list[Injected]) -> float:
    """When the first fault injected after ``f`` was seen through came: an incident detected
    from then on is not ``f``'s (its own was detected before it was seen through, and the
    schedule injects nothing while an incident is open). Without this, a fault seen through
    a moment before the next one took that one's incident (chaos seed 7 of the 60-fault
    torchrun run at bfbbf87: an overlapped corrupt_replica, seen through 1.2 s before a
    sigstop_past_lease, took its host_lost incident, and the sigstop_past_lease had none)."""
    if f.recovered_at is None:
        return float("inf")
    return min((g.t for g in ordered if g.t >= f.recovered_at and g is not f), default=float("inf"))


def explains(i: Incident, f: Injected) -> bool:
    """Is the incident of a class that records the fault (a shrink by its cause)?"""
    return i.fault_class in f.expect or (i.fault_class == SHRUNK and i.cause in f.expect)


FLEET_WIDE = {
    "console_restart": "console_restart",
    "console_restart_partitioned": "console_restart",
    "leader_kill": "console_failover",
}
"""Faults of the controller, not of a job, and the class of the incident each opens for
every job it left running (by the controller that starts or takes over after it)."""


def armed_again(
    events: list[Event], armed: dict[str, int], faults: list[Injected]
) -> list[Injected]:
    """An armed NaN or OOM fires once per executor process, so a job restarted from a
    checkpoint before its step (in a new process) meets it again: each such firing the
    executor reported is a fault of its own (seed 70 of the second 200-fault run took one,
    after a failover that resumed from step 0, for an incident after a blip)."""
    seen = {(f.kind, f.job, round(f.t, 3)) for f in faults}
    return [
        Injected(kind, e.job or "", e.host or "", e.t, (kind,), note="armed, fired again")
        for e in events
        for kind in [e.data.get("fault")]
        if e.kind is Kind.FAULT and kind in armed and (kind, e.job or "", round(e.t, 3)) not in seen
    ]


def _open_during(i: Incident, t0: float, t1: float) -> bool:
    """Was the incident open at some moment of [t0, t1] (with the matching slack)?"""
    detected = i.times.get("detected", float("inf"))
    resolved = i.times.get("first_step", float("inf"))
    return detected - MATCH_SLACK_S <= t1 and t0 <= resolved + MATCH_SLACK_S


def false_failovers(leftover: list[Incident]) -> list[Incident]:
    """Incidents no injected fault explains that moved the job to another host."""
    return [
        i for i in leftover if i.data.get("decided", {}).get("action") == "failover" or i.planned
    ]
