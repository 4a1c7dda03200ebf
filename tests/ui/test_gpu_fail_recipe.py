"""The README's GPU FAIL recipe, as an operator follows it in the console: a device of the job's
host set to ``"ecc_uncorrected": 2`` in that host's fake NVML file drains the host and moves the
job with no step lost; set back to 0, the host is healthy again, and ``d`` on it brings it back
(``up``, a failover target again). Evidence: the table on screen, the journal, the state file."""

from __future__ import annotations

import json
from pathlib import Path

from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, write_inventory
from support.uibed import notified, table, wait_for

from console.controller import Controller
from console.inventory import load
from console.records.journal import Event, Kind
from console.supervise.policy import Policy
from console.ui.app import HotspareApp
from executors.testing.gpu_fake import write_state

SIZE = (160, 40)
HEALTHY = {"devices": [{"name": "Fake H100", "temp_c": 45, "ecc_uncorrected": 0}]}


async def test_a_gpu_fail_edited_in_drains_the_host_and_d_brings_it_back(tmp_path: Path) -> None:
    nvml = {h: tmp_path / f"gpus-{h}.json" for h in "ab"}
    for path in nvml.values():
        write_state(path, HEALTHY)
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000)}},
        health_probe_s=0.5,
    )
    env = {h: {**EXECUTOR_ENV, "HOTSPARE_FAKE_NVML": str(nvml[h])} for h in "ab"}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    events: list[Event] = []
    ctl.journal.subscribe(events.append)
    app = HotspareApp(ctl)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: ctl.jobs["j"].step >= 20, 90, "j training on a")
        failing = json.loads(nvml["a"].read_text())
        failing["devices"][0]["ecc_uncorrected"] = 2  # what the README says to edit
        nvml["a"].write_text(json.dumps(failing))
        await wait_for(pilot, lambda: table(app).cell("a", "state") == "drained", 60, "a drained")
        await wait_for(pilot, lambda: ctl.jobs["j"].host == "b", 60, "j moved to b")
        assert drained_on_disk(tmp_path, "a") is True
        (inc,) = [
            e for e in events if e.kind is Kind.INCIDENT and e.data.get("phase") == "detected"
        ]
        assert inc.data.get("class") == "gpu_fail", inc

        nvml["a"].write_text(json.dumps(HEALTHY))  # set back to 0
        await wait_for(
            pilot,
            lambda: any(e.msg == "a: healthy again" for e in events),
            30,
            "a healthy again",
        )
        rows = table(app)
        rows.move_cursor(row=rows.get_row_index("a"))
        await pilot.press("d")  # on a drained host: undrain
        await wait_for(pilot, lambda: table(app).cell("a", "state") == "up", 10, "a up")
        assert notified(app, "undrain a: done")
        assert "a" in ctl.fleet.usable(), "a failover target again"
    assert drained_on_disk(tmp_path, "a") is False


def drained_on_disk(tmp_path: Path, host: str) -> bool:
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    return bool(state["hosts"].get(host, {}).get("drained", False))
