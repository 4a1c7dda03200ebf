"""The chaos fleet: real sshd hosts (most inside network namespaces), each host's disk a small
tmpfs, a fake NVML state file per host, the inventory, and the headless console as a process
that can be killed and started again. Everything made here is undone by ``close``."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.etcdbed import EtcdCluster
from support.fleetbed import FULL_SPEED_ENV, write_inventory
from support.helpers import REPO, TINY_CONFIG, env_with
from support.netbed import NsSshHost
from support.sshbed import SshBed, SshHost

from chaos import torchrun
from chaos.observe import journal
from console.records.journal import Event
from console.service.client import ControllerGone, Remote
from console.service.standby import DEPOSED
from executors.testing.gpu_fake import write_state

DISK_MB = 48
"""Each host's disk: big enough for the bundle, checkpoints and replicas; small to fill."""
HEALTHY_GPU: dict[str, Any] = {"devices": [{"name": "Fake H100", "temp_c": 50}]}
FAILING_GPU: dict[str, Any] = {
    "devices": [{"name": "Fake H100", "temp_c": 50, "ecc_uncorrected": 2, "xids": [79]}]
}
CONSOLE = [sys.executable, "-m", "console.cli"]
# name, namespaced, region, role
# d, the one loopback host, is a job's last choice, so a partition most often finds a target
LAYOUT = (("a", True, "r1", "primary"), ("b", True, "r1", "spare"), ("c", True, "r2", "spare"))
LAYOUT += (("d", False, "r2", "primary"),)
STANDBY_LEASE_S = 8.0
STANDBY_TTL_S = 2.0
"""Standby controllers (``--standby``): the settings tests/console/supervise/test_standby.py proves, a
lease long enough for a standby on this machine to take over and renew inside it."""
SLOTS = ("state", "state-2")
"""Each controller's state dir (its own machine's, in a real fleet); one slot without etcd."""


@dataclass
class JobPlan:
    name: str
    host: str
    spare: str
    steps: int
    seed: int
    kind: str = "torch"
    """``torch`` (the charlm workload) or ``torchrun`` (a command job: chaos.torchrun)."""


@dataclass
class Fleet:
    folder: Path
    bed: SshBed
    hosts: dict[str, SshHost] = field(default_factory=dict)
    mounts: list[Path] = field(default_factory=list)
    jobs: list[JobPlan] = field(default_factory=list)
    inventory: Path | None = None
    baseline_inventory: Path | None = None
    """Torchrun jobs renamed for their uninterrupted runs (``write_inventory``)."""
    inject: str = ""
    console: subprocess.Popen[bytes] | None = None
    """The controller of the first slot: the fleet's only one, or one of two with etcd."""
    etcd: EtcdCluster | None = None
    """Standby mode: a 3-member etcd cluster on loopback and a controller per slot."""
    standby: subprocess.Popen[bytes] | None = None
    """The controller of the second slot (standby mode)."""
    console_starts: int = 0
    deposed: list[float] = field(default_factory=list)
    """When a controller that had lost its lead ended (standby mode; started again)."""
    clock_shifts: list[float] = field(default_factory=list)
    """Every wall-clock step the console was given (chaos.faults_fencing.wall_clock_step)."""

    # ------------------------------------------------------------ building

    @classmethod
    def build(cls, seed: int, standby: bool = False) -> Fleet:
        folder = Path(tempfile.mkdtemp(prefix="cz-", dir="/tmp"))
        fleet = cls(folder, SshBed(folder / "bed"))
        try:
            if standby:
                (folder / "etcd").mkdir()
                fleet.etcd = EtcdCluster(folder / "etcd")
                fleet.etcd.start()
            for name, namespaced, _, _ in LAYOUT:
                host = fleet._host(name, namespaced)
                fleet.hosts[name] = host
                fleet._mount(host.root)  # before sshd starts: a namespaced sshd copies the mounts
                host.start()
                write_state(fleet.nvml(name), HEALTHY_GPU)
        except BaseException:
            fleet.close()
            raise
        return fleet

    def _host(self, name: str, namespaced: bool) -> SshHost:
        """A host in the bed (and its known_hosts), not started yet (netbed.ns_host starts);
        ``namespaced``: in a network namespace of its own, on a /24 no other test here uses."""
        if not namespaced:
            return self.bed.host(name=name, start=False)
        taken = {
            int(h.address.rsplit(".", 1)[1]) for h in self.bed.hosts if h.address[:4] == "127."
        }
        host = NsSshHost(self.bed, next(i for i in range(2, 250) if i not in taken), name)
        self.bed.hosts.append(host)
        with open(self.bed.known_hosts, "a") as f:
            f.write(host.known_hosts_line + "\n")
        return host

    def _mount(self, root: Path) -> None:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(root)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise RuntimeError(f"cannot mount a tmpfs on {root} (root needed): {done.stderr}")
        self.mounts.append(root)

    def nvml(self, host: str) -> Path:
        return self.folder / f"nvml-{host}.json"

    def namespaced(self, host: str) -> bool:
        return isinstance(self.hosts[host], NsSshHost)

    def write_inventory(self, jobs: list[JobPlan], checkpoint_every: int) -> Path:
        """The fleet's inventory; also, for torchrun jobs, ``baseline_inventory``: the same jobs
        under other names, for their uninterrupted runs (see chaos.torchrun)."""
        self.jobs = jobs
        self.inventory = self._inventory("inventory.toml", jobs, checkpoint_every, "")
        if self.etcd is not None:
            self._inventory("inventory-2.toml", jobs, checkpoint_every, "", SLOTS[1])
        if any(j.kind == torchrun.KIND for j in jobs):
            torchruns = [j for j in jobs if j.kind == torchrun.KIND]
            self.baseline_inventory = self._inventory(
                "baseline.toml", torchruns, checkpoint_every, torchrun.BASELINE_PREFIX
            )
        return self.inventory

    def _inventory(
        self, name: str, jobs: list[JobPlan], every: int, prefix: str, slot: str = SLOTS[0]
    ) -> Path:
        hosts = {
            name: self.hosts[name].inventory_table(region, role=role)
            for name, _, region, role in LAYOUT
        }
        table = {}
        for j in jobs:
            job: dict[str, Any] = {
                "host": j.host,
                "spares": [j.spare],
                "steps": j.steps,
                "seed": j.seed,
                "keep_checkpoints": 3,
            }
            if j.kind == torchrun.KIND:
                job.update(executor="command", command=torchrun.command_table(every))
            else:
                job.update(
                    workload="charlm",
                    checkpoint_every_steps=every,
                    config=dict(TINY_CONFIG, micro_batch=4),
                )
            table[prefix + j.name] = job
        standby: dict[str, Any] = {}
        if self.etcd is not None:
            standby = {
                "etcd": self.etcd.endpoints,
                "etcd_ttl_s": STANDBY_TTL_S,
                "lease_s": STANDBY_LEASE_S,
                "etcd_prefix": "/chaos",
            }
        return write_inventory(
            self.folder / name,
            hosts=hosts,
            jobs=table,
            min_free_disk_gb=0.0,
            health={"disk_free_warn_gb": 0.001},
            state_dir=str(self.folder / slot),
            **standby,
        )

    def executor_env(self) -> dict[str, dict[str, str]]:
        env = {}
        for name in self.hosts:
            extra = {**FULL_SPEED_ENV, "HOTSPARE_FAKE_NVML": str(self.nvml(name))}
            if self.inject:
                extra["HOTSPARE_INJECT"] = self.inject
            env[name] = extra
        return env

    @property
    def state_dir(self) -> Path:
        return self.folder / "state"

    @property
    def clock_offset_file(self) -> Path:
        """The console's wall-clock test hook (console/clock.py): seconds added to its clock."""
        return self.folder / "clock-offset"

    @property
    def state_dirs(self) -> list[Path]:
        """Every controller's state dir (two in standby mode)."""
        return [self.folder / s for s in SLOTS] if self.etcd is not None else [self.state_dir]

    def journal(self) -> list[Event]:
        """The controllers' journals as one timeline, on the real clock (see observe.unshift)."""
        return journal(self.state_dirs, self.clock_shifts)

    def lease_record(self, job: str) -> dict[str, Any] | None:
        """The bound on the job's newest lease as a controller persisted it (state.json; the
        latest of the two in standby mode)."""
        found = []
        for d in self.state_dirs:
            try:
                state = json.loads((d / "state.json").read_text())
            except (OSError, ValueError):
                continue
            rec = state.get("jobs", {}).get(job, {})
            lease = rec.get("lease") if isinstance(rec, dict) else None
            if isinstance(lease, dict):
                found.append(lease)
        return max(found, key=lambda x: float(x.get("until", 0) or 0), default=None)

    def workdir(self, host: str, job: str) -> Path:
        return self.hosts[host].root / "jobs" / job

    def replicas(self, host: str, job: str) -> Path:
        return self.hosts[host].root / "replicas" / job

    # ------------------------------------------------------------ console

    def start_console(self) -> None:
        self.console = self.spawn_console()
        if self.etcd is not None and self.standby is None:
            self.standby = self.spawn_console(SLOTS[1])

    def spawn_console(self, slot: str = SLOTS[0]) -> subprocess.Popen[bytes]:
        """``hotspare run --policy auto`` on a slot's state dir, its output in files."""
        assert self.inventory is not None
        inventory = self.inventory if slot == SLOTS[0] else self.folder / "inventory-2.toml"
        self.console_starts += 1
        n = self.console_starts
        out, err = self.console_output(n)
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            return subprocess.Popen(
                [*CONSOLE, "--inventory", str(inventory), "run", "--policy", "auto", "--json"],
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                env=env_with(
                    HOTSPARE_EXECUTOR_ENV=json.dumps(self.executor_env()),
                    HOTSPARE_CLOCK_OFFSET_FILE=str(self.clock_offset_file),
                ),
            )

    def console_output(self, n: int) -> tuple[Path, Path]:
        """(stdout, stderr) files of the n-th console started."""
        return self.folder / f"console-{n}.out", self.folder / f"console-{n}.err"

    def kill_console(self) -> None:
        """The console dies at once (SIGKILL): nothing tells the executors."""
        proc, self.console = self.console, None
        _kill(proc)

    def leading_slot(self) -> str | None:
        """Standby mode: the slot whose controller leads (its hello names no standby)."""
        for slot, proc in zip(SLOTS, (self.console, self.standby), strict=True):
            if proc is None or proc.poll() is not None:
                continue
            remote = Remote(self.folder / slot, timeout=5.0)
            try:
                hello = remote.hello()
            except ControllerGone:
                continue
            finally:
                remote.close()
            if hello.get("pid") == proc.pid and not hello.get("standby"):
                return slot
        return None

    def kill_leader(self, slot: str) -> None:
        """Standby mode: the leading controller SIGKILLed, and one started in its place (as
        its supervisor would), which stands by."""
        if slot == SLOTS[0]:
            self.kill_console()
            self.console = self.spawn_console(slot)
        else:
            proc, self.standby = self.standby, None
            _kill(proc)
            self.standby = self.spawn_console(slot)

    def check_console(self) -> None:
        """Raise if a controller has ended (with its last words). In standby mode a controller
        that lost its lead (exit ``DEPOSED``) is started again, as its supervisor would: the
        times are kept (``deposed``), and the incidents it leaves are the checks' to judge."""
        if self.etcd is not None:
            for slot, proc in zip(SLOTS, (self.console, self.standby), strict=True):
                if proc is not None and proc.poll() == DEPOSED:
                    self.deposed.append(time.time())
                    if slot == SLOTS[0]:
                        self.console = self.spawn_console(slot)
                    else:
                        self.standby = self.spawn_console(slot)
        for proc in (self.console, self.standby):
            if proc is not None and proc.poll() not in (None, 0):
                raise AssertionError(
                    f"hotspare run exited {proc.returncode}: {self.console_stderr()[-1500:]}"
                )

    def console_exit(self, timeout: float) -> int:
        """The run's exit status; in standby mode the first controller to end (the leader, once
        every job is done) and then the other, which leads to find nothing left to do."""
        assert self.console is not None
        if self.standby is None:
            return self.console.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        procs = [self.console, self.standby]
        while all(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("hotspare run", timeout)
            time.sleep(0.2)  # polling, bounded by the deadline above
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        return next((c for c in codes if c != 0), 0)

    def console_stderr(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.folder.glob("console-*.err"))
        )

    def report(self) -> str:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "console.cli",
                "report",
                *(x for d in self.state_dirs if d.exists() for x in ("--state-dir", str(d))),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env_with(),
            timeout=120,
        )
        if done.returncode != 0:
            raise AssertionError(f"hotspare report failed: {done.stderr.strip()}")
        return done.stdout

    # ------------------------------------------------------------ teardown

    def close(self, keep: bool = False) -> None:
        """Every process, namespace and mount made here goes, even after a failure."""
        with contextlib.suppress(Exception):
            self.kill_console()
        with contextlib.suppress(Exception):
            proc, self.standby = self.standby, None
            _kill(proc)
        if self.etcd is not None:
            with contextlib.suppress(Exception):
                self.etcd.stop()
        for host in self.hosts.values():
            if isinstance(host, NsSshHost):
                with contextlib.suppress(Exception):
                    host.netns.heal()
        with contextlib.suppress(Exception):
            self.bed.stop()  # kill_all per host; namespaces deleted
        if keep:
            for name, host in self.hosts.items():
                with contextlib.suppress(OSError):  # the disks are tmpfs: keep all but the data
                    shutil.copytree(
                        host.root,
                        self.folder / "disks" / name,
                        ignore=shutil.ignore_patterns(
                            "*.pt", "*.tmp", "*.sock", "filler", "bundles"
                        ),
                        symlinks=True,
                    )
        for root in self.mounts:
            subprocess.run(["umount", "-l", str(root)], capture_output=True, timeout=30)
        self.mounts.clear()
        if not keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
