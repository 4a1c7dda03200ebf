"""``hotspare run --policy auto --json`` and ``hotspare report``, as an operator runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.fleetbed import EXECUTOR_ENV, baseline_sha, job_table, local_host, write_inventory
from support.helpers import REPO, env_with
from support.wait import wait_for as wait


def hotspare(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args],
        capture_output=True,
        text=True,
        env=env or env_with(),
        cwd=REPO,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (not gone, not a zombie)? From ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def run_auto(
    inv: Path, hook: dict[str, dict[str, str]], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``hotspare run --policy auto --json``, each host's executors given ``hook``'s environment."""
    env = env_with(HOTSPARE_EXECUTOR_ENV=json.dumps(hook))
    return hotspare(
        "--inventory", str(inv), "run", "--policy", "auto", "--json", env=env, timeout=timeout
    )


def test_a_crash_loop_on_one_host_ends_on_the_spare_and_the_report_lists_it(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=200)}},
        restart_limit=1,
    )
    digest = baseline_sha(inv, "j", tmp_path / "baseline")
    # Each injected fault fires once per executor process, and a crash is restarted in the same
    # process: resumed from step 80, the run crashes again at 91, past the one restart allowed.
    hook = {"a": {**EXECUTOR_ENV, "HOTSPARE_INJECT": "crash@90,crash@91"}, "b": EXECUTOR_ENV}
    run = run_auto(inv, hook)
    assert run.returncode == 0, run.stderr[-2000:]
    events = [json.loads(line) for line in run.stdout.splitlines()]
    (finished,) = [e for e in events if e["kind"] == "finished"]
    assert finished["data"]["params_sha256"] == digest
    assert finished["host"] == "b", "two crashes on a (limit 1 restart), then the spare"
    report = hotspare("--inventory", str(inv), "report")
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "| j | `" + digest + "` |" in text
    assert "run_crash" in text
    assert "## Incident 1: j on a" in text
    assert "MTTR" in text


def test_a_crash_that_follows_the_job_to_its_spare_fails_it_as_a_crash_loop(
    tmp_path: Path,
) -> None:
    """The same crash on every host (the job's code or data, not a host): restarted on a, moved
    to b, restarted there, then failed, with the hosts named. It went back to a before, and on
    between the two for ever."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=200, warm_standby=None)}},
        restart_limit=1,
    )
    crash = {**EXECUTOR_ENV, "HOTSPARE_INJECT": "crash@90,crash@91"}
    run = run_auto(inv, {"a": crash, "b": crash}, timeout=180)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "job j did not finish: crash_loop: the run crash-looped on a and then b" in run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert not [e for e in events if e["kind"] == "finished"]
    started = [e["host"] for e in events if e["kind"] == "executor" and " started " in e["msg"]]
    assert "a" in started and "b" in started, started
    for host in "ab":  # trained on each host, crashed there at step 91 and not again
        said = (tmp_path / host / "jobs" / "j" / "events.jsonl").read_text().splitlines()
        ends = [json.loads(x) for x in said if '"run_ended"' in x]
        assert [e["message"][-30:] for e in ends][-1].endswith("step 91 (HOTSPARE_INJECT)")
    # Every executor the console started is gone once it has ended: the warm standby readied
    # on a after the move to b too. A restart in place on b started a second standby task
    # beside the first; the job's failure dropped only the second, and the first (its
    # executor on a) outlived the run until its idle exit (60 s).
    pids = [e["data"]["pid"] for e in events if e["kind"] == "executor" and " started " in e["msg"]]
    standbys = [e for e in events if e["kind"] == "executor" and "as its warm standby" in e["msg"]]
    assert [e["host"] for e in standbys] == ["b", "a"], "one standby on b, then one on a"
    wait(lambda: not [p for p in pids if alive(p)], 10, "every executor gone after the run")


def test_a_job_with_a_bad_config_fails_fast_with_a_reason(tmp_path: Path) -> None:
    """A config only the host can find wrong (its corpus file is not there); one the console
    can judge (a key, a value) is refused before the run (tests/console/test_check_jobs.py)."""
    corpus = tmp_path / "no-such-corpus.txt"
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **job_table(steps=20, config={"corpus": str(corpus)})}},
    )
    run = hotspare("--inventory", str(inv), "run", "--policy", "auto", timeout=120)
    assert run.returncode == 1
    assert "job j did not finish: config" in run.stderr
    assert f"config.corpus: cannot read {corpus}" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout


def test_report_without_a_journal_is_a_clear_error(tmp_path: Path) -> None:
    r = hotspare("report", "--state-dir", str(tmp_path))
    assert r.returncode == 2
    assert "no journal here" in r.stderr
