"""An operator's say before a job moves: under the manual and ask policies a failover waits for
an answer (approve, or go ahead by hand); under observe, which never acts alone, every
recovery waits so (a restart in place and a planned move included). A denial stops the job.
Shared by a single-host job's recovery and a multi-host group's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from console.states import FailureKind, JobState
from console.supervise.live import Alert, LiveJob, Transitions
from console.supervise.outcome import Outcome
from console.supervise.policy import Decision, Policy, decide
from protocol.faults import StopReason


async def approved(
    live: LiveJob,
    *,
    policy: Policy,
    states: Transitions,
    alert: Alert,
    save: Callable[[], object],
    release: Callable[[], None],
    end: Outcome,
    asks: str,
    failover: bool = True,
) -> bool:
    """Whether the recovery of the run that ended so (``end``) may go ahead. ``asks``: what the
    operator is asked, ending before "; VERB in the console". ``failover``: the job leaves a
    host after a fault (manual asks); False for a restart where it is, or a planned move (an
    operator's drain, a preemption's notice): those go ahead under manual and wait only under
    observe, which never acts alone. An operator's own ask (a drain, a target) goes ahead. A
    denial stops the job (remembered across consoles) and releases its hosts."""
    operator = end.reason == StopReason.DRAIN or live.target is not None
    decision = decide(policy, failover=failover, operator=operator)
    if decision is Decision.ACT:
        return True
    verb = "approve" if decision is Decision.ASK else "go ahead by hand"
    states.move(JobState.PENDING, f"waiting for an operator to {verb}: {end.why}")
    alert(f"{asks}; {verb} in the console", job=live.name)
    live.approval = asyncio.get_running_loop().create_future()
    answer = await live.approval
    live.approval = None
    if not answer:
        live.rec.stopped = True
        save()
        what = "failover" if failover else "recovery"  # a restart in place under observe
        states.fail(FailureKind.STOPPED, f"{what} denied by an operator")
        release()
    return answer
