"""Fixtures of the console's UI tests; a module asks for ``reap_executors`` by name (its
``pytestmark``), so only the tests that start processes reap them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.uibed import reap


@pytest.fixture
def reap_executors(tmp_path: Path) -> Iterator[None]:
    """Quitting a view leaves the controller and its executors running on purpose; this
    test's own (every process named with its folder: executors, controllers, views) are
    killed after."""
    yield
    reap(tmp_path)
