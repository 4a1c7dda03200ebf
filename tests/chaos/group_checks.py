"""The checks of a multi-host chaos episode that the single-host ones do not cover: a job whose
members train at once by design, so "one trainer" becomes "one trainer per node rank".

- /proc: never two processes training as one node rank in the same sample window. A process's
  node rank is its host's in the newest epoch that had the host as a member and had begun by
  then: the console's record of whom it started as what (the line it writes before sending any
  Start), never what an executor or the console says about who still trains.
- the executors' own events.jsonl: every ``resumed`` step (other than 0) is one of which each
  node rank had written its shard whole under one earlier epoch (two-phase commit); the shard
  a member loaded is its own rank's; all members of an epoch resume at one step.
- the disks: one node rank of one epoch publishes on one host only.
- the journal's placements: a restart in place (an executor killed or hung, the console
  restarted) keeps every member; a lost member's rank alone moves, to another host.

Stale publishes (an older epoch's checkpoint after a newer epoch began) are chaos.fencing's
``stale_files`` and ``stale_steps``, which hold for groups as they are.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from chaos.disk import DiskWatch
from chaos.faults import Injected
from chaos.observe import executor_events
from chaos.procs import Sampler, Window
from console.records.incidents import Incident
from console.records.journal import Event, Kind


@dataclass(frozen=True)
class Epoch:
    number: int
    t: float
    """When the console recorded it, before it sent any member its Start."""
    members: tuple[str, ...]
    """Hosts by node rank."""


def epochs(events: list[Event], job: str) -> list[Epoch]:
    """Every epoch the console started, oldest first (a reattach is not a new epoch)."""
    return [
        Epoch(int(e.data["epoch"]), e.t, tuple(e.data["members"]))
        for e in events
        if e.job == job and e.kind is Kind.EXECUTOR and "port" in e.data and "members" in e.data
    ]


def rank_at(eps: list[Epoch], host: str, t: float) -> int | None:
    """``host``'s node rank at ``t``: its rank in the newest epoch begun by then that had it."""
    rank = None
    for ep in eps:
        if ep.t > t:
            break
        if host in ep.members:
            rank = ep.members.index(host)
    return rank


def _rank_in(eps: list[Epoch], host: str, epoch: int) -> int | None:
    ep = next((ep for ep in eps if ep.number == epoch), None)
    return None if ep is None or host not in ep.members else ep.members.index(host)


def two_trainers_per_rank(
    sampler: Sampler, eps: list[Epoch], hosts: dict[str, str], job: str
) -> tuple[list[str], int]:
    """Intervals in which two processes trained as one node rank. ``hosts``: workdir -> host."""
    by_window: dict[Window, dict[int, set[tuple[int, str]]]] = defaultdict(lambda: defaultdict(set))
    out: list[str] = []
    for t in sampler.trainers.values():
        if t.job != job:
            continue
        host = hosts[t.workdir]
        for w in t.windows:
            rank = rank_at(eps, host, w.t1)
            if rank is None:
                out.append(
                    f"{job}: pid {t.pid} on {host} trained from {w.t0:.3f} to {w.t1:.3f}, "
                    "before any epoch had that host as a member"
                )
                break
            by_window[w][rank].add((t.pid, host))
    intervals: list[tuple[int, list[tuple[int, str]], float, float]] = []
    for w in sorted(by_window, key=lambda w: w.t0):
        for rank, who in sorted(by_window[w].items()):
            if len(who) < 2:
                continue
            pids = sorted(who)
            last = next((iv for iv in reversed(intervals) if iv[:2] == (rank, pids)), None)
            if last is not None and abs(last[3] - w.t0) < 1e-6:
                intervals[intervals.index(last)] = (rank, pids, last[2], w.t1)
            else:
                intervals.append((rank, pids, w.t0, w.t1))
    out += [
        f"{job}: {len(pids)} processes trained as node rank {rank} from {t0:.3f} to {t1:.3f} "
        f"(CPU of their training threads grew in the same sample windows): {pids}"
        for rank, pids, t0, t1 in intervals
    ]
    if not sampler.seen_training(job):
        out.append(f"{job}: the sampler never saw an executor train (is it looking?)")
    return out, len(intervals)


@dataclass(frozen=True)
class Load:
    host: str
    epoch: int
    step: int
    checkpoint: str | None


def committed_loads(
    workdirs: dict[str, Path],
    eps: list[Epoch],
    disk: DiskWatch,
    job: str,
    nnodes: int,
    *,
    any_shard: bool = False,
) -> tuple[list[str], int]:
    """Every member's resume is of a committed step (or step 0), of its own rank's shard (of
    any rank's with ``any_shard``: a torch-kind group's shards are each the whole replicated
    state, and a replacement may promote another rank's replica of the step), and every
    member of an epoch resumes at the same step; also how many shards were loaded.
    ``workdirs``: host -> the job's workdir there."""
    written: dict[tuple[int, int], set[int]] = defaultdict(set)
    """(step, node rank) -> epochs that wrote that shard whole (CheckpointSaved)."""
    loads: list[Load] = []
    for host, w in workdirs.items():
        for ev in executor_events(w):
            if ev.get("kind") == "checkpoint":
                m = ev["manifest"]
                if m.get("node_rank") is not None and m.get("nnodes") == nnodes:
                    written[(int(m["step"]), int(m["node_rank"]))].add(int(m["epoch"]))
            elif ev.get("kind") == "resumed":
                loads.append(Load(host, int(ev["epoch"]), int(ev["step"]), ev.get("checkpoint")))
    shards: dict[tuple[str, str], list[tuple[int, int | None]]] = defaultdict(list)
    """(host, manifest path) -> (epoch, node rank) of every manifest seen there, in order."""
    for m in disk.manifests:
        if m.job == job and not m.replica:
            shards[(m.host, m.path)].append((m.epoch, m.node_rank))
    out: list[str] = []
    steps: dict[int, set[int]] = defaultdict(set)
    for ld in loads:
        steps[ld.epoch].add(ld.step)
        if ld.checkpoint is None:
            if ld.step != 0:
                out.append(
                    f"{job}: {ld.host} resumed at step {ld.step} of epoch {ld.epoch} from no file"
                )
            continue
        whole = set.intersection(*(written.get((ld.step, r), set()) for r in range(nnodes)))
        if not any(e < ld.epoch for e in whole):
            have = {r: sorted(written.get((ld.step, r), set())) for r in range(nnodes)}
            out.append(
                f"{job}: {ld.host} loaded step {ld.step} at epoch {ld.epoch}, which no earlier "
                f"epoch committed: epochs that wrote each node rank's shard of it: {have}"
            )
        mine = _rank_in(eps, ld.host, ld.epoch)
        # the file at that path when it was loaded: the newest there written by an earlier epoch
        seen = shards.get((ld.host, str(Path(ld.checkpoint).with_suffix(".json"))), [])
        shard = next((r for e, r in reversed(seen) if e < ld.epoch), None)
        if shard is not None and mine is not None and shard != mine and not any_shard:
            out.append(
                f"{job}: {ld.host}, node rank {mine} at epoch {ld.epoch}, loaded node rank "
                f"{shard}'s shard {ld.checkpoint}"
            )
    out += [
        f"{job}: the members of epoch {epoch} resumed at different steps: {sorted(s)}"
        for epoch, s in sorted(steps.items())
        if len(s) > 1
    ]
    return out, len([ld for ld in loads if ld.checkpoint is not None])


def rank_hosts(disk: DiskWatch, job: str) -> list[str]:
    """One node rank of one epoch publishes on one host (a promoted replica is no publish)."""
    replica_inodes = disk.replica_inodes()
    hosts: dict[tuple[int, int | None], set[str]] = defaultdict(set)
    for m in disk.manifests:
        if m.job == job and not m.replica and (m.host, m.ino) not in replica_inodes:
            hosts[(m.epoch, m.node_rank)].add(m.host)
    return [
        f"{job}: node rank {rank} of epoch {epoch} published checkpoints on {sorted(hs)}"
        for (epoch, rank), hs in sorted(hosts.items(), key=str)
        if len(hs) > 1
    ]


IN_PLACE = ("sigkill", "sigstop", "console_restart")
"""Faults after which the group goes on with the same hosts (a restart in place, a reattach)."""
MOVED = ("host_kill", "partition", "sigstop_past_lease")
"""Faults after which the member hit is replaced, every other member keeping its node rank."""


def _placed(events: list[Event], job: str, until: float) -> tuple[str, ...]:
    placed = [
        e
        for e in events
        if e.job == job and e.kind is Kind.PLACEMENT and "members" in e.data and e.t <= until
    ]
    return tuple(placed[-1].data["members"]) if placed else ()


def memberships(events: list[Event], faults: list[Injected], job: str) -> list[str]:
    """A restart in place keeps every member; a lost member's rank alone moves, to another host."""
    out = []
    for f in faults:
        if f.recovered_at is None or f.kind not in (*IN_PLACE, *MOVED):
            continue
        before, after = _placed(events, job, f.t), _placed(events, job, f.recovered_at)
        if f.kind in IN_PLACE:
            ok = after == before
        else:
            rank = before.index(f.host) if f.host in before else -1
            kept = [h for i, h in enumerate(before) if i != rank]
            ok = rank >= 0 and [h for i, h in enumerate(after) if i != rank] == kept
            ok = ok and after[rank] != f.host
        if not ok:
            out.append(
                f"{f.kind} on {f.host}: the members went from {list(before)} to {list(after)}"
            )
    return out


# --------------------------------------------------------------------------- elastic groups
#
# An elastic group (min_hosts below its planned size, no spare) shrinks to its survivors when
# a member is lost and grows back when a host is free: the node ranks are renumbered at each
# change of size, so a rank means something only within one epoch, any member may load any
# member's shard, and a shard of a committed step may have been written at another size.


def elastic_trainers(
    sampler: Sampler, eps: list[Epoch], hosts: dict[str, str], job: str
) -> tuple[list[str], int]:
    """Intervals in which an elastic group had two trainers where it may have one: two
    processes on one host (the job has one executor per host), two as one node rank of one
    epoch, or one training on a host after an epoch that left the host out had begun (a lost
    member's trainer beside the shrunk group: its ranks are the survivors' now). A window is
    the process's on its host's newest epoch begun by its end; ``hosts``: workdir -> host."""
    out: list[str] = []
    slots: dict[str, dict[Window, set[tuple[int, str]]]] = defaultdict(lambda: defaultdict(set))
    """"on HOST" / "as node rank R of epoch E" -> window -> (pid, host) that trained in it."""
    for t in sampler.trainers.values():
        if t.job != job:
            continue
        host = hosts[t.workdir]
        for w in t.windows:
            newest = next((ep for ep in reversed(eps) if ep.t <= w.t0), None)
            if newest is not None and host not in newest.members:
                out.append(
                    f"{job}: pid {t.pid} on {host} trained from {w.t0:.3f} to {w.t1:.3f}, after "
                    f"epoch {newest.number} had begun at {newest.t:.3f} without it "
                    f"(members {list(newest.members)})"
                )
                break
            mine = next((ep for ep in reversed(eps) if ep.t <= w.t1 and host in ep.members), None)
            if mine is None:
                out.append(
                    f"{job}: pid {t.pid} on {host} trained from {w.t0:.3f} to {w.t1:.3f}, "
                    "before any epoch had that host as a member"
                )
                break
            slots[f"on {host}"][w].add((t.pid, host))
            rank = mine.members.index(host)
            slots[f"as node rank {rank} of epoch {mine.number}"][w].add((t.pid, host))
    intervals: list[tuple[str, list[tuple[int, str]], float, float]] = []
    for slot, windows in slots.items():
        for w in sorted(windows, key=lambda w: w.t0):
            who = sorted(windows[w])
            if len(who) < 2:
                continue
            last = intervals[-1] if intervals else None
            if last is not None and last[:2] == (slot, who) and abs(last[3] - w.t0) < 1e-6:
                intervals[-1] = (slot, who, last[2], w.t1)
            else:
                intervals.append((slot, who, w.t0, w.t1))
    for where, pids, t0, t1 in intervals:
        out.append(
            f"{job}: {len(pids)} processes trained {where} from {t0:.3f} to {t1:.3f} (CPU of "
            f"their training threads grew in the same sample windows): {pids}"
        )
    if not sampler.seen_training(job):
        out.append(f"{job}: the sampler never saw an executor train (is it looking?)")
    same = {(tuple(pids), t0, t1) for _, pids, t0, t1 in intervals}  # a host's and its rank's
    return out, len(same) + len([ln for ln in out if "without it" in ln])


def elastic_loads(workdirs: dict[str, Path], eps: list[Epoch], job: str) -> tuple[list[str], int]:
    """Every member's resume is of a committed step (or step 0): one of which some earlier
    epoch wrote every node rank's shard whole at that epoch's size (any size: a step written
    at three members loads at two); any member's shard will do. Every member of an epoch
    resumes at the same step. Also how many shards were loaded."""
    written: dict[tuple[int, int], set[int]] = defaultdict(set)
    """(step, epoch) -> node ranks that wrote their shard of it whole (CheckpointSaved)."""
    sizes: dict[int, int] = {ep.number: len(ep.members) for ep in eps}
    loads: list[Load] = []
    for host, w in workdirs.items():
        for ev in executor_events(w):
            if ev.get("kind") == "checkpoint":
                m = ev["manifest"]
                if m.get("node_rank") is not None:
                    epoch = int(m["epoch"])
                    written[(int(m["step"]), epoch)].add(int(m["node_rank"]))
                    if m.get("nnodes") is not None:
                        sizes.setdefault(epoch, int(m["nnodes"]))
            elif ev.get("kind") == "resumed":
                loads.append(Load(host, int(ev["epoch"]), int(ev["step"]), ev.get("checkpoint")))
    out: list[str] = []
    steps: dict[int, set[int]] = defaultdict(set)
    for ld in loads:
        steps[ld.epoch].add(ld.step)
        if ld.checkpoint is None:
            if ld.step != 0:
                out.append(
                    f"{job}: {ld.host} resumed at step {ld.step} of epoch {ld.epoch} from no file"
                )
            continue
        committed = [
            e
            for (step, e), ranks in written.items()
            if step == ld.step and e < ld.epoch and ranks >= set(range(sizes.get(e, 1 << 30)))
        ]
        if not committed:
            have = {e: sorted(r) for (s, e), r in sorted(written.items()) if s == ld.step}
            out.append(
                f"{job}: {ld.host} loaded step {ld.step} at epoch {ld.epoch}, which no earlier "
                f"epoch committed: node ranks that wrote a shard of it, by epoch: {have} "
                f"(epoch sizes {sizes})"
            )
    out += [
        f"{job}: the members of epoch {epoch} resumed at different steps: {sorted(s)}"
        for epoch, s in sorted(steps.items())
        if len(s) > 1
    ]
    return out, len([ld for ld in loads if ld.checkpoint is not None])


def elastic_memberships(eps: list[Epoch], faults: list[Injected], job: str) -> list[str]:
    """The first epoch after a fault: a restart in place keeps every member (a frozen member
    may also be found silent and left out: a shrink); a lost member is left out and the others
    keep their order (a shrink: no spare, no free host)."""
    out = []
    for f in faults:
        if f.recovered_at is None or f.kind not in (*IN_PLACE, *MOVED):
            continue
        before = next((ep.members for ep in reversed(eps) if ep.t <= f.t), ())
        after = next((ep.members for ep in eps if f.t < ep.t <= f.recovered_at), None)
        if after is None:
            if f.kind in MOVED:
                out.append(f"{f.kind} on {f.host}: no epoch started before it was recovered from")
            continue  # a reattach (console restart) starts no epoch
        shrunk = tuple(h for h in before if h != f.host)
        ok = after == before if f.kind != "sigstop" else after in (before, shrunk)
        if f.kind in MOVED:
            ok = f.host in before and after == shrunk
        if not ok:
            out.append(
                f"{f.kind} on {f.host}: the members went from {list(before)} to {list(after)}"
            )
    return out


def sizes(eps: list[Epoch], job: str, min_hosts: int, planned: int) -> list[str]:
    """No epoch of an elastic group trains below min_hosts, or above its planned size, or on
    one host twice."""
    return [
        f"{job}: epoch {ep.number} started on {list(ep.members)}: {len(ep.members)} members, "
        f"min_hosts {min_hosts}, planned {planned}"
        for ep in eps
        if not min_hosts <= len(set(ep.members)) == len(ep.members) <= planned
    ]


def grows(found: list[Incident], job: str) -> list[str]:
    """Every grow of an elastic group is a planned stop with a checkpoint: resolved, 0 lost."""
    return [
        f"{job}: grow (incident {i.id}) "
        + ("never resolved" if not i.resolved else f"lost {i.lost_steps} steps")
        for i in found
        if i.job == job and i.fault_class == "grown" and (not i.resolved or i.lost_steps != 0)
    ]
