"""An epoch's Starts: said in the journal (members, master, resume step), then one to each
member, its rendezvous with its node rank and its first lease granted on a current clock
reading (``granted_start``); a member that cannot be Started ends the epoch's run for it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import msgspec

from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Journal, Kind
from console.supervise.group.epoch import GroupEpoch
from console.supervise.lease import NoAnchor
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome
from console.supervise.start_lease import granted_start
from protocol.messages import Rendezvous, Start
from protocol.spec import JobSpec


async def start_epoch(
    run: GroupEpoch,
    links: list[ExecutorLink],
    *,
    rendezvous: Rendezvous,
    spec: JobSpec,
    ttl_s: float,
    reading: Callable[[str, ExecutorLink], Awaitable[ExecutorLink]],
    journal: Journal,
    planned: int,
) -> None:
    """Each of ``run``'s members Started over its link (``links``, by node rank), from node
    rank 0's ``rendezvous``; ``reading``: a link to the same idle executor holding a current
    clock reading; ``planned``: the hosts it is planned on (elastic), for the journal."""
    plan, resume = [m.host for m in run.members], rendezvous.resume_step
    journal.record(
        Kind.EXECUTOR,
        f"{spec.name}: epoch {run.epoch} on {', '.join(plan)}, master "
        f"{rendezvous.master_addr}:{rendezvous.master_port}, "
        + (f"resuming from committed step {resume}" if resume else "from step 0"),
        job=spec.name,
        host=plan[0],
        data={
            "epoch": run.epoch,
            "members": plan,
            "port": rendezvous.master_port,
            "resume": resume,
            "planned": planned,
        },
    )
    for m, link in zip(run.members, links, strict=True):
        m.link = link
        ours = msgspec.structs.replace(rendezvous, node_rank=m.node_rank)

        def grant(link: ExecutorLink, m: Member = m, ours: Rendezvous = ours) -> Start:
            m.link = link
            return run.start(m, spec, ours)

        try:  # granted on a current reading, and again if the grant spent half of it
            link, start = await granted_start(
                link,
                m.host,
                job=spec.name,
                ttl_s=ttl_s,
                reading=functools.partial(reading, m.host),
                grant=grant,
                journal=journal,
            )
            await link.send(start)
        except LinkError as e:
            run.ended(m, Outcome(Exit.CRASHED, f"executor on {m.host} went away: {e}"))
        except NoAnchor as e:  # its bound could not be persisted (the disk filled again)
            run.ended(m, Outcome(Exit.CRASHED, f"not started on {m.host}: {e}"))
