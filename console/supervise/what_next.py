"""What a job does once its run has ended: one decision for every job, a single host's (a
group of one) and a multi-host group's, made from the members' outcomes and their hosts'
fitness alone, no process or link touched (the fault table of docs/guarantees.md).

In order:

- every member finished -> ``FINISH``;
- a member's configuration is bad -> ``CONFIG`` (fail fast: no retry makes it better);
- an operator asked the job to stop, or the run that ended it was stopped on purpose by
  someone else (a ``Stopped`` this console did not ask for) -> ``STOP``;
- a member's host may not take its rank again (lost, preempted, down, draining, failing a
  health rule, being released, to be left: ``unfit``) -> ``REPLACE`` those members;
- else -> ``RESTART`` every member in place: a planned stop (a grow, a Ctrl-C of an executor
  on a host still fit) restarts for free, and so does a member that could not load the step
  chosen (``resume_failed``: the next resume is older), once per host and step; a crash takes
  one of the job's restarts in place (``budgeted``): past the limit the member that ended the
  run is replaced, and a run that crash-looped on a second host fails (``CRASH_LOOP``).

How each act is carried out (an executor kept warm, a twin, a standby, the committed step
promoted) is ``group/recovery.py``'s, for a job on one host (a group of one) and a group alike.
Written once here, the two could no longer drift as they did while each had a supervisor of
its own: a single host's job failed on a ``Stopped`` it did not ask for while a group
restarted, and a single host moved off a host still fit after a planned stop while a group
restarted on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from console.fleet.hosts import Fleet
from console.supervise.outcome import Exit, Outcome
from console.supervise.restart import RestartBudget, not_again_on


class Act(StrEnum):
    FINISH = "finish"
    CONFIG = "config"
    """A member's configuration is bad: the job fails fast."""
    STOP = "stop"
    """Stopped on purpose: by this console's operator, or told so by another."""
    RESTART = "restart"
    """Every member again on its host."""
    REPLACE = "replace"
    """The members in ``Next.replace`` go to other hosts; the others stay."""
    CRASH_LOOP = "crash_loop"
    """The run crash-looped on a second host: the fault follows the job."""


@dataclass(frozen=True)
class Next:
    act: Act
    first: int
    """The member (index into the outcomes) whose end decides: the one that ended the run."""
    replace: tuple[int, ...] = ()
    """``REPLACE``: the members that leave their hosts, by index."""
    planned: bool = False
    """A planned stop among the ends (checkpointed at its step: nothing to restart for)."""
    why: str = ""
    """``REPLACE``: why the first member replaced may not stay; ``CRASH_LOOP``: the loop."""
    retry: bool = False
    """``RESTART``: the first member could not load the step chosen (``resume_failed``): the
    same members again from an older step, which spends no restart the first time for that
    host and step (``budgeted``'s ``free``)."""


def unfit(fleet: Fleet, host: str, outcome: Outcome, leave: dict[str, str]) -> str | None:
    """Why the member that ran on ``host`` and ended so may not take its rank there again
    (None: it may): its host lost, its executor preempted (told its host is going away), or
    one of ``restart.not_again_on``'s (released, failing a health rule, to be left, down,
    draining, drained)."""
    if outcome.exit is Exit.HOST_LOST:
        return "it was lost"
    if outcome.preempted:
        return "it is being preempted"
    return not_again_on(fleet, host, leave)


def what_next(
    ends: Sequence[Outcome],
    first: int,
    *,
    stop_requested: bool,
    unfit: Sequence[str | None],
) -> Next:
    """The act for a run whose members ended so (``ends``, by node rank; one for a single
    host), ``first`` the one that ended it, ``unfit`` each member's host's reason not to take
    its rank again (None: fit). A member that stopped only because its group agreed to (a
    peer's stop) is never the one that ended it: the decision's ``first`` is then the first
    member that ended for a reason of its own. A restart decided here has not taken the
    restart budget yet (``budgeted``)."""
    if len(ends) != len(unfit) or not 0 <= first < len(ends):
        raise ValueError(f"{len(ends)} ends, {len(unfit)} fitness verdicts, first {first}")
    if ends[first].peer_stopped:  # read first, but stopped for another member's end
        first = next((i for i, o in enumerate(ends) if not o.peer_stopped), first)
    refused = next((i for i, o in enumerate(ends) if o.exit is Exit.RESUME_FAILED), None)
    if refused is not None and ends[first].exit is Exit.RUN_CRASHED:
        first = refused  # a peer's collective failed because that member could not load
    if all(o.exit is Exit.FINISHED for o in ends):
        return Next(Act.FINISH, first)
    config = next((i for i, o in enumerate(ends) if o.exit is Exit.CONFIG), None)
    if config is not None:
        return Next(Act.CONFIG, config, why=ends[config].why)
    if stop_requested or (ends[first].exit is Exit.STOPPED and not ends[first].peer_stopped):
        return Next(Act.STOP, first, why=ends[first].why)
    planned = any(o.exit is Exit.PLANNED for o in ends)
    leaving = tuple(i for i, why in enumerate(unfit) if why is not None)
    if leaving:
        why = unfit[first] if unfit[first] is not None else unfit[leaving[0]]
        return Next(Act.REPLACE, first, leaving, planned, why or "")
    retry = ends[first].exit is Exit.RESUME_FAILED
    return Next(Act.RESTART, first, planned=planned, retry=retry)


def budgeted(
    decision: Next,
    restarts: RestartBudget,
    host: str,
    why: str,
    last_step: int,
    *,
    free: bool = False,
) -> Next:
    """A restart after a crash takes one of the job's restarts in place on ``host`` (the first
    member's): within the limit it stands; past it the first member is replaced, unless the
    run crash-looped on a second host (``CRASH_LOOP``). A ``retry`` the caller says is
    ``free`` (a step refused on that host for the first time: the next resume is older, so
    retries end) takes none. Any other decision stands as it is."""
    if decision.act is not Act.RESTART or decision.planned:
        return decision
    if decision.retry and free:
        restarts.retry(host, why, last_step)
        return decision
    if restarts.take(host, why, last_step):
        return decision
    loop = restarts.refused(host, why)
    if loop is not None:
        return Next(Act.CRASH_LOOP, decision.first, why=loop)
    return Next(
        Act.REPLACE,
        decision.first,
        (decision.first,),
        why=f"its {restarts.limit} restarts in place are spent",
    )
