"""An operator's say before a job moves: under the manual and ask policies a failover waits for
an answer (approve, or go ahead by hand); under observe, which never acts alone, every
recovery waits so (a restart in place and a planned move included). A denial stops the job.
Shared by a single-host job's recovery and a multi-host group's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from console.states import FailureKind, JobState
from console.supervise.live import Alert, LiveJob, Transitions
from console.supervise.policy import Decision, Policy, decide


async def approved(
    live: LiveJob,
    *,
    policy: Policy,
    states: Transitions,
    alert: Alert,
    save: Callable[[], object],
    release: Callable[[], None],
    why: str,
    asks: str,
    failover: bool = True,
    operator: bool = False,
) -> bool:
    """Whether the recovery may go ahead. ``why``: what happened; ``asks``: what the operator
    is asked, ending before "; VERB in the console". ``failover``: the job leaves a host after
    a fault (manual asks); False for a restart where it is, or a planned move (an operator's
    drain, a preemption's notice): those go ahead under manual and wait only under observe,
    which never acts alone. ``operator``: an operator asked for it (a drain, a target). A
    denial stops the job (remembered across consoles) and releases its hosts."""
    decision = decide(policy, failover=failover, operator=operator or live.target is not None)
    if decision is Decision.ACT:
        return True
    verb = "approve" if decision is Decision.ASK else "go ahead by hand"
    states.move(JobState.PENDING, f"waiting for an operator to {verb}: {why}")
    alert(f"{asks}; {verb} in the console", job=live.name)
    live.approval = asyncio.get_running_loop().create_future()
    answer = await live.approval
    live.approval = None
    if not answer:
        live.rec.stopped = True
        save()
        states.fail(FailureKind.STOPPED, "failover denied by an operator")
        release()
    return answer
