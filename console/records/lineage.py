"""``hotspare lineage JOB``: the chain of a job's checkpoints across hosts and epochs, with the
incidents between them, read from the journal alone (no host need be reachable).

Each checkpoint event keeps what its manifest says of its lineage (``journal_fields``): its
sha256, spec hash, code version and ``protocol.spec.Lineage`` (without the list of code files).
A checkpoint's parent is found among the earlier ones by step and sha256; a parent written on
another host is where the chain crossed hosts (a failover or a migration). Incidents are
placed where the new run began (its executor up, else its decision, else its detection).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import msgspec

from console.records.incidents import Incident, incidents
from console.records.journal import Event, Kind, read_all
from protocol.spec import JOB_NAME_PATTERN, CheckpointManifest

SHORT = 12
"""Hex digits of a hash shown in markdown (the JSON has them whole)."""
KNOWN_BY = (Kind.CHECKPOINT, Kind.INCIDENT, Kind.PLACEMENT, Kind.JOB_STATE, Kind.EXECUTOR)
"""Kinds whose events name the jobs a journal knows."""
NEW_RUN = ("executor_up", "loaded", "decided", "detected")
"""An incident's place in the chain: the first of these phases it reached."""


def journal_fields(m: CheckpointManifest) -> dict[str, Any]:
    """What a checkpoint event keeps of its manifest, so the lineage can be told offline."""
    out: dict[str, Any] = {
        "sha256": m.sha256,
        "spec_hash": m.spec_hash,
        "code_version": m.code_version,
    }
    if m.lineage is not None:
        out["lineage"] = msgspec.to_builtins(msgspec.structs.replace(m.lineage, code_files=[]))
    return out


@dataclass(frozen=True)
class Link:
    """One checkpoint in the chain, as the journal recorded it."""

    at: float
    host: str
    """The inventory's name of the host it was written on."""
    step: int
    epoch: int
    sha256: str | None
    shard: int | None = None
    hostname: str | None = None
    run_id: str | None = None
    spec_hash: str | None = None
    code_version: str | None = None
    code_hash: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    data: str | None = None
    known: bool = False
    """Its manifest had a lineage (a journal written before lineage was recorded has none)."""
    parent_step: int | None = None
    parent_sha256: str | None = None
    parent_host: str | None = None
    """The host its parent was written on, when the parent is in the journal."""

    @property
    def crossed(self) -> bool:
        return self.parent_host is not None and self.parent_host != self.host


def links(events: Iterable[Event], job: str) -> list[Link]:
    """The job's checkpoints in journal order, each with its parent's host when known."""
    found: list[Link] = []
    where: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.kind is not Kind.CHECKPOINT or e.job != job or e.data.get("committed"):
            continue
        d, lin = e.data, e.data.get("lineage")
        lin = lin if isinstance(lin, dict) else {}
        parent = (lin.get("parent_step"), lin.get("parent_sha256"))
        parent_host = where.get(parent) if None not in parent else None
        link = Link(
            at=e.t,
            host=e.host or "?",
            step=int(d.get("step", 0)),
            epoch=int(d.get("epoch", 0)),
            sha256=d.get("sha256"),
            shard=d.get("shard"),
            hostname=lin.get("host"),
            run_id=lin.get("run_id"),
            spec_hash=d.get("spec_hash"),
            code_version=d.get("code_version"),
            code_hash=lin.get("code_hash"),
            git_commit=lin.get("git_commit"),
            git_dirty=lin.get("git_dirty"),
            data=lin.get("data"),
            known=bool(lin),
            parent_step=parent[0],
            parent_sha256=parent[1],
            parent_host=parent_host,
        )
        found.append(link)
        if link.sha256:
            where.setdefault((link.step, link.sha256), link.host)
    return found


def _placed_at(i: Incident) -> float:
    return next((i.times[p] for p in NEW_RUN if p in i.times), i.fault_at)


def chain(events: list[Event], job: str) -> list[Link | Incident]:
    """The job's checkpoints and incidents, in the order they happened."""
    items: list[tuple[float, int, Link | Incident]] = [
        (x.at, n, x) for n, x in enumerate(links(events, job))
    ]
    items += [(_placed_at(i), -1, i) for i in incidents(events) if i.job == job]
    return [x for _, _, x in sorted(items, key=lambda t: (t[0], t[1]))]


# ------------------------------------------------------------------ rendering


def as_json(job: str, items: list[Link | Incident]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for x in items:
        if isinstance(x, Link):
            out.append({"kind": "checkpoint", **asdict(x), "crossed": x.crossed})
        else:
            out.append(
                {
                    "kind": "incident",
                    "id": x.id,
                    "host": x.host,
                    "class": x.fault_class,
                    "cause": x.cause,
                    "fault_at": x.fault_at,
                    "last_step": x.last_step,
                    "resumed_step": x.resumed_step,
                    "lost_steps": x.lost_steps,
                    "resolved": x.resolved,
                }
            )
    return {"job": job, "chain": out}


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _code(text: object) -> str:
    """Text from a host or a spec as a markdown code span, on one line, safe in a table cell."""
    s = " ".join(str(text).split())
    fence = "`" * max([1, *(len(run) + 1 for run in re.findall("`+", s))])
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}".replace("|", "\\|")


def _short(h: str | None) -> str:
    return "-" if not h else _code(h[:SHORT])


def parent_text(x: Link) -> str:
    if x.parent_step is None:
        return "fresh start" if x.known else "-"
    if x.parent_host is None:
        return f"step {x.parent_step} (not in the journal)"
    if x.crossed:
        return f"step {x.parent_step} on {_code(x.parent_host)} (crossed hosts)"
    return f"step {x.parent_step}"


def incident_text(i: Incident) -> str:
    cause = f", caused by {_code(i.cause)}" if i.cause else ""
    lost = "-" if i.lost_steps is None else str(i.lost_steps)
    resumed = "-" if i.resumed_step is None else str(i.resumed_step)
    return (
        f"incident {i.id} on {_code(i.host)} at {_clock(i.fault_at)}: {_code(i.fault_class)}"
        f"{cause}; last step {i.last_step}, resumed at step {resumed}, lost steps {lost}"
        + ("" if i.resolved else " (not resolved)")
    )


def _origin(x: Link) -> str:
    """What a start's checkpoints came from: spec, code, data, machine."""
    parts = [f"spec {_short(x.spec_hash)}", f"code version {_code(x.code_version or '-')}"]
    if x.run_id:
        parts.insert(0, f"run {_code(x.run_id)}")
    if x.code_hash:
        parts.append(f"workload code {_short(x.code_hash)}")
    if x.git_commit:
        parts.append(f"git {_short(x.git_commit)}{' (dirty)' if x.git_dirty else ''}")
    parts.append(f"data {_code(x.data) if x.data else '-'}")
    parts.append(f"hostname {_code(x.hostname) if x.hostname else '-'}")
    return ", ".join(parts)


def render(job: str, items: list[Link | Incident], out: TextIO) -> None:
    found = [x for x in items if isinstance(x, Link)]
    out.write(f"# Lineage of {_code(job)}\n\n")
    hosts = list(dict.fromkeys(x.host for x in found))
    epochs = sorted({x.epoch for x in found})
    n_inc = sum(1 for x in items if isinstance(x, Incident))
    if not found:
        out.write("No checkpoints recorded yet.\n")
    else:
        span = f"epoch {epochs[0]}" + (f" to {epochs[-1]}" if len(epochs) > 1 else "")
        out.write(
            f"{len(found)} checkpoint(s) on {', '.join(map(_code, hosts))}, {span}; "
            f"{n_inc} incident(s).\n"
        )
    epoch: int | None = None
    for x in items:
        if isinstance(x, Incident):
            out.write(f"\n**{incident_text(x)}**\n")
            epoch = None  # the table starts again after it
            continue
        if x.epoch != epoch:
            on = dict.fromkeys(y.host for y in found if y.epoch == x.epoch)
            out.write(f"\n## Epoch {x.epoch} on {', '.join(map(_code, on))}\n\n")
            out.write(f"{_origin(x)}\n\n| time | host | step | sha256 | parent |\n")
            out.write("|---|---|---|---|---|\n")
            epoch = x.epoch
        step = f"{x.step}" + (f" (shard {x.shard})" if x.shard is not None else "")
        out.write(
            f"| {_clock(x.at)} | {_code(x.host)} | {step} | {_short(x.sha256)} | {parent_text(x)} |\n"
        )


def brief(events: list[Event], job: str, last: int = 3) -> list[str]:
    """A few lines for the job's detail view, oldest first: its newest checkpoints with host,
    epoch and parent, then the last two places the chain crossed hosts."""
    found = links(events, job)
    lines = [f"step {x.step} on {x.host}, epoch {x.epoch}, {_came_from(x)}" for x in found[-last:]]
    crossings = [
        f"crossed {x.parent_host} -> {x.host} at step {x.parent_step} (epoch {x.epoch})"
        for x in found
        if x.crossed
    ]
    return lines + crossings[-2:]


def _came_from(x: Link) -> str:
    if x.parent_step is None:
        return "fresh start" if x.known else "parent unknown"
    return f"from step {x.parent_step}" + (f" on {x.parent_host}" if x.crossed else "")


# ------------------------------------------------------------------- the CLI


def write_lineage(
    state_dir: Path | list[Path], job: str, out: TextIO, *, to_json: bool = False
) -> int:
    """``hotspare lineage``: 0, or 2 with one line on stderr (no state dir, unknown job).
    Several state dirs (standby controllers) are read as one timeline."""
    if not re.match(JOB_NAME_PATTERN, job):
        return _fail(f"{job!r} is not a job name (letters, digits, '.', '_', '-')")
    dirs = state_dir if isinstance(state_dir, list) else [state_dir]
    for d in dirs:
        if not d.is_dir():
            return _fail(f"no state dir {d} yet (has the console run with it?)")
    paths = [d / "journal.jsonl" for d in dirs if (d / "journal.jsonl").is_file()]
    where = ", ".join(str(d / "journal.jsonl") for d in dirs)
    if not paths:
        return _fail(f"{where}: no journal here (has the console run with this state dir?)")
    events = read_all(paths, kinds=KNOWN_BY)
    jobs = sorted({e.job for e in events if e.job})
    if job not in jobs:
        return _fail(f"no job {job!r} in {where} (jobs there: {', '.join(jobs) or 'none'})")
    items = chain(events, job)
    if to_json:
        out.write(json.dumps(as_json(job, items), indent=2) + "\n")
    else:
        render(job, items, out)
    return 0


def _fail(text: str) -> int:
    print(f"hotspare: lineage: {text}", file=sys.stderr)
    return 2
