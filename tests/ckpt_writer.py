"""A checkpoint writer the completeness tests drive through files in a gate folder: it writes
a checkpoint as the frameworks do (one open, written, closed), holding it open for as long as
the test says.

    python ckpt_writer.py MODE PATH --gate DIR [--wait-start]

- ``hold``: open PATH, write half, create ``DIR/holding`` (its pid inside), wait for
  ``DIR/release``, write the rest, close, create ``DIR/closed``, wait for ``DIR/exit``, exit 0.
- ``torn``: as ``hold`` up to ``DIR/holding``, then wait, the file open, until killed.
- ``hf``: PATH is a Hugging Face ``checkpoint-N/`` folder: write model.safetensors,
  optimizer.pt, scheduler.pt and rng_state.pth, then ``trainer_state.json`` (last, as
  ``Trainer._save_checkpoint`` does) held open until ``DIR/release``; then as ``hold``.

``--wait-start``: wait for ``DIR/start`` before anything. Every wait has a deadline (``WAIT_S``): a test that dies leaves no writer behind for long.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

WAIT_S = 120.0
HALF = b"\x5a" * (1 << 16)


def wait(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"ckpt_writer: {path} never came")
        time.sleep(0.01)


def mark(path: Path, text: str = "") -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def held(path: Path, gate: Path, first: bytes, rest: bytes, *, torn: bool) -> None:
    """Write ``first``, say so, and, unless ``torn``, the rest once released, then close."""
    with open(path, "wb") as f:
        f.write(first)
        f.flush()
        mark(gate / "holding", str(os.getpid()))
        if torn:
            wait(gate / "never")
        wait(gate / "release")
        f.write(rest)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["hold", "torn", "hf"])
    ap.add_argument("path", type=Path)
    ap.add_argument("--gate", type=Path, required=True)
    ap.add_argument("--wait-start", action="store_true")
    args = ap.parse_args()
    if args.wait_start:
        wait(args.gate / "start")
    path: Path = args.path
    if args.mode == "hf":
        path.mkdir(parents=True)
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
            (path / name).write_bytes(HALF)
        held(path / "trainer_state.json", args.gate, b'{"global_step": ', b"5}\n", torn=False)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        held(path, args.gate, HALF, HALF, torn=args.mode == "torn")
    mark(args.gate / "closed")
    wait(args.gate / "exit")


if __name__ == "__main__":
    main()
