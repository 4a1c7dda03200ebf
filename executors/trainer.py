"""The step loop: resume, train, checkpoint, degrade, and stop when asked.

Reads like the algorithm: ``run`` -> ``_train_step`` -> ``_forward_backward``. Faults in a
step (out of memory, NaN) are handled here, at the step, for every workload.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from executors import exitcodes, rng
from executors.checkpoint import PUBLISH_MARGIN_S, CheckpointManager, Emit, Loaded
from executors.control import Control
from executors.inject import Injections
from executors.kinds import Outcome
from executors.version import code_version
from executors.workload import Factory, Workload, WorkloadContext, resolve
from protocol.faults import FaultKind
from protocol.messages import Fault, Finished, Progress, Resumed, Stopped
from protocol.spec import JobSpec

DEFAULT_CHECKPOINT_EVERY_S = 30.0
MAX_ROLLBACKS_IN_A_ROW = 5
MAX_CHECKPOINT_FAILURES = 3


@dataclass
class TrainState:
    """The trainer's own resumable state: where the step loop and the data stand."""

    step: int = 0
    data_index: int = 0
    micro_batch: int = 0
    skipped: list[int] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "data_index": self.data_index,
            "micro_batch": self.micro_batch,
            "skipped": list(self.skipped),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.data_index = int(sd["step"]), int(sd["data_index"])
        self.micro_batch, self.skipped = int(sd["micro_batch"]), [int(i) for i in sd["skipped"]]


def pick_device(name: str | None = None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_deterministic(device: torch.device) -> None:
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic kernels, but no NaN-filling of every torch.empty: that fill cost ~18% of
    # the steps/s of a small charlm on CPU (benchmarks/executor_overhead.py), and results of
    # ops that never read uninitialised memory are the same either way.
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e)
    )


class Trainer:
    def __init__(
        self,
        spec: JobSpec,
        workdir: Path,
        emit: Emit,
        *,
        control: Control | None = None,
        device: torch.device | None = None,
        injections: Injections | None = None,
        progress_interval_s: float = 0.5,
    ) -> None:
        self.spec = spec
        self.emit = emit
        self.control = control or Control()
        self.device = device or pick_device()
        self.inj = injections or Injections()
        self.progress_interval_s = progress_interval_s
        self.every_s = spec.checkpoint_every_s or (
            None if spec.checkpoint_every_steps else DEFAULT_CHECKPOINT_EVERY_S
        )
        self.ckpt = CheckpointManager(
            workdir / "checkpoints",
            job=spec.name,
            spec_hash=spec.state_hash(),
            keep=spec.keep_checkpoints,
            epoch=self.control.epoch,
            code_version=code_version(),
            emit=emit,
            write_delay_s=self.inj.slow_write_s,
            lease_valid=self.control.lease_valid,
        )
        self.state = TrainState()
        self.saved_step: int | None = None
        self.stall_s = 0.0
        self._factory: Factory = resolve(spec.workload)
        self._rate: deque[tuple[float, int]] = deque(maxlen=32)
        self._last_progress = 0.0
        self._last_loss = math.nan
        self._tokens = 0
        self._rollbacks_in_a_row = 0
        self._first_step_pending = True
        """The first step after a (re)start is always reported: it ends a recovery."""
        self.workload: Workload

    # --------------------------------------------------------------------- run

    def run(self) -> Outcome:
        try:
            return self._run()
        finally:
            self.ckpt.close()

    def _run(self) -> Outcome:
        make_deterministic(self.device)
        self._build()
        self._resume()
        self._last_ckpt_t = time.monotonic()
        while self.state.step < self.spec.steps:
            stopped = self._at_boundary()
            if stopped is not None:
                return stopped
            loss = self._train_step()
            if not self.control.lease_valid():
                continue  # finished after the lease ended: not counted; the boundary stops
            if loss is not None:
                self._after_step(loss)
        if self.saved_step != self.state.step:
            self._save("final")
        self.ckpt.wait()
        if not self.control.lease_valid():
            return self._lease_ended()  # the final checkpoint was not published: not finished
        self._progress(force=True)
        digest = rng.params_sha256(self.workload.model)
        self.emit(Finished(step=self.state.step, params_sha256=digest))
        return Outcome(exitcodes.OK, self.state.step, "finished", digest)

    def _build(self) -> None:
        rng.seed_all(self.spec.seed)
        self.workload = self._factory(
            self.spec.config, WorkloadContext(seed=self.spec.seed, device=self.device)
        )
        self.state = TrainState(micro_batch=self.workload.micro_batch)

    def _resume(self) -> None:
        t0 = time.perf_counter()
        loaded = self.ckpt.load_latest(self.device)
        if loaded is not None:
            self._restore(loaded)
        self.emit(
            Resumed(
                step=self.state.step,
                checkpoint=str(loaded.path) if loaded else None,
                epoch=self.control.epoch,
                load_s=time.perf_counter() - t0,
            )
        )

    def _restore(self, loaded: Loaded) -> None:
        self.workload.load_state_dict(loaded.state["workload"])
        self.state.load_state_dict(loaded.state["train"])
        rng.restore(loaded.state["rng"])
        self.saved_step = self.state.step

    # ------------------------------------------------------------ boundaries

    def _at_boundary(self) -> Outcome | None:
        """Between steps: honour a stop, the lease, a checkpoint request, repeated write failures."""
        stop = self.control.stop
        if stop is not None:
            if stop.fault:
                self.emit(
                    Fault(
                        fault=stop.fault,
                        step=self.state.step,
                        message=f"{stop.reason}: checkpointing at step {self.state.step} and stopping",
                    )
                )
            return self._stop(stop.reason, stop.exit_code, checkpoint=stop.checkpoint)
        left = self.control.lease_left()
        if left is not None and left <= 0:
            return self._lease_ended()
        if left is not None and left <= self._lease_guard():
            self.emit(
                Fault(
                    fault=FaultKind.LEASE_LOST.value,
                    step=self.state.step,
                    message=f"lease of epoch {self.control.epoch} ends in {max(left, 0):.1f}s without renewal; "
                    "checkpointing and stopping",
                )
            )
            return self._stop("lease_lost", exitcodes.LEASE_LOST, checkpoint=True)
        reason = self.control.take_checkpoint_request()
        if reason is not None and self.saved_step != self.state.step:
            self._save(reason)
        if self.ckpt.consecutive_failures >= MAX_CHECKPOINT_FAILURES:
            return self._stop("disk_full", exitcodes.DISK_FULL, checkpoint=False)
        return None

    def _lease_ended(self) -> Outcome:
        self.emit(
            Fault(
                fault=FaultKind.LEASE_LOST.value,
                step=self.state.step,
                message=f"lease of epoch {self.control.epoch} has ended; stopping without writing",
            )
        )
        return self._stop("lease_lost", exitcodes.LEASE_LOST, checkpoint=False)

    def _lease_guard(self) -> float:
        """Stop this long before the lease ends: room for two steps and one checkpoint write,
        published with more than the publish margin left."""
        ttl = self.control.lease_ttl_s
        need = 2 * self._step_time() + 1.5 * self.ckpt.last_write_s + 0.2 + PUBLISH_MARGIN_S
        return min(0.5 * ttl, max(0.2 * ttl, need))

    def _stop(self, reason: str, exit_code: int, *, checkpoint: bool) -> Outcome:
        if checkpoint and self.saved_step != self.state.step:
            self._save(reason)
        self.ckpt.wait()
        self._progress(force=True)
        saved = self.ckpt.last_saved.manifest.step if self.ckpt.last_saved else self.saved_step
        self.emit(
            Stopped(step=self.state.step, reason=reason, checkpoint_step=saved, exit_code=exit_code)
        )
        return Outcome(exit_code, self.state.step, reason)

    def _save(self, reason: str) -> None:
        state = {
            "workload": self.workload.state_dict(),
            "train": self.state.state_dict(),
            "rng": rng.capture(),
        }
        self.stall_s += self.ckpt.save(self.state.step, state)
        self.saved_step = self.state.step
        self._last_ckpt_t = time.monotonic()

    def _after_step(self, loss: float) -> None:
        self.state.step += 1
        self._last_loss = loss
        self._rollbacks_in_a_row = 0
        now = time.monotonic()
        self._rate.append((now, self.state.step))
        first = self._first_step_pending
        self._first_step_pending = False
        every = self.spec.checkpoint_every_steps
        if (every and self.state.step % every == 0) or (
            self.every_s and now - self._last_ckpt_t >= self.every_s
        ):
            self._save("periodic")
        self._progress(force=first)

    # ------------------------------------------------------------------ steps

    def _train_step(self) -> float | None:
        """One optimizer step; None when the step was rolled back instead."""
        while self.state.data_index in self.state.skipped:
            self.state.data_index += 1
        step = self.state.step + 1
        batch = self.workload.batch(self.state.data_index)
        self._tokens = self.workload.tokens(batch)
        before = rng.capture()
        while True:
            try:
                loss = self._forward_backward(batch, step)
                break
            except Exception as e:
                if not is_oom(e):
                    raise
                self.workload.optimizer.zero_grad(set_to_none=True)
                self._degrade(step, e)
                rng.restore(before)
        params = [p for p in self.workload.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.workload.grad_clip or math.inf)
        if not (math.isfinite(loss) and math.isfinite(float(norm))):
            self._rollback(step, loss)
            return None
        self.workload.optimizer.step()
        if self.workload.scheduler is not None:
            self.workload.scheduler.step()
        self.workload.optimizer.zero_grad(set_to_none=True)
        self.state.data_index += 1
        return loss

    def _forward_backward(self, batch: Any, step: int) -> float:
        mb = self.state.micro_batch
        accumulation = self.workload.global_batch // mb
        total = torch.zeros((), device=self.device)
        for i in range(accumulation):
            micro = [t[i * mb : (i + 1) * mb] for t in batch]
            if i == 0 and self.inj.take("oom", step):
                raise torch.OutOfMemoryError(
                    f"injected out of memory at step {step} (HOTSPARE_INJECT)"
                )
            if i == 0 and self.inj.take("crash", step):
                raise RuntimeError(f"injected crash at step {step} (HOTSPARE_INJECT)")
            loss = self.workload.loss(micro)
            if i == 0 and self.inj.take("nan", step):
                loss = loss * math.nan
            (loss / accumulation).backward()
            total += loss.detach()
        return float(total / accumulation)

    def _degrade(self, step: int, e: BaseException) -> None:
        """Out of memory: halve the micro-batch and double accumulation; the global batch stays."""
        g, mb = self.workload.global_batch, self.state.micro_batch
        smaller = next((d for d in range(mb // 2, 0, -1) if g % d == 0), None)
        if smaller is None:
            raise RuntimeError(f"out of memory at step {step} with micro-batch 1: {e}") from e
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.state.micro_batch = smaller
        self.emit(
            Fault(
                fault=FaultKind.OOM.value,
                step=step,
                message=f"out of memory at step {step} with micro-batch {mb}; now micro-batch {smaller} x "
                f"{g // smaller} accumulation (global batch {g})",
            )
        )

    def _rollback(self, step: int, loss: float) -> None:
        """Non-finite numbers: back to the last good checkpoint, and never use that batch again."""
        self._rollbacks_in_a_row += 1
        if self._rollbacks_in_a_row > MAX_ROLLBACKS_IN_A_ROW:
            raise RuntimeError(
                f"loss not finite after {MAX_ROLLBACKS_IN_A_ROW} rollbacks in a row; giving up"
            )
        bad = self.state.data_index
        skipped = sorted({*self.state.skipped, bad})
        self.emit(
            Fault(
                fault=FaultKind.NAN.value,
                step=step,
                message=f"loss {loss} at step {step} (data position {bad}); rolling back to step "
                f"{self.saved_step or 0} and skipping that batch",
            )
        )
        self.workload.optimizer.zero_grad(set_to_none=True)
        self.ckpt.wait()
        micro = self.state.micro_batch
        loaded = self.ckpt.load_latest(self.device)
        if loaded is not None:
            self._restore(loaded)
        else:
            self._build()
            self.state.micro_batch = micro
        self.state.skipped = skipped
        self.emit(
            Resumed(
                step=self.state.step,
                checkpoint=str(loaded.path) if loaded else None,
                epoch=self.control.epoch,
                load_s=0.0,
            )
        )

    # --------------------------------------------------------------- progress

    def _step_time(self) -> float:
        if len(self._rate) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._rate[0], self._rate[-1]
        return (t1 - t0) / max(1, s1 - s0)

    def _progress(self, force: bool = False) -> None:
        """Progress only inside the lease: a console that moved on must not count a stale run's steps."""
        if not self.control.lease_valid():
            return
        now = time.monotonic()
        if not force and now - self._last_progress < self.progress_interval_s:
            return
        self._last_progress = now
        dt = self._step_time()
        rate = 1.0 / dt if dt > 0 else 0.0
        left = self.spec.steps - self.state.step
        self.emit(
            Progress(
                step=self.state.step,
                steps=self.spec.steps,
                loss=self._last_loss,
                steps_per_s=rate,
                tokens_per_s=rate * self._tokens,
                eta_s=left / rate if rate > 0 else None,
                micro_batch=self.state.micro_batch,
                accumulation=self.workload.global_batch // self.state.micro_batch,
                epoch=self.control.epoch,
            )
        )
