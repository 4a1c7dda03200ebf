#!/usr/bin/env python3
"""A provisioner for hotspare that makes a local demo host on this machine (the tests' one).

    [provisioner]
    command = ["python3", "examples/provision_local.py", "--root", "/tmp/hosts", "--region", "r1"]
    release = ["python3", "examples/provision_local.py", "--root", "/tmp/hosts", "--release"]

Provisioning creates a fresh folder under ``--root`` (``prov-1``, ``prov-2``, ...) and prints
its ``[hosts.X]`` table as one JSON object with the host's ``name``; ``--release NAME`` removes
that folder. A cloud provisioner does the same with a real machine: start it, wait for its
sshd, print ``{"name": ..., "region": ..., "transport": "ssh", "addresses": [...], ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, type=Path)
    ap.add_argument(
        "--region",
        default=os.environ.get("HOTSPARE_REGION") or "r1",
        help="the host's region (default: HOTSPARE_REGION, which the console sets when it "
        "provisions for a region's min_spares, else r1)",
    )
    ap.add_argument("--delay", type=float, default=0.0, help="seconds a machine takes to boot")
    ap.add_argument("--release", metavar="NAME")
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    if args.release:
        folder = args.root / args.release
        if not folder.is_dir() or folder.parent != args.root:
            print(f"provision_local: no host {args.release!r} under {args.root}", file=sys.stderr)
            return 1
        shutil.rmtree(folder)
        return 0
    time.sleep(args.delay)
    n = 1
    while True:
        folder = args.root / f"prov-{n}"
        try:
            folder.mkdir()
            break
        except FileExistsError:
            n += 1
    host = {"name": folder.name, "region": args.region, "transport": "local", "root": str(folder)}
    print(json.dumps(host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
