"""An incident's timeline marks the phases readied before the fault was declared: a failover's
target is readied while the console still waits on the host, so its transfer and executor
come first in the timeline, before ``detected``, and read as if time ran backwards unless
they say so."""

from __future__ import annotations

import io
import time
from pathlib import Path

from console.records.incidents import IncidentLog, incidents
from console.records.journal import Journal, read
from console.records.report import EARLY, render_incident
from console.records.state_store import StateStore


def test_phases_readied_before_detection_say_so(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    log = IncidentLog(journal, StateStore(tmp_path))
    now = time.time()
    n = log.open("j", "a", "host_lost", fault_at=now - 2.0, last_step=40, msg="gone")
    log.phase(n, "j", "transfer_done", at=now - 1.0, host="b")
    log.phase(n, "j", "executor_up", at=now - 0.5, host="b")
    log.phase(n, "j", "decided", at=now + 1.0, action="failover", host="b")
    log.phase(n, "j", "loaded", at=now + 1.2, step=40)
    log.phase(n, "j", "first_step", at=now + 1.3, step=41)
    journal.close()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    out = io.StringIO()
    render_incident(inc, out)
    lines = out.getvalue().split("```text\n", 1)[1].splitlines()
    phases = [line.split()[1] for line in lines if line and not line.startswith("`")]
    assert phases == ["transfer_done", "executor_up", "detected", "decided", "loaded", "first_step"]
    marked = [line.split()[1] for line in lines if EARLY in line]
    assert marked == ["transfer_done", "executor_up"]
