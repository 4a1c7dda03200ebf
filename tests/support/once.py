"""A deterministic reference computed once per test run, whichever worker asks first.

The suite runs in pytest-xdist workers that share no memory, and a module's tests land on any
of them: a reference run (an uninterrupted job, to compare a resumed one's parameters with) was
made again by each worker that ran one of its tests, up to three times the same training. Here
the first worker to ask makes it and writes it down; the others wait for it and read it. Only
what is the same wherever it is computed belongs here (a run's final parameters' digest).
Without xdist it is kept in this process only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from support.wait import flocked

T = TypeVar("T")

WAIT_S = 900.0
"""How long a worker waits for another to make a reference (a long training run at most)."""
POLL_S = 0.2

_MINE: dict[str, object] = {}


FOLDER_ENV = "HOTSPARE_TEST_ONCE_DIR"
"""Set by the tests' conftest in each xdist worker: a folder every worker of the run shares
(beside the workers' own temporary folders, so pytest removes it with them)."""


def _folder() -> Path | None:
    folder = os.environ.get(FOLDER_ENV)
    return Path(folder) if folder else None


def once(key: str | bytes, make: Callable[[], T]) -> T:
    """``make()``'s value for ``key``, made once per test run (its value must be JSON)."""
    raw = key if isinstance(key, bytes) else key.encode()
    name = hashlib.sha256(raw).hexdigest()[:32]
    if name in _MINE:
        return _MINE[name]  # type: ignore[return-value]
    folder = _folder()
    if folder is None:
        value = _MINE[name] = make()
        return value
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / f"{name}.json"
    with flocked(folder / f"{name}.lock", WAIT_S, POLL_S):
        if done.exists():
            value = json.loads(done.read_text())
        else:
            value = make()
            tmp = folder / f"{name}.tmp"
            tmp.write_text(json.dumps(value))
            tmp.replace(done)
    _MINE[name] = value
    return value  # type: ignore[no-any-return]
