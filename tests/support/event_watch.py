"""When each executor event first appeared in a workdir's ``events.jsonl``, on the wall clock:
the executors' own record, watched as it is written, so a test can time what an executor did
(resumed under a new epoch) against a lease bound without the console's account of it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_S = 0.02


class EventWatch:
    def __init__(self, workdirs: list[Path]) -> None:
        self.seen: dict[Path, list[tuple[float, dict[str, Any]]]] = {w: [] for w in workdirs}
        """Per workdir, (wall time first seen, event), in the order written."""
        self._read: dict[Path, int] = dict.fromkeys(workdirs, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-watch", daemon=True)

    def __enter__(self) -> EventWatch:
        for w in self.seen:  # what was written before the watch is not timed
            self._read[w] = _size(w / "events.jsonl")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def first(self, workdir: Path, match: Callable[[dict[str, Any]], bool]) -> float | None:
        """When the first event ``match`` accepts was seen in ``workdir``; None if none was."""
        return next((t for t, e in list(self.seen[workdir]) if match(e)), None)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            for w in self.seen:
                self._poll(w)

    def _poll(self, workdir: Path) -> None:
        try:
            with open(workdir / "events.jsonl", "rb") as f:
                f.seek(self._read[workdir])
                data = f.read()
        except OSError:
            return
        now = time.time()
        whole = data[: data.rfind(b"\n") + 1]  # a torn last line waits for its end
        self._read[workdir] += len(whole)
        for line in whole.splitlines():
            try:
                self.seen[workdir].append((now, json.loads(line)))
            except ValueError:
                continue


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
