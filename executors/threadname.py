"""OS-level thread names (Linux ``comm``), so ``top -H``, ``ps -L`` and tests see which thread
of an executor trains. Python 3.11 names threads only inside Python; this tells the kernel."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Name the calling thread (at most 15 bytes kept); a no-op where the kernel cannot."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
