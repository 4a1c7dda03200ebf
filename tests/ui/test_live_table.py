"""The live table writes only the cells that changed, and keeps rows in the order given."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult

from console.ui.view import age, progress_bar
from console.ui.widgets.live_table import LiveTable


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LiveTable(("name", "state", "step"))


async def test_sync_touches_only_changed_cells_and_follows_row_order() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)):
        t = app.query_one(LiveTable)
        assert t.sync({"a": ("a", "up", "1"), "b": ("b", "up", "2")}) == 6
        assert t.sync({"a": ("a", "up", "1"), "b": ("b", "up", "2")}) == 0
        assert t.sync({"a": ("a", "down", "1"), "b": ("b", "up", "3")}) == 2
        assert [str(cell) for cell in t.get_row("a")] == ["a", "down", "1"]
        t.sync({"a": ("a", "down", "1"), "c": ("c", "up", "0"), "b": ("b", "up", "3")})
        assert [r.key.value for r in t.ordered_rows] == ["a", "c", "b"]
        t.sync({"b": ("b", "up", "3")})
        assert [r.key.value for r in t.ordered_rows] == ["b"]
        assert t.selected == "b"


async def test_cells_are_shown_as_written_not_as_markup_and_columns_fit_them() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)):
        t = app.query_one(LiveTable)
        t.sync({"x": ("[red]host[/red]", "up", "1")})
        assert str(t.get_row("x")[0]) == "[red]host[/red]"
        assert t.columns[t.ordered_columns[0].key].content_width == len("[red]host[/red]")
        t.sync({"x": ("h", "up", "1")})
        assert t.columns[t.ordered_columns[0].key].content_width == len("name"), "shrinks back"


async def test_a_sync_before_the_table_is_mounted_writes_nothing_and_does_not_fail() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)):
        early = LiveTable(("a", "b"))  # composed but not mounted: no columns yet
        assert early.sync({"x": ("1", "2")}) == 0
        await app.mount(early)
        assert early.sync({"x": ("1", "2")}) == 2


def test_cells_render_progress_and_ages() -> None:
    assert progress_bar(50, 200, width=4) == "█░░░ 50/200  25%"
    assert progress_bar(0, 0, width=2).startswith("░░ 0/0")
    assert age(3.25) == "3.2s"
    assert age(300) == "5m"
    assert age(None) == "-"


def test_a_newer_progress_event_replaces_a_queued_one_for_the_same_job() -> None:
    from console.journal import Event, Kind
    from console.ui.messages import JournalEvent

    def msg(kind: Kind, job: str) -> JournalEvent:
        return JournalEvent(Event(t=0.0, kind=kind, job=job))

    assert msg(Kind.PROGRESS, "j").can_replace(msg(Kind.PROGRESS, "j"))
    assert not msg(Kind.PROGRESS, "j").can_replace(msg(Kind.PROGRESS, "k"))
    assert not msg(Kind.ALERT, "j").can_replace(msg(Kind.ALERT, "j"))


async def test_a_redraw_tick_while_the_app_shuts_down_is_ignored(tmp_path: Path) -> None:
    from test_snapshots import fixed_app

    app = fixed_app(tmp_path)
    async with app.run_test(size=(120, 40)):
        assert app.redraws >= 0
    app.redraw()  # no screen left on the stack: nothing to do, and no ScreenStackError
