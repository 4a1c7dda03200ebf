"""Drain and cordon undone from the keys and the palette; an action that would change nothing,
or may not be done now, says so and is journalled as refused, never as done (issue 29).

Before: ``o`` on a drained host said ``cordon c: done`` and changed nothing, ``r`` said
``revive c: done`` and did nothing, the palette had no undrain (a drained host never came
back), and ``approve failover of j`` was journalled with no failover waiting (now ``approve
recovery of j``: under observe a restart waits for it too)."""

from __future__ import annotations

import json
from pathlib import Path

from support.fleetbed import job_table, local_host, stdlib_job, write_inventory
from support.uibed import console_app, notified, table, wait_for
from textual.widgets import OptionList

from console.records.journal import Event, Kind
from console.ui.app import HotspareApp
from console.ui.screens.confirm import ConfirmScreen

SIZE = (120, 40)


def hosts_only(tmp_path: Path) -> Path:
    """Hosts and no job: nothing trains, the host actions alone are exercised."""
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "c": local_host(tmp_path / "c", region="r2")},
        jobs={},
    )


def on_disk(inventory: Path, host: str) -> dict[str, bool]:
    """The host's record in state.json as the next console would read it."""
    saved = json.loads((inventory.parent / "state" / "state.json").read_text())
    return saved["hosts"].get(host, {"cordoned": False, "drained": False})


def actions(events: list[Event]) -> list[tuple[str, str | None]]:
    """(message, why refused or None) of every operator action journalled."""
    return [(e.msg, e.data.get("refused")) for e in events if e.kind is Kind.ACTION]


async def palette(pilot: object, app: HotspareApp, query: str) -> list[str]:
    """Type ``query`` in the command palette; the commands it offers, best first."""
    await pilot.press("colon", *query)  # type: ignore[attr-defined]
    await wait_for(pilot, lambda: app.screen.query(OptionList) and True, 5, "the palette")  # type: ignore[arg-type]
    options = app.screen.query_one(OptionList)
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


async def test_a_drained_host_is_undrained_and_what_changes_nothing_is_refused(
    tmp_path: Path,
) -> None:
    inventory = hosts_only(tmp_path)
    app, events = console_app(inventory)
    ctl = app.ctl
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert "d  drain; undrain a drained host" in str(
            app.screen.query_one("#help-keys").render()
        )
        await pilot.press("escape")
        hosts = table(app)
        hosts.move_cursor(row=hosts.get_row_index("c"))
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "drained", 5, "drained")
        assert on_disk(inventory, "c")["drained"] is True

        await pilot.press("o")
        await wait_for(pilot, lambda: notified(app, "cordon c: refused"), 5, "cordon refused")
        assert not notified(app, "cordon c: done")
        await pilot.press("r")
        await wait_for(pilot, lambda: notified(app, "revive c: refused"), 5, "revive refused")
        assert not notified(app, "revive c: done")
        assert table(app).cell("c", "state") == "drained"
        assert (on_disk(inventory, "c")["drained"], on_disk(inventory, "c")["cordoned"]) == (
            True,
            False,
        ), "nothing changed on disk"
        refused = [msg for msg, why in actions(events) if why]
        assert refused == [
            "cordon c: refused (c is drained; cordon is for a host that is up)",
            "revive demo host c: refused (c was not killed; revive brings back a killed demo host)",
        ]
        assert ("cordon c", None) not in actions(events), "never journalled as done"

        await pilot.press("d")  # on a drained host: undrain, nothing to confirm
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "up", 5, "undrained")
        assert on_disk(inventory, "c")["drained"] is False
        assert notified(app, "undrain c: done")
        assert "c" in ctl.fleet.usable(), "it takes jobs again"

        await pilot.press("d", "y")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "drained", 5, "again")
        offered = await palette(pilot, app, "c")
        assert any("undrain c" in o for o in offered), offered
        assert not any(o.startswith(("cordon c", "drain c", "revive c")) for o in offered), offered
        await pilot.press("escape")
        await pilot.press("colon", *"undrain c")
        await wait_for(
            pilot,
            lambda: (
                "undrain c" in str(app.screen.query_one(OptionList).get_option_at_index(0).prompt)
            ),
            5,
            "undrain c first",
        )
        await pilot.press("enter")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "up", 5, "palette undrain")
        assert on_disk(inventory, "c")["drained"] is False

        await pilot.press("o")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "cordoned", 5, "cordoned")
        assert on_disk(inventory, "c")["cordoned"] is True
        offered = await palette(pilot, app, "cordon c")
        assert any("uncordon c" in o for o in offered), offered
        assert not any(o.startswith("cordon c") for o in offered), "cordoned already"
        await pilot.press("escape")
        await pilot.press("colon", *"uncordon c")
        await wait_for(
            pilot,
            lambda: (
                "uncordon c" in str(app.screen.query_one(OptionList).get_option_at_index(0).prompt)
            ),
            5,
            "uncordon c first",
        )
        await pilot.press("enter")
        await wait_for(pilot, lambda: table(app).cell("c", "state") == "up", 5, "uncordoned")
        assert on_disk(inventory, "c")["cordoned"] is False
    assert [msg for msg, why in actions(events) if not why] == [
        "drain c",
        "undrain c",
        "drain c",
        "undrain c",
        "cordon c",
        "uncordon c",
    ]


async def test_approving_with_no_failover_waiting_is_refused_not_journalled_as_done(
    tmp_path: Path,
) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **job_table()}},
    )
    app, events = console_app(inventory)
    app.supervise = False  # the job is not started: nothing asks for an approval
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: "j" in table(app).row_keys(), 5, "j listed")
        await pilot.press("a")
        await wait_for(pilot, lambda: notified(app, "approve recovery of j: refused"), 5, "said")
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: notified(app, "deny recovery of j: refused"), 5, "said")
    none = "j has no recovery waiting for approval"
    assert actions(events) == [
        (f"approve recovery of j: refused ({none})", none),
        (f"deny recovery of j: refused ({none})", none),
    ], "journalled as refused, never as done"


async def test_checkpoint_now_on_a_command_job_is_refused_not_sent_to_nothing(
    tmp_path: Path,
) -> None:
    """The command kind takes no checkpoint requests (its script checkpoints on its own
    schedule): before, ``c`` said ``checkpoint j now: done`` and no checkpoint ever came."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **stdlib_job()}},
    )
    app, events = console_app(inventory)
    app.supervise = False
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: "j" in table(app).row_keys(), 5, "j listed")
        await pilot.press("c")
        await wait_for(pilot, lambda: notified(app, "checkpoint j: refused"), 5, "said")
        assert notified(app, "checkpoints on its own schedule only")
        assert not notified(app, "checkpoint j: done")
    why = "j runs the command kind, which checkpoints on its own schedule only"
    assert actions(events) == [(f"checkpoint j now: refused ({why})", why)]
