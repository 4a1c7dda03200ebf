"""``hotspare report``: a post-mortem of the journal, as markdown.

For each incident: its timeline, fault class, time to detect, the MTTR breakdown (detect,
decide, transfer, start, setup, load, first step) and the steps lost; for an elastic job that
trained at several sizes, its throughput at each; every host provisioned or released, with
its cost in seconds; and per job, its goodput, the steps each class of incident lost and its
checkpoint overhead (``console/records/summary.py`` defines them). ``--json``: the same as one
JSON object, every key of ours snake_case (``breakdown_s``: ``detect``, ``until_stopped``,
``stopped``, ``decide``, ``transfer``, ``start``, ``setup``, ``load``, ``first_step``).

What an incident's figures mean, so that they add up:

- **Outcome**: ``recovered`` once the job trained a step after the fault; otherwise why not:
  ``stopped`` (an operator stopped the job, or denied its failover: the incident ends there,
  not left open), ``failed`` (the job failed first), or ``open`` (recovery under way, or
  waiting for an operator, a host, a lease). The table's ``resolved`` is ``yes`` or ``no:``
  with that reason.
- **A start after a stop belongs to the same story**: a job started again (``g``) whose last
  incident ended it resumes in that incident (phase ``started``), not in a new one: the
  fault is what cost the steps and the time. It then reads ``recovered, after an operator
  stopped the job and started it again``, its MTTR runs from the fault to the first step
  after the start, and its breakdown shows ``until stopped`` and ``stopped`` (the time the
  job stood stopped) apart. The MTTR p50 leaves such incidents out, and says how many: the
  time an operator kept a job stopped is a decision, not the system's time to recover.
- **MTTR** is present exactly when the incident recovered; its parts sum to it.
- **Lost steps** = the last step the console knew done before the fault (its last Progress,
  or a checkpoint's step, whichever is later; a console restarted meanwhile may learn a later
  one) minus the step training resumed from (the earliest resume in the incident: every step
  past it was trained again). A job resumed from step 0 lost every step. Until the job has
  resumed the figure is ``-`` with ``not resumed yet``; a job's summary counts such
  incidents as ``N not resumed`` rather than as 0 steps.
- A stop (``s``) and a start with no fault open no incident: the stop checkpoints, and the
  start resumes from that checkpoint (none lost).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from console.records.incidents import PHASES, Incident, Resolution, incidents
from console.records.journal import Event, Kind, read_all
from console.records.summary import SUMMARY_KINDS, JobSummary, summarise


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


def _fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.2f} {unit}"


def _parts(data: dict[str, Any]) -> str:
    """A provision's seconds by part (making the host, preflight, deploy), where journalled."""
    names = (("made_s", "made"), ("preflight_s", "preflight"), ("deploy_s", "deploy"))
    parts = [f"{label} {data[k]:.1f} s" for k, label in names if isinstance(data.get(k), float)]
    return ", ".join(parts)


def not_clean(warnings: list[str]) -> str:
    """What ``hotspare run`` and the report say of a finish that is not clean."""
    return "not clean: " + "; ".join(warnings)


def render(
    found: list[Incident],
    finished: dict[str, str],
    out: TextIO,
    rates: dict[str, dict[int, list[float]]] | None = None,
    provisions: list[Event] | None = None,
    summaries: list[JobSummary] | None = None,
    dirty: dict[str, list[str]] | None = None,
) -> None:
    """``dirty``: the warnings of each job that finished not clean."""
    out.write("# hotspare post-mortem\n\n")
    if finished:
        out.write("## Jobs finished\n\n| job | params sha256 | clean |\n|---|---|---|\n")
        for job, sha in sorted(finished.items()):
            warnings = (dirty or {}).get(job)
            clean = (
                "yes" if not warnings else " ".join(not_clean(warnings).split()).replace("|", "/")
            )
            out.write(f"| {job} | `{sha}` | {clean} |\n")
        out.write("\n")
    if summaries:
        render_summaries(summaries, out)
    if provisions:
        out.write(
            "## Provisioned hosts\n\n| time | host | what | seconds | note |\n|---|---|---|---|---|\n"
        )
        for e in provisions:
            what = "provision" if "provision" in e.data else "release"
            outcome = e.data.get(what)
            secs = e.data.get("seconds")
            note = e.data.get("error", "") if outcome == "failed" else _parts(e.data)
            note = " ".join(str(note).split()).replace("|", "/")
            out.write(
                f"| {_clock(e.t)} | {e.data.get('host') or '-'} | {what} {outcome} | "
                f"{'-' if secs is None else f'{secs:.1f}'} | {note} |\n"
            )
        out.write("\n")
    resized = {job: by for job, by in (rates or {}).items() if len(by) > 1}
    if resized:
        out.write(
            "## Throughput by size\n\n| job | ranks | steps/s (median) | samples |\n"
            "|---|---|---|---|\n"
        )
        for job, by in sorted(resized.items()):
            for n, xs in sorted(by.items(), reverse=True):
                out.write(f"| {job} | {n} | {statistics.median(xs):.2f} | {len(xs)} |\n")
        out.write("\n")
    if not found:
        out.write("No incidents.\n")
        return
    out.write(
        "## Incidents\n\n| # | job | host | class | detect | MTTR | lost steps | resolved |\n"
    )
    out.write("|---|---|---|---|---|---|---|---|\n")
    for i in found:
        detect = i.breakdown().get("detect")
        resolved = "yes" if i.resolved else "no: " + resolution_text(i).replace("|", "/")
        out.write(
            f"| {i.id} | {i.job} | {i.host} | {i.fault_class} | {_fmt(detect)} | {_fmt(i.mttr_s)} | "
            f"{'-' if i.lost_steps is None else i.lost_steps} | {resolved} |\n"
        )
    out.write(_p50(found))
    for i in found:
        out.write("\n")
        render_incident(i, out)


def render_summaries(summaries: list[JobSummary], out: TextIO) -> None:
    """Per job: wall and training time, goodput, checkpoint overhead, steps lost by class."""
    out.write(
        "## Goodput\n\n| job | wall | training | goodput | checkpoints | checkpoint stall "
        "| stall share | steps lost |\n|---|---|---|---|---|---|---|---|\n"
    )
    for s in summaries:
        lost = ", ".join(
            f"{cls} {x.steps} ({x.incidents} incident{'' if x.incidents == 1 else 's'}"
            + (f", {x.unresumed} not resumed" if x.unresumed else "")
            + ")"
            for cls, x in sorted(s.lost.items())
        )
        out.write(
            f"| {s.job} | {_fmt(s.wall_s)} | {_fmt(s.training_s)} | {_share(s.goodput)} | "
            f"{s.checkpoints} | {_fmt(s.stall_s)} | {_share(s.stall_share)} | {lost or '-'} |\n"
        )
    out.write(
        "\nGoodput: training time / wall time (from each start to its end); training runs "
        "from the first step after a start or a recovery to the next fault. Stall share: "
        "checkpoint stall / training time.\n\n"
    )


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _p50(found: list[Incident]) -> str:
    """The MTTR p50 line: over incidents recovered without an operator's stop (the time a
    job stood stopped is a decision, not the system's time to recover)."""
    mttrs = [i.mttr_s for i in found if i.mttr_s is not None and not i.stopped_once]
    held = sum(1 for i in found if i.resolved and i.stopped_once)
    aside = f" ({held} recovered after an operator's stop left out)" if held else ""
    if not mttrs:
        return (
            f"\nNo MTTR p50: no incident recovered without an operator's stop{aside}.\n"
            if held
            else ""
        )
    return (
        f"\nMTTR p50 {statistics.median(mttrs):.2f} s over {len(mttrs)} resolved "
        f"incident{'' if len(mttrs) == 1 else 's'}{aside}.\n"
    )


def resolution_text(i: Incident) -> str:
    """How an incident ended, in words: recovered, or why not."""
    match i.resolution:
        case Resolution.RECOVERED:
            return (
                "recovered, after an operator stopped the job and started it again"
                if i.stopped_once
                else "recovered"
            )
        case Resolution.STOPPED:
            return (
                f"not recovered: the job was stopped by an operator ({i.ended_why}); "
                "a start resumes it in this incident"
            )
        case Resolution.FAILED:
            return f"not recovered: the job failed ({i.ended_why})"
    return "open: the job has trained no step since the fault"


def render_incident(i: Incident, out: TextIO) -> None:
    """One incident's section: its outcome, MTTR with its breakdown, lost steps, and the
    timeline."""
    out.write(f"## Incident {i.id}: {i.job} on {i.host} ({i.fault_class})\n\n")
    out.write(f"- outcome: {resolution_text(i)}\n")
    parts = ", ".join(f"{k} {v:.2f} s" for k, v in i.breakdown().items())
    out.write(f"- MTTR: {_fmt(i.mttr_s)}" + (f" ({parts})" if parts else "") + "\n")
    resumed = "not resumed yet" if i.resumed_step is None else f"resumed at {i.resumed_step}"
    out.write(
        f"- lost steps: {'-' if i.lost_steps is None else i.lost_steps} "
        f"(last step {i.last_step}, {resumed})\n"
    )
    if i.cause is not None:
        out.write(f"- caused by: {i.cause}\n")
    if i.size is not None:
        size = i.size
        out.write(
            f"- size: {size.get('from', '?')} -> {size.get('to', '?')} of "
            f"{size.get('planned', '?')} hosts\n"
        )
    out.write(f"- fault at {_clock(i.fault_at)}\n\n")
    lines = [
        f"{_clock(e.t)}  {_phase(e):<{PHASE_WIDTH}}  {_detail(i, e)}".rstrip() for e in timeline(i)
    ]
    # A fence of its own, after a blank line: one event a line, shown as written (a list's
    # indented lines would be read as one paragraph of the list, and host text as markdown).
    fence = "`" * max([3, *(len(run) + 1 for line in lines for run in re.findall("`+", line))])
    out.write(f"{fence}text\n" + "".join(f"{line}\n" for line in lines) + f"{fence}\n")


PHASE_WIDTH = max(len(p) for p in PHASES)
FACTS = ("action", "host", "step", "last_step", "load_s")
"""Data of a phase worth a word in its timeline line, in this order."""


def timeline(i: Incident) -> list[Event]:
    """An incident's events in time order: phases seen while a failover was being prepared
    are recorded after the incident opened, back-dated to when they happened."""
    return sorted(i.lines, key=lambda e: e.t)


def _phase(e: Event) -> str:
    return str(e.data.get("phase", ""))


def _detail(i: Incident, e: Event) -> str:
    """What a timeline line says after its time and phase: the event's message without the
    incident, job and phase the line already shows, then the phase's facts."""
    text = " ".join(e.msg.splitlines())  # one event, one line
    text = text.removeprefix(f"incident {i.id}: ").removeprefix(f"{i.job}: ")
    if text in (_phase(e), f"incident {i.id}"):
        text = ""
    facts = [
        f"{k.replace('_', ' ')} {f'{v:.2f} s' if k.endswith('_s') else v}"
        for k in FACTS
        if (v := e.data.get(k)) is not None and not (k == "last_step" and v < i.last_step)
    ]  # a lower last step is a console's that had not seen the run (a start, a restart)
    detected = i.times.get("detected")
    early = _phase(e) != "detected" and detected is not None and e.t < detected
    mark = EARLY if early else ""
    return "; ".join(x for x in (text, ", ".join(facts), mark) if x)


EARLY = "readied before the fault was declared, while the console waited on the host"
"""What a phase timed before ``detected`` says: the failover target was readied while the
console still waited on the host, so its line comes first in the timeline."""


def write_report(state_dir: Path | list[Path], out: TextIO, *, as_json: bool = False) -> int:
    """The post-mortem of one state dir's journal, or of several controllers' journals as
    one timeline (standby controllers: a state dir each)."""
    dirs = state_dir if isinstance(state_dir, list) else [state_dir]
    paths = [d / "journal.jsonl" for d in dirs if (d / "journal.jsonl").exists()]
    if not paths:
        where = ", ".join(str(d / "journal.jsonl") for d in dirs)
        print(
            f"hotspare: {where}: no journal here (has the console run with this state dir?)",
            file=sys.stderr,
        )
        return 2
    events = read_all(paths, kinds={*SUMMARY_KINDS, Kind.ACTION})
    finished = {
        e.job: e.data.get("params_sha256", "") for e in events if e.kind is Kind.FINISHED and e.job
    }
    dirty = {
        e.job: [str(w) for w in e.data.get("warnings") or []]
        for e in events
        if e.kind is Kind.FINISHED and e.job
    }
    dirty = {job: ws for job, ws in dirty.items() if ws}
    provisions = [
        e
        for e in events
        if e.kind is Kind.ACTION
        and (e.data.get("provision") in ("done", "failed") or "release" in e.data)
    ]
    found, summaries = incidents(events), summarise(events)
    if as_json:
        json.dump(_as_json(found, finished, summaries, dirty), out, indent=2)
        out.write("\n")
        return 0
    render(found, finished, out, throughput(events), provisions, summaries, dirty)
    return 0


def _as_json(
    found: list[Incident],
    finished: dict[str, str],
    summaries: list[JobSummary],
    dirty: dict[str, list[str]],
) -> dict[str, object]:
    return {
        "jobs": [s.to_json() for s in summaries],
        "finished": finished,
        "not_clean": dirty,
        "incidents": [
            {
                "id": i.id,
                "job": i.job,
                "host": i.host,
                "class": i.fault_class,
                "cause": i.cause,
                "planned": i.planned,
                "fault_at": i.fault_at,
                "mttr_s": i.mttr_s,
                "breakdown_s": {k.replace(" ", "_"): v for k, v in i.breakdown().items()},
                "last_step": i.last_step,
                "resumed_step": i.resumed_step,
                "lost_steps": i.lost_steps,
                "resolved": i.resolved,
                "outcome": i.resolution.value,
                "ended": i.ended_why or None,
                "stopped_once": i.stopped_once,
            }
            for i in found
        ],
    }


def throughput(events: list[Event]) -> dict[str, dict[int, list[float]]]:
    """Each job's steps/s samples (the journal's progress lines) by the ranks it trained on."""
    out: dict[str, dict[int, list[float]]] = {}
    for e in events:
        rate, size = e.data.get("steps_per_s"), e.data.get("world_size")
        if e.kind is Kind.PROGRESS and e.job and isinstance(size, int) and rate:
            out.setdefault(e.job, {}).setdefault(size, []).append(float(rate))
    return out
