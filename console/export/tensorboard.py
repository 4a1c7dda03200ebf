"""Each job's metrics as one TensorBoard run, ``tensorboard_dir/JOB``, across failovers,
restarts and consoles, written with tensorboardX's own ``SummaryWriter``.

No step is written twice. After a failover the job trains again the steps past its last
checkpoint; each run folder keeps ``hotspare-marks.json``, the highest step written in each
series, and a point at or below its series' mark is dropped. The marks are saved (atomically)
before the points under them go to the writer, so a console that dies mid-write leaves at worst
a gap, never a step that the next console writes again.

The console's loop only queues points; a one-worker thread saves marks and hands points to the
writer every ``FLUSH_S`` (tensorboardX writes and flushes them from its own thread).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from console import clock
from console.export.points import Point, Translate
from console.records.journal import Event
from protocol.errors import HotspareError
from protocol.messages import Progress

MARKS = "hotspare-marks.json"
FLUSH_S = 2.0
"""How often queued points go to the writer (and so how much a dying console may leave out)."""
WRITER_FLUSH_S = 5
"""How often tensorboardX's own thread flushes its file."""
CLOSE_TIMEOUT_S = 10.0
"""The most a closing console waits for the last points to reach the files."""
MAX_QUEUED = 100_000
"""Points waiting for the worker; past this (a disk that hangs) new ones are dropped."""


class ExportError(HotspareError):
    """Metrics cannot be written (a one-line reason); the console goes on without them."""

    permanent = True


class Writer(Protocol):
    """The part of tensorboardX's ``SummaryWriter`` used here."""

    def add_scalar(
        self, tag: str, scalar_value: float, global_step: int, walltime: float
    ) -> None: ...
    def add_text(self, tag: str, text_string: str, global_step: int, walltime: float) -> None: ...
    def close(self) -> None: ...


def open_tensorboard(root: Path, problem: Callable[[str], None]) -> TensorBoardExport:
    """The exporter for ``root``; ExportError when tensorboardX is missing or ``root`` cannot
    be written. ``problem`` hears of a failure later on (a disk that filled)."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ExportError(
            f"tensorboard_dir is set ({root}) but tensorboardX is not installed "
            "(pip install 'hotspare[tensorboard]'): no metrics are exported"
        ) from None
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".hotspare-probe-"):
            pass
    except OSError as e:
        raise ExportError(
            f"tensorboard_dir {root} is not writable ({e.strerror or e}): no metrics are exported"
        ) from None

    def writer(logdir: Path) -> Writer:
        # A file of its own per console (two consoles may start within the same second).
        suffix = f".{os.getpid()}.{time.time_ns()}"
        return SummaryWriter(
            logdir=str(logdir), flush_secs=WRITER_FLUSH_S, max_queue=1000, filename_suffix=suffix
        )

    return TensorBoardExport(root, writer, problem)


class TensorBoardExport:
    """A sink for the controller: ``progress`` for each Progress message, ``event`` for each
    journal event; ``run`` hands them to the writer, ``close`` writes the last."""

    def __init__(
        self, root: Path, writer: Callable[[Path], Writer], problem: Callable[[str], None]
    ) -> None:
        self.root = root
        self._new_writer = writer
        self._problem = problem
        self._translate = Translate()
        self._queued: deque[Point] = deque()
        self._dropped = 0
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensorboard")
        # Touched by the worker thread only:
        self._writers: dict[str, Writer] = {}
        self._marks: dict[str, dict[str, int] | None] = {}
        """Job -> series -> highest step written; None: its marks are unreadable (not written)."""

    # --------------------------------------------------------------- the loop's side

    def progress(self, job: str, msg: Progress) -> None:
        self._queue([self._translate.progress(job, msg, clock.wall())])

    def event(self, e: Event) -> None:
        self._queue(self._translate.event(e))

    def _queue(self, points: list[Point]) -> None:
        if self._closed:
            return
        for p in points:
            if len(self._queued) >= MAX_QUEUED:
                self._dropped += 1
            else:
                self._queued.append(p)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        """Hand every queued point to the worker and wait for it to pass them on."""
        batch: list[Point] = []
        while self._queued:
            batch.append(self._queued.popleft())
        if self._dropped:
            self._problem(f"tensorboard export: {self._dropped} points dropped (writes too slow)")
            self._dropped = 0
        if not batch:
            return
        loop = asyncio.get_running_loop()
        problems = await loop.run_in_executor(self._pool, self._write, batch)
        for problem in problems:
            self._problem(problem)

    async def close(self) -> None:
        """The last points written and the files closed (waiting ``CLOSE_TIMEOUT_S`` at most)."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.flush()
                self._closed = True
                await loop.run_in_executor(self._pool, self._close_writers)
        except TimeoutError:
            self._problem(f"tensorboard export: the last points did not reach {self.root} in time")
        except OSError as e:  # tensorboardX's last flush
            self._problem(f"tensorboard export to {self.root} failed while closing: {e}")
        finally:
            self._closed = True
            self._pool.shutdown(wait=False)

    # ------------------------------------------------------------- the worker's side

    def _write(self, batch: list[Point]) -> list[str]:
        """Points to the writers, job by job; what went wrong, for the loop to say."""
        by_job: dict[str, list[Point]] = {}
        for p in batch:
            by_job.setdefault(p.job, []).append(p)
        problems: list[str] = []
        for job, points in by_job.items():
            logdir = self.root / job
            try:
                marks = self._job_marks(job, logdir)
                if marks is not None:
                    self._write_job(job, logdir, marks, points)
            except ValueError as e:
                problems.append(f"tensorboard export of {job} is off: {e}")
            except OSError as e:
                problems.append(f"tensorboard export to {logdir} failed: {e}")
        return problems

    def _write_job(
        self, job: str, logdir: Path, marks: dict[str, int], points: list[Point]
    ) -> None:
        new = dict(marks)
        kept: list[tuple[int, Point]] = []
        for p in points:
            mark = new.get(p.series, -1)
            if p.step > mark:
                step = p.step
            elif p.event:
                step = mark + 1
            else:
                continue  # a step trained again after a resume: written once already
            new[p.series] = step
            kept.append((step, p))
        if not kept:
            return
        _save_marks(logdir / MARKS, new)  # first: what reaches the files is never above it
        self._marks[job] = new
        writer = self._writers.get(job)
        if writer is None:
            writer = self._writers[job] = self._new_writer(logdir)
        for step, p in kept:
            for tag, value in p.scalars.items():
                writer.add_scalar(tag, value, global_step=step, walltime=p.wall)
            for tag, text in p.texts.items():
                writer.add_text(tag, text, global_step=step, walltime=p.wall)

    def _job_marks(self, job: str, logdir: Path) -> dict[str, int] | None:
        """Its marks, read once; ValueError the first time they are unreadable, None after."""
        if job not in self._marks:
            logdir.mkdir(parents=True, exist_ok=True)
            self._marks[job] = None
            self._marks[job] = _load_marks(logdir / MARKS)
        return self._marks[job]

    def _close_writers(self) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()


def _load_marks(path: Path) -> dict[str, int]:
    """The highest step written per series; ValueError for a file that does not read as one
    (exporting on would risk writing steps twice)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e}); move the run folder aside") from None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in raw.items()
    ):
        raise ValueError(f"{path}: not a map of series to steps; move the run folder aside")
    return raw


def _save_marks(path: Path, marks: dict[str, int]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(marks, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
