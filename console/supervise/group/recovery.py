"""What a multi-host job does once an epoch has ended: finish, fail, restart the group in place,
or replace the members whose hosts cannot take their rank again (same world size, rank order
kept), then say the committed step the next epoch resumes from."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.records.journal import Journal, Kind
from console.states import FailureKind, HostState, JobState
from console.supervise.approval import approved
from console.supervise.finish import finish, last_step, release
from console.supervise.group.elastic import Growth
from console.supervise.group.epoch import GroupEpoch
from console.supervise.group.resume import ResumeStep
from console.supervise.group.warm import WarmExecutors
from console.supervise.incident import OpenIncident, preempted_why
from console.supervise.live import Alert, LiveJob, Transitions
from console.supervise.member import Member
from console.supervise.outcome import RESTART_IN_PLACE, WAITING, Exit, Outcome
from console.supervise.policy import Policy
from console.supervise.restart import RestartBudget
from console.supervise.unless_down import HostLost, unless_down
from console.supervise.what_next import Act, budgeted, unfit, what_next


class Pick(Protocol):
    """``Targets.pick``: the host a leaving member goes to, or None."""

    async def __call__(
        self,
        old: str | None,
        *,
        back: bool,
        taken: frozenset[str],
        first: tuple[str, ...],
        to_target: bool,
    ) -> str | None: ...


class OpenMemberIncident(Protocol):
    """Opens the job's incident naming a member (``MemberEvents.open_incident``)."""

    def __call__(self, m: Member, fault_class: str, why: str, planned: bool = False) -> None: ...


class GroupRecovery:
    """Recovery decisions once an epoch has ended, given the members' outcomes."""

    def __init__(
        self,
        live: LiveJob,
        *,
        states: Transitions,
        incident: OpenIncident,
        open_incident: OpenMemberIncident,
        inv: Inventory,
        fleet: Fleet,
        journal: Journal,
        alert: Alert,
        save: Callable[[], object],
        policy: Callable[[], Policy],
        restarts: RestartBudget,
        pick: Pick,
        wait_for_hosts: Callable[[], Awaitable[None]],
        stop_before_start: Callable[[], bool],
        executors: WarmExecutors,
        resume: ResumeStep,
        members: Callable[[], list[str]],
        assign: Callable[[list[str]], None],
        growth: Growth,
        reap: Callable[[str], Awaitable[bool]] | None = None,
        wind_down: Callable[[], Awaitable[None]],
    ) -> None:
        self._live = live
        self._name = live.name
        self._states = states
        self._incident = incident
        self._open_incident = open_incident
        """Open the job's incident naming a member (unless one is open)."""
        self._inv = inv
        self._fleet = fleet
        self._journal = journal
        self._alert = alert
        self._save = save
        """Persist the job's record."""
        self._policy = policy
        self._restarts = restarts
        self._pick = pick
        """Where a leaving member goes (``Targets.pick``)."""
        self._wait_for_hosts = wait_for_hosts
        """Until the fleet may have a usable host again (or a while has passed)."""
        self._stop_before_start = stop_before_start
        self._executors = executors
        self._resume = resume
        self._members = members
        """The job's hosts now, by node rank."""
        self._assign = assign
        """Place the job on these hosts (node ranks in order), spares chosen anew if none left."""
        self._growth = growth
        """The job's size: whether it may shrink, and the host a grow was started for."""
        self._reap = reap
        """Kill what is left of a member's run on a host the console can reach."""
        self._wind_down = wind_down
        """Before the job reads as over: nothing readied for it stays (its warm standby, its
        twin, readied replacements), so an operator's start right after is no refusal ("still
        winding down"), as a single host's was not."""

    def _ended(self, m: Member, end: Outcome) -> str:
        """The journal's line for ``m``'s end: a member's, by node rank; a group of one's (a
        job on one host) in one host's words."""
        if self._inv.multi_host(self._name):
            return f"{self._name}: member {m.node_rank} on {m.host} ended: {end.said()}"
        if end.exit in WAITING and m.waiting:
            return f"{self._name}: the run on {m.host} ended, its executor stays: {end.said()}"
        return f"{self._name}: executor on {m.host} ended: {end.said()}"

    async def recover(self, run: GroupEpoch) -> tuple[int | None] | None:
        """Act on how the epoch ended: the committed step to resume from next (in a tuple: it
        may be None, step 0), or None when the job is over."""
        job, fleet = self._live, self._fleet
        members = run.members
        for m in members:
            assert m.exit is not None
            self._journal.record(
                Kind.EXECUTOR,
                self._ended(m, m.exit),
                job=self._name,
                host=m.host,
                data={"exit": m.exit.exit.value, "step": m.exit.step, "node_rank": m.node_rank},
            )
        job.link = None
        ends = [m.exit for m in members if m.exit is not None]
        first = run.origin() or members[0]
        assert first.exit is not None and len(ends) == len(members)
        leave = job.leave
        decision = what_next(
            ends,
            members.index(first),
            stop_requested=job.stop_requested,
            unfit=[unfit(fleet, m.host, end, leave) for m, end in zip(members, ends, strict=True)],
        )
        if decision.act in (Act.FINISH, Act.CONFIG, Act.STOP):
            await self._wind_down()
        if decision.act is Act.FINISH:
            self._finished(members)
            return None
        if decision.act is Act.CONFIG:
            bad = members[decision.first]
            self._states.fail(FailureKind.CONFIG, f"{bad.host}: {decision.why}")
            self.release()
            return None
        first = members[decision.first]  # a peer's stop read first is never the origin
        assert first.exit is not None
        if decision.act is Act.STOP:
            job.rec.stopped = job.stop_requested
            self._save()
            self._states.fail(
                FailureKind.STOPPED,
                "stopped by an operator"
                if job.stop_requested
                else f"{first.host}: {first.exit.why}",
            )
            self.release()
            return None
        for m in members:
            if m.exit is not None and m.exit.exit is Exit.HOST_LOST:
                fleet.set_state(m.host, HostState.DOWN, m.exit.why)
        planned = decision.planned
        if first.exit.preempted:  # its Fault unread (only its Stopped): a preemption all the same
            cls, why = "preemption", preempted_why(first.host)
        else:
            cls = "host_lost" if first.exit.exit is Exit.HOST_LOST else first.exit.exit.value
            why = f"{first.host}: {first.exit.why}"
        self._open_incident(first, cls, why, planned=planned)
        free = decision.retry and self._resume.retry(first.host, run.resume)
        decision = budgeted(
            decision, self._restarts, first.host, first.exit.why, self._last(members), free=free
        )
        if decision.act is Act.CRASH_LOOP:
            await self._wind_down()
            self._states.fail(FailureKind.CRASH_LOOP, decision.why)
            self.release()
            return None
        if decision.act is Act.RESTART and not planned:
            if not await self._approved(first, "a restart in place", failover=False):
                return None
            return (await self._resume.step([]),)
        replace = [members[i] for i in decision.replace]
        newcomer = self._growth.take() if planned else None
        before = list(self._members())
        if replace:
            hosts = ", ".join(m.host for m in replace)
            if first in replace and first.exit.exit in RESTART_IN_PLACE:  # it could have...
                self._journal.record(  # ...restarted there, but its host may not keep it
                    Kind.ACTION,
                    f"{self._name}: not restarted on {first.host}: {decision.why}; failing over",
                    job=self._name,
                    host=first.host,
                )
            self._states.move(JobState.FAILING_OVER, f"replacing {hosts}: {first.exit.why}")
            # a move planned goes ahead under manual, as a single host's does; under observe
            # it waits (it went ahead unasked under every policy)
            if not await self._approved(first, f"{hosts} replaced", failover=not planned):
                return None
            for m in replace:
                if self._reap is not None and fleet.hosts[m.host].state is not HostState.DOWN:
                    await self._reap(m.host)  # its old run gone before the next epoch trains
            # no await from the choice to the assignment: a host chosen is taken before a
            # release (or another job) can find it free
            targets = await self.targets(
                [m.host for m in replace], survivors=len(members) - len(replace)
            )
            if targets is None:
                return None
            slots: list[str | None] = list(before)
            for m, target in zip(replace, targets, strict=True):
                slots[m.node_rank] = target
            plan = [h for h in slots if h is not None]
            if newcomer is not None and newcomer not in plan:
                plan.append(newcomer)
            job.rec.restarts = 0
            for m in replace:  # a draining host is drained once the job leaves it (_assign)
                job.leave.pop(m.host, None)
            self._decided(before, plan, first, members)
            self._assign(plan)
        elif newcomer is not None:
            plan = [*before, newcomer]
            self._states.move(JobState.RESTARTING, f"growing onto {newcomer}")
            self._decided(before, plan, first, members)
            self._assign(plan)
        else:
            if not await self._approved(first, "a restart in place", failover=False):
                return None
            plan = before
            self._states.move(JobState.RESTARTING, "planned stop: restarting the group")
            self._incident.phase(
                "decided", action="restart", host=first.host, last_step=self._last(members)
            )
        return await self._resumed(before, plan, first, members, planned=planned)

    async def _resumed(
        self,
        before: list[str],
        plan: list[str],
        first: Member,
        members: list[Member],
        *,
        planned: bool,
    ) -> tuple[int | None] | None:
        """The step the next epoch resumes from (``ResumeStep.step``), given up once a host new
        to the job is found down meanwhile (a target that froze with the fault answers nothing
        until the copies' timeouts): its rank goes to another host, chosen as before."""
        while True:
            new = [r for r, h in enumerate(plan) if h not in before]
            try:
                return (
                    await unless_down(
                        self._fleet,
                        [plan[r] for r in new],
                        self._resume.step(new, planned=planned),
                    ),
                )
            except HostLost as e:
                self._journal.record(
                    Kind.ACTION,
                    f"{self._name}: {e.host} was lost while the failover readied it; not used",
                    job=self._name,
                    host=e.host,
                )
                targets = await self.targets([e.host], survivors=len(plan) - 1)
                if targets is None:
                    return None
                slots = [targets[0] if h == e.host else h for h in plan]
                plan = [h for h in slots if h is not None]
                self._decided(before, plan, first, members)
                self._assign(plan)

    def _decided(
        self, before: list[str], plan: list[str], first: Member, members: list[Member]
    ) -> None:
        """The incident's decision: replace members (same size), or shrink or grow the group."""
        added = [h for h in plan if h not in before]
        last = self._last(members)
        if len(plan) == len(before):
            self._incident.phase(
                "decided", action="failover", host=", ".join(added), last_step=last
            )
            return
        change = "shrunk" if len(plan) < len(before) else "grown"
        size = {"from": len(before), "to": len(plan), "planned": self._growth.planned}
        self._incident.phase(
            "decided",
            action="shrink" if change == "shrunk" else "grow",
            host=", ".join(added) or first.host,
            last_step=last,
            size=size,
            **{"class": change},
        )
        self._journal.record(
            Kind.PLACEMENT,
            f"{self._name}: {change} from {len(before)} to {len(plan)} of "
            f"{self._growth.planned} hosts ({', '.join(plan)})",
            job=self._name,
            host=plan[0],
            data={"members": plan, "size": size, "change": change},
        )
        if change == "shrunk":
            self._alert(
                f"{self._name} shrunk to {len(plan)} of {self._growth.planned} hosts (no host "
                f"free to replace {first.host}): same global batch, it grows back when one is",
                job=self._name,
            )

    def _last(self, members: list[Member]) -> int:
        return last_step(self._live, [m.exit for m in members if m.exit is not None])

    def _finished(self, members: list[Member]) -> None:
        job = self._live
        shas = {m.exit.sha256 for m in members if m.exit is not None}
        step = max(m.exit.step or 0 for m in members if m.exit is not None)
        if len(shas) != 1:
            self._states.fail(
                FailureKind.CRASH_LOOP,
                f"members finished with different parameters: {sorted(map(str, shas))}",
            )
            self.release()
            return None
        finish(
            job,
            step=step,
            sha256=shas.pop() or "",
            warnings=[w for m in members if m.exit is not None for w in m.exit.warnings],
            host=members[0].host,
            members=[m.host for m in members],
            states=self._states,
            journal=self._journal,
            alert=self._alert,
            save=self._save,
        )
        self.release()
        return None

    def release(self) -> None:
        """The job is over: every host it held is free (``finish.release``)."""
        release(self._live, self._fleet)

    async def _approved(self, first: Member, what: str, *, failover: bool) -> bool:
        """Whether the policy lets the recovery go ahead (``approval.approved``, as for a
        single host): a replacement after a fault asks under manual; under observe every
        recovery waits for an operator."""
        assert first.exit is not None
        return await approved(
            self._live,
            policy=self._policy(),
            states=self._states,
            alert=self._alert,
            save=self._save,
            release=self.release,
            end=first.exit,
            asks=f"{self._name} needs {what} ({first.exit.why})",
            failover=failover,
        )

    async def targets(
        self, leaving: list[str], *, survivors: int, waits: str | None = None
    ) -> list[str | None] | None:
        """A host for each member leaving (``Targets.pick``, the single host's choice, readied
        executors first). An elastic job that has none for some (None) shrinks, if it keeps
        ``min_hosts``; an operator's target for a lone member is waited for. ``waits``: the
        job's note while it waits for a host (default: a recovery's)."""
        job, fleet = self._live, self._fleet
        # a host left is free (watched by the fleet's probe while the job waits); one lost may
        # be chosen again once it is back, one left up (a drain, a crash past the limit) not
        back = {old for old in leaving if fleet.hosts[old].state is HostState.DOWN}
        for old in leaving:
            fleet.free(old, self._name, f"{self._name} left it")
        while True:
            lone = job.target is not None and len(leaving) == 1  # several: no one target
            chosen: list[str] = []
            for old in leaving:
                pick = await self._pick(
                    old,
                    back=old in back,
                    taken=frozenset(h for h in self._members() if h not in back)
                    | frozenset(chosen),
                    first=tuple(self._executors.ready_hosts()),
                    to_target=lone,
                )
                if pick is None:
                    break
                chosen.append(pick)
            if len(chosen) == len(leaving):
                job.target = None
                return list(chosen)
            if not lone and self._growth.may_shrink(survivors + len(chosen)):
                return [*chosen, *([None] * (len(leaving) - len(chosen)))]
            if job.stop_requested:
                self._stop_before_start()
                return None
            self._states.wait_note(waits or f"no spare left for {self._name}: it waits for a host")
            await self._wait_for_hosts()
