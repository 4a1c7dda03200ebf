"""One leader among an inventory's controllers, elected through etcd; the others stand by.

A controller campaigns by creating ``PREFIX/leader`` under an etcd lease of its own, in one
transaction that succeeds only if no such key exists. The revision it was created at is the
leader's **term**: it rises on every election, and every executor refuses orders from a link
whose term is lower than one it has seen (``executors/fencing/term.py``). The leader keeps its
etcd lease alive; if it dies, the key goes with its lease and a standby's next try takes it.

What the next leader needs (``state.json``: each lease's bound, epochs, placements, committed
steps, run ids, drains and cordons) is written to ``PREFIX/state`` before the action it
guards, in a transaction that compares the leader key's creation with the term: a deposed
leader's write fails, and it learns it is deposed. A leader acts only while it is sure it
still leads: until its last keepalive was *sent* plus the lease's ttl (the key cannot have
expired sooner). Past that (etcd's quorum lost, the leader's machine cut off or stopped) it
grants nothing, and it ends (a supervisor starts it again, as a standby).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from console.records.state_store import Unsaved
from console.service.etcd import Etcd, EtcdError, created_at, get, put, range_kv

POLL_S = 0.2
"""How often a standby tries for the leader key."""
STATE_BACKOFF_S = 2.0
"""After a state write to etcd failed, the next within this long fails at once (no call):
a leader with no quorum does not stall its loop once per persist."""


@dataclass(frozen=True)
class Won:
    term: int
    state: bytes | None
    """The state the leader before wrote (None: no leader has written one yet)."""
    took_over: float | None
    """Wall time from which this leader replaced one whose lease ran out (its end at the
    earliest); None when the key was free (the first, or one that resigned)."""


class Leadership:
    def __init__(self, etcd: Etcd, prefix: str, me: str, ttl_s: float) -> None:
        self.etcd = etcd
        self.key = f"{prefix.rstrip('/')}/leader"
        self.state_key = f"{prefix.rstrip('/')}/state"
        self.writer_key = f"{prefix.rstrip('/')}/writer"
        """The term of the leader that wrote the state (in the same transaction)."""
        self.resigned_key = f"{prefix.rstrip('/')}/resigned"
        """The term of the newest leader that resigned (a clean stop, not a death)."""
        self.me = me
        self.ttl_s = ttl_s
        self.term = 0
        self.lease = 0
        self.sure_until = 0.0
        """``time.monotonic()`` until which this controller surely still leads."""
        self.deposed: str | None = None
        self._failed_at = -STATE_BACKOFF_S

    # ------------------------------------------------------------ campaigning

    async def campaign(self, waiting: Callable[[str], None]) -> Won:
        """Try for the leader key until won; ``waiting`` is told who leads each time that
        changes (or why etcd cannot be asked)."""
        told = ""
        holder_seen: tuple[str, int] | None = None
        while True:
            try:
                won = await asyncio.to_thread(self._try, holder_seen)
            except EtcdError as e:
                won, why = None, str(e)
            else:
                why = ""
            if isinstance(won, Won):
                return won
            if won is not None:
                holder_seen = won
                why = f"standing by: {won[0]} leads (term {won[1]})"
            if why != told:
                waiting(why)
                told = why
            await asyncio.sleep(POLL_S)

    def _try(self, holder_seen: tuple[str, int] | None) -> Won | tuple[str, int]:
        sent = time.monotonic()  # before the lease is renewed: it lasts a ttl from then at least
        if not self.lease or self.etcd.keepalive(self.lease) == 0:
            self.lease = self.etcd.grant(self.ttl_s)
        ok, revision, responses = self.etcd.txn(
            [created_at(self.key, 0)], [put(self.key, self.me, self.lease)], [get(self.key)]
        )
        if not ok:
            kv = range_kv(responses[0]) if responses else None
            if kv is None:  # gone between the compare and the read: try again
                return ("nobody", 0)
            return (kv.value.decode(errors="replace"), kv.create_revision)
        self.term, self.sure_until = revision, sent + self.ttl_s
        state = self.etcd.get(self.state_key)
        # the key was held and is now free: its holder resigned, or its lease ran out (then it
        # was last heard from a ttl before we saw the key free, at the earliest)
        took_over = None
        if holder_seen is not None and holder_seen[1]:
            resigned = self.etcd.get(self.resigned_key)
            if resigned is None or resigned.value != str(holder_seen[1]).encode():
                took_over = time.time() - self.ttl_s
        return Won(revision, None if state is None else state.value, took_over)

    # ------------------------------------------------------------ leading

    async def hold(self) -> str:
        """Keep the lead until it is lost; returns why (never returns while it holds)."""
        while True:
            await asyncio.sleep(self.ttl_s / 4)
            sent = time.monotonic()
            try:
                left = await asyncio.to_thread(self.etcd.keepalive, self.lease)
            except EtcdError as e:
                if self.doubt() is not None:
                    return f"lost the lead: {e}"
                continue
            if left == 0:
                self.deposed = f"deposed: the etcd lease of term {self.term} has expired"
            if self.deposed is not None:
                return self.deposed
            self.sure_until = max(self.sure_until, sent + self.ttl_s)

    def doubt(self) -> str | None:
        """Why this controller may not act now; None while it surely leads."""
        if self.deposed is not None:
            return self.deposed
        if time.monotonic() >= self.sure_until:
            return f"not sure it still leads: etcd has not renewed term {self.term} in time"
        return None

    def put(self, data: bytes) -> None:
        """The state into etcd, only while this controller's term holds (``Unsaved``)."""
        if (why := self.doubt()) is not None:
            raise Unsaved(why)
        if time.monotonic() - self._failed_at < STATE_BACKOFF_S:
            raise Unsaved("etcd: the last state write failed just now")
        try:
            ok, _, _ = self.etcd.txn(
                [created_at(self.key, self.term)],
                [put(self.state_key, data), put(self.writer_key, str(self.term))],
            )
        except EtcdError as e:
            self._failed_at = time.monotonic()
            raise Unsaved(str(e)) from None
        if not ok:
            self.deposed = f"deposed: term {self.term} is no longer the leader's"
            raise Unsaved(self.deposed)

    async def resign(self) -> None:
        """End the lead now (a clean stop): a standby takes over at its next try."""
        if not self.lease:
            return
        try:
            await asyncio.to_thread(
                self.etcd.txn,
                [created_at(self.key, self.term)],
                [put(self.resigned_key, str(self.term))],
            )
            await asyncio.to_thread(self.etcd.revoke, self.lease)
        except EtcdError:
            pass  # it runs out by itself within its ttl
