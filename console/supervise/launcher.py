"""Starting one job's executors on hosts: deploy, the replica put in place, the detached
process, and a link to that process and no other.

It is given what it needs (the hosts' transports, the inventory's paths, the journal, a way
to mark incident phases), not the controller: supervision decides *where* and *when*, this
only knows *how*.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from console.fleet.link import ExecutorLink, LinkError
from console.inventory import Inventory
from console.reach.deploy import deploy, executor_command, job_dir
from console.reach.transport.base import Transport, TransportError
from console.records.journal import Journal, Kind
from console.supervise.outcome import Exit, Outcome
from protocol.faults import StopReason
from protocol.messages import ExecutorState, Prepare, Stop
from protocol.workdirs import EXECUTOR_SOCKET, TWIN_SOCKET

START_TIMEOUT_S = 90.0
POLL_S = 0.2
IDLE_EXIT_S = 60
"""An executor started here that no console talks to and that was never told Start exits
after this long: an orphan cannot sit on a host's workdir."""


class CleanUps:
    """The console's clean-ups that outlive the task they come from (an executor started for a
    start that was cancelled, told to go and waited out), kept referenced until done. The
    console waits for them before it closes: a warm standby still coming up when its job
    failed was cancelled, its stop left to a clean-up, and ``hotspare run`` returned with the
    standby alive until its idle exit. A job started again does not wait for them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def outlive(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Until every clean-up has ended (each is bounded by its own timeouts)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class Phase(Protocol):
    def __call__(self, phase: str, **data: object) -> None: ...


class Launcher:
    def __init__(
        self,
        job: str,
        *,
        inv: Inventory,
        transport: Callable[[str], Transport],
        journal: Journal,
        phase: Phase,
        console_id: str,
        term: int = 0,
        executor_env: dict[str, dict[str, str]],
        ended: Callable[[str], Awaitable[Outcome]],
        cleanups: CleanUps,
    ) -> None:
        self.job = job
        self._inv = inv
        self._transport = transport
        self._journal = journal
        self._phase = phase
        self._console_id = console_id
        self._term = term
        self._env = executor_env
        self._ended = ended
        """How an executor that is gone ended (read from its workdir)."""
        self.dismissed: set[tuple[str, int]] = set()
        """(host, pid) of executors told they are not needed: one may still answer on the
        socket a new executor on that host is about to serve."""
        self.standbys: set[tuple[str, int]] = set()
        """(host, pid) of the warm standbys this console started: one found idle on the
        workdir by a later start (a failover that found no standby ready when it chose its
        target) is the standby, readied before the fault, not an earlier console's."""
        self._cleanups = cleanups
        self._stopping: dict[str, set[asyncio.Event]] = {}
        """Per host, the executors of cancelled starts still being stopped (``_stop_unlinked``):
        one may hold the workdir's lock before it serves the socket, so a start there waits
        for them, or the executor it starts is refused (found by the suite: a standby's start
        cancelled by a stop, the job started again at once on that host)."""

    def carry_from(self, before: Launcher) -> None:
        """The job started again by an operator: what the launcher of its supervision before
        knew of the executors it started and dismissed, and of those it is still stopping (a
        standby whose start the stop cancelled), is this one's: a start on that host waits for
        them, and takes none of them for an earlier console's."""
        self.dismissed = before.dismissed
        self.standbys = before.standbys
        self._stopping = before._stopping

    def socket(self, host: str) -> str:
        return posixpath.join(self.workdir(host), EXECUTOR_SOCKET)

    def workdir(self, host: str) -> str:
        return job_dir(self._inv.host_root(host), self.job)

    def link(self, host: str, *, twin: bool = False) -> ExecutorLink:
        """A new, unopened link to whatever serves the job's socket on ``host`` (``twin``: the
        warm twin's, ``twin.sock``)."""
        path = posixpath.join(self.workdir(host), TWIN_SOCKET) if twin else self.socket(host)
        return ExecutorLink(self._transport(host), path, self._console_id, self._term)

    def relink(self, link: ExecutorLink) -> ExecutorLink:
        """A new, unopened link to what serves ``link``'s socket (the job's, or its twin's)."""
        return ExecutorLink(link.transport, link.socket_path, self._console_id, self._term)

    # ------------------------------------------------------------ starting

    async def start(
        self,
        host: str,
        *,
        released: Callable[[str], None],
        standby: bool = False,
    ) -> ExecutorLink | Outcome:
        """An idle executor on ``host`` (warmed up for the job's kind, waiting for Start), linked; or why not.

        ``released``: called with the host once an executor started for a start that was
        cancelled has been stopped (the host is free again).
        ``standby``: a warm standby, started for no fault: its coming up is no incident's phase,
        even when a failover prepared meanwhile waits for it and takes it.
        """
        t = self._transport(host)
        root, python = self._inv.host_root(host), self._inv.python(host)
        workdir = self.workdir(host)
        for stopping in list(self._stopping.get(host, ())):  # each bounded by its timeout
            await stopping.wait()
        try:
            await t.connect()
            bundle = await deploy(t, root, python)
            await t.makedirs(workdir)
            left = await self._left_behind(host, standby=standby)
            if left is not None:
                return left
            pid = await self._detached(host, bundle.path, twin=False)
        except TransportError as e:
            return Outcome(Exit.HOST_LOST, f"cannot start on {host}: {e}")
        if standby:
            self.standbys.add((host, pid))
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.job}: executor pid {pid} started on {host}"
            + (" as its warm standby" if standby else ""),
            job=self.job,
            host=host,
            data={"pid": pid, "standby": standby},
        )
        try:
            return await self._link_started(host, pid)
        except asyncio.CancelledError:
            # A preparation cancelled (a blip ended the lease wait): the executor started for
            # it must not sit on the host holding the job's workdir.
            self._stop_later(host, pid, released)
            raise

    async def _detached(self, host: str, bundle: str, *, twin: bool) -> int:
        """Start ``serve`` on ``host``, detached; its pid."""
        t, python, workdir = self._transport(host), self._inv.python(host), self.workdir(host)
        hb = str(self._inv.console.heartbeat_s)
        kind = self._inv.jobs[self.job].spec.executor
        args = ["serve", "--workdir", workdir, "--kind", kind, "--heartbeat-s", hb]
        args += ["--health-s", hb, "--idle-exit-s", str(IDLE_EXIT_S), *(["--twin"] if twin else [])]
        argv, env = executor_command(python, bundle, args)
        env.update(self._env.get(host, {}))
        log = posixpath.join(workdir, "twin.log" if twin else "executor.log")
        return await t.start_detached(argv, log_path=log, env=env, cwd=workdir)

    async def start_twin(self, host: str) -> ExecutorLink | str:
        """The job's warm twin on ``host`` (beside its executor, ``serve --twin``), linked; or
        why not. An idle twin an earlier console left is taken."""
        link = self.link(host, twin=True)
        try:
            hello = await link.open(timeout=2)
        except LinkError:
            hello = None
        if hello is not None:
            if hello.state == ExecutorState.IDLE and (host, hello.pid) not in self.dismissed:
                self._journal.record(
                    Kind.EXECUTOR,
                    f"{self.job}: warm twin pid {hello.pid} on {host}, left by an earlier "
                    "console, taken",
                    job=self.job,
                    host=host,
                    data={"pid": hello.pid, "twin": True, "adopted": True},
                )
                return link
            link.close()
            return f"pid {hello.pid} ({hello.state}) answers on the twin's socket"
        t, root, python = self._transport(host), self._inv.host_root(host), self._inv.python(host)
        try:
            await t.connect()
            pid = await self._detached(host, (await deploy(t, root, python)).path, twin=True)
        except TransportError as e:
            return f"cannot start a twin on {host}: {e}"
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.job}: warm twin pid {pid} started on {host}",
            job=self.job,
            host=host,
            data={"pid": pid, "twin": True},
        )
        try:
            started = await self._link_started(host, pid, twin=True)
        except asyncio.CancelledError:
            self._stop_later(host, pid, lambda _host: None, twin=True)
            raise
        return started if isinstance(started, ExecutorLink) else started.why

    async def _left_behind(self, host: str, *, standby: bool) -> ExecutorLink | None:
        """An executor an earlier console left on this workdir (a failover target it readied,
        a standby): an idle one is taken as this start's (it has loaded nothing yet, and holds
        the workdir a new one would need); one that trains under some epoch is told to stop
        and waited out. None: nothing answers, start one."""
        link = self.link(host)
        try:
            hello = await link.open(timeout=2)
        except LinkError:
            return None
        if hello.state == ExecutorState.IDLE and (host, hello.pid) not in self.dismissed:
            ours = (host, hello.pid) in self.standbys
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.job}: idle executor pid {hello.pid} on {host}, "
                + ("its warm standby, taken" if ours else "left by an earlier console, taken"),
                job=self.job,
                host=host,
                data={"pid": hello.pid, "adopted": True, "standby": ours},
            )
            if standby:
                self.standbys.add((host, hello.pid))
            elif not ours:  # a standby's coming up is no incident's phase
                self._phase("executor_up", pid=hello.pid, host=host)
            return link
        self.dismissed.add((host, hello.pid))
        with contextlib.suppress(LinkError):
            await link.send(Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
        await link.finish()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(START_TIMEOUT_S / 3):
                while True:
                    if not await self.pid_alive(host, hello.pid):
                        break
                    await asyncio.sleep(POLL_S)
        return None

    async def _link_started(
        self, host: str, pid: int, *, twin: bool = False
    ) -> ExecutorLink | Outcome:
        """A link to the executor just started as ``pid``, and to no other: one this console
        told to stop may still serve the socket on its way out, and its messages, its
        Stopped above all, are not the new executor's."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            link = self.link(host, twin=twin)
            try:
                hello = await link.open(timeout=5)
                if hello.pid == pid and (host, pid) not in self.dismissed:
                    break
                link.close()
                why = f"pid {hello.pid} answers on the socket, not the new executor (pid {pid})"
            except LinkError as e:
                why = str(e)
            if time.monotonic() > deadline:
                return Outcome(
                    Exit.CRASHED, f"executor did not answer within {START_TIMEOUT_S:g}s: {why}"
                )
            if not await self.pid_alive(host, pid):
                if twin:
                    return Outcome(Exit.CRASHED, f"the twin (pid {pid}) exited: see twin.log")
                return await self._ended(host)
            await asyncio.sleep(POLL_S)
        if not twin and (host, pid) not in self.standbys:  # a standby's is no incident's phase
            self._phase("executor_up", pid=hello.pid, host=host)
        with contextlib.suppress(LinkError):  # an optimisation: a broken link is found when used
            await link.send(Prepare(spec=self._inv.jobs[self.job].spec))
        return link

    # ------------------------------------------------------------ stopping

    async def pid_alive(self, host: str, pid: int) -> bool:
        """While an executor starts (before it holds its lock), its pid says whether it lives."""
        try:
            result = await self._transport(host).run(["kill", "-0", str(pid)], timeout=10)
        except TransportError:
            return False
        return result.returncode == 0

    def _stop_later(
        self, host: str, pid: int, released: Callable[[str], None], *, twin: bool = False
    ) -> None:
        """``_stop_unlinked`` in the background (it outlives the cancelled start), and every
        start on ``host`` waits for it."""
        done = asyncio.Event()
        self._stopping.setdefault(host, set()).add(done)

        async def stop() -> None:
            try:
                await self._stop_unlinked(host, pid, released, twin=twin)
            finally:
                self._stopping[host].discard(done)
                done.set()

        self.outlive(stop())

    async def _stop_unlinked(
        self, host: str, pid: int, released: Callable[[str], None], *, twin: bool = False
    ) -> None:
        """Stop an executor started as ``pid`` that no link was taken for, and wait it out."""
        self.dismissed.add((host, pid))
        link = self.link(host, twin=twin)
        try:
            async with asyncio.timeout(START_TIMEOUT_S / 3):
                while await self.pid_alive(host, pid):
                    with contextlib.suppress(LinkError):
                        hello = await link.open(timeout=5)
                        if hello.pid == pid:
                            await link.send(Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
                    await link.finish()
                    await asyncio.sleep(POLL_S)
        except TimeoutError:
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.job}: executor pid {pid} on {host}, started for a cancelled failover, "
                f"did not stop (idle, it exits by itself within {IDLE_EXIT_S} s)",
                job=self.job,
                host=host,
                data={"pid": pid},
            )
        finally:
            link.close()
        released(host)

    def outlive(self, work: Awaitable[None]) -> None:
        """Run clean-up that must outlive the task it comes from (``CleanUps``)."""
        self._cleanups.outlive(work)
