"""The built-in ``command`` executor kind: run any training command, with the same failover.

A job with ``executor = "command"`` and a ``[command]`` table (``protocol.spec.CommandSpec``)
runs a training script that knows nothing of hotspare. The runner:

1. restores the newest checkpoint of ``WORKDIR/checkpoints`` that verifies (sha256) into the
   command's ``checkpoint_dir`` (after failover the console has put the replica there) and
   emits ``Resumed``; everything else matching ``checkpoint_glob`` there is removed first.
   A member of a multi-host job (Start's ``rendezvous``) restores exactly the group's
   committed ``resume_step`` (none: a fresh start) after removing its newer checkpoints,
   which not every member committed; that step missing or not verifying here is one fatal
   ``crash`` fault naming it, and the run ends without starting the command;
2. starts the argv (placeholders replaced, ``{resume_from}`` pointing at the restored file)
   in its own process group, never through a shell; ``PYTHONUNBUFFERED=1`` unless ``env``
   says otherwise, and the executor bundle's folder taken off ``PYTHONPATH``; the group and
   a random token (in the command's environment) are recorded in the workdir, so whatever
   outlives this executor is reaped by the next one (``executors.agent.workdir.reap_command``);
   by default (``preload`` unset: ``AUTO_PRELOAD``), a Python command is forked warm from the job's zygote instead of exec'd,
   recorded alike (executors/kinds/command/zygote.py; what it cannot run is exec'd, with a Log line why);
   ``HOTSPARE_RUN_ID``, ``HOTSPARE_JOB``, ``HOTSPARE_EPOCH`` and ``HOTSPARE_RESUMED_FROM_STEP``
   are in its environment (``executors.agent.run_env``), below ``env``;
3. forwards output lines as ``Log`` events and parses progress (``progress_regex`` over
   each stdout or stderr line, or ``metrics_file``) into ``Progress`` events;
4. copies each new complete checkpoint (by marker, closed by every process of the run, or
   by settle time: ``executors.kinds.command.command_watch``) into
   ``WORKDIR/checkpoints/step-N.pt`` with its manifest, emits ``CheckpointSaved`` (the
   console replicates it like a torch checkpoint), keeps ``keep_checkpoints``;
5. on Stop, Drain, SIGTERM or the lease nearing its end: SIGTERM to the process group,
   ``grace_s``, then SIGKILL; ``Stopped`` with the newest complete checkpoint's step;
6. no progress for ``hang_timeout_s``: a ``hang`` fault, the group killed, exit FAILED (the
   console restarts it in place); a non-zero exit: a fatal ``crash`` fault, exit FAILED;
   exit 0: ``Finished``, whose ``params_sha256`` is, for this kind, what ``params_regex``
   read from the output, else the sha256 of the newest complete checkpoint file ("" when
   there is neither).

The group placeholders (``{node_rank}``, ``{nnodes}``, ``{master_addr}``, ``{master_port}``,
``{rank}``, ``{world_size}``, ``{local_world_size}``, ``{backend}``, ``{timeout_s}``) come from the
rendezvous, so an argv of ``python -m torch.distributed.run --nnodes {nnodes} --node-rank
{node_rank} --master-addr {master_addr} --master-port {master_port} --nproc-per-node
{local_world_size} train.py ...`` runs one node of the group per host; each manifest names
its node rank and the group's size. Without a rendezvous they describe one host alone
(0, 1, 127.0.0.1, 29500, 0, 1, 1, gloo, 30). ``--device`` is not passed on: say it in ``env``
or ``argv``. Checkpoint requests (CheckpointNow) are not supported: the command checkpoints
on its own schedule (the console refuses `c`, checkpoint now, for a command job and says why).
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from executors import exitcodes
from executors.agent.control import Control
from executors.agent.inject import Injections
from executors.agent.run_env import run_env
from executors.agent.workdir import CHECKPOINTS, CommandLingers, reap_command
from executors.checkpoints.lineage import at_start
from executors.checkpoints.version import code_version
from executors.fencing.guard import LeaseGuard, Verdict
from executors.fencing.publish import Emit
from executors.fencing.run import FencedRun
from executors.kinds import Outcome
from executors.kinds.command.command_files import NotCommitted, Publisher, Restored, Watcher, clear
from executors.kinds.command.command_io import (
    LineLog,
    Meter,
    MetricsTail,
    build_argv,
    check_program,
    command_env,
    describe_exit,
    group_values,
    launch,
    parse_progress,
    per_run_names,
    signal_group,
    start_reader,
)
from executors.kinds.command.command_setup import SetupFailed
from executors.kinds.command.command_setup import ensure as setup_ensure
from executors.kinds.command.command_warm import WarmStart
from executors.kinds.command.command_writers import Writers, run_pids
from executors.kinds.command.zygote import ForkedRun
from protocol.errors import ConfigError
from protocol.faults import RESTARTABLE, FaultKind, StopReason
from protocol.messages import ExecutorMessage, Fault, Finished, Log, LogLevel, Resumed, Stopped
from protocol.spec import CommandSpec, JobSpec

POLL_S = 0.2
LEASE_MARGIN_S = 0.5
"""The command is killed this long before the lease ends, whatever is left of its grace."""
READER_JOIN_S = 2.0


class CommandKind:
    name = "command"

    def runner(
        self,
        spec: JobSpec,
        workdir: Path,
        emit: Emit,
        *,
        control: Control,
        device: str | None,
        injections: Injections,
    ) -> CommandRunner:
        if spec.command is None:
            raise ConfigError(
                f'job {spec.name}: executor = "command" needs a [command] table with argv'
            )
        return CommandRunner(spec, spec.command, workdir, emit, control=control)

    def prepare(
        self, spec: JobSpec, workdir: Path, emit: Emit, stopped: Callable[[], bool]
    ) -> None:
        """Before Start, on an idle executor told ``Prepare`` (a failover's target while the
        old lease runs out, a warm standby): the command's ``setup`` run (``stopped``: the
        executor is ending), then the job's zygote started for the command a run of ``spec``
        here would be, so its imports are done, or under way, when Start comes. The command
        is not run and no checkpoint of the job is touched; the run that follows finds the
        zygote by its key (``zygote.ensure``: the interpreter, preload, cwd, the script's
        folder and the environment but for the per-run variables, not the arguments). What
        the zygote cannot do is said by that run, when it starts."""
        if spec.command is None:
            return
        try:
            runner = CommandRunner(spec, spec.command, workdir, emit, control=Control())
        except ConfigError:
            return  # the Start that follows reports it, as without Prepare
        try:
            runner.setup(stopped)
        except SetupFailed as e:
            runner.emit(
                Log(level=LogLevel.WARNING, text=f"prepare: {e}; the run will try it again")
            )
            return
        if runner.warm is not None:
            runner.warm.prepare(*runner._command(None))


class CommandRunner:
    def __init__(
        self,
        spec: JobSpec,
        cs: CommandSpec,
        workdir: Path,
        emit: Emit,
        *,
        control: Control,
        poll_s: float = POLL_S,
    ) -> None:
        self.spec, self.cs, self.control, self.poll_s = spec, cs, control, poll_s
        self.lease = LeaseGuard(control)
        self.workdir = workdir.resolve()
        self._emit_lock = threading.Lock()
        self._emit = emit
        ours = self.workdir / CHECKPOINTS
        self.ckpt_dir = (self.workdir / cs.checkpoint_dir).resolve()
        if self.ckpt_dir == ours or ours in self.ckpt_dir.parents:
            raise ConfigError(
                f"command.checkpoint_dir: {cs.checkpoint_dir!r} is the executor's own "
                f"{CHECKPOINTS}/ folder; name another one"
            )
        self.cwd = (self.workdir / cs.cwd).resolve() if cs.cwd else self.workdir
        self._progress: list[tuple[int, int]] = []
        """(wall time in ns when it was read, step) of each progress step: what names a
        ``checkpoint_file`` written at some moment."""
        self.watcher = Watcher(
            self.ckpt_dir,
            cs,
            step_at=self._step_at,
            warn=lambda text: self.emit(Log(level=LogLevel.WARNING, text=text)),
            writers=Writers(self._run_pids),
        )
        self.pub = Publisher(
            ours,
            job=spec.name,
            spec_hash=spec.state_hash(),
            keep=spec.keep_checkpoints,
            epoch=control.epoch,
            code_version=code_version(),
            emit=self.emit,
            lease_valid=self.lease.valid,
            node_rank=control.rendezvous.node_rank if control.rendezvous else None,
            nnodes=control.rendezvous.nnodes if control.rendezvous else 1,
            link=cs.checkpoint_file is None,
        )
        self.meter = Meter(spec.steps, control.epoch, self.emit, lease_valid=self.lease.valid)
        self.lines = LineLog(self.emit)
        self._progress_re = re.compile(cs.progress_regex) if cs.progress_regex else None
        self._params_re = re.compile(cs.params_regex) if cs.params_regex else None
        self._params_digest: str | None = None
        self._metrics: MetricsTail | None = None
        self.proc: FencedRun | ForkedRun | None = None
        self._unwatch: Callable[[], None] | None = None
        self.warm = (
            WarmStart(spec.name, cs, self.workdir, self.cwd, control, self.emit)
            if cs.preloads
            else None
        )
        self._readers: list[threading.Thread] = []
        self._publishing = True
        self._ended_at: float | None = None

    def emit(self, msg: ExecutorMessage) -> None:
        with self._emit_lock:
            self._emit(msg)

    # ----------------------------------------------------------------- run

    def run(self) -> Outcome:
        outcome = None
        try:
            outcome = self._run()
            return outcome
        finally:
            self._kill_leftovers()
            self._reap()
            if self.warm is not None and (outcome is None or outcome.reason not in RESTARTABLE):
                self.warm.close()  # no restart in place follows: the executor ends

    def _run(self) -> Outcome:
        t0 = time.perf_counter()
        try:  # a previous run's processes that outlived SIGKILL: no new run beside them
            reap_command(self.workdir)
        except CommandLingers as e:
            self.emit(Fault(fault=FaultKind.CRASH, step=0, fatal=True, message=str(e)))
            return Outcome(exitcodes.FAILED, 0, "crash")
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        try:  # before the zygote: setup may install what it imports
            self.setup(lambda: self.control.stop is not None)
        except SetupFailed as e:
            self.emit(Fault(fault=FaultKind.CRASH, step=0, fatal=True, message=str(e)))
            return Outcome(exitcodes.FAILED, 0, "crash")
        self.pub.lineage = at_start(self.spec, run_id=self.control.run_id, cwd=self.cwd)
        if self.warm is not None:
            self.warm.prepare(*self._command(None))  # the zygote imports while we restore
        gone = clear(self.ckpt_dir, self.cs, self.watcher)
        if gone:
            self.emit(
                Log(
                    level=LogLevel.INFO,
                    text=f"removed {gone} checkpoint file(s) a previous run left in {self.ckpt_dir}; "
                    "only the workdir's verified checkpoints are resumed from",
                )
            )
        try:
            restored = self._restore()
        except NotCommitted as e:
            step = self.control.rendezvous.resume_step if self.control.rendezvous else None
            self.emit(
                Fault(fault=FaultKind.RESUME_FAILED, step=step or 0, fatal=True, message=str(e))
            )
            return Outcome(exitcodes.FAILED, step or 0, FaultKind.RESUME_FAILED.value)
        self.meter.step = restored.manifest.step if restored else 0
        self.emit(
            Resumed(
                step=self.meter.step,
                checkpoint=str(restored.path) if restored else None,
                epoch=self.control.epoch,
                load_s=time.perf_counter() - t0,
            )
        )
        argv, env = self._command(restored)
        check_program(argv[0], self.cwd, env)
        warm = self.warm.ready(argv, env) if self.warm is not None else None
        if self.control.stop is not None:  # asked to stop while restoring: do not start at all
            stop = self.control.stop
            return self._stopped(stop.reason, stop.exit_code)
        if self.lease.verdict(0.0, ended_within_s=LEASE_MARGIN_S) is Verdict.ENDED:
            # set-up outlasted the lease (a loaded host, a slow import): a command started now
            # would train outside it, beside the next epoch, until it was killed
            self._lease_fault(
                f"lease of epoch {self.control.epoch} ended during the set-up "
                f"({time.perf_counter() - t0:.1f}s); the command is not started"
            )
            return self._stopped(StopReason.LEASE_LOST, exitcodes.LEASE_LOST)
        if self.cs.metrics_file:
            self._metrics = MetricsTail(self.workdir / self.cs.metrics_file)
        self.proc = self.warm.launch(argv, env, warm) if self.warm is not None else None
        if self.proc is None:
            self.proc = launch(
                argv,
                cwd=self.cwd,
                env=env,
                record_in=self.workdir,
                deadline=self.control.lease_deadline,
            )
        self._unwatch = self.lease.watch(self.proc.fence.lease)
        how = f" (forked warm, preloaded {', '.join(self.cs.preloads)})" if warm else ""
        self.meter.touch(advanced=False)
        self.emit(
            Log(
                level=LogLevel.INFO,
                text=f"command started, pid {self.proc.pid}: {shlex.join(argv)}{how}",
            )
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            start_reader(
                "hotspare-stdout", self.proc.stdout, lambda s: self._line(LogLevel.STDOUT, s)
            ),
            start_reader(
                "hotspare-stderr", self.proc.stderr, lambda s: self._line(LogLevel.STDERR, s)
            ),
        ]
        while True:
            code = self.proc.poll()
            if code is not None:
                return self._exited(code)
            self._observe()
            outcome = self._check()
            if outcome is not None:
                return outcome
            try:
                self.proc.wait(timeout=self.poll_s)
            except subprocess.TimeoutExpired:
                pass

    def _restore(self) -> Restored | None:
        """One host: the newest checkpoint that verifies. A member of a group: exactly the step
        every member committed (none: a fresh start), and the newer steps, never committed by
        all, removed; NotCommitted when that step cannot be restored here."""
        rendezvous = self.control.rendezvous
        if rendezvous is None:
            return self.pub.restore(self.ckpt_dir, self.cs)
        step = rendezvous.resume_step
        dropped = self.pub.drop_after(step)
        if dropped:
            text = (
                f"removed checkpoint(s) of step {', '.join(map(str, dropped))}: newer than "
                f"the group's committed step ({'none' if step is None else step})"
            )
            self.emit(Log(level=LogLevel.INFO, text=text))
        return None if step is None else self.pub.restore_step(step, self.ckpt_dir, self.cs)

    def _step_at(self, t_ns: int) -> int | None:
        """The highest progress step read at or before ``t_ns`` (a file's mtime), or None.
        What came before the newest such reading is dropped: the file is only written later."""
        seen = list(self._progress)  # appended by the reader threads
        before = [i for i, (t, _) in enumerate(seen) if t <= t_ns]
        if not before:
            return None
        step = max(seen[i][1] for i in before)
        del self._progress[: before[-1]]  # keep the newest reading before it (and after)
        self._progress[0] = (self._progress[0][0], step)
        return step

    def _run_pids(self) -> list[int] | None:
        """The running command's processes (None: none started, or not known)."""
        proc = self.proc
        fence = getattr(proc, "fence", None)  # a forked run's is set once it is handed over
        if proc is None or fence is None:
            return None
        return run_pids(fence.cgroup, proc.pid if isinstance(proc, FencedRun) else None)

    def setup(self, stopped: Callable[[], bool]) -> None:
        """The ``setup`` argv, unless it ran here as it is now (``command_setup``); with the
        placeholders of a fresh start. SetupFailed when it does not complete."""
        if self.cs.setup is None:
            return
        self.cwd.mkdir(parents=True, exist_ok=True)
        argv, env = self._command(None, template=self.cs.setup)
        setup_ensure(
            self.workdir,
            argv,
            env,
            self.cwd,
            per_run=per_run_names(self.cs.env),
            timeout_s=self.cs.setup_timeout_s,
            emit=self.emit,
            stopped=stopped,
        )

    def _command(
        self, restored: Restored | None, template: list[str] | None = None
    ) -> tuple[list[str], dict[str, str]]:
        step, resume_from = (restored.manifest.step, str(restored.path)) if restored else (0, "")
        values = {
            "checkpoint_dir": str(self.ckpt_dir),
            "resume_from": resume_from,
            "step": str(step),
            "workdir": str(self.workdir),
            "steps": str(self.spec.steps),
            "seed": str(self.spec.seed),
            **group_values(self.control.rendezvous),
            "run_id": self.control.run_id,
            "job": self.spec.name,
            "epoch": str(self.control.epoch),
        }
        run = run_env(self.spec.name, self.control, step)
        if template is None:
            template = [*self.cs.argv, *(self.cs.resume_argv or [])] if restored else self.cs.argv
        return build_argv(template, values), command_env(self.cs.env, values, run)

    def _line(self, stream: LogLevel, text: str) -> None:
        self.lines(stream, text)
        if self._progress_re is not None:
            parsed = parse_progress(self._progress_re, text)
            if parsed is not None:
                self.meter.update(*parsed)
                if self.cs.checkpoint_file is not None:
                    self._progress.append((time.time_ns(), parsed[0]))
        if self._params_re is not None and (m := self._params_re.search(text)):
            self._params_digest = m.group("sha256")

    # ------------------------------------------------------------ watching

    def _may_publish(self) -> bool:
        """Not after a stop without checkpoint, nor near the lease's end (``Publisher`` checks
        again at the rename)."""
        return self._publishing and self.lease.may_publish()

    def _observe(self) -> None:
        if self._may_publish():
            self._publish_new()
        if self._metrics is not None:
            for step, loss in self._metrics.records():
                self.meter.update(step, loss)
                if self.cs.checkpoint_file is not None:
                    self._progress.append((time.time_ns(), step))
        self.meter.maybe_emit()
        if self.control.take_checkpoint_request() is not None:
            text = (
                "the command kind cannot checkpoint on request: the command keeps its own schedule"
            )
            self.emit(Log(level=LogLevel.INFO, text=text))

    def _publish_new(self, *, exited_ok: bool = False, ended_at: float | None = None) -> None:
        after = self.pub.step
        for cand in self.watcher.complete(exited_ok=exited_ok, ended_at=ended_at, after=after):
            last = self.pub.step
            if last is not None and cand.step <= last:
                continue
            if self.pub.publish(cand) is not None:
                self.meter.touch()
                if self._progress_re is None and self._metrics is None:
                    self.meter.update(cand.step, None)
                self._prune_own()

    def _prune_own(self) -> None:
        """The command's own files older than what is published and kept (``prune``)."""
        if not self.cs.prune or self.cs.checkpoint_file is not None:
            return
        oldest = self.pub.oldest_kept()
        if oldest is None or not self.lease.valid(0.0):
            return
        try:
            self.watcher.prune_before(oldest)
        except OSError as e:
            self.emit(
                Log(level=LogLevel.WARNING, text=f"pruning the command's old checkpoints: {e}")
            )

    def _check(self) -> Outcome | None:
        """Between polls: a stop request, the lease, a hang."""
        stop = self.control.stop
        if stop is not None:
            if stop.fault:
                self.emit(
                    Fault(
                        fault=stop.fault,
                        step=self.meter.step,
                        message=f"{stop.reason}: SIGTERM to the command, SIGKILL after {self.cs.grace_s:g}s",
                    )
                )
            return self._stop(stop.reason, stop.exit_code, publish=stop.checkpoint)
        verdict = self.lease.verdict(self.cs.grace_s + 1.0, ended_within_s=LEASE_MARGIN_S)
        if verdict is Verdict.ENDED:
            self._lease_fault(
                f"lease of epoch {self.control.epoch} has ended; killing the command "
                "without taking its checkpoints"
            )
            return self._stop(StopReason.LEASE_LOST, exitcodes.LEASE_LOST, publish=False)
        if verdict is Verdict.ENDING:
            self._lease_fault(
                f"lease of epoch {self.control.epoch} ends in {self.lease.left() or 0:.1f}s "
                "without renewal; stopping the command"
            )
            return self._stop(StopReason.LEASE_LOST, exitcodes.LEASE_LOST, publish=True)
        timeout = self.cs.hang_timeout_s
        if timeout is not None and not self.meter.advanced:
            timeout = self.cs.startup_timeout_s or timeout
        quiet = time.monotonic() - self.meter.last_advance
        if timeout is not None and quiet > timeout:
            self.emit(
                Fault(
                    fault=FaultKind.HANG,
                    step=self.meter.step,
                    message=f"no progress for {quiet:.1f}s (hang_timeout_s {timeout:g}) after step "
                    f"{self.meter.step}; killing the command",
                )
            )
            self._terminate()
            self._after_end(self.proc.returncode if self.proc else None)
            return Outcome(exitcodes.FAILED, self.meter.step, "hang")
        return None

    def _lease_fault(self, message: str) -> None:
        self.emit(Fault(fault=FaultKind.LEASE_LOST, step=self.meter.step, message=message))

    # ---------------------------------------------------------------- ends

    def _stop(self, reason: StopReason, exit_code: int, *, publish: bool) -> Outcome:
        self._publishing = self._publishing and publish
        self._terminate()
        self._after_end(self.proc.returncode if self.proc else None)
        return self._stopped(reason, exit_code)

    def _stopped(self, reason: StopReason, exit_code: int) -> Outcome:
        step, saved = self.meter.step, self.pub.step
        self.emit(Stopped(step=step, reason=reason, checkpoint_step=saved, exit_code=exit_code))
        return Outcome(exit_code, step, reason)

    def _terminate(self) -> None:
        """SIGTERM to the group, ``grace_s`` (never past the lease's end), then SIGKILL."""
        proc = self.proc
        assert proc is not None
        signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.cs.grace_s
        if self.control.lease_deadline is not None:
            deadline = min(deadline, self.control.lease_deadline - LEASE_MARGIN_S)
        while proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                proc.fence.end()  # the whole run, whatever session its processes moved to
                proc.wait()
                break
            self._observe()
            try:
                proc.wait(timeout=min(self.poll_s, max(0.0, deadline - now)))
            except subprocess.TimeoutExpired:
                pass
        self._ended_at = time.monotonic()
        proc.fence.end()  # what is left of the run (workers of a dead leader)
        self.emit(Log(level=LogLevel.INFO, text=f"command {describe_exit(proc.returncode)}"))

    def _exited(self, code: int) -> Outcome:
        self._ended_at = time.monotonic()
        assert self.proc is not None
        self.proc.fence.end()
        self._after_end(code)
        step = self.meter.step
        last = self.pub.last
        if code == 0:
            step = max(step, last.step if last else 0)
            digest = self._params_digest or (last.sha256 if last else "")
            warnings = []
            if last is None:
                where = self.cs.checkpoint_file or self.cs.checkpoint_glob
                warnings.append(
                    f"the command finished and no checkpoint of it was ever taken (none "
                    f"complete in {self.ckpt_dir} matching {where!r}): a failover or a "
                    "crash would have restarted it from step 0"
                )
            if not digest:
                warnings.append(
                    "the command finished without a complete checkpoint or a params_regex "
                    "match; params_sha256 is empty"
                )
            for text in warnings:
                self.emit(Log(level=LogLevel.WARNING, text=text))
            self.emit(Finished(step=step, params_sha256=digest, warnings=warnings))
            return Outcome(exitcodes.OK, step, "finished", digest)
        if code < 0 and self.lease.verdict(0.0, ended_within_s=LEASE_MARGIN_S) is Verdict.ENDED:
            # killed at the lease's end by its fence (the executor itself frozen past it, say,
            # and the exit seen first once it woke): a lease lost, not the command's crash
            self._lease_fault(
                f"lease of epoch {self.control.epoch} has ended; the command was "
                f"{describe_exit(code)} at its end, no checkpoint taken after it"
            )
            return self._stopped(StopReason.LEASE_LOST, exitcodes.LEASE_LOST)
        tail = " | ".join(self.lines.tail)
        self.emit(
            Fault(
                fault=FaultKind.CRASH,
                step=step,
                fatal=True,
                message=f"the command {describe_exit(code)} after step {step}"
                + (f"; stderr: {tail[-600:]}" if tail else ""),
            )
        )
        return Outcome(exitcodes.FAILED, step, "crash")

    def _after_end(self, code: int | None) -> None:
        """The command has ended: drain its output, take its last complete checkpoints, report."""
        for t in self._readers:
            t.join(READER_JOIN_S)
        self.lines.flush()
        if self._metrics is not None:
            for step, loss in self._metrics.records():
                self.meter.update(step, loss)
        if self._may_publish():
            self._publish_new(exited_ok=code == 0, ended_at=self._ended_at)
        self.meter.maybe_emit(force=True)

    def _kill_leftovers(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if self._unwatch is not None:
            self._unwatch()
        proc.fence.end()
        proc.wait()
        if not any(t.is_alive() for t in self._readers):
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def _reap(self) -> None:
        """The command's workers that outlived its leader (they carry its token) die too."""
        try:
            gone = reap_command(self.workdir)
        except CommandLingers as e:
            self.emit(Log(level=LogLevel.WARNING, text=str(e)))
            return
        if gone:
            self.emit(
                Log(level=LogLevel.INFO, text=f"killed {gone} leftover process(es) of the command")
            )
