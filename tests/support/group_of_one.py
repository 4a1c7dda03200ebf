"""A gauge for issue 30 (one supervisor: a single-host job is a group of one), not part of
the suite: ``pytest -p support.group_of_one`` has the controller supervise every job with
one ``host`` by ``GroupSupervisor`` too, so the single-host tests show what the group path
does not yet do for such a job (a warm standby on its spare, a warm twin, ...). What it
found so far is fixed on both paths: a group of one trained other parameters (rank 0
reseeded), and a group's unheard checkpoints were never read back."""

from __future__ import annotations

import pytest

from console.controller import Controller
from console.supervise.group.supervisor import GroupSupervisor
from console.supervise.supervisor import Supervisor


@pytest.fixture(autouse=True)
def group_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def supervisor(self: Controller, name: str) -> Supervisor:
        return GroupSupervisor(self.services, name)

    monkeypatch.setattr(Controller, "_supervisor", supervisor)
