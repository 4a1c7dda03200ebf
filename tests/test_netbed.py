"""The test bed's namespaces: two tests side by side never share a 10.213.N.0/24.

A chaos run hung at 982d54b: its fleet took /24s without looking whether another test (on the
other xdist worker) had them, two veths carried one address, and the console's SSH client met
the other test's sshd there ("host key ... has CHANGED"), so no spare could be reached."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import netbed

pytestmark = pytest.mark.skipif(netbed.unavailable() is not None, reason=str(netbed.unavailable()))

# Each maker takes namespaces as fast as it can, from the same starting point (its pid made
# the same), prints their addresses, then waits to be told to delete them.
MAKER = """
import os, sys
os.getpid = lambda: 4242  # the same starting point in both makers: the worst case
sys.path.insert(0, sys.argv[1])
from support import netbed
made = []
try:
    for _ in range(6):
        made.append(netbed.NetNs())
    print(" ".join(ns.local for ns in made), flush=True)
    sys.stdin.readline()
finally:
    for ns in made:
        ns.delete()
"""


def test_two_makers_at_once_never_take_one_network(tmp_path: Path) -> None:
    tests = str(Path(__file__).resolve().parent)
    makers = [
        subprocess.Popen(
            [sys.executable, "-c", MAKER, tests],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        taken = []
        for m in makers:
            assert m.stdout is not None
            line = m.stdout.readline()  # the child's own ip calls each carry a 30 s timeout
            assert line, f"a maker failed: rc={m.poll()}"
            taken.append(set(line.split()))
        # from the kernel, not the makers' word: each address on one interface here
        shown = subprocess.run(
            ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=30
        ).stdout
        for address in taken[0] | taken[1]:
            assert shown.count(f" {address}/24 ") == 1, f"{address} is on two interfaces"
        assert len(taken[0]) == len(taken[1]) == 6
        assert not taken[0] & taken[1], f"both makers took {sorted(taken[0] & taken[1])}"
    finally:
        for m in makers:
            m.communicate("\n", timeout=60)
