"""Rows and text of the detail screens (a job, a host, the incidents), free of Textual."""

from __future__ import annotations

import time

from console.controller import Controller
from console.fleet.hosts import HostRuntime
from console.records.incidents import Incident, Resolution
from console.records.journal import Event, Kind
from console.records.lineage import brief
from console.replication.replicator import ReplicaState, shard_key
from console.ui.view import Row, age
from protocol.units import MIB, size, used_of

CHECKPOINT_COLUMNS = ("step", "written", "size", "sha256", "verified on")
JOB_INCIDENT_COLUMNS = ("#", "class", "MTTR", "lost steps", "resolved")
INCIDENT_COLUMNS = (
    "#",
    "when",
    "job",
    "host",
    "class",
    "planned",
    "detect",
    "MTTR",
    "lost steps",
    "resolved",
)
GPU_COLUMNS = (
    "GPU",
    "name",
    "util",
    "mem",
    "temp",
    "power",
    "throttle",
    "ECC corr/uncorr",
    "retired/remapped",
    "PCIe replays",
    "XIDs",
)
HEALTH_KINDS = frozenset({Kind.HEALTH, Kind.HOST_STATE, Kind.ALERT})


PARALLEL = {
    "ddp": "ddp: a whole copy on each member",
    "fsdp": "fsdp: model and optimizer sharded, each member holds its part",
}
"""What a multi-host torch job's ``parallel`` means, as its detail says it."""


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def checkpoint_rows(ctl: Controller, job: str, now: float | None = None) -> dict[str, Row]:
    """The newest checkpoints first, each with the hosts known to hold a verified copy: a
    spare holds a step when it holds every shard of it (a group's replica states were
    keyed by shard, and matched against the job's name none was ever listed)."""
    now = time.time() if now is None else now
    sup = ctl.jobs[job]
    shards = sup.shards()
    replicas = {spare: _replicas(ctl, job, spare, shards) for spare in _holders(ctl, job)}
    rows: dict[str, Row] = {}
    for host, m in reversed(sup.checkpoints):
        holders = [host]
        for spare, states in sorted(replicas.items()):
            if all(_holds(st, m.step) for st in states):
                holders.append(f"{spare} (replica)")
        rows[f"{m.step}:{m.sha256}"] = (
            str(m.step),
            f"{age(now - m.created_at)} ago",
            size(m.size),
            m.sha256[:12],
            ", ".join(holders),
        )
    return rows


def _holders(ctl: Controller, job: str) -> list[str]:
    """The job's spares, then any other host a replica of one of its shards was copied to."""
    sup = ctl.jobs[job]
    keys = {shard_key(job, s) for s in sup.shards()}
    return list(dict.fromkeys([*sup.spares, *(h for (k, h) in ctl.replicator.state if k in keys)]))


def _replicas(
    ctl: Controller, job: str, spare: str, shards: list[int | None]
) -> list[ReplicaState]:
    """What ``spare`` holds of each shard of the job (read, never created)."""
    key = ctl.replicator.state.get
    return [key((shard_key(job, s), spare)) or ReplicaState() for s in shards]


def _holds(st: ReplicaState, step: int) -> bool:
    """A verified replica of ``step`` (the newest, or one kept beside it): the same step, as
    the replicator takes a replica of a step to be that step's."""
    return st.manifest is not None and (st.manifest.step == step or step in st.kept)


def replica_lines(ctl: Controller, job: str, now: float | None = None) -> str:
    """Per spare: its newest verified replica, and its disk as last measured before a copy."""
    now = time.time() if now is None else now
    sup = ctl.jobs[job]
    shards = sup.shards()
    holders = _holders(ctl, job)
    lines = []
    if shards != [None]:  # a multi-host job: every member's shard, per spare
        for spare in holders:
            parts = []
            for shard in shards:
                st = ctl.replicator.replica(job, spare, shard)
                parts.append(
                    f"shard {shard} step {st.manifest.step} {size(st.manifest.size)} "
                    f"({age(now - st.at)} ago)"
                    if st.manifest is not None
                    else f"shard {shard} none yet"
                )
            lines.append(f"{spare}: " + "; ".join(parts))
        return "\n".join(lines) or "no spares"
    for spare in holders:
        st = ctl.replicator.replica(job, spare)
        line = f"{spare}: " + (
            f"step {st.manifest.step}, verified {age(now - st.at)} ago"
            if st.manifest is not None
            else "no replica yet"
        )
        if st.disk is not None:
            line += (
                f"; disk {size(st.disk.free)} free of {size(st.disk.total)}"
                f" (measured {age(now - st.disk_at)} ago)"
            )
        lines.append(line + ("  DISK FULL" if st.full else ""))
    return "\n".join(lines) or "no spares"


def lineage_lines(ctl: Controller, job: str) -> str:
    """The newest checkpoints' host, epoch and parent, and where the chain crossed hosts, from
    the journal's recent events (``hotspare lineage JOB`` prints the whole chain)."""
    return "\n".join(brief(ctl.timeline.for_job(job), job)) or "no checkpoints yet"


def resolved_word(i: Incident) -> str:
    """yes; or why not in a word: stopped (by an operator), failed, no (still open)."""
    if i.resolved:
        return "yes"
    return "no" if i.resolution is Resolution.OPEN else i.resolution.value


def incident_row(i: Incident) -> Row:
    return (
        str(i.id),
        clock(i.fault_at),
        i.job,
        i.host,
        i.fault_class,
        "yes" if i.planned else "",
        _secs(i.breakdown().get("detect")),
        _secs(i.mttr_s),
        "-" if i.lost_steps is None else str(i.lost_steps),
        resolved_word(i),
    )


def incident_rows(ctl: Controller) -> dict[str, Row]:
    """Newest first."""
    return {str(i.id): incident_row(i) for i in reversed(ctl.timeline.incidents())}


def job_incident_rows(ctl: Controller, job: str) -> dict[str, Row]:
    return {
        str(i.id): (
            str(i.id),
            i.fault_class,
            _secs(i.mttr_s),
            "-" if i.lost_steps is None else str(i.lost_steps),
            resolved_word(i),
        )
        for i in reversed(ctl.timeline.incidents(job))
    }


def _opt(x: float | int | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def gpu_rows(ctl: Controller, host: str) -> dict[str, Row]:
    """Each GPU's counters from the newest health sample."""
    rt = ctl.fleet.hosts[host]
    if not rt.health:
        return {}
    rows: dict[str, Row] = {}
    for g in rt.health[-1].gpus:
        if g.lost:
            rows[str(g.index)] = (str(g.index), g.name, "LOST", *("-",) * 8)
            continue
        mem = used_of((g.mem_used_mb or 0) * MIB, g.mem_total_mb * MIB) if g.mem_total_mb else "-"
        rows[str(g.index)] = (
            str(g.index),
            g.name,
            _opt(g.util_pct, "{:.0f}%"),
            mem,
            _opt(g.temp_c, "{:.0f}C"),
            _opt(g.power_w, "{:.0f}W"),
            ", ".join(g.throttle) or "",
            f"{_opt(g.ecc_corrected)}/{_opt(g.ecc_uncorrected)}",
            f"{_opt(g.retired_pages_dbe)}/{_opt(g.remapped_rows_uncorrected)}"
            + (" pending" if g.remap_pending else ""),
            _opt(g.pcie_replays),
            ", ".join(map(str, g.xids)),
        )
    return rows


def event_lines(events: list[Event]) -> str:
    return "\n".join(f"{clock(e.t)}  {e.msg}" for e in events)


def _ranks(node: int, procs: int) -> str:
    """A member's ranks: ``rank 2``, or with more than one per host ``node 1: ranks 2-3``."""
    if procs == 1:
        return f"rank {node}"
    return f"node {node}: ranks {node * procs}-{node * procs + procs - 1}"


def job_summary(ctl: Controller, job: str) -> str:
    sup = ctl.jobs[job]
    state = sup.state.value + (f" ({sup.failure.value})" if sup.failure else "")
    spares = ", ".join(sup.spares) or "none"
    hosts = sup.hosts_in_use()
    line = (
        f"Job {job}   {state}   on {', '.join(hosts) or '-'} -> {spares}   epoch {sup.epoch}   "
        f"restarts {sup.rec.restarts}   step {sup.step}/{sup.spec.steps}"
    )
    if len(hosts) < 2:
        return line
    committed = sup.rec.committed[-1] if sup.rec.committed else None
    newest = {h: m for h, m in sup.checkpoints}  # each member's newest checkpoint it said
    procs = sup.meeting.procs_per_host(hosts)
    members = ", ".join(
        f"{h} ({_ranks(r, procs)}, {ctl.fleet.hosts[h].state.value}"
        + (f", part {size(newest[h].size)} @{newest[h].step}" if h in newest else "")
        + ")"
        for r, h in enumerate(hosts)
    )
    per_host = f", {procs} ranks per host" if procs > 1 else ""
    text = (
        f"{line}   committed step {committed if committed is not None else '-'}   "
        f"{PARALLEL[sup.spec.parallel]}{per_host}\n{members}"
    )
    planned, least = len(ctl.inv.members(job)), ctl.inv.min_hosts(job)
    if least < planned:
        now = time.time()
        rates = "; ".join(
            f"{n} ranks {rate:.2f} steps/s ({age(now - at)} ago)"
            for n, (rate, at) in sorted(sup.live.rates.items(), reverse=True)
        )
        text += f"\nsize {len(hosts)} of {planned} planned (min {least})" + (
            f"   throughput by size: {rates}" if rates else ""
        )
    return text


def sample_label(rt: HostRuntime, now: float) -> str:
    """How current the newest sample is: ``now`` (within two of its intervals), ``38s ago,
    OLD`` past that, ``no sample yet``."""
    ago = rt.sample_age(now)
    if ago is None:
        return "no sample yet"
    return f"{age(ago)} ago, OLD" if rt.sample_stale(now) else "now"


def host_summary(ctl: Controller, host: str) -> str:
    rt = ctl.fleet.hosts[host]
    h = ctl.inv.hosts[host]
    now = time.monotonic()
    seen = f"{age(now - rt.last_seen)} ago" if rt.last_seen else "never"
    status = rt.health[-1].gpu_status if rt.health else "no health sample yet"
    if rt.sample_stale(now):
        status += f" ({sample_label(rt, now)})"
    return (
        f"Host {host}   {rt.state.value}   {h.region} / {h.role}   job {rt.job or '-'}   "
        f"last heard {seen}   GPUs: {status}\nruns contained by: {contained_by(rt, now)}"
    )


def contained_by(rt: HostRuntime, now: float) -> str:
    """What contains a run on this host, as its newest health sample says (with its age when
    old): ``cgroup``, ``its fence only (why)``, or that nothing was said yet."""
    said = rt.health[-1].containment if rt.health else ""
    if not said:
        return "not reported yet" if not rt.health else "not reported (an older executor)"
    kind, _, why = said.partition(": ")
    text = "a cgroup of its own (cgroup.kill)" if kind == "cgroup" else f"its fence only ({why})"
    return text + (f" ({sample_label(rt, now)})" if rt.sample_stale(now) else "")
