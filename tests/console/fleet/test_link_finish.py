"""An order that is a link's last words reaches the executor (``ExecutorLink.finish``).

A link closed at once leaves an executor busy at that moment (here: frozen, then continued)
with the order and the link's end to read, and a heartbeat to write: the write to the closed
link fails first, and its reader, failed with it, drops the frames it had not handed out (the
asyncio stream raises its error before its buffer). A Stop to a readied executor was never
heard (it sat on the spare until its idle exit), a quitting console's last lease was lost.
Finished instead, the link is shut for writing only and read to the executor's own close.

The executor is real (``serve``, the command kind: no torch); the evidence it heard the Stop
is its process exiting at once, not the console's account.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from support.helpers import REPO, env_with
from support.wait import until

from console.fleet.link import ExecutorLink
from console.reach.transport.local import LocalTransport
from protocol.faults import StopReason
from protocol.messages import Stop

TRIES = 6
"""Closed at once, about one Stop in four was lost (2 of 8 in a row): six tries in a row all
heard is what a finish must give."""
FROZEN_S = 0.3
"""How long the executor stays frozen (the fault): past its heartbeat, due as it wakes."""


def frozen(pid: int) -> bool:
    """The kernel's word: the process is stopped (``T`` in ``/proc/PID/stat``)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


PLAIN_LINKS = (
    "import asyncio, sys, executors.agent.serve as s\n"
    "s.serve_unix = lambda client, sock: asyncio.start_unix_server(client, sock=sock)\n"
    "from executors.cli import main\n"
    "sys.exit(main())"
)
"""The executor with its links served the plain asyncio way, not read to the end
(``executors/agent/streams.py``): the console's ``finish`` is then all that is proven."""


async def stop_as_last_words(
    workdir: Path, *, finish: bool = True, plain_links: bool = False
) -> int | None:
    """An idle executor told Stop as its link's last words while it is frozen, then continued:
    its exit code, or None if it did not exit within 10 s (it never heard the Stop). The link
    finished (``finish``), or closed at once; the executor's links read to the end, or served
    the plain way (``plain_links``)."""
    argv = ["serve", "--workdir", str(workdir), "--kind", "command", "--heartbeat-s", "0.05"]
    head = ["-c", PLAIN_LINKS] if plain_links else ["-m", "executors.cli"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *head, *argv, env=env_with(), cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        socket_path = workdir / "executor.sock"
        await until(lambda: socket_path.exists() or proc.returncode is not None, 30, "a socket")
        link = ExecutorLink(LocalTransport("a"), str(socket_path), "test:1", 0)
        await link.open(timeout=10)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            await until(lambda: frozen(proc.pid), 10, "the executor frozen")
            await link.send(Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
            if finish:
                finishing = asyncio.ensure_future(link.finish(10))
            else:
                link.close()
            await asyncio.sleep(FROZEN_S)  # the fault's length; a finish has begun meanwhile
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        if finish:
            await finishing
        try:
            return await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            return None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_stop_that_is_a_links_last_words_is_heard_by_an_executor_busy_as_it_ends(
    tmp_path: Path,
) -> None:
    """The console's side alone: the executor's links are served the plain way, so a Stop it
    hears is the console's ``finish``'s doing."""
    codes = [await stop_as_last_words(tmp_path / f"w{i}", plain_links=True) for i in range(TRIES)]
    assert None not in codes, f"Stops never heard: {codes}"


async def test_a_stop_on_a_link_closed_at_once_is_still_heard_the_executor_reads_to_the_end(
    tmp_path: Path,
) -> None:
    """The executor's side alone (``executors/agent/streams.py``): a console that closes its
    link at once (an older console, a tool) is still heard, the order read before the end."""
    codes = [await stop_as_last_words(tmp_path / f"w{i}", finish=False) for i in range(TRIES)]
    assert None not in codes, f"Stops never heard: {codes}"
