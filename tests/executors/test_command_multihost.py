"""Multi-host jobs of the command kind: torchrun on every host, one executor per host.

Two real ``serve --kind command`` executors on 127.0.0.1, each in its own workdir (no shared
filesystem), are sent a Start with the group's Rendezvous, as the console would. The script
(tests/train_ddp_plain.py) is plain DDP and knows nothing of hotspare. The reference is one
uninterrupted group run; a group whose node 0 is SIGKILLed (its executor, torchrun and the
worker) and started again at epoch 2 from a step both hosts committed must end with the same
parameters. The placeholders and the committed-step restore are tested without torch.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
from support.helpers import REPO, ExecutorProcess, wait_for

from executors import exitcodes
from executors.agent.control import Control
from executors.agent.workdir import kill_command, read_command, recorded_cgroup
from executors.fencing import cgroup
from executors.kinds.command.command_files import Candidate, NotCommitted, Publisher
from executors.kinds.command.command_io import build_argv, command_env, group_values
from executors.kinds.command.command_kind import CommandRunner
from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, recv_message, send_message
from protocol.messages import (
    CheckpointSaved,
    ConsoleHello,
    ExecutorMessage,
    Fault,
    Finished,
    Log,
    Rendezvous,
    Resumed,
    RunEnded,
    Start,
)
from protocol.spec import CheckpointManifest, CommandSpec, JobSpec

M = TypeVar("M", bound=ExecutorMessage)
SCRIPT = REPO / "tests" / "train_ddp_plain.py"
STEPS = 40
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "{nnodes}"]
TORCHRUN += ["--node-rank", "{node_rank}", "--master-addr", "{master_addr}"]
TORCHRUN += ["--master-port", "{master_port}", "--nproc-per-node", "{local_world_size}"]
SCRIPT_ARGS = ["--checkpoint-dir", "{checkpoint_dir}", "--resume", "{resume_from}"]
SCRIPT_ARGS += ["--steps", "{steps}", "--backend", "{backend}", "--timeout-s", "{timeout_s}"]
SPEC = JobSpec(
    name="ddp",
    executor="command",
    steps=STEPS,
    keep_checkpoints=3,
    command=CommandSpec(
        argv=[*TORCHRUN, str(SCRIPT), *SCRIPT_ARGS, "--step-s", "0.05"],
        env={"OMP_NUM_THREADS": "1"},
        checkpoint_glob="ckpt-*.pt",
        complete_marker="{name}.done",
        progress_regex=r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        params_regex=r"^params sha256 (?P<sha256>[0-9a-f]{64})$",
        grace_s=2.0,
    ),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group(port: int, resume_step: int | None = None) -> list[Rendezvous]:
    """Each member's Rendezvous: two hosts of one process each (a sum of two gradients is the
    same in any order, so a resumed DDP run is bit-exact)."""
    addresses = ["127.0.0.1", "127.0.0.1"]
    return [
        Rendezvous(
            node_rank=i,
            addresses=addresses,
            master_port=port,
            resume_step=resume_step,
            timeout_s=20,
        )
        for i in range(2)
    ]


class Member:
    """One host of the group: a ``serve`` executor and a client that collects its messages."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.executor = ExecutorProcess(["serve", "--kind", "command", "--workdir", str(work)])
        self.sock = wait_for(self._connect, 60, f"{work}/executor.sock to answer")
        send_message(self.sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="test"))
        recv_message(self.sock, EXECUTOR_MESSAGES)
        self.msgs: list[ExecutorMessage] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _connect(self) -> socket.socket | None:
        """A connection, once the executor listens (a killed one's socket file may be left)."""
        if self.executor.proc.poll() is not None:
            rc, err = self.executor.finish()
            raise AssertionError(f"the executor in {self.work} exited {rc}: {err}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        try:
            sock.connect(str(self.work / "executor.sock"))
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return None
        return sock

    def _read(self) -> None:
        while True:
            try:
                msg = recv_message(self.sock, EXECUTOR_MESSAGES)
            except TimeoutError:
                continue
            except OSError:
                msg = None
            with self._cond:
                if msg is not None:
                    self.msgs.append(msg)
                self._cond.notify_all()
            if msg is None:
                return

    def start(self, rendezvous: Rendezvous, epoch: int) -> None:
        send_message(self.sock, Start(spec=SPEC, epoch=epoch, rendezvous=rendezvous))

    def wait(
        self,
        kind: type[M],
        what: str,
        pred: Callable[[M], bool] = lambda _: True,
        timeout: float = 90,
    ) -> M:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((m for m in self.msgs if isinstance(m, kind) and pred(m)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    tail = [m.text for m in self.msgs if isinstance(m, Log)][-8:]
                    raise AssertionError(f"{self.work.name}: no {what} within {timeout}s: {tail}")
                self._cond.wait(min(left, 0.5))

    def said(self, prefix: str) -> list[str]:
        with self._cond:
            return [m.text for m in self.msgs if isinstance(m, Log) and m.text.startswith(prefix)]

    def saved(self, step: int) -> CheckpointSaved:
        return self.wait(CheckpointSaved, f"step {step}", lambda m: m.manifest.step >= step)

    def kill(self) -> None:
        """The host dies: SIGKILL to the executor, then to its command's recorded process group
        and the processes that carry its run token (torchrun starts its workers in sessions of
        their own)."""
        pids = run_processes(self.work)  # read before the host dies: its fence may end them
        assert pids, "the command was recorded"  # before kill_command below finds them
        self.executor.proc.kill()
        self.executor.finish(30)
        kill_command(self.work)
        wait_for(lambda: not any(alive(p) for p in pids), 10, "the command's processes to die")

    def close(self) -> None:
        self.sock.close()
        if self.executor.proc.poll() is None:
            self.executor.proc.kill()
            self.executor.finish(30)
        kill_command(self.work)


def run_processes(work: Path) -> set[int]:
    """The recorded run's processes: its cgroup's, else its recorded process group's (/proc).
    (A loaded run: read after the executor's SIGKILL, its fence had already ended them all.)"""
    cg = recorded_cgroup(work)
    if cg is not None:
        return set(cgroup.procs(cg))
    rec = read_command(work)
    if rec is None or rec[0] is None:
        return set()
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == rec[0]:
                found.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def shard_manifests(work: Path) -> list[CheckpointManifest]:
    return [
        msgspec.json.decode(p.read_bytes(), type=CheckpointManifest)
        for p in sorted((work / "checkpoints").glob("step-*.json"))
    ]


@pytest.fixture
def members(tmp_path: Path) -> Iterator[Callable[..., list[Member]]]:
    """``members(name, ...)``: a started Member per name, each in ``tmp_path / name``."""
    made: list[Member] = []

    def make(*names: str) -> list[Member]:
        new = [Member(tmp_path / name) for name in names]
        made.extend(new)
        return new

    yield make
    for m in made:
        m.close()


@pytest.mark.long  # the suite runs a torchrun group's failover bit-exact under the console (test_group_command)
def test_two_hosts_train_one_group_and_a_killed_host_resumes_it_bit_exact(
    members: Callable[..., list[Member]], tmp_path: Path
) -> None:
    ref = members("ref0", "ref1")
    for m, r in zip(ref, group(free_port()), strict=True):
        m.start(r, epoch=1)
    done = [m.wait(Finished, "Finished") for m in ref]
    digest = done[0].params_sha256
    assert len(digest) == 64 and [d.params_sha256 for d in done] == [digest, digest]
    assert [d.step for d in done] == [STEPS, STEPS]
    for i, m in enumerate(ref):
        assert m.said("resume ") == [f"resume null at step 0 (rank {i} of 2)"]
        assert {(s.node_rank, s.nnodes, s.epoch) for s in shard_manifests(m.work)} == {(i, 2, 1)}

    a, b = members("w0", "w1")
    for m, r in zip((a, b), group(free_port()), strict=True):
        m.start(r, epoch=1)
    a.saved(20), b.saved(20)
    a.kill()
    ended = b.wait(RunEnded, "the survivor's RunEnded", timeout=60)
    assert ended.fault == "crash", ended
    assert 20 <= ended.step < STEPS

    (a,) = members("w0")  # a new executor on the same host and workdir; b restarts in place
    for m, r in zip((a, b), group(free_port(), resume_step=10), strict=True):
        m.start(r, epoch=2)
    again = [m.wait(Finished, "Finished") for m in (a, b)]
    assert [d.params_sha256 for d in again] == [digest, digest], "bit-exact"
    for i, m in enumerate((a, b)):
        resumed = [x for x in m.msgs if isinstance(x, Resumed) and x.epoch == 2]
        restored = m.work / "ckpt" / "ckpt-10.pt"
        assert [(x.step, x.checkpoint) for x in resumed] == [(10, str(restored))]
        assert f"resume {json.dumps(str(restored))} at step 10 (rank {i} of 2)" in m.said("resume ")
        removed = m.said("removed checkpoint(s) of step")
        assert removed and removed[0].startswith("removed checkpoint(s) of step 20"), removed
        kept = shard_manifests(m.work)
        assert [s.step for s in kept] == [20, 30, 40]
        assert {(s.node_rank, s.nnodes, s.epoch) for s in kept} == {(i, 2, 2)}


def test_group_placeholders_fill_torchrun_and_env_and_default_to_one_host() -> None:
    r = Rendezvous(
        node_rank=2,
        addresses=["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        master_port=4321,
        procs_per_host=4,
        backend="nccl",
        timeout_s=12.5,
    )
    values = {"checkpoint_dir": "/c", "resume_from": "", "step": "0", "steps": "9"}
    values |= {"seed": "0", "workdir": "/w", **group_values(r)}
    argv = build_argv([*TORCHRUN, "t.py", *SCRIPT_ARGS, "--rank={rank}/{world_size}"], values)
    assert argv[3:] == [
        *["--nnodes", "3", "--node-rank", "2", "--master-addr", "10.0.0.1"],
        *["--master-port", "4321", "--nproc-per-node", "4", "t.py", "--checkpoint-dir", "/c"],
        *["--steps", "9", "--backend", "nccl", "--timeout-s", "12.5", "--rank=8/12"],
    ]
    env = command_env({"WHO": "{node_rank}/{nnodes}@{master_addr}:{master_port}"}, values)
    assert env["WHO"] == "2/3@10.0.0.1:4321"
    assert group_values(None) == {
        "node_rank": "0",
        "nnodes": "1",
        "master_addr": "127.0.0.1",
        "master_port": "29500",
        "rank": "0",
        "world_size": "1",
        "local_world_size": "1",
        "backend": "gloo",
        "timeout_s": "30",
    }


def shard_publisher(folder: Path, events: list[ExecutorMessage], node_rank: int) -> Publisher:
    return Publisher(
        folder,
        job="ddp",
        spec_hash=SPEC.state_hash(),
        keep=5,
        epoch=1,
        code_version="v",
        emit=events.append,
        node_rank=node_rank,
        nnodes=2,
    )


def publish_fakes(pub: Publisher, src: Path, steps: list[int]) -> None:
    src.mkdir(parents=True, exist_ok=True)
    for step in steps:
        path = src / f"ckpt-{step}.pt"
        path.write_bytes(f"state of step {step}".encode())
        st = path.stat()
        assert pub.publish(Candidate(path, step, st.st_size, st.st_mtime_ns)) is not None


def test_only_the_committed_step_of_this_hosts_shard_is_restored(tmp_path: Path) -> None:
    events: list[ExecutorMessage] = []
    pub = shard_publisher(tmp_path / "checkpoints", events, node_rank=1)
    publish_fakes(pub, tmp_path / "src", [10, 20, 30])
    dest = tmp_path / "ckpt"
    dest.mkdir()
    cs = SPEC.command
    assert cs is not None
    restored = pub.restore_step(20, dest, cs)
    assert (restored.manifest.step, restored.path) == (20, dest / "ckpt-20.pt")
    assert restored.path.read_bytes() == b"state of step 20"
    assert (dest / "ckpt-20.pt.done").exists()
    assert pub.drop_after(20) == [30]
    assert [m.step for m in shard_manifests(tmp_path)] == [10, 20]

    with pytest.raises(NotCommitted, match=r"^committed step 30 is not on this host: no step-"):
        pub.restore_step(30, dest, cs)
    (tmp_path / "checkpoints" / "step-0000000010.pt").write_bytes(b"state of step 11")
    with pytest.raises(NotCommitted, match=r"^committed step 10 cannot be restored: size 16 and"):
        pub.restore_step(10, dest, cs)
    other = shard_publisher(tmp_path / "checkpoints", events, node_rank=0)
    with pytest.raises(NotCommitted, match="node rank 1's shard; this host is node rank 0"):
        other.restore_step(20, dest, cs)
    assert not [e for e in events if isinstance(e, Fault)], "NotCommitted is the caller's to report"


def runner(
    work: Path, rendezvous: Rendezvous, argv: list[str]
) -> tuple[CommandRunner, list[ExecutorMessage]]:
    """The command kind's runner in this process, as ``serve`` makes it for a Start at epoch 2."""
    events: list[ExecutorMessage] = []
    assert SPEC.command is not None
    cs = msgspec.structs.replace(SPEC.command, argv=argv)
    spec = msgspec.structs.replace(SPEC, command=cs)
    control = Control(epoch=2, rendezvous=rendezvous)
    return CommandRunner(spec, cs, work, events.append, control=control), events


def test_a_committed_step_missing_here_ends_the_run_as_unresumable_naming_it(
    tmp_path: Path,
) -> None:
    """The run ends as one that could not resume (``resume_failed``, its executor waiting for
    a restart in place, its zygote kept), and its fault names the step, so the console chooses
    an older one for the next epoch."""
    pub = shard_publisher(tmp_path / "w" / "checkpoints", [], node_rank=0)
    publish_fakes(pub, tmp_path / "src", [10, 20])
    run, events = runner(tmp_path / "w", group(1234, resume_step=30)[0], ["no-such-program"])
    outcome = run.run()
    assert (outcome.exit_code, outcome.reason, outcome.step) == (
        exitcodes.FAILED,
        "resume_failed",
        30,
    )
    (fault,) = [e for e in events if isinstance(e, Fault)]
    assert (fault.fault, fault.fatal, fault.step) == ("resume_failed", True, 30)
    assert fault.message.startswith("committed step 30 is not on this host")
    assert "\n" not in fault.message
    assert run.proc is None and not [e for e in events if isinstance(e, Resumed)]


def test_no_committed_step_starts_fresh_whatever_lies_in_the_workdir(tmp_path: Path) -> None:
    pub = shard_publisher(tmp_path / "w" / "checkpoints", [], node_rank=1)
    publish_fakes(pub, tmp_path / "src", [10, 20])
    show = "import sys; print('argv ' + ' '.join(sys.argv[1:]))"
    argv = [sys.executable, "-c", show, "--resume", "{resume_from}", "{rank}/{world_size}"]
    run, events = runner(tmp_path / "w", group(1234)[1], argv)
    outcome = run.run()
    assert (outcome.exit_code, outcome.reason) == (exitcodes.OK, "finished")
    (resumed,) = [e for e in events if isinstance(e, Resumed)]
    assert (resumed.step, resumed.checkpoint) == (0, None)
    texts = [e.text for e in events if isinstance(e, Log)]
    assert "argv 1/2" in texts, texts
    assert any(t.startswith("removed checkpoint(s) of step 10, 20: newer than") for t in texts)
    assert shard_manifests(tmp_path / "w") == []


def test_a_lone_hosts_restore_skips_a_groups_shard(tmp_path: Path) -> None:
    events: list[ExecutorMessage] = []
    publish_fakes(shard_publisher(tmp_path / "checkpoints", events, 0), tmp_path / "src", [10])
    alone = Publisher(
        tmp_path / "checkpoints",
        job="ddp",
        spec_hash=SPEC.state_hash(),
        keep=5,
        epoch=1,
        code_version="v",
        emit=events.append,
    )
    dest = tmp_path / "ckpt"
    dest.mkdir()
    assert SPEC.command is not None
    assert alone.restore(dest, SPEC.command) is None
    (fault,) = [e for e in events if isinstance(e, Fault)]
    assert fault.fault == "checkpoint_mismatch"
    assert "a shard of a group of 2 host(s); this group has 1" in fault.message
