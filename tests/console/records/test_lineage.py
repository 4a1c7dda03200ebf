"""``hotspare lineage JOB``: a job failed over from host a to host b through the real controller
(real executors, torch and files) reads back from the journal alone as one chain naming both
hosts, both epochs and the incident between them; and the command's bad inputs."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import msgspec
import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, run_until, stdlib_job, write_inventory

from console.cli import main
from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Journal, Kind, read
from console.records.lineage import brief
from console.states import JobState
from console.supervise.policy import Policy
from console.ui.view_detail import lineage_lines
from protocol.spec import CheckpointManifest


def lineage(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["lineage", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def on_disk(root: Path) -> dict[int, CheckpointManifest]:
    """The manifests a host holds for job j, by step: the evidence the journal is checked by."""
    found = {}
    for p in (root / "jobs" / "j" / "checkpoints").glob("step-*.json"):
        m = msgspec.json.decode(p.read_bytes(), type=CheckpointManifest)
        found[m.step] = m
    return found


async def test_a_failover_from_a_to_b_is_one_chain_with_the_incident_between(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=600)}},
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = await run_until(
        ctl,
        lambda: sup.step >= 60 and ctl.replicator.replica("j", "b").manifest,
        90,
        "step 60 and a replica on b",
    )
    ctl.kill_host("a")
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.state is JobState.FINISHED and sup.host == "b"
    (inc,) = incidents(read(tmp_path / "state" / "journal.jsonl"))

    code, out, err = lineage(capsys, "j", "--json", "--state-dir", str(tmp_path / "state"))
    assert (code, err) == (0, "")
    chain = json.loads(out)["chain"]
    kinds = [x["kind"] for x in chain]
    assert kinds.count("incident") == 1
    cut = kinds.index("incident")
    before, after = chain[:cut], chain[cut + 1 :]
    assert before and after and all(k == "checkpoint" for k in kinds[:cut] + kinds[cut + 1 :])
    assert {x["host"] for x in before} == {"a"} and {x["host"] for x in after} == {"b"}
    (epoch_a,) = {x["epoch"] for x in before}
    (epoch_b,) = {x["epoch"] for x in after}
    assert epoch_b > epoch_a
    incident = chain[cut]
    assert (incident["id"], incident["host"], incident["class"]) == (inc.id, "a", "host_lost")
    assert incident["lost_steps"] == inc.lost_steps is not None
    assert incident["resumed_step"] == inc.resumed_step

    assert (before[0]["parent_step"], before[0]["parent_sha256"]) == (None, None), "fresh start"
    for run in (before, after):
        for prev, link in itertools.pairwise(run):
            assert (link["parent_step"], link["parent_sha256"]) == (prev["step"], prev["sha256"])
            assert link["parent_step"] == link["step"] - 20, "every checkpoint_every_steps"
    first_b = after[0]
    from_a = {x["step"]: x["sha256"] for x in before}
    assert first_b["parent_step"] == inc.resumed_step, "b resumed from the replica it loaded"
    assert first_b["parent_sha256"] == from_a[first_b["parent_step"]], "a's checkpoint, as is"
    assert (first_b["parent_host"], first_b["crossed"]) == ("a", True)
    assert not any(x["crossed"] for x in chain if x is not first_b and x["kind"] == "checkpoint")

    disk = on_disk(tmp_path / "b")  # what b holds agrees with what the journal says it wrote
    for x in after:
        if x["step"] in disk:
            lin = disk[x["step"]].lineage
            assert lin is not None and disk[x["step"]].sha256 == x["sha256"]
            assert (lin.parent_step, lin.parent_sha256) == (x["parent_step"], x["parent_sha256"])
            assert lin.host == x["hostname"] and lin.code_hash == x["code_hash"]
            assert lin.run_id == x["run_id"]
    run_id = json.loads((tmp_path / "state" / "state.json").read_text())["jobs"]["j"]["run_id"]
    assert run_id and {x["run_id"] for x in before + after} == {run_id}, "one run, both hosts"

    code, md, _ = lineage(capsys, "j", "--state-dir", str(tmp_path / "state"))
    assert code == 0
    assert f"## Epoch {epoch_a} on `a`" in md and f"## Epoch {epoch_b} on `b`" in md
    assert md.index(f"## Epoch {epoch_a}") < md.index("incident 1 on `a`")
    assert md.index("incident 1 on `a`") < md.index(f"## Epoch {epoch_b}")
    assert f"lost steps {inc.lost_steps}" in md
    assert md.count(f"run `{run_id}`") == 2, "each epoch's origin names the run"
    assert f"| step {inc.resumed_step} on `a` (crossed hosts) |" in md

    events = list(read(tmp_path / "state" / "journal.jsonl"))
    lines = brief(events, "j")
    assert f"crossed a -> b at step {inc.resumed_step} (epoch {epoch_b})" in lines
    assert lines[0].startswith(f"step {after[-3]['step']} on b, epoch {epoch_b}, from step ")
    assert lineage_lines(ctl, "j").splitlines() == lines, "the detail view shows the same"


def journal_with(state: Path) -> None:
    journal = Journal(state / "journal.jsonl")
    journal.record(Kind.PLACEMENT, "j on a", job="j", host="a", data={"host": "a"})
    journal.record(
        Kind.CHECKPOINT,
        "j: checkpoint step 20 on a",
        job="j",
        host="a",
        data={"step": 20, "epoch": 1},  # a journal from before lineage was recorded
    )
    journal.close()


def test_an_unknown_job_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal_with(tmp_path / "state")
    code, out, err = lineage(capsys, "nope", "--state-dir", str(tmp_path / "state"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "no job 'nope'" in err and "jobs there: j" in err


def test_no_state_dir_or_no_journal_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = lineage(capsys, "j", "--state-dir", str(tmp_path / "never"))
    assert (code, out) == (2, "")
    assert (
        err
        == f"hotspare: lineage: no state dir {tmp_path / 'never'} yet (has the console run with it?)\n"
    )
    (tmp_path / "empty").mkdir()
    code, _, err = lineage(capsys, "j", "--state-dir", str(tmp_path / "empty"))
    assert code == 2 and err.count("\n") == 1 and "no journal here" in err
    inventory = write_inventory(  # the inventory's state dir, before any console ran
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **stdlib_job()}},
    )
    code = main(["--inventory", str(inventory), "lineage", "j"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert (
        err
        == f"hotspare: lineage: no state dir {tmp_path / 'state'} yet (has the console run with it?)\n"
    )


def test_a_bad_job_name_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal_with(tmp_path / "state")
    code, out, err = lineage(capsys, "../etc", "--state-dir", str(tmp_path / "state"))
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "is not a job name" in err


def test_a_journal_from_before_lineage_still_prints_its_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal_with(tmp_path / "state")
    code, out, err = lineage(capsys, "j", "--state-dir", str(tmp_path / "state"))
    assert (code, err) == (0, "")
    assert "| `a` | 20 | - | - |" in out, "no sha256, no parent known"
    code, out, _ = lineage(capsys, "j", "--json", "--state-dir", str(tmp_path / "state"))
    (link,) = json.loads(out)["chain"]
    assert (link["step"], link["known"], link["parent_step"]) == (20, False, None)
