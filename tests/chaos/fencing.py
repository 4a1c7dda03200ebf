"""The fencing checks that do not take the console's word: "no two trainers, ever".

Each returns ``(violations, count)``: one line per violation, and the figure the summary
prints. Evidence, weakest trust first:

- /proc (``chaos.procs``): intervals in which two processes of one job trained at once.
- the disks (``chaos.disk``): the epoch in every manifest published, the kernel's mtime of
  the file, the epoch of every progress line executors wrote (stamped when first seen).
- the journal, only for what it can be trusted with: the time the console sent epoch E+1
  its Start is an upper bound of the end of epoch E's lease (the console sends Start only
  once that lease surely ended), so a file of epoch E published later is stale whatever the
  console believed.

The end of epoch E's lease is bounded by the earliest start of any later epoch, on any of:
the journal's Start of it, its first manifest on any disk (mtime), its first progress or
resumed line seen in any executor's events.jsonl.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.disk import SCAN_S, DiskWatch, Line, Manifest
from chaos.procs import Sampler
from console.records.journal import Event, Kind

PROGRESS_S = 0.5
"""The executor's progress interval (executors/kinds/torch/trainer.py)."""
OWN_START_S = 0.5
"""The epoch's own executor may begin (load, first steps) between the Start leaving the
console and the journal line that records it: only a process seen training this long before
that line is one of an earlier epoch."""
STALE_STEP_SLACK = 2
"""Steps a stale executor may report beyond what it was seen at: the step in flight when it
stopped, reported on its way out, and one of rounding."""


def epoch_starts(events: list[Event], disk: DiskWatch, job: str) -> dict[int, float]:
    """Per epoch, the earliest evidence that it had started training."""
    starts: dict[int, float] = {}

    def note(epoch: int, t: float) -> None:
        if epoch > 0:
            starts[epoch] = min(t, starts.get(epoch, t))

    for e in events:
        if e.job == job and e.kind is Kind.JOB_STATE and e.data.get("to") == "running":
            note(int(e.data.get("epoch", 0)), e.t)
    for m in disk.manifests:
        if m.job == job and not m.replica:
            note(m.epoch, m.mtime)
    for ln in disk.lines:
        if ln.job == job and ln.event.get("kind") in ("progress", "resumed"):
            note(int(ln.event.get("epoch", 0)), ln.seen)
    return starts


def lease_ends(starts: dict[int, float]) -> dict[int, float]:
    """Per epoch, an upper bound of the end of its lease: the first start of any later epoch."""
    out, later = {}, float("inf")
    for epoch in sorted(starts, reverse=True):
        out[epoch] = later
        later = min(later, starts[epoch])
    return out


def _promoted(m: Manifest, replica_inodes: set[tuple[str, int]]) -> bool:
    return (m.host, m.ino) in replica_inodes


def stale_files(disk: DiskWatch, ends: dict[int, float], job: str) -> tuple[list[str], int]:
    """Checkpoints of an epoch published (manifest mtime) after that epoch's lease had ended."""
    replica_inodes = disk.replica_inodes()
    out = []
    for m in disk.manifests:
        if m.job != job or m.replica or _promoted(m, replica_inodes):
            continue
        end = ends.get(m.epoch, float("inf"))
        if m.mtime > end:
            out.append(
                f"{job}: checkpoint step {m.step} of epoch {m.epoch} published on {m.host} at "
                f"{m.mtime:.3f} (mtime), {m.mtime - end:.3f} s after a later epoch had started "
                f"({end:.3f}): {m.path}"
            )
    return out, len(out)


def epoch_hosts(disk: DiskWatch, job: str) -> list[str]:
    """One epoch writes on one host: the same epoch publishing on two is two trainers."""
    replica_inodes = disk.replica_inodes()
    hosts: dict[int, set[str]] = defaultdict(set)
    for m in disk.manifests:
        if m.job == job and not m.replica and not _promoted(m, replica_inodes):
            hosts[m.epoch].add(m.host)
    return [
        f"{job}: epoch {epoch} published checkpoints on {len(hs)} hosts: {sorted(hs)}"
        for epoch, hs in sorted(hosts.items())
        if len(hs) > 1
    ]


def replica_origins(disk: DiskWatch, job: str) -> list[str]:
    """Every replica carries the epoch, step and bytes of a checkpoint an executor published."""
    written = {
        (m.epoch, m.step, m.sha256) for m in disk.manifests if m.job == job and not m.replica
    }
    for ln in disk.lines:
        if ln.job == job and ln.event.get("kind") == "checkpoint":
            man = ln.event.get("manifest", {})
            written.add((int(man.get("epoch", 0)), int(man.get("step", -1)), man.get("sha256")))
    return [
        f"{job}: replica {m.path} (epoch {m.epoch}, step {m.step}) matches no checkpoint "
        "an executor published"
        for m in disk.manifests
        if m.job == job and m.replica and (m.epoch, m.step, m.sha256) not in written
    ]


def stale_steps(
    disk: DiskWatch, ends: dict[int, float], job: str, *, command: bool = False
) -> list[str]:
    """No epoch trains on after its lease: a progress line of epoch E first seen after E's
    lease ended (one scan late at most) reports no step beyond what E was seen at before,
    plus what it could have trained unseen (its rate over one progress interval) and
    ``STALE_STEP_SLACK``. ``command``: the rate a command job reports is no rate (it is
    computed over metrics lines read in one batch: about 1e6 steps/s), so it is bounded by
    the steps between its last two progress lines, at least a progress interval apart."""
    before: dict[tuple[str, int], Line] = {}
    prev: dict[tuple[str, int], Line] = {}
    out = []
    for ln in disk.lines:
        ev = ln.event
        if ln.job != job or ev.get("kind") not in ("progress", "resumed"):
            continue
        epoch, step = int(ev.get("epoch", 0)), int(ev.get("step", 0))
        end = ends.get(epoch, float("inf"))
        key = (ln.host, epoch)
        if ln.seen - SCAN_S <= end:
            if key in before and {ev.get("kind"), before[key].event.get("kind")} == {"progress"}:
                prev[key] = before[key]
            before[key] = ln
            continue
        last = before.get(key)
        if last is None:
            continue
        rate = float(last.event.get("steps_per_s") or 0.0)
        if command and key in prev:
            gone = int(last.event.get("step", 0)) - int(prev[key].event.get("step", 0))
            rate = min(rate, gone / PROGRESS_S)
        allowed = int(last.event.get("step", 0)) + int(rate * PROGRESS_S) + STALE_STEP_SLACK
        if step > allowed:
            out.append(
                f"{job}: epoch {epoch} on {ln.host} reported step {step} at {ln.seen:.3f}, after "
                f"a later epoch had started ({end:.3f}); it was at step "
                f"{last.event.get('step')} before (at most {allowed} allowed)"
            )
    return out


def two_trainers(sampler: Sampler) -> tuple[list[str], int]:
    """Intervals (consecutive sample windows) in which two processes of one job trained."""
    intervals: list[list] = []
    for o in sampler.overlaps:
        pids = sorted(p for p, _ in o.pids)
        last = intervals[-1] if intervals else None
        if last is not None and last[0] == (o.job, pids) and last[3] == o.index - 1:
            last[2], last[3] = o.t1, o.index
            continue
        intervals.append([(o.job, pids), o.t0, o.t1, o.index, o.pids])
    lines = [
        f"{key[0]}: {len(key[1])} executors trained at once from {t0:.3f} to {t1:.3f} "
        f"(CPU of their training threads grew in the same sample windows): {who}"
        for key, t0, t1, _, who in intervals
    ]
    for job in sampler.workdirs:
        if not sampler.seen_training(job):
            lines.append(f"{job}: the sampler never saw an executor train (is it looking?)")
    return lines, len(intervals)


def journal_epochs(events: list[Event], sampler: Sampler, job: str) -> list[str]:
    """The journal's epochs only grow, and each new epoch starts only once every process seen
    training before it has stopped training. The proof is /proc (no window of CPU growth in
    such a process begins after the start), never the console's own line that an executor
    "ended": the console writes that line when it gives up on a link, whether or not the
    executor behind it has stopped."""
    out: list[str] = []
    host: str | None = None
    epoch = 0
    trainers = [t for t in sampler.trainers.values() if t.job == job]
    for e in events:
        if e.job != job or e.kind is not Kind.JOB_STATE or e.data.get("to") != "running":
            continue
        new = int(e.data.get("epoch", 0))
        if new == epoch and e.host == host:
            continue  # reattached by a restarted console
        if new <= epoch:
            out.append(f"{job}: epoch {new} on {e.host} started after epoch {epoch}")
        for t in trainers:
            if not any(w.t1 <= e.t - OWN_START_S for w in t.windows):
                continue  # not seen training before this start (or it is the one started)
            late = next((w for w in t.windows if w.t0 >= e.t), None)
            if late is not None:
                out.append(
                    f"{job}: epoch {new} started on {e.host} at {e.t:.3f}, but pid {t.pid} "
                    f"({t.workdir}), training before, trained again from {late.t0:.3f} to "
                    f"{late.t1:.3f}"
                )
        host, epoch = e.host, new
    return out
