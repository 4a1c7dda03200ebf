"""A kind's idle work is found apart from the kind: the executor asks the registry, not a kind
name, what to do while it waits for Start (serve.py once special-cased ``kind == "torch"``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from executors.kinds import BUILTIN, load_idle


def test_only_the_torch_kind_has_idle_work_and_finding_it_imports_neither_torch_nor_a_runner() -> (
    None
):
    """Run in a fresh interpreter: what finding the idle work imported is read from
    sys.modules, not from the registry's own account."""
    probe = (
        "import sys\n"
        "from executors.kinds import load_idle\n"
        "idle = load_idle('torch')\n"
        "assert load_idle('command') is None\n"
        "heavy = [m for m in ('torch', 'executors.kinds.torch.trainer',"
        " 'executors.kinds.torch.torch_kind') if m in sys.modules]\n"
        "print(type(idle).__name__, heavy)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["TorchIdle", "[]"]


def test_an_unknown_kind_has_no_idle_work() -> None:
    assert "nosuchkind" not in BUILTIN
    assert load_idle("nosuchkind") is None


def test_the_idle_read_ahead_returns_once_started(tmp_path: Path) -> None:
    idle = load_idle("torch")
    assert idle is not None
    started = threading.Event()
    started.set()
    done = threading.Thread(target=idle.until_started, args=(started, tmp_path))
    done.start()
    done.join(timeout=30)
    assert not done.is_alive()
