"""Host and job state machines: enums with a written transition table.

A transition not in the table is a bug and raises; every transition the controller makes
is journalled by the caller (``Fleet.set_state`` for hosts, ``Transitions.move`` for jobs).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Generic, NamedTuple, TypeVar

from protocol.errors import HotspareError


class HostState(StrEnum):
    UP = "up"
    """Reachable; its executor (if any) heartbeats."""
    SUSPECT = "suspect"
    """Missed heartbeats for a time window and a count; not yet down (its lease may still run)."""
    DOWN = "down"
    """Unreachable past the end of its lease: its jobs fail over."""
    DRAINING = "draining"
    """An operator or a GPU FAIL asked its jobs to move off (planned migration)."""
    DRAINED = "drained"
    """No jobs; takes none until un-drained."""
    CORDONED = "cordoned"
    """Keeps its jobs but is not given new ones, nor used as a spare."""


HOST_TRANSITIONS: dict[HostState, frozenset[HostState]] = {
    HostState.UP: frozenset(
        {HostState.SUSPECT, HostState.DOWN, HostState.DRAINING, HostState.CORDONED}
    ),
    HostState.SUSPECT: frozenset({HostState.UP, HostState.DOWN, HostState.DRAINING}),
    HostState.DOWN: frozenset({HostState.UP}),
    HostState.DRAINING: frozenset({HostState.DRAINED, HostState.DOWN}),
    HostState.DRAINED: frozenset({HostState.UP, HostState.DOWN}),
    HostState.CORDONED: frozenset(
        {HostState.UP, HostState.DRAINING, HostState.SUSPECT, HostState.DOWN}
    ),
}


class HostOrder(NamedTuple):
    """An operator's order to a host: the state it moves the host to, from the states where it
    may be given. Given anywhere else it would change nothing, so it is refused."""

    to: HostState
    given_in: frozenset[HostState]


HOST_ORDERS: dict[str, HostOrder] = {
    "drain": HostOrder(
        HostState.DRAINING, frozenset({HostState.UP, HostState.SUSPECT, HostState.CORDONED})
    ),
    "undrain": HostOrder(HostState.UP, frozenset({HostState.DRAINED})),
    "cordon": HostOrder(HostState.CORDONED, frozenset({HostState.UP})),
    "uncordon": HostOrder(HostState.UP, frozenset({HostState.CORDONED})),
}
"""Drain and cordon, and what undoes each. A draining host is undrained once drained (its
jobs are already on their way); a down or suspect one is cordoned once it is up."""


def _orders_follow_the_table() -> None:
    for name, order in HOST_ORDERS.items():
        for state in order.given_in:
            if order.to not in HOST_TRANSITIONS[state]:
                raise AssertionError(f"host order {name}: {state} -> {order.to} is not legal")


_orders_follow_the_table()


def host_order_refusal(host: str, state: HostState, order: str) -> str | None:
    """Why ``order`` may not be given to ``host`` in ``state`` (None: it may)."""
    to, given_in = HOST_ORDERS[order]
    if state in given_in:
        return None
    if state is to and to is not HostState.UP:  # "up already" would not say why
        return f"{host} is {state.value} already"
    where = " or ".join(s.value for s in HostState if s in given_in)
    return f"{host} is {state.value}; {order} is for a host that is {where}"


class JobState(StrEnum):
    PENDING = "pending"
    """Not started yet, or waiting for a host (no spare left) or for an operator's approval."""
    DEPLOYING = "deploying"
    """Bundle, workdir and executor being put on a host."""
    RUNNING = "running"
    UNREACHABLE = "unreachable"
    """Its executor is not heard from: the lease it holds is waited out before anything else
    starts (a blip goes back to running). Nothing about it is current."""
    CHECKPOINTING = "checkpointing"
    """A checkpoint-now (drain, preemption) is in flight."""
    FAILING_OVER = "failing_over"
    """Moving to another host: waiting for the lease to end, promoting the replica."""
    RESTARTING = "restarting"
    """Restarting in place after an executor crash."""
    FINISHED = "finished"
    FAILED = "failed"
    """Terminal; ``failure`` says which kind."""
    STOPPED = "stopped"
    """Terminal, and not a failure: an operator stopped it (``s``, or a failover denied); it
    stays stopped under later consoles until started again."""

    def is_terminal(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.STOPPED)


class FailureKind(StrEnum):
    CONFIG = "config"
    """Bad spec, missing torch, auth refused: fail fast, no retry loop."""
    CRASH_LOOP = "crash_loop"
    """The executor kept crashing on every host tried."""
    STOPPED = "stopped"
    """An executor's run stopped though no operator asked. An operator's stop is no failure:
    ``Transitions.fail`` moves such a job to ``JobState.STOPPED``."""


JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # PENDING -> RESTARTING / FAILING_OVER: a console started while the job's host was
    # unreachable waits out the old lease, then acts on what it finds. PENDING -> FINISHED: a
    # console started after the job finished (it never ran under this console).
    JobState.PENDING: frozenset(
        {
            JobState.FINISHED,
            JobState.DEPLOYING,
            JobState.RUNNING,
            JobState.RESTARTING,
            JobState.FAILING_OVER,
            JobState.FAILED,
            JobState.STOPPED,
        }
    ),
    # DEPLOYING -> FINISHED: the executor a console was reattaching to finished meanwhile
    # (its Finished, or its events' last line, came before the link was up).
    JobState.DEPLOYING: frozenset(
        {
            JobState.FINISHED,
            JobState.RUNNING,
            JobState.FAILING_OVER,
            JobState.RESTARTING,
            JobState.PENDING,
            JobState.FAILED,
            JobState.STOPPED,
        }
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.UNREACHABLE,
            JobState.CHECKPOINTING,
            JobState.FAILING_OVER,
            JobState.RESTARTING,
            JobState.FINISHED,
            JobState.FAILED,
            JobState.STOPPED,
            JobState.PENDING,
        }
    ),
    JobState.UNREACHABLE: frozenset(
        {
            JobState.RUNNING,
            JobState.CHECKPOINTING,
            JobState.FAILING_OVER,
            JobState.RESTARTING,
            JobState.FINISHED,
            JobState.FAILED,
            JobState.STOPPED,
            JobState.PENDING,
        }
    ),
    # CHECKPOINTING -> RESTARTING: a planned stop of a group whose members all stay (it grows
    # onto a host that became free, or every member can take its rank again).
    JobState.CHECKPOINTING: frozenset(
        {
            JobState.UNREACHABLE,
            JobState.RUNNING,
            JobState.FAILING_OVER,
            JobState.RESTARTING,
            JobState.FINISHED,
            JobState.FAILED,
            JobState.STOPPED,
            JobState.PENDING,
        }
    ),
    JobState.FAILING_OVER: frozenset(
        {JobState.DEPLOYING, JobState.PENDING, JobState.FAILED, JobState.STOPPED}
    ),
    # RESTARTING -> PENDING: under observe a restart in place waits for an operator.
    JobState.RESTARTING: frozenset(
        {
            JobState.DEPLOYING,
            JobState.FAILING_OVER,
            JobState.PENDING,
            JobState.FAILED,
            JobState.STOPPED,
        }
    ),
    JobState.FINISHED: frozenset(),
    JobState.FAILED: frozenset({JobState.PENDING}),
    JobState.STOPPED: frozenset({JobState.PENDING}),
}

S = TypeVar("S", HostState, JobState)


class IllegalTransition(HotspareError, RuntimeError):
    permanent = True

    pass


class Machine(Generic[S]):
    """One state, changed only along its table."""

    def __init__(self, initial: S, table: dict[S, frozenset[S]]) -> None:
        self.state: S = initial
        self._table: dict[S, frozenset[S]] = table

    def can(self, new: S) -> bool:
        return new == self.state or new in self._table[self.state]

    def move(self, new: S) -> bool:
        """Change state; False if already there; IllegalTransition if not in the table."""
        if new == self.state:
            return False
        if new not in self._table[self.state]:
            raise IllegalTransition(f"{self.state.value} -> {new.value} is not a legal transition")
        self.state = new
        return True
