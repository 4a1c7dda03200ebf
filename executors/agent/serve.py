"""``hotspare-executor serve``: the detached executor the console talks to.

The protocol is served on a Unix socket (mode 0600) in the workdir; no TCP port is
opened. Training runs on its own thread and goes on when clients come and go. The
lease is enforced twice: the trainer stops at a step boundary before it ends, and a
watchdog here ends the process if a step overruns it.

The executor is the node's agent: when the training run dies (a ``crash`` or a ``hang``:
the command exited or was killed, the workload raised), the executor stays and says so
(``RunEnded``, state ``faulted``). A Start at a higher epoch restarts the run in place,
in this process (torch already imported, the command's leftovers reaped); a Stop, a
signal or the end of the lease ends the process. An executor started for a job of
another kind than ``torch`` never imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

from executors import clock, exitcodes
from executors.agent.control import Control
from executors.agent.events import EventLog, report_crash
from executors.agent.inject import Injections
from executors.agent.streams import serve_unix
from executors.agent.twin import TWIN_EVENTS, TwinSeat, listen
from executors.agent.workdir import EVENTS, PID, WorkdirBusy, kill_command
from executors.durable import atomic_write
from executors.fencing.guard import LeaseGuard
from executors.fencing.publish import seal
from executors.fencing.term import TermFence
from executors.kinds import Idle, load_idle, load_kind
from executors.threadname import name_os_thread
from protocol.errors import ConfigError, ProtocolError
from protocol.faults import RESTARTABLE, FaultKind, StopReason
from protocol.framing import (
    CONSOLE_MESSAGES,
    check_hello,
    encode_frame,
    read_message,
    write_message,
)
from protocol.messages import (
    PROTOCOL_VERSION,
    Abandon,
    CheckpointNow,
    CheckpointSaved,
    ConsoleHello,
    ConsoleMessage,
    Drain,
    ExecutorHello,
    ExecutorMessage,
    ExecutorState,
    Fault,
    Heartbeat,
    Lease,
    Log,
    LogLevel,
    Ping,
    Prepare,
    Progress,
    RunEnded,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import JobSpec
from protocol.workdirs import EXECUTOR_SOCKET as SOCKET
from protocol.workdirs import TWIN_SOCKET

HELLO_TIMEOUT_S = 10.0
MAX_CLIENT_BUFFER = 1 << 20
WARMUP_JOIN_S = 2.0
"""How long an ending executor waits for its warm-up to return. Short: the process ends with
``os._exit`` (no interpreter teardown for torch on that thread to abort), and an idle twin
told to stop while importing torch under load sat a minute in two 30 s joins (test_warm_twin:
'no twin left on b once finished')."""
_FINAL = {
    exitcodes.OK: ExecutorState.FINISHED,
    exitcodes.FAILED: ExecutorState.FAILED,
    exitcodes.CONFIG: ExecutorState.FAILED,
}


class Server:
    def __init__(
        self,
        workdir: Path,
        *,
        device: str | None = None,
        heartbeat_s: float = 1.0,
        health_s: float = 1.0,
        idle_exit_s: float = 600.0,
        kind: str = "torch",
        twin: TwinSeat | None = None,
    ) -> None:
        self.idle_exit_s = idle_exit_s
        """An idle executor (no Start) with no console connected exits after this long: an orphaned
        standby does not sit on its host's workdir forever."""
        self.workdir = workdir.resolve()
        self.kind = kind
        """The kind of job expected: only ``torch`` warms torch up while idle."""
        self.device = device
        self.heartbeat_s = heartbeat_s
        self.health_s = health_s
        self.twin = twin
        """Held while this executor is a warm twin (``executors.agent.twin``): Start promotes it."""
        self.state = ExecutorState.IDLE
        self.step = 0
        self.spec: JobSpec | None = None
        self.control: Control | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._log = EventLog(self.workdir / (TWIN_EVENTS if twin else EVENTS))
        self._servers: list[asyncio.Task[asyncio.AbstractServer]] = []
        self._lock: int | None = None
        """A promoted twin's hold on the workdir's executor lock (kept for the process's life)."""
        self._thread: threading.Thread | None = None
        self._client_tasks: set[asyncio.Task[None]] = set()
        self._warmup: threading.Thread | None = None
        self._preparing: threading.Thread | None = None
        """Readying a start told by ``Prepare`` (``_prepare``)."""
        self._warmed = threading.Event()
        """The idle executor's warm-up (its kind's imports) is done."""
        self._ending = threading.Event()
        """Set as the process ends: what ``Prepare`` runs (a command's setup) stops."""
        self._warmup_s = 0.0
        self._idle_over = threading.Event()
        """Set at Start or at the end: the warm-up thread stops reading ahead, and returns."""
        """Set by the first Start: the idle work (warm-up, read-ahead) ends."""
        self._seq = 0
        self._term = TermFence(self.workdir)
        """The highest controller term seen: orders from a lower one are refused."""
        self._injections: Injections | None = None
        """Parsed once per process: each injected fault fires once, restarts in place included."""
        self._last_fault: Fault | None = None
        self._checkpoint_step: int | None = None
        self._lease_low: float | None = None
        """The least lease left at a renewal's landing since the last heartbeat (``lease_low_s``)."""

    # ------------------------------------------------------------------ life

    async def main(self, autostart: JobSpec | None = None) -> int:
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[int] = self._loop.create_future()
        if self.twin is None:  # we hold the workdir lock (a twin its own), so a socket is stale
            atomic_write(self.workdir / PID, f"{os.getpid()}\n".encode())  # before the socket
        idle = load_idle(self.kind) if autostart is None else None
        if idle is not None:
            idle.before_serving()
        try:
            self._serve(self.workdir / (TWIN_SOCKET if self.twin else SOCKET))
        except ConfigError as e:
            # No socket, so no console hears this: the events file says why, for the console
            # that finds the executor gone (else "died without a word", and started again)
            self._log(Fault(fault=FaultKind.CONFIG, message=str(e), fatal=True))
            self._log.close()
            if self.twin is None:
                (self.workdir / PID).unlink(missing_ok=True)
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        tasks = [
            asyncio.create_task(t) for t in (self._heartbeats(), self._health(), self._watchdog())
        ]
        if autostart is not None:
            self._start(Start(spec=autostart))
        elif idle is not None:
            self._warmup_s = Injections.from_env().slow_warmup_s
            self._warmup = threading.Thread(
                target=self._while_idle, args=(idle,), name="hotspare-warmup", daemon=True
            )
            self._warmup.start()
        try:
            code = await self._done
        finally:
            for t in tasks:
                t.cancel()
            await self._warmup_ended()
            for server in await asyncio.gather(*self._servers):
                server.close()
            await self._flush_clients()
            if self.twin is not None:
                self.twin.leave()
            else:
                (self.workdir / SOCKET).unlink(missing_ok=True)
                (self.workdir / PID).unlink(missing_ok=True)
            self._log.close()
        return code

    async def _warmup_ended(self) -> None:
        """The warm-up thread is done before the process exits: torch running on a daemon
        thread while the interpreter finalizes aborts it (``terminate called without an active
        exception``, SIGABRT instead of the exit code the console reads; CI saw it)."""
        self._idle_over.set()
        self._ending.set()
        for thread in (self._warmup, self._preparing):
            if thread is not None and thread.is_alive():
                await asyncio.to_thread(thread.join, WARMUP_JOIN_S)

    def _serve(self, path: Path) -> None:
        """Serve the protocol on ``path`` (bound and listening before this returns)."""
        sock = listen(path)
        self._servers.append(self._loop.create_task(serve_unix(self._client, sock)))

    def _promote(self, twin: TwinSeat) -> bool:
        """A twin told Start becomes the job's executor, or refuses while the executor lives."""
        try:
            self._lock = twin.promote()
        except WorkdirBusy as e:
            text = f"warm twin: Start refused, the job's executor still runs ({e})"
            self.emit(Fault(fault=FaultKind.WORKDIR_BUSY, message=text))
            self._finish_idle(StopReason.WORKDIR_BUSY, exitcodes.BUSY)
            return False
        self._serve(self.workdir / SOCKET)  # a later console reattaches here as to any executor
        for listening in self._servers[:1]:
            listening.add_done_callback(lambda t: t.cancelled() or t.result().close())
        twin.leave()
        self.twin = None
        self._log.close()
        self._log = EventLog(self.workdir / EVENTS)
        return True

    def _on_signal(self, sig: int) -> None:
        if self.state is ExecutorState.FAULTED:
            self._end_faulted(
                StopReason.PREEMPTED if sig == signal.SIGTERM else StopReason.INTERRUPTED,
                exitcodes.PREEMPTED if sig == signal.SIGTERM else exitcodes.INTERRUPTED,
            )
        elif self.control is None:
            self._finish_idle(
                StopReason.PREEMPTED if sig == signal.SIGTERM else StopReason.INTERRUPTED,
                exitcodes.PREEMPTED,
            )
        elif sig == signal.SIGTERM:
            self.control.request_stop(
                StopReason.PREEMPTED,
                checkpoint=True,
                exit_code=exitcodes.PREEMPTED,
                fault=FaultKind.PREEMPTED,
            )
        else:
            self.control.request_stop(
                StopReason.INTERRUPTED, checkpoint=True, exit_code=exitcodes.INTERRUPTED
            )

    def _finish_idle(self, reason: StopReason, code: int) -> None:
        self.emit(Stopped(step=0, reason=reason, exit_code=code))
        self.state = ExecutorState.STOPPED
        self._loop.call_soon(self._resolve, code)

    def _resolve(self, code: int) -> None:
        """The process's exit status, once (the first end said wins)."""
        if not self._done.done():
            self._done.set_result(code)

    def _end_faulted(self, reason: StopReason, code: int) -> None:
        """A faulted executor told to stop (or whose lease ended): nothing runs; end the process."""
        self.emit(
            Stopped(
                step=self.step, reason=reason, checkpoint_step=self._checkpoint_step, exit_code=code
            )
        )
        self.state = ExecutorState.STOPPED
        self._loop.call_soon(self._resolve, code)

    # -------------------------------------------------------------- training

    def _start(self, msg: Start) -> None:
        if self.state is ExecutorState.FAULTED:
            assert self.control is not None
            if msg.epoch <= self.control.epoch:
                self._broadcast(
                    Log(
                        level=LogLevel.WARNING,
                        text=f"Start at epoch {msg.epoch} ignored: a restart needs an epoch above "
                        f"{self.control.epoch}",
                    )
                )
                return
        elif self._thread is not None:
            assert self.spec is not None
            self._broadcast(
                Log(
                    level=LogLevel.WARNING,
                    text=f"already running job {self.spec.name} under epoch "
                    f"{self.control.epoch if self.control else 0}; Start ignored",
                )
            )
            return
        if self.twin is not None and not self._promote(self.twin):
            return
        self._idle_over.set()
        self.spec, self._last_fault = msg.spec, None
        self.control = Control(
            epoch=msg.epoch,
            lease_s=msg.lease_s,
            lease_anchor=msg.lease_anchor,
            rendezvous=msg.rendezvous,
            run_id=msg.run_id,
        )
        self.state = ExecutorState.TRAINING
        self._thread = threading.Thread(
            target=self._train, args=(msg.spec, self.control), name="hotspare-train", daemon=True
        )
        self._thread.start()

    def _prepare(self, spec: JobSpec) -> None:
        """Prepare: ready a start of ``spec`` (the kind's ``prepare``), on a thread of its own,
        while idle; after a Start there is nothing left to ready."""
        if self._thread is not None or self.state is not ExecutorState.IDLE:
            return
        self._preparing = threading.Thread(
            target=self._ready_ahead, args=(spec,), name="hotspare-prepare", daemon=True
        )
        self._preparing.start()

    def _ready_ahead(self, spec: JobSpec) -> None:
        name_os_thread("hotspare-prepare")
        while self._warmup is not None and not self._warmed.wait(0.1):
            if self._ending.is_set():  # imports must not race the warm-up's (torch's are not
                return  # thread-safe): the kind is loaded once it is done
        try:
            prepare = getattr(load_kind(spec.executor), "prepare", None)
            if prepare is not None:
                prepare(spec, self.workdir, self.emit, self._ending.is_set)
        except Exception as e:  # noqa: BLE001 - readying is an optimisation: the Start reports
            self.emit(Log(level=LogLevel.INFO, text=f"prepare: {type(e).__name__}: {e}"))

    def _train(self, spec: JobSpec, control: Control) -> None:
        code, reason = exitcodes.FAILED, FaultKind.CRASH.value
        name_os_thread("hotspare-train")  # visible in /proc: which executor trains, not idles
        if self._warmup is not None:
            self._warmup.join()  # imports must not race: torch's import machinery is not thread-safe
        try:
            if self._injections is None:
                self._injections = Injections.from_env()
            kind = load_kind(spec.executor)
            runner = kind.runner(
                spec,
                self.workdir,
                self.emit,
                control=control,
                device=self.device,
                injections=self._injections,
            )
            outcome = runner.run()
            code, reason = outcome.exit_code, outcome.reason
        except ConfigError as e:
            self.emit(Fault(fault=FaultKind.CONFIG, message=str(e), fatal=True))
            code, reason = exitcodes.CONFIG, "config"
        except Exception as e:  # noqa: BLE001 - reported as a crash event; the traceback goes to crash.log
            code = report_crash(e, self.workdir, self.emit)
        finally:
            self._loop.call_soon_threadsafe(self._trainer_done, control, code, reason)

    def _while_idle(self, idle: Idle) -> None:
        """An idle executor's thread, for a kind with idle work: warm up, then ready what a
        Start will load (the torch kind: the newest checkpoint, read ahead)."""
        name_os_thread("hotspare-warmup")
        try:
            idle.warm_up(self._idle_over, self._warmup_s)
        finally:
            self._warmed.set()
        if self.twin is not None:
            self.twin.warmed()
        idle.until_started(self._idle_over, self.workdir)

    def _trainer_done(self, control: Control, code: int, reason: str) -> None:
        if (
            code == exitcodes.FAILED
            and reason in RESTARTABLE
            and control.stop is None
            and not LeaseGuard(control).ended()
            and not self._done.done()
        ):
            self._thread = None
            self.state = ExecutorState.FAULTED
            fault = self._last_fault
            self.emit(
                RunEnded(
                    step=self.step,
                    fault=FaultKind(reason),
                    message=fault.message if fault is not None else reason,
                    exit_code=code,
                    checkpoint_step=self._checkpoint_step,
                )
            )
            return
        self.state = _FINAL.get(code, ExecutorState.STOPPED)
        if not self._done.done():
            self._done.set_result(code)

    def emit(self, msg: ExecutorMessage) -> None:
        """From any thread: into the workdir's log, then to every client."""
        if isinstance(msg, Progress):
            self.step = msg.step
        elif isinstance(msg, Fault) and msg.fatal:
            self._last_fault = msg
        elif isinstance(msg, CheckpointSaved):
            self._checkpoint_step = msg.manifest.step
        self._log(msg)
        self._loop.call_soon_threadsafe(self._broadcast, msg)

    # ---------------------------------------------------------------- clients

    def _broadcast(self, msg: ExecutorMessage) -> None:
        frame = encode_frame(msg)
        for w in list(self._clients):
            if w.transport.is_closing() or w.transport.get_write_buffer_size() > MAX_CLIENT_BUFFER:
                self._clients.discard(w)
                w.close()
                continue
            w.write(frame)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._client_tasks.add(task)
            task.add_done_callback(self._client_tasks.discard)
        try:
            hello = await read_message(reader, CONSOLE_MESSAGES, timeout=HELLO_TIMEOUT_S)
            if hello is None:
                return
            check_hello(hello, ConsoleHello)
            assert isinstance(hello, ConsoleHello)
            self._term.hello(hello.term)
            await write_message(writer, self._hello())
            self._clients.add(writer)
            while (msg := await read_message(reader, CONSOLE_MESSAGES)) is not None:
                if not isinstance(msg, Ping) and (
                    why := self._term.refusal(hello.term, type(msg).__name__)
                ):
                    self.emit(Log(level=LogLevel.WARNING, text=why))
                    continue
                self._handle(msg, writer)
        except ProtocolError as e:
            with contextlib.suppress(ConnectionError, TimeoutError, ProtocolError):
                await write_message(
                    writer, Fault(fault=FaultKind.PROTOCOL, message=str(e)), timeout=2
                )
        except (ConnectionError, TimeoutError):
            pass
        finally:
            self._clients.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(2):
                    await writer.wait_closed()

    def _hello(self) -> ExecutorHello:
        return ExecutorHello(
            version=PROTOCOL_VERSION,
            executor=self.spec.executor if self.spec else "torch",
            pid=os.getpid(),
            hostname=socket.gethostname(),
            workdir=str(self.workdir),
            state=self.state,
            job=self.spec.name if self.spec else None,
            epoch=self.control.epoch if self.control else 0,
            step=self.step,
            clock=clock.now(),
        )

    def _handle(self, msg: ConsoleMessage, writer: asyncio.StreamWriter) -> None:
        control = self.control
        if isinstance(msg, Start):
            self._start(msg)
        elif isinstance(msg, Prepare):
            self._prepare(msg.spec)
        elif isinstance(msg, Ping):
            writer.write(encode_frame(self._heartbeat(nonce=msg.nonce)))
        elif control is None:
            if isinstance(msg, (Stop, Drain)):
                self._finish_idle(msg.reason, exitcodes.STOPPED)
            else:
                writer.write(
                    encode_frame(
                        Log(
                            level=LogLevel.WARNING,
                            text=f"no job running; {type(msg).__name__} ignored",
                        )
                    )
                )
        elif isinstance(msg, Lease):
            self._lease(msg, control)
        elif isinstance(msg, Abandon):
            if msg.epoch == control.epoch:  # a join still waiting gives up; nothing else does
                control.abandoned.set()
        elif isinstance(msg, (Stop, Drain)) and self.state is ExecutorState.FAULTED:
            self._end_faulted(msg.reason, exitcodes.STOPPED)
        elif isinstance(msg, CheckpointNow):
            control.request_checkpoint(msg.reason)
        elif isinstance(msg, (Stop, Drain)):
            checkpoint = msg.checkpoint if isinstance(msg, Stop) else True
            control.request_stop(msg.reason, checkpoint=checkpoint, exit_code=exitcodes.STOPPED)
            self.state = ExecutorState.STOPPING

    def _lease(self, msg: Lease, control: Control) -> None:
        left = control.lease_left()
        if msg.epoch == control.epoch and left is not None:
            self._lease_low = left if self._lease_low is None else min(self._lease_low, left)
        if control.renew(msg.epoch, msg.ttl_s, msg.anchor):
            return
        if msg.epoch > control.epoch:
            self.emit(
                Fault(
                    fault=FaultKind.LEASE_LOST,
                    step=self.step,
                    message=f"epoch {control.epoch} is stale (console is at {msg.epoch}); stopping "
                    "without writing anything more",
                )
            )
            control.request_stop(
                StopReason.STALE_EPOCH, checkpoint=False, exit_code=exitcodes.LEASE_LOST
            )
            self.state = ExecutorState.STOPPING

    async def _flush_clients(self) -> None:
        """Send what is queued, close every client, and let their handlers end (no noise at exit)."""
        for w in list(self._clients):
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(2):
                    await w.drain()
            w.close()
        if self._client_tasks:
            _, pending = await asyncio.wait(set(self._client_tasks), timeout=2)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1)

    # ------------------------------------------------------------ background

    def _heartbeat(self, nonce: int | None = None) -> Heartbeat:
        self._seq += 1
        control = self.control
        low = self._lease_low
        if nonce is None:  # a Ping's answer goes to one client: the broadcast one reports it
            self._lease_low = None
        return Heartbeat(
            seq=self._seq,
            t=time.time(),
            clock=clock.now(),
            state=self.state,
            step=self.step,
            epoch=control.epoch if control else 0,
            lease_left_s=control.lease_left() if control else None,
            nonce=nonce,
            lease_low_s=low,
        )

    async def _heartbeats(self) -> None:
        while True:
            self._broadcast(self._heartbeat())
            await asyncio.sleep(self.heartbeat_s)

    async def _health(self) -> None:
        from executors.health.health import HealthSampler

        sampler = await asyncio.to_thread(HealthSampler, self.workdir)
        while True:
            self._broadcast(await asyncio.to_thread(sampler.sample))
            await asyncio.sleep(self.health_s)

    async def _watchdog(self) -> None:
        """The backstop of the lease: if it has ended and training has not stopped, end the process.

        Before it ends, no checkpoint may be published any more (``seal``: a publish in flight
        finishes its check after the renames first) and a ``command`` kind's processes are
        killed. Also ends an idle executor that no console has talked to for ``idle_exit_s``.
        """
        alone_since = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            if self.control is not None or self._clients:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since > self.idle_exit_s and not self._done.done():
                self._finish_idle(StopReason.NO_CONSOLE, exitcodes.STOPPED)
            ended = self.control is not None and LeaseGuard(self.control).ended()
            if self.state is ExecutorState.FAULTED and ended:
                self._end_faulted(
                    StopReason.LEASE_LOST, exitcodes.LEASE_LOST
                )  # no restart came in time
                continue
            if ended and self._thread is not None and self._thread.is_alive():
                seal()
                kill_command(self.workdir)
                self._log(
                    Fault(
                        fault=FaultKind.LEASE_LOST,
                        step=self.step,
                        fatal=True,
                        message="lease ended while a step was still running; exiting at once",
                    )
                )
                os._exit(exitcodes.LEASE_LOST)
