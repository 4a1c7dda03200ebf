"""Every operator action once: what it says, what it asks first, and which controller call it
makes. The list views, the detail screens and the command palette all act through these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from console.controller import Controller
from console.reach.transport.local import LocalTransport
from console.service.client import Remote
from console.states import HOST_ORDERS, JobState
from console.ui.targets import failover_confirm


@dataclass(frozen=True)
class Action:
    verb: str
    """How it reads before its target: ``drain gpu-3``."""
    run: Callable[[Controller | Remote, str], object]
    """The call, to this process's controller or to a controller service's socket."""
    help: str
    confirm: str | None = None
    """The question asked first, ``{}`` being the target(s); None for a harmless action."""
    applies: Callable[[Controller, str], bool] = lambda ctl, key: True
    """Whether the palette offers it for this target now."""
    ask_one: Callable[[Controller, str], str] | None = None
    """The question for one target where it says more than ``confirm`` can (the host a
    failover goes to)."""


def _live(ctl: Controller, job: str) -> bool:
    return not ctl.jobs[job].state.is_terminal()


def _startable(ctl: Controller, job: str) -> bool:
    state = ctl.jobs[job].state
    return state.is_terminal() and state is not JobState.FINISHED


def _awaiting(ctl: Controller, job: str) -> bool:
    return ctl.jobs[job].awaiting_approval


def _may(order: str) -> Callable[[Controller, str], bool]:
    """Whether the host order may be given to the host now (``HOST_ORDERS``)."""
    return lambda ctl, host: ctl.fleet.hosts[host].state in HOST_ORDERS[order].given_in


def _killed(ctl: Controller, host: str) -> bool | None:
    """A local demo host: killed or not; None for any other."""
    t = ctl.fleet.hosts[host].transport
    return t.killed if isinstance(t, LocalTransport) else None


JOB_ACTIONS = {
    "fail_over": Action(
        "fail over",
        lambda ctl, job: ctl.fail_over(job),
        "move it to its best spare now",
        "Fail {} over, each to its best host now?",
        _live,
        ask_one=failover_confirm,
    ),
    "approve": Action(
        "approve recovery of",
        lambda ctl, job: ctl.approve(job),
        "a failover under manual, any recovery under observe",
        None,
        _awaiting,
    ),
    "deny": Action(
        "deny recovery of",
        lambda ctl, job: ctl.deny(job),
        "the job stops",
        "Deny the recovery of {}? It stops.",
        _awaiting,
    ),
    "checkpoint": Action(
        "checkpoint", lambda ctl, job: ctl.checkpoint_now(job), "checkpoint now", None, _live
    ),
    "stop": Action(
        "stop",
        lambda ctl, job: ctl.stop_job(job),
        "checkpoint, then the executor exits",
        "Stop {}? It checkpoints and its executor exits.",
        _live,
    ),
    "start": Action(
        "start",
        lambda ctl, job: ctl.start_job(job),
        "start again from its newest checkpoint",
        None,
        _startable,
    ),
}

HOST_ACTIONS = {
    "drain": Action(
        "drain",
        lambda ctl, host: ctl.drain_host(host),
        "move its jobs off with 0 lost steps",
        "Drain {}? Its jobs move off with 0 lost steps.",
        _may("drain"),
    ),
    "undrain": Action(
        "undrain", lambda ctl, host: ctl.undrain(host), "take jobs again", None, _may("undrain")
    ),
    "cordon": Action(
        "cordon",
        lambda ctl, host: ctl.cordon(host),
        "keep its jobs, take no new ones",
        None,
        _may("cordon"),
    ),
    "uncordon": Action(
        "uncordon", lambda ctl, host: ctl.uncordon(host), "take jobs again", None, _may("uncordon")
    ),
    "kill": Action(
        "kill",
        lambda ctl, host: ctl.kill_host(host),
        "simulate a host loss: SIGKILL its executors, unreachable",
        "Kill local host {}? Its executors get SIGKILL and it stops answering.",
        lambda ctl, host: _killed(ctl, host) is False,
    ),
    "revive": Action(
        "revive",
        lambda ctl, host: ctl.revive_host(host),
        "end a simulated host loss: reachable again",
        None,
        lambda ctl, host: _killed(ctl, host) is True,
    ),
}
