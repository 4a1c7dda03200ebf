"""A stand-in for a live executor when a probe asks about a workdir: a script that holds the
workdir's executor lock until its stdin closes."""

from __future__ import annotations

HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""
"""Holds a workdir's executor lock, as a live executor does, until its stdin closes."""
