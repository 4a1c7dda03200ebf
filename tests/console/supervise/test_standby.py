"""Standby controllers on a real 3-member etcd cluster: training outlives its leader.

Two ``hotspare serve`` processes of one inventory (each its own state dir) elect a leader; the
other stands by. The leader SIGKILLed: the standby takes over within the lease, reattaches to
the same executor process, and the job finishes bit-exact on its host, never stopped or moved.
The leader SIGSTOPped past its term and woken: it ends, deposed, and the executor trains on
under the new term. etcd members killed: one changes nothing; two (no quorum) and no lease is
granted, the executor stops at its lease's end, and nothing moves.

Evidence: ``/proc`` (the executor's pid and start time), the executor's own events and exit,
the workdirs on disk, etcd's keys, each controller's exit status and journal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos.observe import executor_events, last_step
from support.etcdbed import EtcdCluster, etcd_cluster_fixture  # noqa: F401 - the fixture
from support.fleetbed import (
    EXECUTOR_ENV,
    baseline_sha,
    local_host,
    stdlib_job,
    write_inventory,
)
from support.helpers import command_pid
from support.wait import wait_for as wait

from console.records.console_lock import held
from console.records.incidents import Resolution, incidents
from console.records.journal import Kind, read, read_all
from console.service.client import Remote
from console.service.etcd import Etcd
from console.service.standby import DEPOSED
from console.supervise.refusal import Refused
from executors import exitcodes

HOTSPARE = Path(sys.executable).with_name("hotspare")
LEASE_S = 8.0
TTL_S = 2.0
PREFIX = "/hotspare-test"


def trained_on(root: Path) -> list[str]:
    """The training events an executor of job j wrote on a host (an idle standby writes none)."""
    path = root / "jobs" / "j" / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    training = {"progress", "resumed", "checkpoint", "finished", "run_ended"}
    return [k for x in lines if (k := json.loads(x).get("kind")) in training]


def inventories(tmp_path: Path, cluster: EtcdCluster, steps: int) -> list[Path]:
    """One inventory per controller (as each machine has its own copy): the same hosts, job
    and etcd, each with its own state dir."""
    paths = []
    for name in ("c1", "c2"):
        (tmp_path / name).mkdir()
        paths.append(
            write_inventory(
                tmp_path / name / "inventory.toml",
                hosts={
                    "a": local_host(tmp_path / "a"),
                    "b": local_host(tmp_path / "b", role="spare"),
                },
                jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=steps)}},
                lease_s=LEASE_S,
                etcd=cluster.endpoints,
                etcd_ttl_s=TTL_S,
                etcd_prefix=PREFIX,
            )
        )
    return paths


class Serving:
    """``hotspare serve`` on one inventory, its output in a file."""

    def __init__(self, inventory: Path) -> None:
        self.inventory = inventory
        self.out = inventory.parent / "serve.out"
        hook = json.dumps({h: dict(EXECUTOR_ENV) for h in ("a", "b")})
        self.proc = subprocess.Popen(
            [str(HOTSPARE), "--inventory", str(inventory), "serve", "--policy", "auto"],
            stdout=self.out.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "HOTSPARE_EXECUTOR_ENV": hook, "OMP_NUM_THREADS": "1"},
            start_new_session=True,
        )

    def said(self) -> str:
        return self.out.read_text(errors="replace")

    def journal(self) -> list[object]:
        return list(read(self.inventory.parent / "state" / "journal.jsonl"))

    def term(self) -> int | None:
        for e in self.journal():
            if e.kind is Kind.CONSOLE and "leading as term" in e.msg:  # type: ignore[attr-defined]
                return int(e.data["term"])  # type: ignore[attr-defined]
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def controllers() -> Iterator[list[Serving]]:
    started: list[Serving] = []
    yield started
    for s in started:
        s.kill()


def leader_name(s: Serving) -> str:
    """How etcd's leader key names a controller: host:pid:state_dir."""
    return f"{socket.gethostname()}:{s.proc.pid}:{s.inventory.parent / 'state'}"


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def reap_executors(tmp_path: Path) -> Iterator[None]:
    yield
    for host in ("a", "b"):
        with contextlib.suppress(OSError, ValueError):
            pid = int((tmp_path / host / "jobs" / "j" / "executor.pid").read_text())
            if Path(f"/proc/{pid}/cmdline").read_bytes().find(str(tmp_path).encode()) >= 0:
                os.kill(pid, signal.SIGKILL)


def lead_and_stand_by(
    invs: list[Path], controllers: list[Serving], workdir: Path, past_step: int
) -> tuple[Serving, Serving, int]:
    """The first controller leads and trains j on a past ``past_step``; the second stands by.
    Returns them and the executor's pid."""
    leader = Serving(invs[0])
    controllers.append(leader)
    wait(leader.term, 60, "the first controller leading")
    wait(lambda: last_step(workdir) > past_step, 120, f"j past step {past_step} on a")
    standby = Serving(invs[1])
    controllers.append(standby)
    wait(lambda: "standing by" in standby.said(), 60, "the second controller standing by")
    return leader, standby, int((workdir / "executor.pid").read_text())


@pytest.mark.long  # the suite kills the leader mid-failover (in this file): the standby takes over and finishes
def test_the_leader_killed_the_standby_renews_and_the_job_finishes_bit_exact_in_place(
    tmp_path: Path, etcd_cluster: EtcdCluster, controllers: list[Serving], reap_executors: None
) -> None:
    invs = inventories(tmp_path, etcd_cluster, steps=3000)
    workdir = tmp_path / "a" / "jobs" / "j"
    reference = baseline_sha(invs[0], "j", tmp_path / "baseline")
    leader, standby, executor = lead_and_stand_by(invs, controllers, workdir, 200)
    born = start_time(executor)
    # a view on the standby's machine says it stands by and who leads; its actions are refused
    view = subprocess.run(
        [str(HOTSPARE), "--inventory", str(invs[1])],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert view.returncode == 1 and len(view.stderr.splitlines()) == 1, view.stderr
    assert f"standing by: {leader_name(leader)} leads" in view.stderr, view.stderr
    remote = Remote(invs[1].parent / "state")
    with pytest.raises(Refused, match="standing by"):
        remote.stop_job("j")
    remote.close()

    leader.kill()  # SIGKILL, mid-run
    wait(standby.term, 60, "the standby leading")
    assert standby.term() > leader.term()  # type: ignore[operator]
    wait(
        lambda: standby.proc.poll() is not None or "finished at step" in standby.said(),
        300,
        "j finished under the standby",
    )
    finished = [e for e in standby.journal() if e.kind is Kind.FINISHED]  # type: ignore[attr-defined]
    assert len(finished) == 1 and finished[0].data["params_sha256"] == reference  # type: ignore[attr-defined]
    assert finished[0].host == "a"  # type: ignore[attr-defined]
    # one executor process, start to finish: never stopped, never replaced, never moved
    assert not alive(executor) or start_time(executor) == born
    assert "stopped" not in [e.get("kind") for e in executor_events(workdir)]
    assert not trained_on(tmp_path / "b"), "b never trained (its warm standby idles)"
    reattached = [e for e in standby.journal() if "reattached to executor pid" in e.msg]  # type: ignore[attr-defined]
    assert reattached and f"pid {executor} " in reattached[0].msg  # type: ignore[attr-defined]
    incidents = [
        e
        for e in standby.journal()
        if e.kind is Kind.INCIDENT and e.data.get("class") == "console_failover"  # type: ignore[attr-defined]
    ]
    assert len(incidents) == 1
    assert (workdir / "term").read_text().strip() == str(standby.term())
    # the two controllers' journals, read as one timeline: the run whole, its one incident
    dirs = [a for inv in invs for a in ("--state-dir", str(inv.parent / "state"))]
    done = subprocess.run(
        [str(HOTSPARE), "report", *dirs, "--json"], capture_output=True, text=True, timeout=120
    )
    report = json.loads(done.stdout)
    assert report["finished"] == {"j": reference}
    (inc,) = report["incidents"]
    assert inc["class"] == "console_failover" and inc["resolved"] and inc["lost_steps"] == 0
    done = subprocess.run(
        [str(HOTSPARE), "lineage", "j", *dirs, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    steps = [c["step"] for c in json.loads(done.stdout)["chain"] if c["kind"] == "checkpoint"]
    assert steps == sorted(steps) and steps[0] == 20 and steps[-1] >= 2980, steps[-3:]
    assert {c["epoch"] for c in json.loads(done.stdout)["chain"] if "epoch" in c} == {1}


def test_a_leader_stopped_past_its_term_wakes_deposed_and_orders_nothing(
    tmp_path: Path, etcd_cluster: EtcdCluster, controllers: list[Serving], reap_executors: None
) -> None:
    invs = inventories(tmp_path, etcd_cluster, steps=400_000)
    workdir = tmp_path / "a" / "jobs" / "j"
    leader, standby, executor = lead_and_stand_by(invs, controllers, workdir, 20)
    born = start_time(executor)
    os.killpg(leader.proc.pid, signal.SIGSTOP)  # a VM paused, a laptop's lid: past its term
    try:
        wait(standby.term, 60, "the standby leading")
        wait(
            lambda: (workdir / "term").read_text().strip() == str(standby.term()),
            30,
            "the executor linked under the new term",
        )
        etcd = Etcd(etcd_cluster.endpoints)
        woke = etcd.get(f"{PREFIX}/writer")
        assert woke is not None and woke.value == str(standby.term()).encode()
    finally:
        os.killpg(leader.proc.pid, signal.SIGCONT)
    code = leader.proc.wait(timeout=60)
    assert code == DEPOSED, leader.said()[-2000:]
    assert "lost the lead" in leader.said(), leader.said()[-2000:]
    # nothing it wrote after waking landed: every version of the state since, the new term's
    now = etcd.get(f"{PREFIX}/writer")
    assert now is not None
    for revision in range(woke.mod_revision, now.mod_revision + 1):
        kv = etcd.get(f"{PREFIX}/writer", revision)
        assert kv is not None and kv.value == str(standby.term()).encode(), revision
    step = last_step(workdir)
    wait(lambda: last_step(workdir) > step + 20, 60, "j training on under the new leader")
    assert alive(executor) and start_time(executor) == born
    kinds = [e.get("kind") for e in executor_events(workdir)]
    assert "stopped" not in kinds
    refused = [e for e in executor_events(workdir) if "refused" in str(e.get("text", ""))]
    assert all(f"term {leader.term()}" in str(e["text"]) for e in refused)


def test_etcd_one_member_lost_changes_nothing_two_lost_and_nothing_is_granted_or_moved(
    tmp_path: Path, etcd_cluster: EtcdCluster, controllers: list[Serving], reap_executors: None
) -> None:
    invs = inventories(tmp_path, etcd_cluster, steps=400_000)
    workdir = tmp_path / "a" / "jobs" / "j"
    leader, standby, executor = lead_and_stand_by(invs, controllers, workdir, 20)
    born = start_time(executor)

    etcd_cluster.kill("m0")
    step, until = last_step(workdir), time.monotonic() + 3 * LEASE_S
    while time.monotonic() < until:  # three leases pass: nothing changes
        assert leader.proc.poll() is None, leader.said()[-2000:]
        time.sleep(0.2)  # sampling while time passes (the property is the time)
    assert last_step(workdir) > step and alive(executor) and start_time(executor) == born
    assert standby.term() is None

    etcd_cluster.kill("m1")  # no quorum
    code = leader.proc.wait(timeout=60)
    assert code == DEPOSED, leader.said()[-2000:]
    wait(lambda: not alive(executor), LEASE_S * 3, "the executor stopped at its lease's end")
    ends = [e for e in executor_events(workdir) if e.get("kind") == "run_ended"]
    exit_codes = [e.get("exit_code") for e in ends]
    assert exitcodes.LEASE_LOST in exit_codes or any(
        e.get("fault") == "lease_lost" for e in executor_events(workdir)
    ), executor_events(workdir)[-5:]
    assert standby.term() is None and standby.proc.poll() is None, "no standby led"
    assert not trained_on(tmp_path / "b"), "nothing moved to b (its warm standby idles)"
    # `hotspare stop` ends a standby too (it answers on its socket while it waits)
    done = subprocess.run(
        [str(HOTSPARE), "--inventory", str(invs[1]), "stop"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert standby.proc.wait(timeout=30) == 0
    assert not held(invs[1].parent / "state")


def test_the_leader_killed_mid_failover_the_standby_finishes_it_with_one_trainer_at_a_time(
    tmp_path: Path, etcd_cluster: EtcdCluster, controllers: list[Serving], reap_executors: None
) -> None:
    """The job's host is lost, and the leader dies while it fails the job over: the standby
    takes the failover where the state in etcd left it. Never two trainers (sampled from
    /proc all along), the job bit-exact on b under a later epoch."""
    invs = inventories(tmp_path, etcd_cluster, steps=3000)
    workdir, spare = tmp_path / "a" / "jobs" / "j", tmp_path / "b" / "jobs" / "j"
    reference = baseline_sha(invs[0], "j", tmp_path / "baseline")
    leader, standby, executor = lead_and_stand_by(invs, controllers, workdir, 200)
    overlaps: list[int] = []
    sampling = threading.Event()

    on_a = [executor, command_pid(workdir)]  # the executor and the script it runs
    assert on_a[1] is not None, "a's executor recorded its command"

    def sample() -> None:  # anything of a's alive while anything on b has trained
        while not sampling.is_set():
            with contextlib.suppress(OSError, ValueError):
                on_b = [int((spare / "executor.pid").read_text()), command_pid(spare)]
                a_up = any(alive(p) for p in on_a if p is not None)
                if a_up and any(alive(p) for p in on_b if p is not None) and last_step(spare) > 0:
                    overlaps.append(on_b[0])
            time.sleep(0.02)  # sampling while time passes (the property is the time)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        remote = Remote(invs[0].parent / "state")
        remote.kill_host("a")  # the operator's demo kill: everything on a ends, a is down
        remote.close()
        wait(
            lambda: any(
                e.kind is Kind.INCIDENT and e.data.get("phase") == "detected"  # type: ignore[attr-defined]
                for e in leader.journal()
            ),
            60,
            "the leader detecting the loss",
        )
        leader.kill()  # mid-failover: waiting out a's lease, or readying b
        wait(standby.term, 60, "the standby leading")
        wait(
            lambda: standby.proc.poll() is not None or "finished at step" in standby.said(),
            300,
            "j finished under the standby",
        )
    finally:
        sampling.set()
        sampler.join(timeout=10)
    assert not overlaps, "two trainers at once"
    finished = [e for e in standby.journal() if e.kind is Kind.FINISHED]  # type: ignore[attr-defined]
    assert len(finished) == 1 and finished[0].host == "b"  # type: ignore[attr-defined]
    assert finished[0].data["params_sha256"] == reference  # type: ignore[attr-defined]
    epochs = {e.get("epoch") for e in executor_events(spare) if e.get("kind") == "resumed"}
    assert epochs and min(epochs) > 1, epochs  # type: ignore[operator]
    # one incident in the two journals: the loss the leader detected, carried on by the
    # standby (its detection is in the dead leader's journal alone) and resolved on b
    timeline = read_all([inv.parent / "state" / "journal.jsonl" for inv in invs])
    found = [i for i in incidents(timeline) if i.job == "j"]
    assert [(i.fault_class, i.resolution) for i in found] == [
        ("host_lost", Resolution.RECOVERED)
    ], [(i.id, i.fault_class, i.resolution, sorted(i.times)) for i in found]
    phases = [e.data.get("phase") for e in found[0].lines]
    assert "console_failover" in phases, phases
