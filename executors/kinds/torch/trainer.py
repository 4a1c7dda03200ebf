"""The step loop: resume, train, checkpoint, degrade, and stop when asked.

Reads like the algorithm: ``run`` -> ``_train_step`` -> ``_forward_backward``. Faults in a
step (out of memory, NaN) are handled here, at the step, for every workload.

A multi-host job (a rendezvous in Control) trains data parallel, ``procs_per_host`` ranks per
host (local rank 0 here, in the executor; the others followers in processes of their own that
it starts for the run, ``executors.kinds.torch.local_ranks``, which publish nothing: their
RNG states are gathered into local rank 0's checkpoint): each rank takes its contiguous share
of every global batch, the gradients and the loss are averaged
over the ranks (``executors.kinds.torch.dist``), and at each step boundary the ranks agree on saving and
stopping (``executors.kinds.torch.boundary``), so every one checkpoints the same steps and stops at the
same step. Progress reports are made by ``executors.agent.progress``.

An elastic job (``logical_ranks`` in the rendezvous) expresses that work as a fixed number of
logical ranks whatever the number of members (``executors.kinds.torch.logical``): each rank runs its block
of them one after another, each over its own rows with its RNGs seeded from (seed, logical
rank, data position), so the global batch, the data order and the dropout are the planned
run's at any world size, and any member's checkpoint loads on any other. With
``deterministic_reduce`` each logical rank's gradients are gathered and summed in logical
order (bit-exact across world sizes); without it, one all-reduce of each rank's sum.
A fixed-size group is the same loop with one logical rank per rank (and no reseeding).

With ``parallel = "fsdp"`` (``executors.kinds.torch.sharded``) the model and optimizer are sharded over the
ranks (FSDP2): the gradients are reduce-scattered in the last backward of a step (each loss
scaled so that they come out divided by the logical ranks), only the loss is all-reduced here,
every rank makes as many passes as the busiest (``_pad``), and each rank checkpoints its part
through torch.distributed.checkpoint over a gloo group of its own (the writer thread's).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch

from executors import exitcodes
from executors.agent import run_env
from executors.agent.control import Control
from executors.agent.inject import Injections
from executors.agent.progress import ProgressMeter
from executors.checkpoints.checkpoint import CheckpointManager, CorruptCheckpoint, Emit, Loaded
from executors.checkpoints.lineage import at_start
from executors.checkpoints.version import code_version
from executors.fencing.guard import LeaseGuard
from executors.kinds import Outcome
from executors.kinds.torch import local_ranks, logical, rng
from executors.kinds.torch.boundary import Boundary, Halt
from executors.kinds.torch.device import is_oom, make_deterministic, pick_device
from executors.kinds.torch.dist import Group, check, flatten, joined, trained
from executors.kinds.torch.workload import Factory, Workload, WorkloadContext, resolve
from protocol.errors import ConfigError
from protocol.faults import FaultKind, StopReason
from protocol.messages import Fault, Finished, Log, LogLevel, Resumed, Stopped
from protocol.spec import JobSpec

DEFAULT_CHECKPOINT_EVERY_S = 30.0
MAX_ROLLBACKS_IN_A_ROW = 5


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
        local_rank: int = 0,
    ) -> None:
        self.spec = spec
        self.emit = emit
        self.workdir = workdir
        self.local_rank = local_rank
        """This process's rank on its host: 0 in the executor, above 0 in a follower."""
        self._follower = local_rank > 0
        """A follower publishes nothing and removes nothing: local rank 0 holds the host's
        checkpoints (and the lease)."""
        self.control = control or Control()
        self.device = device or pick_device()
        self.inj = injections or Injections()
        self.every_s = spec.checkpoint_every_s or (
            None if spec.checkpoint_every_steps else DEFAULT_CHECKPOINT_EVERY_S
        )
        self.lease = LeaseGuard(self.control)
        rv = self.control.rendezvous
        self._factory: Factory = resolve(spec.workload)
        self.ckpt = CheckpointManager(
            workdir / "checkpoints",
            job=spec.name,
            spec_hash=spec.state_hash(),
            keep=spec.keep_checkpoints,
            epoch=self.control.epoch,
            code_version=code_version(),
            emit=emit,
            write_delay_s=self.inj.slow_write_s,
            lease_valid=self.lease.valid,
            node_rank=rv.node_rank if rv else None,
            nnodes=rv.nnodes if rv else 1,
            any_shard=rv is not None and rv.logical_ranks is not None,
            lineage=at_start(spec, run_id=self.control.run_id, factory=self._factory),
            publishes=not self._follower,
            load_tag=f"-r{self.local_rank}" if rv is not None and rv.procs_per_host > 1 else "",
        )
        self._procs = rv.procs_per_host if rv else 1
        """Ranks on this host (``procs_per_host``)."""
        self.group: Group | None = None
        """This epoch's process group, while a multi-host run is in it."""
        self._logical_ranks = rv.logical_ranks if rv else None
        """An elastic job's logical ranks (None: one per rank)."""
        self._in_order = rv is not None and rv.logical_ranks is not None and rv.deterministic_reduce
        """The deterministic reduce: each logical rank's gradients apart, summed in order."""
        self._fsdp = spec.parallel == "fsdp"
        """The model and optimizer sharded over the group (``executors.kinds.torch.sharded``)."""
        self._ckpt_group: Any = None
        """A sharded job's gloo group for its checkpoints' collectives (the writer thread's)."""
        self._passes = _Passes(0, None)
        """A sharded job's forward and backward passes this step (``_pad``)."""
        self._last_micro: Any = None
        self._grad_scale = 1.0
        """What each backward's loss is multiplied by (a sharded elastic job's: ``_build``)."""
        self.layout: logical.Layout
        """This rank's logical ranks and their rows of each global batch."""
        self.state = TrainState()
        self.saved_step: int | None = None
        self.stall_s = 0.0
        self.meter = ProgressMeter(spec.steps, self.control, emit, progress_interval_s)
        self.boundary = Boundary(
            self.control, self.ckpt, save=self._save_new, step_time=self.meter.step_time
        )
        self._rollbacks_in_a_row = 0
        self._first_step_pending = True
        """The first step after a (re)start is always reported: it ends a recovery."""
        self.workload: Workload

    # --------------------------------------------------------------------- run

    def run(self) -> Outcome:
        try:
            rv = self.control.rendezvous
            if rv is None:
                return self._run()
            check(rv, self.device, self.local_rank)  # before any follower is started
            with (
                local_ranks.running(
                    self.spec,
                    rv,
                    local_rank=self.local_rank,
                    epoch=self.control.epoch,
                    run_id=self.control.run_id,
                    workdir=self.workdir,
                    device=str(self.device),
                ) as ranks,
                joined(
                    rv,
                    self.device,
                    self._warn,
                    side=self._fsdp,
                    local_rank=self.local_rank,
                    abandoned=self.control.abandoned.is_set,
                ) as self.group,
            ):
                try:
                    return self._run()
                except Exception:
                    if ranks is not None:  # before the group is left: who had ended by then
                        ranks.run_failed()
                    raise
        finally:
            self.ckpt.close()

    def _run(self) -> Outcome:
        make_deterministic(self.device)
        if self._fsdp:
            self._ckpt_group = _sharding_group(self.group, self._in_order)
        self._build()
        if self._logical_ranks is not None:
            self.emit(Log(level=LogLevel.INFO, text=self.layout.describe()))
        failed = self._resume()
        if failed is not None:
            return failed
        self._last_ckpt_t = time.monotonic()
        while self.state.step < self.spec.steps:
            stopped = self._at_boundary()
            if stopped is not None:
                return stopped
            loss = self._train_step()
            if self.lease.ended() and self.group is None:
                continue  # finished after the lease ended: not counted; the boundary stops
            if loss is not None:
                self._after_step(loss)
        self._save_new("final")
        self.ckpt.wait()
        if self.lease.ended():  # the final checkpoint was not published
            return self._halt(self.boundary.lease_ended(self.state.step))
        self._progress(force=True)
        digest = self._digest()
        self.emit(Finished(step=self.state.step, params_sha256=digest))
        return Outcome(exitcodes.OK, self.state.step, "finished", digest)

    def _build(self) -> None:
        rng.seed_all(self.spec.seed)
        g = self.group
        ctx = WorkloadContext(seed=self.spec.seed, device=self.device)
        if g is not None:
            ctx = replace(ctx, rank=g.rank, world_size=g.world_size)
        self.workload = w = self._factory(self.spec.config, ctx)
        if g is None:
            self.layout = logical.plan(w.global_batch, w.micro_batch, logical_ranks=1)
        else:
            self.layout = logical.plan(
                w.global_batch,
                w.micro_batch,
                logical_ranks=self._logical_ranks or g.world_size,
                world_size=g.world_size,
                rank=g.rank,
                elastic=self._logical_ranks is not None,
            )
            # the same model on every rank, each its own dropout: rank 0 goes on in the seed's
            # streams as one host alone does (a group of one trains what a single host trains)
            if g.rank:
                rng.seed_all(self.spec.seed + g.rank)
            if self._fsdp:
                from executors.kinds.torch import sharded

                sharded.shard(w)
                # FSDP divides the reduce-scatter's sum by the world size; the step's gradient
                # is the sum of the logical ranks' over their count (gloo has no other divisor)
                if self.layout.logical_ranks != g.world_size:
                    self._grad_scale = g.world_size / self.layout.logical_ranks
        self.meter.global_batch, self.meter.world_size = w.global_batch, self.layout.world_size
        self.state = TrainState(micro_batch=self.layout.micro_batch)

    def _resume(self) -> Outcome | None:
        """Restore the training state; an Outcome only when a member cannot (the run ends)."""
        t0 = time.perf_counter()
        try:
            loaded = self.ckpt.load_latest(self.device) if self.group is None else self._committed()
        except CorruptCheckpoint as e:
            if self._alone():  # as one host alone: the newest whole one below, the damage said
                loaded = self.ckpt.load_latest(self.device)
                held = loaded.manifest if loaded else None
                below = f"step {held.step}" if held else "step 0 (none is whole)"
                text = f"cannot resume from the committed step {self._told()}: {e}; resuming from {below}"
                self.emit(Log(level=LogLevel.WARNING, text=text))
            else:
                return self._unresumable(e)
        if loaded is not None:
            self._restore(loaded)
        run_env.export_resumed(self.state.step)
        self.emit(
            Resumed(
                step=self.state.step,
                checkpoint=str(loaded.path) if loaded else None,
                epoch=self.control.epoch,
                load_s=time.perf_counter() - t0,
            )
        )
        return None

    def _alone(self) -> bool:
        """A group of one rank (a job on one host): no other member must load the same step,
        so a damaged committed checkpoint is skipped for the newest whole one below it (those
        above were removed), as an executor with no group does, not a failed run."""
        return self.group is not None and self.group.world_size == 1 and not self._fsdp

    def _told(self) -> int | None:
        """The committed step the console told this member to resume from (None: step 0)."""
        return self.control.rendezvous.resume_step if self.control.rendezvous else None

    def _unresumable(self, e: CorruptCheckpoint) -> Outcome:
        """The run ends: this member cannot load the step its group committed."""
        step = self._told()
        text = f"cannot resume from the committed step {step}: {e}"
        kind = FaultKind.RESUME_FAILED if self.group is not None else FaultKind.CRASH
        self.emit(Fault(fault=kind, step=step or 0, message=text, fatal=True))
        return Outcome(exitcodes.FAILED, 0, kind.value)

    def _committed(self) -> Loaded | None:
        """A member loads exactly the step every member committed (None: none, start at 0); its
        checkpoints newer than that were not committed by all, and are removed."""
        assert self.control.rendezvous is not None
        step = self.control.rendezvous.resume_step
        if not self._follower and (dropped := self.ckpt.drop_above(step)):
            text = f"removed uncommitted checkpoints of steps {dropped} (committed: {step})"
            self.emit(Log(level=LogLevel.INFO, text=text))
        return None if step is None else self._load_step(step)

    def _load_step(self, step: int) -> Loaded:
        """A member's checkpoint of ``step``: its own copy, or a sharded job's part (with the
        model and optimizer loaded into the sharded workload already, a collective)."""
        if not self._fsdp:
            return self.ckpt.load_step(step, self.device)
        w = self.workload
        return self.ckpt.load_part(step, w.model, w.optimizer, self._ckpt_group, self.device)

    def _restore(self, loaded: Loaded) -> None:
        if self._fsdp:  # the model and optimizer were loaded in place; the scheduler is here
            if self.workload.scheduler is not None:
                self.workload.scheduler.load_state_dict(loaded.state["lr_scheduler"])
        else:
            self.workload.load_state_dict(loaded.state["workload"])
        self.state.load_state_dict(loaded.state["train"])
        rng.restore(self._own_rng(loaded.state))
        self.saved_step = self.state.step
        saved_micro, self.state.micro_batch = (
            self.state.micro_batch,
            self.layout.fit(self.state.micro_batch),
        )
        if self.state.micro_batch != saved_micro:
            self.emit(
                Log(
                    level=LogLevel.INFO,
                    text=f"micro-batch {saved_micro} of the checkpoint does not divide each "
                    f"logical rank's {self.layout.rows_per_logical} rows; now "
                    f"{self.state.micro_batch}",
                )
            )

    # ------------------------------------------------------------ boundaries

    def _at_boundary(self) -> Outcome | None:
        """Between steps: stop (``Halt``) or checkpoint as ``executors.kinds.torch.boundary`` decides."""
        halt = self.boundary.decide(self.state.step, self.group)
        return None if halt is None else self._halt(halt)

    def _halt(self, halt: Halt) -> Outcome:
        if halt.fault is not None:
            self.emit(halt.fault)
        return self._stop(halt.reason, halt.exit_code, checkpoint=halt.checkpoint)

    def _stop(self, reason: StopReason, exit_code: int, *, checkpoint: bool) -> Outcome:
        if checkpoint:
            self._save_new(reason)
        self.ckpt.wait()
        self._progress(force=True)
        saved = self.ckpt.last_saved.manifest.step if self.ckpt.last_saved else self.saved_step
        self.emit(
            Stopped(step=self.state.step, reason=reason, checkpoint_step=saved, exit_code=exit_code)
        )
        return Outcome(exit_code, self.state.step, reason)

    def _save_new(self, reason: str) -> None:
        """Checkpoint this step unless it is saved already."""
        if self.saved_step != self.state.step:
            self._save(reason)

    def _save(self, reason: str) -> None:
        if self._fsdp:
            self.stall_s += self._save_part()
        elif self._follower:
            self._rng_states()  # its part of the host's checkpoint: its RNG states
        else:
            state = {
                "workload": self.workload.state_dict(),
                "train": self.state.state_dict(),
                **self._rng_states(),
            }
            self.stall_s += self.ckpt.save(self.state.step, state)
        self.saved_step = self.state.step
        self._last_ckpt_t = time.monotonic()

    def _rng_states(self) -> dict[str, Any]:
        """The RNG states a checkpoint holds: this rank's, and with more than one rank per host
        every local rank's by local rank (gathered: a collective of every rank)."""
        mine = rng.capture()
        if self.group is None or self._procs < 2:
            return {"rng": mine}
        return {"rng": mine, "rng_local": self.group.host_states(mine)}

    def _own_rng(self, state: dict[str, Any]) -> dict[str, Any]:
        """This rank's RNG states in a checkpoint: its local rank's where the host's are kept."""
        local = state.get("rng_local")
        if isinstance(local, list) and self.local_rank < len(local):
            return cast(dict[str, Any], local[self.local_rank])
        return cast(dict[str, Any], state["rng"])

    def _save_part(self) -> float:
        from executors.kinds.torch import sharded

        w = self.workload
        trainer: dict[str, Any] = {"train": self.state.state_dict(), **self._rng_states()}
        if w.scheduler is not None:
            trainer["lr_scheduler"] = w.scheduler.state_dict()
        state = sharded.sharded_state(w.model, w.optimizer)
        return self.ckpt.save_part(
            self.state.step, state, trainer, self._ckpt_group, procs=self._procs
        )

    def _digest(self) -> str:
        """sha256 of the whole parameters (a sharded job's gathered: a collective)."""
        if not self._fsdp:
            return rng.params_sha256(self.workload.model)
        from executors.kinds.torch import sharded

        return sharded.full_digest(self.workload.model)

    def _after_step(self, loss: float) -> None:
        self.state.step += 1
        self._rollbacks_in_a_row = 0
        now = time.monotonic()
        self.meter.stepped(now, self.state.step, loss)
        first = self._first_step_pending
        self._first_step_pending = False
        every = self.spec.checkpoint_every_steps
        if (every and self.state.step % every == 0) or (
            self.every_s and now - self._last_ckpt_t >= self.every_s
        ):
            if self.group is None:
                self._save("periodic")
            else:
                self.boundary.save_due = "periodic"
        self._progress(force=first)

    # ------------------------------------------------------------------ steps

    def _train_step(self) -> float | None:
        """One optimizer step; None when the step was rolled back instead."""
        while self.state.data_index in self.state.skipped:
            self.state.data_index += 1
        step = self.state.step + 1
        batch = self.workload.batch(self.state.data_index)
        self.meter.tokens = self.workload.tokens(batch)
        before = rng.capture()
        while True:
            try:
                shares = self._forward_backward(batch, step)
                break
            except Exception as e:
                if not is_oom(e) or self._fsdp:  # a sharded step's peers are mid-collective:
                    raise  # the group restarts from its committed step instead
                self.workload.optimizer.zero_grad(set_to_none=True)
                self._degrade(step, e)
                rng.restore(before)
        params, loss = self._reduced(shares)
        norm = torch.nn.utils.clip_grad_norm_(params, self.workload.grad_clip or math.inf)
        if self._fsdp:
            from executors.kinds.torch import sharded

            norm = sharded.full(norm)
        if not (math.isfinite(loss) and math.isfinite(float(norm))):
            self._rollback(step, loss)
            return None
        self.workload.optimizer.step()
        if self.workload.scheduler is not None:
            self.workload.scheduler.step()
        self.workload.optimizer.zero_grad(set_to_none=True)
        self.state.data_index += 1
        return loss

    def _reduced(self, shares: list[torch.Tensor]) -> tuple[list[torch.nn.Parameter], float]:
        """The parameters to clip and step and the loss: this host's own, or averaged over the
        group's logical ranks (then every rank sees the same loss and decides a rollback alike)."""
        model = self.workload.model
        if self.group is None:
            (mean,) = shares
            return [p for p in model.parameters() if p.grad is not None], float(mean)
        if self._in_order:
            return self.group.average_in_order(model, shares, self.layout)
        total = shares[0]
        for mean in shares[1:]:
            total = total + mean
        if self._fsdp:  # the gradients were reduce-scattered in the backward: only the loss
            return trained(model), self.group.mean_loss(total, over=self.layout.logical_ranks)
        return self.group.average(model, total, over=self.layout.logical_ranks)

    def _forward_backward(self, batch: Any, step: int) -> list[torch.Tensor]:
        """Forward and backward over this rank's logical ranks' rows of the global batch, in
        order; per logical rank its mean loss (a tensor: no sync), or with the deterministic
        reduce its own gradients and loss as one vector (their gradients kept apart)."""
        model = self.workload.model
        shares = []
        if self._fsdp:
            self._passes = _Passes(self._passes_needed(), self.group)
        for n, rank in enumerate(self.layout.ranks):
            if self._logical_ranks is not None:
                rng.seed_all(rng.derived_seed(self.spec.seed, rank, self.state.data_index))
            if self._in_order:
                model.zero_grad(set_to_none=True)  # so a -0.0 or +0.0 cannot differ either
            rows = self.layout.rows(rank)
            mean = self._micro_batches([t[rows] for t in batch], step, first=n == 0)
            shares.append(flatten(trained(model), mean) if self._in_order else mean)
        if self._fsdp:
            self._pad()
        return shares

    def _passes_needed(self) -> int:
        """This rank's forward and backward passes this step: its logical ranks' micro-batches."""
        return len(self.layout.ranks) * (self.layout.rows_per_logical // self.state.micro_batch)

    def _pad(self) -> None:
        """A sharded model's every forward and backward is a collective, so every rank makes as
        many as the busiest: a rank with fewer logical ranks (an elastic job's uneven blocks)
        adds passes of its last micro-batch at zero weight, while it would wait anyway."""
        from executors.kinds.torch import sharded

        passes, micro = self._passes, self._last_micro
        while passes.done < passes.most:
            loss = self.workload.loss(micro) * 0.0
            sharded.sync_gradients(self.workload.model, passes.next_is_last())
            loss.backward()

    def _micro_batches(self, rows: Any, step: int, *, first: bool) -> torch.Tensor:
        """Forward and backward over one logical rank's rows in micro-batches (the gradients
        accumulate); the mean loss. Injections fire in the first micro-batch of the first (a late
        out-of-memory in its last)."""
        mb = self.state.micro_batch
        accumulation = self.layout.rows_per_logical // mb
        total = torch.zeros((), device=self.device)
        for i in range(accumulation):
            micro = [t[i * mb : (i + 1) * mb] for t in rows]
            inject = first and i == 0
            late = first and i == accumulation - 1 and i > 0
            if (inject and self.inj.take("oom", step)) or (
                late and self.inj.take("oom_late", step)
            ):
                raise torch.OutOfMemoryError(
                    f"injected out of memory at step {step} (HOTSPARE_INJECT)"
                )
            if inject and self.inj.take("crash", step):
                raise RuntimeError(f"injected crash at step {step} (HOTSPARE_INJECT)")
            if inject and self.inj.slow_step_s:
                time.sleep(self.inj.slow_step_s)
            loss = self.workload.loss(micro)
            if inject and self.inj.take("nan", step):
                loss = loss * math.nan
            if self._fsdp:  # reduce-scatter once a step, in its last backward
                from executors.kinds.torch import sharded

                self._last_micro = micro
                sharded.sync_gradients(self.workload.model, self._passes.next_is_last())
            scaled = loss * self._grad_scale if self._grad_scale != 1.0 else loss
            (scaled / accumulation).backward()
            total += loss.detach()
        return total / accumulation

    def _degrade(self, step: int, e: BaseException) -> None:
        """Out of memory: halve the micro-batch and double accumulation (within each logical
        rank's rows); the global batch stays."""
        g, mb, rows = (
            self.workload.global_batch,
            self.state.micro_batch,
            self.layout.rows_per_logical,
        )
        smaller = next((d for d in range(mb // 2, 0, -1) if rows % d == 0), None)
        if smaller is None:
            raise RuntimeError(f"out of memory at step {step} with micro-batch 1: {e}") from e
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.state.micro_batch = smaller
        self.emit(
            Fault(
                fault=FaultKind.OOM,
                step=step,
                message=f"out of memory at step {step} with micro-batch {mb}; now micro-batch {smaller} x "
                f"{rows // smaller} accumulation (global batch {g})",
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
                fault=FaultKind.NAN,
                step=step,
                message=f"loss {loss} at step {step} (data position {bad}); rolling back to step "
                f"{self.saved_step or 0} and skipping that batch",
            )
        )
        self.workload.optimizer.zero_grad(set_to_none=True)
        self.ckpt.wait()
        if self.group is not None and self._procs > 1:
            self.group.barrier()  # local rank 0 has published what its followers load
        micro = self.state.micro_batch
        loaded = self._last_saved()
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

    def _last_saved(self) -> Loaded | None:
        """Where a rollback goes: the newest checkpoint; a member's exactly the step all saved."""
        if self.group is None:
            return self.ckpt.load_latest(self.device)
        if self.saved_step is None:
            return None
        try:
            return self._load_step(self.saved_step)
        except CorruptCheckpoint as e:
            raise RuntimeError(f"rolling back to step {self.saved_step}: {e}") from None

    def _warn(self, text: str) -> None:
        self.emit(Log(level=LogLevel.WARNING, text=text))

    # --------------------------------------------------------------- progress

    def _progress(self, force: bool = False) -> None:
        self.meter.report(self.state.step, self.state.micro_batch, self.layout.local_rows, force)


class _Passes:
    """A step's passes on a sharded model: how many every rank makes (the most any needs,
    agreed by one tiny all-reduce), and how many this rank has begun."""

    def __init__(self, needed: int, group: Group | None) -> None:
        self.most = group.most(needed) if group is not None else needed
        self.done = 0

    def next_is_last(self) -> bool:
        """Count the pass about to run; True for the step's last (its gradients reduced)."""
        self.done += 1
        return self.done == self.most


def _sharding_group(group: Group | None, in_order: bool) -> Any:
    """A sharded job's checkpoint group (gloo, whatever the training backend: DCP's planning and
    the writer thread's collectives run beside the step's); ConfigError where FSDP cannot run."""
    if group is None:
        raise ConfigError(
            "parallel: fsdp shards the model over a multi-host job's members; this job has one "
            'host (give it hosts = [...], or parallel = "ddp")'
        )
    if in_order:
        raise ConfigError(
            "parallel: fsdp reduce-scatters the gradients, in an order that cannot be fixed: "
            'deterministic_reduce needs parallel = "ddp"'
        )
    return group.side
