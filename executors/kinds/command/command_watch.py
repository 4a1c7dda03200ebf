"""Which of the checkpoints a command wrote are complete, by the command's completeness rule.

A checkpoint is taken as soon as it is safe to, and never torn. Each poll reads the run's
processes first (``command_writers``: its cgroup, else its fence's descendants), then the
checkpoints, then which files of those not yet published the run's processes hold open for
writing. The rule, in order:

1. Open for writing by a process of the run: not complete, however long it stayed unchanged
   (said once, as a warning, when ``settle_s`` would have taken it). That process is its
   writer until a poll sees it closed: by the writer, alive (its settle time starts then), or
   by the writer's end (a process killed mid-write closes nothing itself; its descriptors go
   with it): then it is torn, said once, and never complete in that state.
2. The command exited 0: every file is complete (a checkpoint with a marker rule still needs
   its marker).
3. With ``complete_marker``: a missing marker, never. A marker no older than the rest of the
   checkpoint: complete at once; but where the run's processes can be read and were read at
   the poll before the checkpoint (its marker included) took its present state, only if none
   of those has ended since (HF's ``trainer_state.json`` is written in place: its writer dying
   mid-write leaves it torn), else it waits ``settle_s``. Where nothing tells, the marker
   alone, as the writer's word. A marker older than a file of the checkpoint (transformers
   releases that wrote ``rng_state.pth`` after ``trainer_state.json``) proves nothing: the
   checkpoint must then be closed (4) or settled (5).
4. A file without a marker is complete once *closed*: on a local filesystem (``LOCAL_FS``: no
   other host writes it), the run's processes readable, none holds it open for writing, every
   process the run had at the poll before it took its present state still alive, and its size
   and mtime the same after the scan of open files as before it (or at the poll before).
5. Otherwise (a folder without a marker: its files are written one after another, with nothing
   open between them; another filesystem; processes that cannot be read; a process of the
   run that ended): complete once its size and mtime (a folder: every file's) stayed the same
   ``settle_s`` while the command ran.

Once the command has ended (not exit 0), a checkpoint counts only if it had settled before the
end, or by its marker alone where nothing tells (3). What the rule cannot tell: a writer that
closes a checkpoint and opens it again to write more (``torch.save``, Lightning and nanoGPT
write a file in one open); a process born after the poll before a checkpoint changed and
killed mid-write without ever being seen holding it, while the rest of the run goes on
(``settle_s`` cannot either); a file written only through a shared writable mapping.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from executors.kinds.command.command_tree import Entry, judge, remove
from executors.kinds.command.command_writers import (
    LOCAL_FS,
    FileId,
    Proc,
    Scan,
    Writers,
    file_ids,
    mount_fs,
)
from protocol.spec import CommandSpec


@dataclass(frozen=True)
class Candidate:
    """A complete checkpoint in the command's folder, as it was when judged complete."""

    path: Path
    step: int
    size: int
    mtime_ns: int
    """For a folder: the sum of its files' sizes and the newest of their mtimes."""
    entries: tuple[Entry, ...] | None = None
    """A folder's files; None for a file."""


def marker_name(template: str, name: str) -> str:
    return template.replace("{name}", name).replace("{stem}", Path(name).stem)


def marker_beside(template: str) -> bool:
    """A folder's marker is beside it when its name depends on the folder's, else inside it
    (``.metadata``, which torch.distributed.checkpoint writes last); a file's is always beside."""
    return "{name}" in template or "{stem}" in template


StepAt = Callable[[int], int | None]
"""The newest progress step seen at a wall time (ns, as a file's mtime), or None."""


UNSETTLED_WARN_AFTER = 3
"""Writes of ``checkpoint_file`` in a row that never settled before the warning."""


@dataclass(frozen=True)
class _Seen:
    key: tuple[object, tuple[int, int] | None]
    """Its state (size and mtime, or a folder's listing) and its marker's beside it."""
    since: float
    """Monotonic time it was first seen in this state."""
    before: frozenset[Proc] | None
    """The run's processes at the poll before it was first seen in this state (read before
    that poll's files): any writer of this state that had started by then."""
    writer: Proc | None = None
    """The process last seen holding it open for writing, until seen closed by it."""
    torn: bool = False
    """Its writer ended while holding it open: never complete in this state."""


@dataclass(frozen=True)
class _Judged:
    cand: Candidate
    seen: _Seen
    again: bool
    """Seen in this same state at the poll before."""
    changed: bool
    """Seen before, in another state (of the checkpoint itself, not its marker)."""
    ids: set[FileId]


class Watcher:
    """Finds complete checkpoints in ``folder`` by the command's completeness rule."""

    def __init__(
        self,
        folder: Path,
        cs: CommandSpec,
        *,
        step_at: StepAt = lambda _t: None,
        warn: Callable[[str], None] = lambda _text: None,
        writers: Writers | None = None,
    ) -> None:
        self.folder = folder
        self.cs = cs
        self._step = re.compile(cs.step_regex)
        self._step_at = step_at
        """``checkpoint_file``'s step: the command's progress when the file was written."""
        self._warn = warn
        self._warned: set[str] = set()
        self._writers = writers
        """The run's processes (None: not known; ``settle_s`` and markers alone decide)."""
        self._procs: frozenset[Proc] | None = None
        """The run's processes at the last poll, read before its files."""
        self._watched = False
        """The run's processes were readable at the last poll while the command ran."""
        self._local: bool | None = None
        self._seen: dict[str, _Seen] = {}
        """name -> how and since when it has been seen unchanged."""
        self._rewrites = 0
        """Writes of ``checkpoint_file`` in a row that never settled."""

    def writing(self, name: str) -> int | None:
        """The pid last seen holding checkpoint ``name`` open for writing, until seen to close
        it (None: not seen open)."""
        seen = self._seen.get(name)
        return None if seen is None or seen.writer is None else seen.writer[0]

    def files(self) -> list[tuple[Path, int | None]]:
        """Checkpoint files (not markers, not hidden) with their step: the one their name
        carries, or for ``checkpoint_file`` the progress step when it was written (None: not
        known yet). A name with no step is said once, as a warning, and left alone."""
        if self.cs.checkpoint_file is not None:
            path = self.folder / self.cs.checkpoint_file
            try:
                mtime_ns = path.stat().st_mtime_ns
            except OSError:
                return []
            return [(path, self._step_at(mtime_ns))]
        names = sorted(
            p.name for p in self.folder.glob(self.cs.checkpoint_glob) if not p.name.startswith(".")
        )
        markers = (
            {marker_name(self.cs.complete_marker, n) for n in names}
            if self.cs.complete_marker
            else set()
        )
        out: list[tuple[Path, int | None]] = []
        for name in names:
            if name in markers:
                continue
            m = self._step.search(name)
            if m is None:
                if name not in self._warned:
                    self._warned.add(name)
                    self._warn(
                        f"{self.folder / name} matches checkpoint_glob {self.cs.checkpoint_glob!r} "
                        f"but step_regex {self.cs.step_regex!r} finds no step in its name: not a "
                        "checkpoint. A file rewritten in place: set checkpoint_file = "
                        f"{name!r} (its step then comes from the progress)"
                    )
                continue
            out.append((self.folder / name, int(m.group("step"))))
        return out

    def complete(
        self, *, exited_ok: bool = False, ended_at: float | None = None, after: int | None = None
    ) -> list[Candidate]:
        """The complete checkpoints now, oldest step first, by the module's rule; ``after``:
        only those of a later step are judged (the newest one published).

        ``ended_at`` (monotonic) is set once the command has ended; ``exited_ok`` (exit 0)
        vouches for every file.
        """
        now = time.monotonic()
        writers = self._writers if ended_at is None else None
        before, self._procs = self._procs, (writers.live() if writers else None)
        if ended_at is None:
            self._watched = self._procs is not None
        judged = self._judge_all(now, before, after, ids=writers is not None)
        scan = None
        if writers is not None and judged and not exited_ok:
            scan = writers.scan(set().union(*(j.ids for j in judged)))
        found = []
        for j in judged:
            if self._ready(j, scan, exited_ok=exited_ok, ended_at=ended_at, now=now):
                found.append(j.cand)
                self._rewrites = 0
            elif j.changed and self.cs.checkpoint_file:
                self._rewritten_unsettled(j.cand.path)
        return sorted(found, key=lambda c: c.step)

    def _judge_all(
        self, now: float, before: frozenset[Proc] | None, after: int | None, *, ids: bool
    ) -> list[_Judged]:
        """Each checkpoint as it is now, with since when it has been so."""
        out = []
        seen, self._seen = self._seen, {}
        for path, step in self.files():
            if step is None:
                continue
            state = judge(path)
            if state is None:
                continue
            cand = Candidate(path, step, *state)
            mark = self._beside(cand)
            key = (cand.entries or (cand.size, cand.mtime_ns), _state(mark))
            old = seen.get(path.name)
            again = old is not None and old.key == key
            if again and old is not None:
                now_seen = old
            else:  # a writer seen holding it stays its writer until seen to close it
                now_seen = _Seen(key, now, before, writer=old.writer if old else None)
            self._seen[path.name] = now_seen
            if after is not None and step <= after:
                continue
            changed = old is not None and old.key[0] != key[0]
            found = file_ids(path, () if mark is None else (mark,)) if ids else set()
            out.append(_Judged(cand, now_seen, again, changed, found))
        return out

    def _ready(
        self, j: _Judged, scan: Scan | None, *, exited_ok: bool, ended_at: float | None, now: float
    ) -> bool:
        seen = self._track(j, scan, now)
        if seen is None or seen.torn:
            return False
        end = ended_at if ended_at is not None else now
        settled = seen.writer is None and end - seen.since >= self.cs.settle_s
        undisturbed = scan is not None and seen.before is not None and seen.before <= scan.live
        if self.cs.complete_marker:
            mark = self._marked(j.cand, self.cs.complete_marker)
            if mark is None:
                return False
            if exited_ok or settled:
                return True
            if mark:  # the marker alone where nothing tells whether a process of the run ended
                if undisturbed or seen.before is None:
                    return True
                return scan is None and (ended_at is None or not self._watched)
            return undisturbed and self._closed(j)  # older: no word of the writer's
        if exited_ok or settled:
            return True
        return j.cand.entries is None and undisturbed and self._closed(j)

    def _closed(self, j: _Judged) -> bool:
        """Unchanged from before this poll's scan of the run's open files to after it (or
        since the poll before), on a filesystem only this host writes."""
        if not self._local_fs():
            return False
        c = j.cand
        return j.again or judge(c.path) == (c.size, c.mtime_ns, c.entries)

    def _track(self, j: _Judged, scan: Scan | None, now: float) -> _Seen | None:
        """What this poll's scan says of its writer: None while one holds it open, torn once
        that writer has ended without closing it; seen closed, its settle time starts then."""
        seen, name = j.seen, j.cand.path.name
        if scan is None:
            return seen
        holder = next((scan.held[i] for i in j.ids if i in scan.held), None)
        if holder is not None:
            if now - seen.since >= self.cs.settle_s:
                self._say(f"open:{name}", self._held_text(j.cand.path, holder[0]))
            self._seen[name] = replace(seen, writer=holder)
            return None
        writer = seen.writer
        if writer is not None:
            seen = replace(seen, since=now, writer=None, torn=writer not in scan.live)
            self._seen[name] = seen
            if seen.torn:
                self._say(
                    f"torn:{name}",
                    f"{j.cand.path}: process {writer[0]} of the command ended while it held it "
                    "open for writing: a torn write, never taken as a checkpoint",
                )
        return seen

    def _beside(self, cand: Candidate) -> Path | None:
        """The marker beside the checkpoint, if its rule names one there."""
        template = self.cs.complete_marker
        if not template or (cand.entries is not None and not marker_beside(template)):
            return None
        return self.folder / marker_name(template, cand.path.name)

    def _local_fs(self) -> bool:
        if self._local is None:
            self._local = mount_fs(self.folder) in LOCAL_FS
        return self._local

    def _held_text(self, path: Path, pid: int) -> str:
        return (
            f"{path} has stayed unchanged for settle_s {self.cs.settle_s:g} s but process {pid} "
            "of the command still holds it open for writing: not taken until it is closed"
        )

    def _say(self, once: str, text: str) -> None:
        """A warning, said once per ``once``."""
        if once not in self._warned:
            self._warned.add(once)
            self._warn(text)

    def _rewritten_unsettled(self, path: Path) -> None:
        """``checkpoint_file`` rewritten again before it stayed unchanged for ``settle_s``: none
        of its writes is taken. Said once, after a few, as a warning naming the fix (a script
        that saves every second under the default settle_s 2 s was never checkpointed)."""
        self._rewrites += 1
        if self._rewrites < UNSETTLED_WARN_AFTER or "settle" in self._warned:
            return
        self._warned.add("settle")
        self._warn(
            f"{path} was rewritten {self._rewrites} times, each time before it stayed unchanged "
            f"for settle_s {self.cs.settle_s:g} s: none of those writes was taken as a "
            "checkpoint. Set settle_s below the time between its writes, or have the script "
            "write a complete_marker"
        )

    def prune_before(self, step: int) -> int:
        """Remove the command's own checkpoints (and their markers) older than ``step``, the
        oldest one published and kept: hotspare restores from its published copies, never from
        these. ``checkpoint_file`` is one file: nothing to prune. How many went."""
        if self.cs.checkpoint_file is not None:
            return 0
        gone = 0
        for path, at in self.files():
            if at is None or at >= step:
                continue
            remove(path)
            self._seen.pop(path.name, None)
            if self.cs.complete_marker:
                (self.folder / marker_name(self.cs.complete_marker, path.name)).unlink(
                    missing_ok=True
                )
            gone += 1
        return gone

    def _marked(self, cand: Candidate, template: str) -> bool | None:
        """Its marker is no older than anything of the checkpoint (True), is older (False), or
        does not exist (None)."""
        name, newest = marker_name(template, cand.path.name), cand.mtime_ns
        mark = self.folder / name
        if cand.entries is not None and not marker_beside(template):
            mark = cand.path / name
            newest = max((e[2] for e in cand.entries if e[0] != name), default=0)
        try:
            return mark.stat().st_mtime_ns >= newest
        except OSError:
            return None


def _state(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
