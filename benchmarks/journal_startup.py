"""What a console's startup costs on a journal that has grown for months.

Writes a journal of N events shaped like a long run (mostly progress, then checkpoints, host
states and replica copies, an incident now and then) and times what a console reads back
before it shows anything: the unclean-exit check, the Timeline (every incident, the recent
events of the tail), and, for comparison, decoding the whole file as it did before. No
target was set for it; the figure to watch is that startup stays flat as N grows.

    python benchmarks/journal_startup.py [--events 1000000] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import Figure, emit

from console.records.incidents import unclean_exit
from console.records.journal import TAIL_BYTES, Journal, Kind, is_longer_than, read
from console.records.timeline import Timeline


def write_journal(path: Path, events: int) -> None:
    j = Journal(path)
    j.record(Kind.CONSOLE, "console started (policy auto)")
    incident = 0
    for n in range(events):
        if n % 50_000 == 0:
            incident += 1
            j.record(
                Kind.INCIDENT,
                f"incident {incident}",
                job="llm",
                host="gpu-a",
                incident=incident,
                data={"phase": "detected", "class": "host_lost", "fault_at": float(n)},
            )
        elif n % 20 == 0:
            j.record(
                Kind.CHECKPOINT,
                f"llm: checkpoint step {n}",
                job="llm",
                host="gpu-a",
                data={"step": n, "bytes": 6e10, "stall_s": 0.01, "write_s": 4.0, "epoch": 3},
            )
        elif n % 20 == 1:
            j.record(
                Kind.REPLICA,
                f"llm: step {n} on gpu-b",
                job="llm",
                host="gpu-b",
                data={"step": n, "seconds": 12.5},
            )
        else:
            j.record(
                Kind.PROGRESS,
                f"llm: step {n}/10000000 loss 2.3141",
                job="llm",
                host="gpu-a",
                data={"step": n, "loss": 2.3141, "steps_per_s": 3.2},
            )
    j.close()


def seconds(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl"
        write_journal(path, args.events)
        mb = path.stat().st_size / 1e6

        def startup() -> None:
            whole = not is_longer_than(path, TAIL_BYTES)
            unclean_exit(read(path, tail_bytes=TAIL_BYTES), whole=whole)
            journal = Journal(path)
            Timeline(journal)
            journal.close()

        now = min(seconds(startup) for _ in range(3))
        before = min(seconds(lambda: list(read(path))) for _ in range(2))
    figures = [
        Figure("journal size", round(mb, 1), "MB"),
        Figure("console startup reading the journal", round(now, 3), "s"),
        Figure("decoding the whole journal (the reading before)", round(before, 2), "s"),
    ]
    emit("journal_startup", figures, f"{args.events:,} events, best of 3", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
