"""A controller that leads, or stands by until it may: what ``serve`` and ``run`` start.

Without ``[console] etcd`` a controller leads at once (its state dir's lock is the only
authority). With it, the controller takes its state dir's lock, campaigns through etcd
(``leader.py``) and waits as a standby; once elected it takes the state the leader before it
wrote (the files of this machine are replaced by it), says its term to every executor, writes
its state to etcd before each action that state guards, and runs until its lead is lost. A
leader that loses its lead ends: its supervisor starts it again, and it stands by.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable

import msgspec

from console.controller import Controller
from console.inventory import Inventory
from console.records.console_lock import ConsoleLock
from console.records.journal import Kind
from console.records.state_store import OperatorState, StateStore
from console.service.etcd import Etcd
from console.service.leader import Leadership
from console.supervise.policy import Policy
from protocol.errors import HotspareError

DEPOSED = 3
"""The exit status of a controller that lost its lead (a supervisor starts it again)."""


class LostLead(HotspareError):
    """This controller no longer leads; ``str()`` says why in one line."""

    permanent = False


def take_state_dir(inv: Inventory) -> ConsoleLock:
    """The state dir's lock, held (``StateDirBusy`` names the holder): a standby holds it
    while it waits, so one machine's state dir has one controller, leading or not."""
    lock = ConsoleLock(inv.state_dir)
    lock.acquire()
    return lock


async def open_controller(
    inv: Inventory,
    policy: Policy,
    *,
    lock: ConsoleLock,
    executor_env: dict[str, dict[str, str]],
    say: Callable[[str], None],
) -> tuple[Controller, Leadership | None]:
    """A controller that leads (after standing by, with etcd), and its leadership; ``say``
    is told each change of who leads while this one stands by. The lock is released if
    this raises (cancelled while standing by)."""
    try:
        if not inv.console.etcd:
            return Controller(inv, policy, executor_env=executor_env, lock=lock), None
        me = f"{socket.gethostname()}:{os.getpid()}:{inv.state_dir}"
        leadership = Leadership(
            Etcd(inv.console.etcd), inv.console.etcd_prefix, me, inv.console.leader_ttl_s
        )
        won = await leadership.campaign(say)
        if won.state is not None:
            adopt(inv, won.state)
        ctl = Controller(
            inv,
            policy,
            executor_env=executor_env,
            lock=lock,
            term=won.term,
            took_over=won.took_over,
        )
    except BaseException:
        lock.release()
        raise
    ctl.store.authority = leadership
    say(f"leading as term {won.term}")
    ctl.journal.record(
        Kind.CONSOLE,
        f"leading as term {won.term} (etcd {', '.join(inv.console.etcd)})",
        data={"term": won.term, "took_over": won.took_over is not None},
    )
    return ctl, leadership


def adopt(inv: Inventory, data: bytes) -> None:
    """The leader before's state, as this machine's file (written whole, or ConfigError)."""
    store = StateStore(inv.state_dir)
    try:
        store.state = msgspec.json.decode(data, type=OperatorState)
    except msgspec.DecodeError as e:
        from protocol.errors import ConfigError

        raise ConfigError(f"etcd {inv.console.etcd_prefix}/state: unreadable ({e})") from None
    store.persist()


async def lead(ctl: Controller, leadership: Leadership | None, work: Awaitable[object]) -> object:
    """Run ``work`` (the controller's run) while this controller leads; ``LostLead`` once it
    does not (the work cancelled first, so nothing more is granted)."""
    if leadership is None:
        return await work
    job = asyncio.ensure_future(work)
    held = asyncio.ensure_future(leadership.hold())
    try:
        await asyncio.wait({job, held}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        held.cancel()
        if not job.done():
            job.cancel()
        await asyncio.gather(job, held, return_exceptions=True)
    if held.done() and not held.cancelled() and job.cancelled():
        why = held.result()
        ctl.journal.record(Kind.CONSOLE, f"lost the lead: {why}", data={"term": leadership.term})
        raise LostLead(why)
    return job.result()
