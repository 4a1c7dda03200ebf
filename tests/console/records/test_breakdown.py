"""The MTTR breakdown names the parts as they are: ``load`` is the checkpoint's load as the
executor timed it, ``setup`` the rest of the way from the executor's start to it. It read
``load 12.19 s`` for a checkpoint loaded in 0.09 s."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from console.cli import main
from console.records.incidents import IncidentLog, incidents
from console.records.journal import Journal, read
from console.records.report import render_incident
from console.records.state_store import StateStore


def _incident(tmp_path: Path, **loaded: float) -> Journal:
    journal = Journal(tmp_path / "journal.jsonl")
    log = IncidentLog(journal, StateStore(tmp_path / "state.json"))
    t0 = time.time()
    n = log.open("j", "a", "host_lost", fault_at=t0 - 1, last_step=57, msg="gone")
    log.phase(n, "j", "decided", action="failover", host="b", at=t0 + 1)
    log.phase(n, "j", "executor_up", at=t0 + 3)
    log.phase(n, "j", "loaded", step=40, at=t0 + 15.19, **loaded)
    log.phase(n, "j", "first_step", step=41, at=t0 + 16)
    journal.close()
    return journal


def test_the_load_is_the_executor_s_own_and_the_rest_is_setup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _incident(tmp_path, load_s=0.09)
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    parts = inc.breakdown()
    assert list(parts) == ["detect", "decide", "start", "setup", "load", "first step"]
    assert parts["setup"] == pytest.approx(12.1, abs=0.01)
    assert parts["load"] == pytest.approx(0.09)
    assert sum(parts.values()) == pytest.approx(inc.mttr_s)
    out = io.StringIO()
    render_incident(inc, out)
    assert "setup 12.10 s, load 0.09 s, first step 0.81 s" in out.getvalue()
    assert main(["report", "--state-dir", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["incidents"][0]["breakdown_s"]["setup"] == pytest.approx(12.1, abs=0.01)


def test_without_a_timed_load_the_stretch_stays_one_load(tmp_path: Path) -> None:
    _incident(tmp_path)
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    parts = inc.breakdown()
    assert "setup" not in parts and parts["load"] == pytest.approx(12.19, abs=0.01)
    assert sum(parts.values()) == pytest.approx(inc.mttr_s)
