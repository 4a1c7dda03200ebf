"""The executor's rooms hold: a new module goes into the room of its concern, the arrows point
one way (console and executors import protocol, never each other), and the test doubles shipped
in the bundle are imported by production code only where a test asked for them (inside a
function, never at a module's top)."""

from __future__ import annotations

import ast
from pathlib import Path

from support.helpers import parsed

REPO = Path(__file__).resolve().parents[2]
EXECUTORS = REPO / "executors"

TOP = {"__init__.py", "cli.py", "exitcodes.py", "clock.py", "durable.py", "threadname.py"}
"""What stays at the top of executors/: the front door and what every room uses."""
ROOMS = {"agent", "fencing", "checkpoints", "kinds", "health", "testing"}


def top_level_imports(path: Path) -> set[str]:
    """Modules imported at a module's top (not inside a function or a TYPE_CHECKING block)."""
    found: set[str] = set()
    for node in parsed(path).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def all_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module}
    return found


def test_the_top_of_executors_holds_only_the_front_door_and_what_every_room_uses() -> None:
    assert {p.name for p in EXECUTORS.glob("*.py")} == TOP
    rooms = {p.name for p in EXECUTORS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == ROOMS
    for room in rooms:
        assert (EXECUTORS / room / "__init__.py").read_text().startswith('"""'), room


def test_production_code_imports_the_test_doubles_only_where_a_test_asked() -> None:
    eager = sorted(
        str(p.relative_to(REPO))
        for p in EXECUTORS.rglob("*.py")
        if "testing" not in p.parts
        and any(m.startswith("executors.testing") for m in top_level_imports(p))
    )
    assert eager == []


def test_the_arrows_point_one_way() -> None:
    """console and executors import protocol; neither imports the other (the console ships
    the executors' source, it never runs it), and protocol imports neither."""
    for package, forbidden in (
        ("executors", "console"),
        ("console", "executors"),
        ("protocol", "console"),
        ("protocol", "executors"),
    ):
        crossing = sorted(
            str(p.relative_to(REPO))
            for p in (REPO / package).rglob("*.py")
            if any(m == forbidden or m.startswith(f"{forbidden}.") for m in all_imports(p))
        )
        assert crossing == [], f"{package} imports {forbidden}"
