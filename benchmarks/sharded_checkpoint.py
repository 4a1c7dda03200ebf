"""Sharded checkpoints against whole copies, side by side in one run (issue 31).

The same three-member job of a few-hundred-MB trainer state (charlm, AdamW), under the console
on local demo hosts with one spare, gloo over loopback, at each parallelism:

- ``ddp``: today's default, every member writes the whole trainer state (``torch.save``, its
  write in the checkpoint thread);
- ``fsdp``: the model and optimizer sharded (FSDP2), each member writing its part through
  torch.distributed.checkpoint in the checkpoint thread (its shard, a copy of the previous
  member's, DCP's index, the trainer state).

Per mode: the bytes each member writes per checkpoint, the step loop's stall per checkpoint
(``CheckpointSaved.stall_s``, from the executors' events), the write's own time, the step time
(from Progress), the stall as a share of the training time between two checkpoints; then the
MTTR of a member's loss (host c, node rank 2, killed once its part is on the spare: the
incident's fault to first step, from the console's journal) and whether the run finished
(its state; bit-exactness is proven by the tests, ``tests/console/supervise/group/test_fsdp_group.py``).

    python benchmarks/sharded_checkpoint.py [--quick] [--json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from common import Figure, at_most, emit  # noqa: E402
from support.fleetbed import EXECUTOR_ENV, local_host, until, write_inventory  # noqa: E402

from console.controller import Controller  # noqa: E402
from console.inventory import load  # noqa: E402
from console.records.incidents import incidents  # noqa: E402
from console.records.journal import read  # noqa: E402
from console.states import JobState  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402

FULL = {"n_layer": 8, "n_head": 8, "n_embd": 512, "block_size": 64, "global_batch": 6}
QUICK = {"n_layer": 2, "n_head": 4, "n_embd": 256, "block_size": 64, "global_batch": 6}


@dataclass
class Side:
    mode: str
    part_mb: float
    stall_s: float
    write_s: float
    step_s: float
    every: int
    mttr_s: float | None
    finished: bool
    digest: str | None

    @property
    def share(self) -> float:
        return self.stall_s / (self.step_s * self.every)


def job(mode: str, config: dict[str, Any], steps: int, every: int) -> dict[str, Any]:
    return {
        "hosts": ["a", "b", "c"],
        "spares": ["d"],
        "steps": steps,
        "seed": 3,
        "checkpoint_every_steps": every,
        "keep_checkpoints": 2,
        "parallel": mode,
        "config": {**config, "dropout": 0.0, "micro_batch": 2, "corpus_chars": 20_000},
    }


def events(root: Path, host: str) -> list[dict[str, Any]]:
    path = root / host / "jobs" / "j" / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def run(folder: Path, mode: str, config: dict[str, Any], steps: int, every: int) -> Side:
    folder.mkdir(parents=True)
    hosts = {h: local_host(folder / h) for h in "abc"} | {
        "d": local_host(folder / "d", role="spare")
    }
    inv = write_inventory(
        folder / "inventory.toml", hosts=hosts, jobs={"j": job(mode, config, steps, every)}
    )
    env = {h: dict(EXECUTOR_ENV) for h in "abcd"}
    ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    first = 2 * every
    await until(
        lambda: (
            task.done()
            or (sup.step >= first and bool(ctl.replicator.replica("j", "d", 2).manifest))
        ),
        1800,
        f"step {first} and rank 2's part on the spare",
    )
    kill_t = time.time()
    ctl.kill_host("c")
    await asyncio.wait_for(task, 3600)
    await ctl.close()
    saved = [
        e
        for h in "abc"
        for e in events(folder, h)
        if e["kind"] == "checkpoint" and e["manifest"]["epoch"] == 1
    ]
    gaps = _step_times(events(folder, "a"))
    journal = list(read(folder / "state" / "journal.jsonl"))
    lost = [i for i in incidents(journal) if i.fault_class == "host_lost"]
    mttr = lost[0].mttr_s if lost else None
    assert not lost or lost[0].fault_at >= kill_t - 1
    return Side(
        mode=mode,
        part_mb=statistics.median(e["manifest"]["size"] for e in saved) / 1e6,
        stall_s=statistics.median(e["stall_s"] for e in saved),
        write_s=statistics.median(e["write_s"] for e in saved),
        step_s=statistics.median(gaps) if gaps else float("nan"),
        every=every,
        mttr_s=mttr,
        finished=sup.state is JobState.FINISHED,
        digest=sup.sha256,
    )


def _step_times(evs: list[dict[str, Any]]) -> list[float]:
    """Seconds per step of epoch 1, from its Progress reports' rates."""
    rates = [
        e["steps_per_s"]
        for e in evs
        if e["kind"] == "progress" and e["epoch"] == 1 and e["steps_per_s"] > 0
    ]
    return [1.0 / r for r in rates]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small model, few steps")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep the hosts' folders here")
    args = ap.parse_args()
    config = QUICK if args.quick else FULL
    steps, every = (60, 10) if args.quick else (80, 10)
    sides: dict[str, Side] = {}
    with tempfile.TemporaryDirectory(prefix="hotspare-sharded-") as tmp:
        base = args.keep or Path(tmp)
        for mode in ("ddp", "fsdp"):
            sides[mode] = asyncio.run(run(base / mode, mode, config, steps, every))
    print("| mode | part per member | stall per checkpoint | write | step | stall share | MTTR |")
    print("|---|---|---|---|---|---|---|")
    for s in sides.values():
        mttr = f"{s.mttr_s:.1f} s" if s.mttr_s is not None else "-"
        print(
            f"| {s.mode} | {s.part_mb:.1f} MB | {s.stall_s * 1e3:.0f} ms | {s.write_s:.2f} s | "
            f"{s.step_s * 1e3:.0f} ms | {s.share:.2%} | {mttr} |"
        )
    ddp, fsdp = sides["ddp"], sides["fsdp"]
    ratio, share = fsdp.part_mb / ddp.part_mb, fsdp.share * 100
    figures = [
        Figure("fsdp part per member / ddp copy", ratio, "x", "<= 0.75", at_most(ratio, 0.75)),
        Figure("fsdp stall per checkpoint", fsdp.stall_s * 1e3, "ms"),
        Figure("ddp stall per checkpoint", ddp.stall_s * 1e3, "ms"),
        Figure("fsdp stall share of step time", share, "%", "<= 5", at_most(share, 5.0)),
        Figure("ddp stall share of step time", ddp.share * 100, "%"),
        Figure("fsdp MTTR, a member's host lost", fsdp.mttr_s or float("nan"), "s"),
        Figure("ddp MTTR, a member's host lost", ddp.mttr_s or float("nan"), "s"),
        Figure("fsdp run finished", float(fsdp.finished), "", "1", fsdp.finished),
    ]
    size = "quick" if args.quick else "full"
    notes = (
        f"3 members + 1 spare, local hosts, gloo, {size} model ({config['n_layer']} layers x "
        f"{config['n_embd']}), a checkpoint every {every} steps; ddp whole copies vs fsdp parts"
    )
    emit("sharded_checkpoint", figures, notes, as_json=args.json)


if __name__ == "__main__":
    main()
