"""The listing program: the complete checkpoints in each folder given, as one JSON line (a list
of manifest lists, in the order of the folders). Run on the host as ``python -c SOURCE
FOLDER...``. A manifest counts only with its data beside it and no ``.STEM.pending`` marker
(its publish never confirmed inside the lease: ``executors/fencing/publish.py``). The standard
library only."""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any


def complete(folder: str) -> list[dict[str, Any]]:
    found = []
    for p in sorted(glob.glob(os.path.join(folder, "step-*.json"))):
        stem = os.path.basename(p)[: -len(".json")]
        if not os.path.exists(os.path.join(folder, stem + ".pt")):
            continue  # a manifest whose data is gone is no checkpoint to load or promote
        if os.path.exists(os.path.join(folder, "." + stem + ".pending")):
            continue
        try:
            with open(p) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            pass
    return found


def main(argv: list[str]) -> int:
    print(json.dumps([complete(folder) for folder in argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
