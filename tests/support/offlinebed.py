"""The console itself offline in tests: the alert it raises when it reaches no host at all, and
the executors a host's root holds, read from ``/proc``."""

from __future__ import annotations

import contextlib
from pathlib import Path

OFFLINE = "the console reaches no host at all"


def executors_under(root: Path) -> list[int]:
    """Pids of executors (``executors.cli serve``) whose command line names ``root``, from
    /proc; the console's short-lived probes (``executors.cli health``) are not executors."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if (
                b"executors.cli" in args
                and b"serve" in args
                and any(str(root).encode() in a for a in args)
            ):
                pids.append(int(cmdline.parent.name))
    return pids
