"""The demo's own files, all under its state dir (``.hotspare``), so ``rm -rf .hotspare`` starts
it over and nothing the demo does changes a tracked file (called by ``scripts/demo``):

- ``inventory.toml``: a copy of the shipped inventory with its paths rewritten to resolve to
  the same folders from there (``state_dir = "."``, ``root = "hosts/NAME"``). The demo runs on
  the copy, so a host added with ``n`` is appended to it, not to the shipped file.
- ``gpus/HOST.json``: one fake NVML per demo host (two "Demo GPU" devices each), so editing
  one host's file (``"ecc_uncorrected": 2`` on a device) drains that host alone; and
  ``gpus/default.json`` for a host added later.

Files already there are kept (the demo started again goes on where it was). Prints the JSON
``{host: {"HOTSPARE_FAKE_NVML": path}}`` for ``HOTSPARE_EXECUTOR_ENV``.

Usage: python scripts/demo_setup.py REPO STATE_DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from console.inventory import load
from executors.testing.gpu_fake import write_state

GPU = {
    "name": "Demo GPU (fake NVML)",
    "util_pct": 90,
    "util_wave": 9,
    "mem_used_mb": 61440,
    "temp_c": 64,
    "power_w": 412.0,
}
STATE_DIR_LINE = re.compile(r'^(state_dir\s*=\s*)"[^"]*"', re.M)
ROOT_LINE = re.compile(r'^(root\s*=\s*)"([^"]*)"', re.M)


def copied_inventory(shipped: Path, state: Path) -> str:
    """The shipped inventory's text, its state dir and local roots made relative to ``state``
    (where the copy goes); comments and everything else as they are."""
    text = shipped.read_text()
    inv = load(shipped)
    if inv.state_dir != state.resolve():
        raise SystemExit(f"{shipped}: its state_dir is not {state}: not the shipped demo file")

    def root(m: re.Match[str]) -> str:
        path = (shipped.parent / m.group(2)).resolve()
        try:
            return f'{m.group(1)}"{path.relative_to(state.resolve())}"'
        except ValueError:  # a root outside the state dir stays where it is
            return f'{m.group(1)}"{path}"'

    return ROOT_LINE.sub(root, STATE_DIR_LINE.sub(r'\1"."', text))


def setup(repo: Path, state: Path) -> dict[str, dict[str, str]]:
    state.mkdir(parents=True, exist_ok=True)
    copy = state / "inventory.toml"
    if not copy.exists():
        text = copied_inventory(repo / "inventory.toml", state)
        tmp = copy.with_suffix(".toml.tmp")
        tmp.write_text(text)
        tmp.replace(copy)
    inv = load(copy)
    gpus = state / "gpus"
    gpus.mkdir(exist_ok=True)
    env: dict[str, dict[str, str]] = {}
    for name in ["default", *(h for h, t in inv.hosts.items() if t.transport == "local")]:
        path = gpus / f"{name}.json"
        if not path.exists():
            write_state(str(path), {"devices": [dict(GPU) for _ in range(2)]})
        if name != "default":
            env[name] = {"HOTSPARE_FAKE_NVML": str(path.resolve())}
    return env


def main() -> None:
    repo, state = Path(sys.argv[1]), Path(sys.argv[2])
    print(json.dumps(setup(repo, state)))


if __name__ == "__main__":
    main()
