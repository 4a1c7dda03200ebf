"""The checks of a chaos run: each returns a list of violations (one line each); empty is good.

- every job finished, with its uninterrupted run's params_sha256;
- never two executors of one job training at once: from the processes (the sampler), from
  the journal (a new epoch on another host only after the old executor was seen to end) and
  from the checkpoints (none of an epoch written after the next epoch started);
- no damaged checkpoint ever loaded;
- every injected fault an incident in ``hotspare report``, with class, MTTR and lost steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chaos.faults import Injected
from chaos.observe import Sampler, executor_events, json_lines
from console.records.incidents import Incident, incidents
from console.records.journal import Event, Kind

MATCH_SLACK_S = 2.0
"""An incident may be detected this long before the injector returned (it acts first)."""
QUIET_WINDOW_S = 15.0
"""A blip must cause no incident on its job within this long."""


def finished(events: list[Event], baselines: dict[str, str]) -> list[str]:
    got = {e.job: e.data.get("params_sha256") for e in events if e.kind is Kind.FINISHED}
    out = []
    for job, want in baselines.items():
        if job not in got:
            out.append(f"job {job} did not finish")
        elif got[job] != want:
            out.append(f"job {job}: params_sha256 {got[job]} != uninterrupted run's {want}")
    return out


def processes(sampler: Sampler) -> list[str]:
    """One line per stretch of samples in which a job had more than one executor training."""
    out, last = [], None
    for o in sampler.overlaps:
        pids = sorted(p for p, _, _ in o.pids)
        if last is not None and last[0] == (o.job, pids):
            last[2] = o.t
            continue
        last = [(o.job, pids), o.t, o.t, o.pids]
        out.append(last)
    lines = [
        f"{key[0]}: {len(key[1])} executors training from {t0:.3f} to {t1:.3f}: {who}"
        for key, t0, t1, who in out
    ]
    for job, pids in sampler.seen_training.items():
        if not pids:
            lines.append(f"{job}: the sampler never saw an executor train (is it looking?)")
    return lines


def journal_epochs(events: list[Event], job: str) -> list[str]:
    """Each new epoch starts after the one before it was seen to end (or on the same host,
    where the workdir lock fences it), and epochs only grow."""
    out: list[str] = []
    host: str | None = None
    epoch = 0
    ended = True
    for e in events:
        if e.job != job:
            continue
        if e.kind is Kind.EXECUTOR and "ended" in e.msg and e.host == host:
            ended = True
        if e.kind is not Kind.JOB_STATE or e.data.get("to") != "running":
            continue
        new = int(e.data.get("epoch", 0))
        if new == epoch and e.host == host:
            continue  # reattached by a restarted console
        if new <= epoch:
            out.append(f"{job}: epoch {new} on {e.host} started after epoch {epoch}")
        if not ended and e.host != host:
            out.append(
                f"{job}: epoch {new} started on {e.host} at {e.t:.3f} before epoch {epoch} "
                f"on {host} was seen to end"
            )
        host, epoch, ended = e.host, new, False
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
    files a loader met and skipped."""
    out, skipped = [], 0
    for f in faults:
        for host, path, offset in f.corrupted:
            workdir = Path(path).parent.parent
            data = (workdir / "events.jsonl").read_bytes()[offset:] if workdir.exists() else b""
            for ev in json_lines(data):
                kind = ev.get("kind")
                if kind == "checkpoint" and ev.get("path") == path:
                    break  # written again, whole: loading it from now on is fine
                if kind == "fault" and Path(path).name in ev.get("message", ""):
                    skipped += 1
                if kind == "resumed" and ev.get("checkpoint") == path:
                    out.append(f"{f.kind}: {host} loaded the damaged {path}")
                    break
    return out, skipped


def loads_whole(workdirs: list[Path], job: str) -> tuple[list[str], int]:
    """Every checkpoint an executor loaded (a resume or a NaN rollback) is one some executor
    wrote whole: its step is that of a CheckpointSaved (which follows the manifest's rename).
    Also how many loads there were."""
    saved, loaded = set(), []
    for w in workdirs:
        for ev in executor_events(w):
            if ev.get("kind") == "checkpoint":
                saved.add(ev["manifest"]["step"])
            elif ev.get("kind") == "resumed" and ev.get("checkpoint"):
                loaded.append((w, ev["step"], ev["checkpoint"]))
    bad = [
        f"{job}: {w} loaded {path} (step {step}), which no executor reported written whole"
        for w, step, path in loaded
        if step not in saved
    ]
    return bad, len(loaded)


@dataclass
class Match:
    fault: Injected
    incident: Incident | None
    ok: bool
    why: str = ""


def match_incidents(
    events: list[Event], faults: list[Injected], report: str
) -> tuple[list[Match], list[Incident]]:
    """Pair each injected fault with the incident that records it; the incidents left over."""
    found = incidents(events)
    free = list(found)
    matches = []
    ordered = sorted(faults, key=lambda f: f.t)
    for n, f in enumerate(ordered):
        if not f.expect:
            end = min([f.t + QUIET_WINDOW_S] + [g.t - 0.5 for g in ordered[n + 1 :]])
            noisy = [
                i for i in free if i.job == f.job and f.t - 1 <= i.times.get("detected", 0) <= end
            ]
            why = f"incidents {[i.id for i in noisy]} after a blip" if noisy else ""
            matches.append(Match(f, None, not noisy, why))
            continue
        inc = next(
            (
                i
                for i in free
                if i.job == f.job
                and i.fault_class in f.expect
                and i.times.get("detected", 0) >= f.t - MATCH_SLACK_S
            ),
            None,
        )
        if inc is None:
            matches.append(Match(f, None, False, f"no {'/'.join(f.expect)} incident"))
            continue
        free.remove(inc)
        why = ""
        if not inc.resolved:
            why = "not resolved"
        elif inc.lost_steps is None:
            why = "no lost steps"
        elif f"| {inc.id} | {inc.job} | {inc.host} | {inc.fault_class} |" not in report:
            why = "not in the report"
        matches.append(Match(f, inc, not why, why))
    return matches, free


def false_failovers(leftover: list[Incident]) -> list[Incident]:
    """Incidents no injected fault explains that moved the job to another host."""
    return [
        i for i in leftover if i.data.get("decided", {}).get("action") == "failover" or i.planned
    ]
