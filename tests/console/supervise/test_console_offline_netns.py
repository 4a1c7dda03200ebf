"""The console's own network out, for real: every host's link cut at once in its network
namespace, so each probe and relink runs into a timeout rather than an error the transport
raises at once. Nothing is failed over; a host is declared lost past its lease only while the
console still reaches some other host. Evidence: the executors' processes in /proc and their
own events, beside the journal's job and host states."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import netbed, sshbed
from support.fleetbed import EXECUTOR_ENV, job_table, slow_python, until, write_inventory
from support.offlinebed import OFFLINE, executors_under

from console.controller import Controller
from console.inventory import load
from console.records.journal import Event, Kind
from console.states import JobState
from console.supervise.launcher import IDLE_EXIT_S
from console.supervise.policy import Policy

# What an executor writes once it trains (protocol/messages.py's tags).
TRAINING = {"progress", "resumed", "checkpoint", "finished"}

pytestmark = pytest.mark.skipif(netbed.unavailable() is not None, reason=str(netbed.unavailable()))


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


async def test_a_console_whose_links_are_all_cut_fails_nothing_over_and_trains_on_after(
    bed: sshbed.SshBed, tmp_path: Path
) -> None:
    a, b = (netbed.ns_host(bed, n) for n in "ab")
    python, slow = slow_python(tmp_path / "bin")  # slow once ``slow`` exists
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": a.inventory_table("r1", python=str(python)),
            "b": b.inventory_table("r1", role="spare"),
        },
        # no warm standby: nothing may start on a spare while offline (a standby is started
        # before; tests/console/supervise/test_warm_standby_default.py covers it)
        jobs={
            "j": {"host": "a", "spares": ["b"], "warm_standby": False, **job_table(steps=100_000)}
        },
    )
    ctl = Controller(
        load(inventory), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "ab"}
    )
    sup = ctl.jobs["j"]
    events: list[Event] = []
    ctl.journal.subscribe(events.append)
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.step >= 20 or task.done(), 120, "step 20")
        assert not task.done(), task
        epoch = sup.epoch
        cut_at = len(events)
        a.netns.cut()
        b.netns.cut()
        await until(lambda: any(OFFLINE in e.msg for e in events) or task.done(), 90, "the alert")
        assert not task.done(), task
        lease_s = ctl.inv.console.lease_s
        # held offline for two more leases: time enough for any wrong decision to be made
        held = asyncio.get_running_loop().time() + 2 * lease_s
        await until(lambda: asyncio.get_running_loop().time() > held or task.done(), 60, "offline")
        while_offline = events[cut_at:]
        moves = [e.data["to"] for e in while_offline if e.kind is Kind.JOB_STATE]
        assert "failing_over" not in moves, moves
        downs = [e.msg for e in while_offline if e.kind is Kind.HOST_STATE and "-> down" in e.msg]
        assert not [m for m in downs if m.startswith("a:")], downs
        assert not executors_under(b.root), "nothing started on the spare"
        a_events = [
            json.loads(x)
            for x in (a.root / "jobs" / "j" / "events.jsonl").read_text().splitlines()
            if x.strip()
        ]
        assert a_events[-1]["kind"] == "stopped" and a_events[-1]["reason"] == "lease_lost", (
            "a stopped itself at its lease's end: the console could not renew it"
        )
        # The worst order: the spare answers first (the console is online again while its job's
        # host has not yet been asked again), and a, whose executor stopped at its lease's end,
        # is slow to start Python (a loaded host). a is healed the moment the console is seen
        # reaching b (a new TCP connection to b in /proc, or b journalled up again), so a host
        # lost is a wrong decision: made on what was heard while the console was cut off, over
        # a connection the outage left stalled, or by an ask cut too short for a slow host.
        slow.touch()
        before = connections_to(b.address, b.port)
        b.netns.heal()
        await until(
            lambda: (
                connections_to(b.address, b.port) - before
                or any(e.msg.startswith("b: down -> up") for e in events[cut_at:])
                or task.done()
            ),
            60,
            "the console to reach b",
        )
        a.netns.heal()
        resumed = sup.step
        await until(
            lambda: (sup.state is JobState.RUNNING and sup.step > resumed + 10) or task.done(),
            120,
            "training again",
        )
        assert not task.done(), task
        assert sup.host == "a" and sup.epoch > epoch, "trained on where it was, a new epoch"
        # Healed, b may answer before a does: b is readied meanwhile (an idle executor, which
        # trains nothing) and dismissed once a answers. It must be gone well before an idle
        # executor leaves by itself (IDLE_EXIT_S), and it must never have trained.
        await until(
            lambda: not executors_under(b.root), IDLE_EXIT_S / 2, "b's readied executor gone"
        )
        trained = [
            line
            for f in b.root.glob("jobs/*/events.jsonl")
            for line in f.read_text().splitlines()
            if json.loads(line).get("kind") in TRAINING
        ]
        assert not trained, f"nothing ever trained on the spare: {trained[:3]}"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await ctl.close()


def connections_to(address: str, port: int) -> set[int]:
    """Local ports of this namespace's established TCP connections to ``address:port``, from
    /proc/net/tcp (addresses in the kernel's little-endian hex)."""
    want = f"{socket.inet_aton(address)[::-1].hex().upper()}:{port:04X}"
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if remote == want and state == "01":  # TCP_ESTABLISHED
            ports.add(int(local.split(":")[1], 16))
    return ports
