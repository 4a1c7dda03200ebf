"""Hosts made on demand: when a job waits for a host and none is usable, the inventory's
``[provisioner] command`` is run (argv, never a shell) and prints the new host's ``[hosts.X]``
table as one JSON object with a ``name``; the host is preflighted and the executor deployed
there, and only then is it added to the inventory (appended, as ``n`` does) and to the running
fleet, where the waiting job takes it. A host that fails its preflight is given back (the
``release`` command) and another is provisioned.

One provision at a time, at most ``max_hosts`` provisioned hosts held; each run has a timeout
(its whole process group killed past it); a failure (exit status, output that is not a host
table, a table the inventory refuses, a hang) is one alert line and a retry after an
exponential back-off (tenacity), for as long as a job still waits. A provisioned host idle
(no job on it, no job's spare) past ``idle_release_s`` is given back: it is taken out of use
for good first (cordoned, never a failover target, a spare or a restart's host), then the
``release`` command runs with its name, then its table is taken out of the inventory. Every
provision and release is in the journal with its cost in seconds.

With ``min_spares`` (region -> count), a region with fewer free hosts (fit, no job training
on them) gets one provisioned for it: the command runs with ``HOTSPARE_REGION`` set, and a
host it prints in another region is refused (and given back). A provisioned host is not
released while that would leave its region short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from console.inventory import ProvisionerSettings
from console.reach.check import Readied
from console.records.journal import Journal, Kind
from protocol.errors import ConfigError, HotspareError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
RELEASE_CHECK_S = 5.0
"""How often provisioned hosts are checked for idleness."""
OUTPUT_LIMIT = 1 << 20
"""Bytes of a provisioner's stdout read at most (a host table is a few hundred)."""


class ProvisionFailed(HotspareError):
    """One provision that did not give a usable host; the message is the alert's line."""

    permanent = False


class Provisioner:
    """Given the settings, how to ready a new host (preflight and deploy, before the fleet
    knows it; ConfigError when the inventory would refuse its table), how to add it
    (``Controller.add_host``: appends to the inventory, starts using it), the names known,
    whether a job still waits, how many free hosts a region has (for ``min_spares``), the
    journal and the alert sink."""

    def __init__(
        self,
        settings: ProvisionerSettings,
        *,
        prepare: Callable[[str, dict[str, Any]], Awaitable[Readied]],
        add: Callable[[str, dict[str, Any]], None],
        known: Callable[[], set[str]],
        provisioned: Callable[[], dict[str, str]],
        wanted: Callable[[], bool],
        free_in: Callable[[str], int],
        journal: Journal,
        alert: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self._prepare = prepare
        self._add = add
        self._known = known
        self._provisioned = provisioned
        """Hosts this fleet holds that a provisioner made, with their regions."""
        self._wanted = wanted
        self._free_in = free_in
        """Free hosts (fit, no job training on them) in a region."""
        self._journal = journal
        self._alert = alert
        self._task: asyncio.Task[None] | None = None

    async def keep(
        self,
        busy: Callable[[str], bool],
        released: Callable[[str], None],
        *,
        releasing: Callable[[str], None],
        quiet: Callable[[str], Awaitable[None]],
        chosen: Callable[[str], bool],
        every_s: float = RELEASE_CHECK_S,
    ) -> None:
        """Keep ``min_spares`` free hosts in each region named (provisioning one for a region
        short of it), and give back each provisioned host idle (``busy`` false: no job on
        it, no job's spare) past ``idle_release_s``, unless its region would then be short:
        ``releasing`` (out of use for good, cordoned), ``quiet`` (what the console still
        runs there, a health probe, is waited out), then its release command, then
        ``released`` (the console forgets it). A failed release is an alert and is tried again
        after a growing wait; the host stays out of use meanwhile (``chosen`` says so, also for
        one a console before this one chose).

        The host is found idle and taken out of use with no await between: a release command
        takes minutes (``sky down``), and a job placed there meanwhile would lose its host."""
        s = self.settings
        if s.release is None and not s.min_spares:
            return
        idle_since: dict[str, float] = {}
        next_try: dict[str, tuple[int, float]] = {}
        while True:
            await asyncio.sleep(every_s)
            for region, least in sorted(s.min_spares.items()):
                if (have := self._free_in(region)) < least:
                    self.want(f"{region} has {have} free hosts, min_spares {least}", region)
            if s.release is None:
                continue
            now = time.monotonic()
            for host, region in sorted(self._provisioned().items()):
                failures, at = next_try.get(host, (0, 0.0))
                if not chosen(host):
                    if busy(host):
                        idle_since.pop(host, None)
                        continue
                    idle = now - idle_since.setdefault(host, now)
                    if idle < s.idle_release_s:
                        continue
                    if self._free_in(region) - 1 < s.min_spares.get(region, 0):
                        continue  # kept as one of its region's min_spares
                    releasing(host)  # out of use before the command runs, no await since busy
                    self._journal.record(
                        Kind.ACTION,
                        f"provisioner: releasing {host} (after {idle:.0f} s idle): out of use "
                        "from now",
                        host=host,
                        data={"release": "chosen", "host": host, "idle_s": idle},
                    )
                elif now < at:
                    continue
                idle = now - idle_since.setdefault(host, now)
                await quiet(host)
                if await self._release(host, idle):
                    released(host)
                    idle_since.pop(host, None)
                    next_try.pop(host, None)
                else:
                    wait = min(s.retry_max_s, s.retry_s * 2**failures)
                    next_try[host] = (failures + 1, time.monotonic() + wait)

    async def _release(self, host: str, idle: float, why: str = "") -> bool:
        assert self.settings.release is not None
        t0 = time.monotonic()
        try:
            await self._run([*self.settings.release, host])
        except ProvisionFailed as e:
            self._alert(f"provisioner: releasing {host} failed: {e}; trying again later")
            self._journal.record(
                Kind.ACTION,
                f"provisioner: releasing {host} failed: {e}",
                host=host,
                data={"release": "failed", "host": host, "error": str(e)},
            )
            return False
        took = time.monotonic() - t0
        after = why or f"after {idle:.0f} s idle"
        self._journal.record(
            Kind.ACTION,
            f"provisioner: {host} released ({after}) in {took:.1f} s",
            host=host,
            data={"release": "done", "host": host, "seconds": took, "idle_s": idle},
        )
        return True

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def want(self, why: str, region: str | None = None) -> None:
        """A job waits for a host (or ``region`` is short of its ``min_spares``): provision
        one, unless one is on its way or the cap is met."""
        if self.busy:
            return
        held = len(self._provisioned())
        if held >= self.settings.max_hosts:
            self._alert(
                f"provisioner: {held} provisioned hosts held, the most max_hosts allows; "
                f"not provisioning another ({why})"
            )
            return
        self._task = asyncio.get_running_loop().create_task(self._until_one(why, region))

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _still_wanted(self, region: str | None) -> bool:
        if region is None:
            return self._wanted()
        return self._free_in(region) < self.settings.min_spares.get(region, 0)

    async def _until_one(self, why: str, region: str | None) -> None:
        s = self.settings
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(ProvisionFailed),
            wait=wait_exponential(multiplier=s.retry_s, max=s.retry_max_s),
            stop=lambda _state: not self._still_wanted(region),
            reraise=True,
        )
        with contextlib.suppress(ProvisionFailed):
            async for attempt in retrying:
                with attempt:
                    await self._once(why, attempt.retry_state.attempt_number, region)

    async def _once(self, why: str, attempt: int, region: str | None) -> None:
        t0 = time.monotonic()
        self._journal.record(
            Kind.ACTION,
            f"provisioner: provisioning a host ({why}; attempt {attempt})",
            data={"provision": "start", "attempt": attempt, "region": region},
        )
        made: str | None = None
        try:
            out = await self._run(self.settings.command, region)
            name, table = _host_table(out, self._known())
            made, made_s = name, time.monotonic() - t0
            if region is not None and table.get("region") != region:
                raise ProvisionFailed(
                    f"it printed {name} in region {table.get('region')!r}, not {region!r} "
                    "(HOTSPARE_REGION)"
                )
            try:
                ready = await self._prepare(name, table)
                if ready.problems:
                    raise ProvisionFailed(
                        f"{name} failed its preflight: {'; '.join(ready.problems)}"
                    )
                self._add(name, table)
            except ConfigError as e:
                raise ProvisionFailed(f"the host it printed is refused: {e}") from None
        except ProvisionFailed as e:
            took = time.monotonic() - t0
            self._alert(f"provisioner failed after {took:.1f} s: {e}; retrying")
            self._journal.record(
                Kind.ACTION,
                f"provisioner: failed after {took:.1f} s: {e}",
                host=made,
                data={"provision": "failed", "seconds": took, "error": str(e)},
            )
            if made is not None and self.settings.release is not None:
                await self._release(made, 0.0, why="it is not usable")
            raise
        took = time.monotonic() - t0
        self._journal.record(
            Kind.ACTION,
            f"provisioner: {name} provisioned in {took:.1f} s (made {made_s:.1f} s, "
            f"preflight {ready.preflight_s:.1f} s, deploy {ready.deploy_s:.1f} s)",
            host=name,
            data={
                "provision": "done",
                "host": name,
                "seconds": took,
                "made_s": made_s,
                "preflight_s": ready.preflight_s,
                "deploy_s": ready.deploy_s,
            },
        )

    async def _run(self, argv: list[str], region: str | None = None) -> str:
        """The command's stdout; ProvisionFailed on a non-zero exit or past the timeout (its
        process group is killed). ``region``: in its environment as ``HOTSPARE_REGION``."""
        env = {**os.environ, **({"HOTSPARE_REGION": region} if region else {})}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            raise ProvisionFailed(f"{argv[0]}: cannot run: {e.strerror or e}") from None
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                out, err = await proc.communicate()
        except TimeoutError:
            await _kill(proc)
            raise ProvisionFailed(
                f"{argv[0]}: no answer within timeout_s = {self.settings.timeout_s:g} s (killed)"
            ) from None
        except asyncio.CancelledError:  # the console closes: the command does not outlive it
            await asyncio.shield(_kill(proc))
            raise
        if proc.returncode != 0:
            last = _last_line(err.decode("utf-8", "replace"))
            raise ProvisionFailed(
                f"{argv[0]} exited {proc.returncode}" + (f": {last}" if last else "")
            )
        return out[:OUTPUT_LIMIT].decode("utf-8", "replace")


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL to the command's whole process group; reaped (it cannot refuse SIGKILL)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def _host_table(out: str, known: set[str]) -> tuple[str, dict[str, Any]]:
    """The host a provisioner printed: one JSON object with a ``name`` and the ``[hosts.X]``
    keys (the inventory checks those)."""
    try:
        data = json.loads(out)
    except ValueError:
        raise ProvisionFailed(f"its output is not JSON: {_last_line(out)[:80]!r}") from None
    if not isinstance(data, dict):
        raise ProvisionFailed("its output is not a JSON object (a host table)")
    name = data.pop("name", None)
    if not isinstance(name, str) or not NAME.match(name):
        raise ProvisionFailed(f"its host table has no usable name: {name!r}")
    if name in known:
        raise ProvisionFailed(f"it printed {name!r}, a host the inventory already has")
    return name, data


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
