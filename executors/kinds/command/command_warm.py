"""The command kind's warm start: when to fork a run from the job's zygote, and when not.

``CommandRunner`` asks ``prepare`` as a run begins (the zygote imports while the checkpoint is
restored), ``ready`` once the argv is final (waits for the zygote's spare) and ``launch``;
``launch`` returning None means: start the command with exec, as without ``preload``. Each
such fallback is a Log line that says why (``preload: starting the command with exec: ...``):
a ``warning`` when the table named its modules, an ``info`` line, each reason once, when it
did not (``AUTO_PRELOAD``: torchrun or a shell is simply exec'd); a zygote that failed is not
started again for the same command.
"""

from __future__ import annotations

import time
from pathlib import Path

from executors.agent.control import Control
from executors.fencing import cgroup
from executors.fencing.publish import Emit
from executors.kinds.command import zygote
from executors.kinds.command.command_io import per_run_names
from executors.kinds.command.zygote import ForkedRun, Plan, Zygote, ZygoteError
from protocol.messages import Log, LogLevel
from protocol.spec import CommandSpec

READY_TIMEOUT_S = 300.0
"""How long a run waits for its zygote's imports before it is started with exec instead (or
``startup_timeout_s``, else ``hang_timeout_s``, when shorter). The lease is not watched here:
a lease that ends while the zygote imports is fenced by the executor's watchdog, as a run's."""


LAUNCHERS = frozenset({"torch.distributed.run", "torch.distributed.launch"})
"""Modules whose workers start interpreters of their own: forking the launcher warm saves
nothing, so ``AUTO_PRELOAD`` execs them (a table that names ``preload`` still forks them)."""


def _plan(argv: list[str], cwd: Path, env: dict[str, str], auto: bool) -> Plan | str:
    """``zygote.plan``, or why not: with ``auto``, a launcher is exec'd too."""
    p = zygote.plan(argv, cwd, env)
    if auto and not isinstance(p, str) and p.module in LAUNCHERS:
        return f"{p.module} is a launcher (its workers start interpreters of their own)"
    return p


class WarmStart:
    def __init__(
        self, job: str, cs: CommandSpec, workdir: Path, cwd: Path, control: Control, emit: Emit
    ) -> None:
        self.job, self.cs, self.workdir, self.cwd = job, cs, workdir, cwd
        self.control, self.emit = control, emit
        self.per_run = per_run_names(cs.env)
        """Set in each run, no reason for a new zygote."""
        self.preload = cs.preloads
        self.auto = cs.preload is None
        """Unset in the table: a fallback to exec is expected somewhere, not a warning."""
        self._said: set[str] = set()
        self._zygote: Zygote | None = None
        self._failed_note: str | None = None
        self._no_cgroup: str | None = None

    def prepare(self, argv: list[str], env: dict[str, str]) -> None:
        """The job's zygote for this command, started now if it has none (or another's)."""
        p = _plan(argv, self.cwd, env, self.auto)
        if isinstance(p, str):
            return  # ready() says why
        no_cgroup = cgroup.usable()
        if no_cgroup is not None:  # a forked run is fenced by its cgroup alone
            self._zygote, self._failed_note = None, None
            self._no_cgroup = f"runs get no cgroup on this host ({no_cgroup})"
            return
        k = zygote.key(p, self.preload, self.cwd, env, self.per_run)
        title = ["hotspare-zygote", f"job={self.job}", f"preload={','.join(self.preload)}"]
        z, note = zygote.ensure(self.workdir, k, env, title)
        if z is not None and note is not None:
            self.emit(Log(level=LogLevel.INFO, text=f"preload: {note}"))
        self._zygote, self._failed_note = z, note if z is None else None

    def ready(self, argv: list[str], env: dict[str, str]) -> tuple[Zygote, Plan] | None:
        """Wait for the zygote's spare; None when the command is to be exec'd (said why) or a
        stop came first."""
        p = _plan(argv, self.cwd, env, self.auto)
        if isinstance(p, str):
            self._cold(p)
            return None
        z = self._zygote
        if z is None or zygote.key(p, self.preload, self.cwd, env, self.per_run) != z.key:
            self.prepare(argv, env)
            z = self._zygote
        if z is None:
            self._cold(self._no_cgroup or f"{self._failed_note} (the zygote failed before)")
            return None
        cs = self.cs
        limit = min(READY_TIMEOUT_S, cs.startup_timeout_s or cs.hang_timeout_s or READY_TIMEOUT_S)
        try:
            ok = z.wait_ready(time.monotonic() + limit, lambda: self.control.stop is not None)
        except ZygoteError as e:
            self._fail(z, str(e))
            return None
        return (z, p) if ok else None

    def launch(
        self, argv: list[str], env: dict[str, str], warm: tuple[Zygote, Plan] | None
    ) -> ForkedRun | None:
        """The run forked from the zygote; None: exec it (said why, unless ``warm`` was None)."""
        if warm is None:
            return None
        z, p = warm
        try:
            return z.run(
                p,
                argv,
                cwd=self.cwd,
                env=env,
                record_in=self.workdir,
                deadline=self.control.lease_deadline,
            )
        except ZygoteError as e:
            self._fail(z, str(e))
            return None

    def close(self) -> None:
        zygote.close(self.workdir)

    def _fail(self, z: Zygote, why: str) -> None:
        zygote.failed(self.workdir, z, why)
        self._zygote = None
        self._cold(why)

    def _cold(self, why: str) -> None:
        text = f"preload: starting the command with exec: {why}"
        if not self.auto:
            self.emit(Log(level=LogLevel.WARNING, text=text))
        elif why not in self._said:
            self._said.add(why)
            self.emit(Log(level=LogLevel.INFO, text=text))
