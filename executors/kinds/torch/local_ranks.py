"""A host's other ranks: with ``procs_per_host`` = P, the executor's training thread is local
rank 0 of its host and starts local ranks 1..P-1 for the run, each a process of its own
(``executors.kinds.torch.rank_process``) running the same step loop as a follower.

What ties them to the executor, so that none trains beside the next epoch:

- each sets its parent-death signal to SIGKILL first thing (and exits if its parent is gone
  already): an executor killed, however, takes its local ranks with it, where torchrun's
  workers (a session of their own) outlived it;
- they stay in the executor's process group (a kill of the group reaches them too);
- they ignore SIGINT and SIGTERM: a stop reaches them through local rank 0, by the step
  boundary's agreement, so a preemption's SIGTERM to the whole group still checkpoints;
- a follower has no lease and publishes nothing; it trains only while local rank 0 does
  (every step is a collective with it);
- the run waits for them before it ends, and kills by recorded pid what is left.

A follower's stderr goes to ``ranks/local-K.log`` in the workdir; when the run fails because one
died, its exit and the tail of that log are what the run's crash says.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

import executors
from protocol.errors import ConfigError, HotspareError
from protocol.messages import Rendezvous
from protocol.spec import JobSpec

END_WAIT_S = 60.0
"""How long a run that ended well waits for its followers to end too (they end at the same
step: every step is a collective) before they are killed."""
FAILED_WAIT_S = 3.0
"""How long a run that failed waits for its followers to end by themselves (a dead peer ends
their collectives) before they are killed: one that died first is the likely cause."""
CULPRIT_GRACE_S = 0.3
"""How long a failed run looks for a follower that ended before it (``run_failed``)."""
TAIL_CHARS = 600


class RankOrder(msgspec.Struct, kw_only=True):
    """What a follower is started with (on its stdin, JSON)."""

    spec: JobSpec
    rendezvous: Rendezvous
    local_rank: int
    epoch: int
    run_id: str
    workdir: str
    device: str
    parent: int
    """The executor's pid: a follower whose parent is already another exits at once."""


@dataclass
class Follower:
    local_rank: int
    proc: subprocess.Popen[bytes]
    log: Path
    culprit: bool = False
    """It had ended on its own when local rank 0's run failed: the likely cause."""


def device_of(leader: str, local_rank: int) -> str:
    """Local rank ``local_rank``'s device: a CUDA host's ranks take one GPU each, in order."""
    if not leader.startswith("cuda"):
        return leader
    first = int(leader.split(":", 1)[1]) if ":" in leader else 0
    return f"cuda:{first + local_rank}"


class LocalRanks:
    """Local ranks 1..P-1 of one run, started, watched and ended by local rank 0."""

    def __init__(
        self,
        spec: JobSpec,
        rv: Rendezvous,
        *,
        epoch: int,
        run_id: str,
        workdir: Path,
        device: str,
    ) -> None:
        self._orders = [
            RankOrder(
                spec=spec,
                rendezvous=rv,
                local_rank=k,
                epoch=epoch,
                run_id=run_id,
                workdir=str(workdir),
                device=device_of(device, k),
                parent=os.getpid(),
            )
            for k in range(1, rv.procs_per_host)
        ]
        self._logs = workdir / "ranks"
        self.followers: list[Follower] = []

    def start(self) -> None:
        self._logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        root = str(Path(executors.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for order in self._orders:
            log = self._logs / f"local-{order.local_rank}.log"
            with open(log, "wb") as err:
                argv = [sys.executable, "-m", "executors.kinds.torch.rank_process"]
                # what it trains, for ps and /proc (its order comes on stdin)
                where = ["--workdir", order.workdir, "--local-rank", str(order.local_rank)]
                proc = subprocess.Popen(
                    argv + where,
                    stdin=subprocess.PIPE,
                    stdout=err,
                    stderr=err,
                    env=env,
                    close_fds=True,
                )
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # it died at once: its log says why
                proc.stdin.write(msgspec.json.encode(order))
            proc.stdin.close()
            self.followers.append(Follower(order.local_rank, proc, log))

    def run_failed(self, grace_s: float = CULPRIT_GRACE_S) -> None:
        """Local rank 0's run failed, its group not left yet: which followers had ended on their
        own by then (a dead follower's sockets close a moment before it can be reaped: looked
        for a short while). Those that end after, once the group is left, are its consequence."""
        deadline = time.monotonic() + grace_s
        while True:
            for f in self.followers:
                f.culprit = f.proc.poll() not in (None, 0)
            if any(f.culprit for f in self.followers) or time.monotonic() >= deadline:
                return
            time.sleep(0.01)

    def end(self, *, failed: bool) -> str | None:
        """Wait for the followers (``failed``: briefly), kill what is left by its pid; why the
        first one that had ended on its own when the run failed did (``run_failed``; None:
        none did)."""
        deadline = time.monotonic() + (FAILED_WAIT_S if failed else END_WAIT_S)
        for f in self.followers:
            try:
                f.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(f.proc.pid, signal.SIGKILL)
                f.proc.wait()
        return next((self._why(f) for f in self.followers if f.culprit), None)

    @staticmethod
    def _why(f: Follower) -> str:
        code = f.proc.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        try:
            text = f.log.read_bytes()[-TAIL_CHARS:].decode("utf-8", "replace").strip()
        except OSError as e:
            text = f"(its log cannot be read: {e.strerror or e})"
        last = text.splitlines()[-1] if text else "(its log is empty)"
        return f"local rank {f.local_rank} (pid {f.proc.pid}) {how}: {last}"


@contextlib.contextmanager
def running(
    spec: JobSpec,
    rv: Rendezvous | None,
    *,
    local_rank: int,
    epoch: int,
    run_id: str,
    workdir: Path,
    device: str,
) -> Iterator[LocalRanks | None]:
    """Local rank 0's followers for the run in the block (None: none, one rank per host or a
    follower itself). A run that fails while one of them had failed by itself says so."""
    if rv is None or rv.procs_per_host < 2 or local_rank != 0:
        yield None
        return
    ranks = LocalRanks(spec, rv, epoch=epoch, run_id=run_id, workdir=workdir, device=device)
    try:
        ranks.start()  # inside: those started before one that could not be are ended too
        yield ranks
    except BaseException as e:
        why = ranks.end(failed=True)
        if why is not None and isinstance(e, Exception) and not isinstance(e, ConfigError):
            raise LocalRankFailed(why) from e
        raise
    else:
        ranks.end(failed=False)


class LocalRankFailed(HotspareError):
    """A follower ended on its own while the run needed it (its exit and last words)."""

    permanent = False  # the run is restarted, its followers started again
