"""The lock probe: does a live process hold this flock? Run on the host as ``python -c SOURCE
LOCKFILE``; exits ``HELD`` when one does, 0 when the lock could be taken (and is let go at
once, as the program ends). The kernel drops a dead process's flock. The standard library
only."""

from __future__ import annotations

import fcntl
import os
import sys

HELD = 75


def main(argv: list[str]) -> int:
    fd = os.open(argv[0], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return HELD
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
