"""A chaos check that could not be made is inconclusive, never a pass (issue 32, item 9): the
faults that used to add only a note now record it (``Injected.inconclusive``), the summary
counts it per kind, and it fails the run unless its fault was overlapped; an MTTR target
missed is counted and shown, and fails nothing. A checkpoint loaded must be one written whole
as loaded (its manifest's sha256, on its own host or as a promoted replica), not merely a step
some executor wrote; a damaged file no loader met is inconclusive. Driven by fabricated
events, files and a frozen dummy process (no fleet)."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.netbed import NsSshHost
from support.wait import wait_for

from chaos import faults_fencing as ff
from chaos import invariants as inv
from chaos import runner
from chaos.disk import DiskWatch, Line, Manifest
from chaos.episode import Result
from chaos.faults import Injected, Target, _corrupt
from console.records.journal import Event, Kind

SHA_A = "a" * 64
SHA_B = "b" * 64


class _Netns:
    def __init__(self) -> None:
        self.cut_now = False

    def cut(self) -> None:
        self.cut_now = True

    def heal(self) -> None:
        self.cut_now = False


def _host() -> NsSshHost:
    h = NsSshHost.__new__(NsSshHost)  # no sshd, no namespace: what the injectors call
    h.netns = _Netns()
    return h


class _Fleet:
    """What the fencing injectors use of a Fleet, with a scripted journal and lease record."""

    def __init__(self, root: Path, lease: dict[str, Any] | None = None) -> None:
        self.root = root
        self.hosts = {"a": _host(), "b": _host()}
        self.jobs: list[Any] = []
        self.events: list[Event] = []
        self.lease = lease
        self.console_kills = self.console_starts = 0

    def workdir(self, host: str, job: str) -> Path:
        return self.root / host / "jobs" / job

    def journal(self) -> list[Event]:
        return self.events

    def lease_record(self, job: str) -> dict[str, Any] | None:
        return self.lease

    def kill_console(self) -> None:
        self.console_kills += 1

    def start_console(self) -> None:
        self.console_starts += 1


def _target(fleet: _Fleet, host: str = "a") -> Target:
    return Target(fleet, "j", host, "b", random.Random(1))


# ------------------------------------------------------------ sigstop_past_lease


def test_a_frozen_executor_gone_before_it_is_continued_is_inconclusive(tmp_path: Path) -> None:
    """The fault's check (no step, no publish once continued past its lease) never ran: that
    was only a note ("gone before it could be continued"), and the fault counted as survived."""
    fleet = _Fleet(tmp_path)
    workdir = fleet.workdir("a", "j")
    (workdir / "checkpoints").mkdir(parents=True)
    progress = {"kind": "progress", "epoch": 1, "step": 40, "steps_per_s": 100.0}
    (workdir / "events.jsonl").write_text(json.dumps(progress) + "\n")
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(workdir)])
    try:
        (workdir / "executor.pid").write_text(f"{proc.pid}\n")
        wait_for(lambda: b"serve" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 10, "exec")
        inj = ff.sigstop_past_lease(_target(fleet))
        assert fleet.hosts["a"].netns.cut_now
        assert inj.inconclusive == []
    finally:
        proc.send_signal(signal.SIGKILL)  # gone while frozen
        proc.wait()
    assert inj.heal is not None
    inj.heal()
    assert not fleet.hosts["a"].netns.cut_now
    assert len(inj.inconclusive) == 1 and "was not checked" in inj.inconclusive[0], inj
    assert inv.inconclusive([inj]) == [f"inconclusive: {inj.inconclusive[0]}"]
    inj.overlapped = True
    assert inv.inconclusive([inj]) == [], "an overlapped fault's: counted, failing nothing"


# ------------------------------------------------------- console_restart_partitioned


def test_a_restart_whose_persisted_lease_is_another_hosts_is_inconclusive(tmp_path: Path) -> None:
    lease = {"host": "b", "epoch": 3, "until": 1.0, "ttl_s": 3.0}
    fleet = _Fleet(tmp_path, lease)
    inj = ff.console_restart_partitioned(_target(fleet, "a"))
    assert fleet.console_kills == fleet.console_starts == 1
    assert len(inj.inconclusive) == 1, inj
    assert "not the cut host a's" in inj.inconclusive[0]
    assert inj.heal is not None
    inj.heal()
    assert not fleet.hosts["a"].netns.cut_now


def test_a_restart_after_which_no_newer_epoch_started_is_inconclusive(tmp_path: Path) -> None:
    lease = {"host": "a", "epoch": 3, "until": ff._boottime() + 1.0, "ttl_s": 3.0}
    fleet = _Fleet(tmp_path, lease)
    inj = ff.console_restart_partitioned(_target(fleet, "a"))
    assert inj.inconclusive == [] and "bound_left_s" in inj.figures
    assert inj.heal is not None
    inj.heal()  # the journal shows no epoch after 3: the wait is not measured
    assert len(inj.inconclusive) == 1 and "no epoch of j newer than 3" in inj.inconclusive[0]
    assert "extra_s" not in inj.figures


def test_a_restart_judged_against_a_newer_epoch_is_conclusive(tmp_path: Path) -> None:
    lease = {"host": "a", "epoch": 3, "until": ff._boottime() + 1.0, "ttl_s": 3.0}
    fleet = _Fleet(tmp_path, lease)
    inj = ff.console_restart_partitioned(_target(fleet, "a"))
    bound = inj.t + inj.figures["bound_left_s"] + 1.0
    fleet.events = [
        Event(
            t=bound + 0.5,
            kind=Kind.JOB_STATE,
            job="j",
            host="b",
            data={"from": "deploying", "to": "running", "epoch": 4},
        )
    ]
    assert inj.heal is not None
    inj.heal()
    assert inj.inconclusive == [] and inj.violations == [] and "extra_s" in inj.figures


# ------------------------------------------------------------------ the summary


def _result(*faults: Injected) -> Result:
    r = Result(seed=1, faults=list(faults))
    r.matches = [inv.Match(f, None, True) for f in faults]
    return r


def _row(text: str, kind: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {kind} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_summary_counts_inconclusives_and_mttr_misses_per_kind() -> None:
    frozen = Injected("sigstop_past_lease", "j", "a", 1.0, ("host_lost",))
    frozen.inconclusive.append("sigstop_past_lease: gone")
    restart = Injected("console_restart_partitioned", "j", "a", 2.0, ("host_lost",))
    restart.missed.append("console_restart_partitioned (MTTR bound, not safety): 9 s")
    r = _result(frozen, restart)
    text = runner.summary([r], 60.0)
    header = _row(text, "fault")
    assert header[4:6] == ["inconclusive", "MTTR missed"], header
    assert _row(text, "sigstop_past_lease")[1:6] == ["1", "0", "0", "1", "0"], text
    assert _row(text, "console_restart_partitioned")[1:6] == ["1", "0", "1", "0", "1"], text
    assert _row(text, "**all**")[1:6] == ["2", "0", "1", "1", "1"], text
    assert "MTTR targets missed 1" in text
    assert "target missed (not safety): console_restart_partitioned" in text


def test_an_inconclusive_fails_the_run_an_mttr_miss_does_not() -> None:
    restart = Injected("console_restart_partitioned", "j", "a", 2.0, ("host_lost",))
    restart.missed.append("console_restart_partitioned (MTTR bound, not safety): 9 s")
    assert not runner.failed([_result(restart)]), "an MTTR miss is no safety violation"
    frozen = Injected("sigstop_past_lease", "j", "a", 1.0, ("host_lost",))
    frozen.inconclusive.append("sigstop_past_lease: gone")
    assert runner.failed([_result(frozen)])
    frozen.overlapped = True
    r = _result(frozen)
    assert not runner.failed([r])
    assert "inconclusive (overlapped: counted only): sigstop_past_lease: gone" in runner.summary(
        [r], 1.0
    )
    r.inconclusive.append("j: a loaded step-0000000200.pt ...: not checked")
    assert runner.failed([r]), "an episode's inconclusive fails the run"


# ------------------------------------------------------------------ loads_whole


def _saved(host: str, step: int, sha: str, seen: float = 1.0) -> Line:
    path = f"/r/{host}/jobs/j/checkpoints/step-{step:010d}.pt"
    ev = {"kind": "checkpoint", "path": path, "manifest": {"step": step, "sha256": sha}}
    return Line(seen, host, "j", ev)


def _resumed(host: str, step: int, seen: float) -> Line:
    path = f"/r/{host}/jobs/j/checkpoints/step-{step:010d}.pt"
    return Line(seen, host, "j", {"kind": "resumed", "step": step, "checkpoint": path, "epoch": 2})


def _manifest(
    host: str, step: int, sha: str, seen: float, ino: int, replica: bool = False
) -> Manifest:
    folder = f"/r/{host}/replicas/j" if replica else f"/r/{host}/jobs/j/checkpoints"
    path = f"{folder}/step-{step:010d}.json"
    return Manifest(host, "j", replica, path, ino, seen, seen, 1, step, sha, seen)


def _disk(lines: list[Line], manifests: list[Manifest]) -> DiskWatch:
    disk = DiskWatch({}, ["j"])
    disk.lines += lines
    disk.manifests += manifests
    return disk


def test_a_load_of_a_step_written_whole_elsewhere_but_not_as_loaded_is_a_violation() -> None:
    """The old check took a step any executor wrote whole: b's step 400, whose manifest
    vouches for bytes no executor reported (sha B), passed because a wrote its own step 400."""
    disk = _disk(
        [_saved("a", 400, SHA_A), _resumed("b", 400, 9.0)],
        [_manifest("a", 400, SHA_A, 1.0, 5), _manifest("b", 400, SHA_B, 8.0, 7)],
    )
    bad, loads, unsure = inv.loads_whole(disk, "j")
    assert loads == 1 and unsure == []
    assert len(bad) == 1 and "which no executor reported written whole on b" in bad[0], bad


def test_a_replica_promoted_from_a_whole_write_elsewhere_is_a_whole_load() -> None:
    disk = _disk(
        [_saved("a", 400, SHA_A), _resumed("b", 400, 9.0)],
        [
            _manifest("b", 400, SHA_A, 2.0, 7, replica=True),  # copied from a's
            _manifest("b", 400, SHA_A, 8.0, 7),  # promoted: a hard link of the replica
        ],
    )
    assert inv.loads_whole(disk, "j") == ([], 1, [])


def test_a_load_of_its_own_whole_write_is_whole_and_of_another_version_is_not() -> None:
    """Which manifest was loaded: the newest at that step seen by the time the Resumed was."""
    manifests = [
        _manifest("b", 400, SHA_B, 1.0, 6),  # seen, never reported written (withdrawn)
        _manifest("b", 400, SHA_A, 5.0, 7),
    ]
    lines = [_saved("b", 400, SHA_A, 5.0), _resumed("b", 400, 6.0)]
    assert inv.loads_whole(_disk(lines, manifests), "j") == ([], 1, [])
    lines = [_saved("b", 400, SHA_A, 5.0), _resumed("b", 400, 2.0)]
    bad, _, unsure = inv.loads_whole(_disk(lines, manifests), "j")
    assert len(bad) == 1 and unsure == [], bad


def test_a_load_whose_manifest_was_never_seen_or_unlinked_is_inconclusive() -> None:
    lines = [_saved("a", 400, SHA_A), _resumed("b", 400, 9.0)]
    bad, _, unsure = inv.loads_whole(_disk(lines, []), "j")
    assert bad == [] and len(unsure) == 1 and "never saw a manifest" in unsure[0]
    bad, _, unsure = inv.loads_whole(_disk(lines, [_manifest("b", 400, SHA_A, 8.0, 7)]), "j")
    assert bad == [] and len(unsure) == 1 and "written whole on a" in unsure[0], unsure


# ------------------------------------------------------------------ corrupt_loads


def _checkpoint(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"step-{step:010d}.pt"
    data.write_bytes(bytes(range(256)) * 8)
    sha = hashlib.sha256(data.read_bytes()).hexdigest()
    data.with_suffix(".json").write_text(json.dumps({"step": step, "sha256": sha}))
    return data


def _events(workdir: Path, *events: dict[str, Any]) -> None:
    with open(workdir / "events.jsonl", "a") as f:
        f.writelines(json.dumps(ev) + "\n" for ev in events)


def test_the_injector_hashes_the_damage_and_a_missing_victim_is_inconclusive(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "a" / "jobs" / "j"
    victim = _checkpoint(workdir / "checkpoints", 400)
    inj = Injected("corrupt_checkpoint", "j", "a", 1.0, ("executor_crash",))
    _corrupt(inj, victim, "a", workdir, random.Random(3))
    vouched, now = inj.damage[str(victim)]
    assert vouched != now == hashlib.sha256(victim.read_bytes()).hexdigest()
    assert inj.corrupted == [("a", str(victim), 0)] and inj.inconclusive == []
    none = Injected("corrupt_checkpoint", "j", "a", 1.0, ("executor_crash",))
    _corrupt(none, None, "a", workdir, random.Random(3))
    assert none.corrupted == [] and len(none.inconclusive) == 1, none


def _damaged(tmp_path: Path) -> tuple[Injected, Path, str]:
    workdir = tmp_path / "b" / "jobs" / "j"
    victim = _checkpoint(workdir / "checkpoints", 400)
    _checkpoint(workdir / "checkpoints", 200)
    _events(workdir, {"kind": "progress", "step": 410, "epoch": 1})
    inj = Injected("corrupt_replica", "j", "a", 1.0, ("host_lost",))
    _corrupt(inj, victim, "b", workdir, random.Random(5))
    return inj, workdir, str(victim)


def test_a_damaged_file_met_and_skipped_is_conclusive(tmp_path: Path) -> None:
    inj, workdir, path = _damaged(tmp_path)
    _events(
        workdir,
        {"kind": "fault", "fault": "checkpoint_corrupt", "message": f"skipped {path}: sha256"},
        {"kind": "resumed", "step": 200, "checkpoint": path.replace("400", "200"), "epoch": 2},
    )
    assert inv.corrupt_loads([inj]) == ([], 1)
    assert inj.inconclusive == []


def test_a_damaged_file_no_loader_met_is_inconclusive(tmp_path: Path) -> None:
    """Trusting the executor's word, each of these passed: nothing resumed there (the job went
    elsewhere), a resume from an older step that never skipped the damaged newest, damage
    that left the bytes as the manifest vouches."""
    inj, workdir, path = _damaged(tmp_path)
    assert inv.corrupt_loads([inj]) == ([], 0)
    assert len(inj.inconclusive) == 1 and "no executor resumed there" in inj.inconclusive[0]

    inj, workdir, path = _damaged(tmp_path / "older")
    older = path.replace("400", "200")
    _events(workdir, {"kind": "resumed", "step": 200, "checkpoint": older, "epoch": 2})
    assert inv.corrupt_loads([inj]) == ([], 0)
    assert len(inj.inconclusive) == 1 and "neither skipped nor loaded" in inj.inconclusive[0]

    inj, workdir, path = _damaged(tmp_path / "undamaged")
    vouched, _ = inj.damage[path]
    inj.damage[path] = (vouched, vouched)
    _events(workdir, {"kind": "fault", "message": f"skipped {path}: sha256"})
    assert inv.corrupt_loads([inj]) == ([], 1)
    assert len(inj.inconclusive) == 1 and "still match" in inj.inconclusive[0], inj


def test_a_damaged_file_loaded_is_a_violation(tmp_path: Path) -> None:
    inj, workdir, path = _damaged(tmp_path)
    _events(workdir, {"kind": "resumed", "step": 400, "checkpoint": path, "epoch": 2})
    assert inv.corrupt_loads([inj]) == ([f"corrupt_replica: b loaded the damaged {path}"], 0)
    assert inj.inconclusive == []
