"""The live table: diffs snapshots, keeps row order and the cursor row, scrolls, selects."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from textual.app import App, ComposeResult

from console.ui.view import age, progress_bar, spark
from console.ui.widgets.live_table import LiveTable


class TableApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.selected: list[str] = []

    def compose(self) -> ComposeResult:
        yield LiveTable(("name", "state", "step"))

    def on_live_table_row_selected(self, event: LiveTable.RowSelected) -> None:
        self.selected.append(event.key)


def shown(t: LiveTable) -> list[str]:
    """The table's lines as a terminal would show them (header first), trailing blanks cut."""
    return [t.render_line(y).text.rstrip() for y in range(t.size.height)]


async def test_sync_counts_changed_cells_follows_row_order_and_keeps_the_cursor_row() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)) as pilot:
        t = app.query_one(LiveTable)
        assert t.sync({"a": ("a", "up", "1"), "b": ("b", "up", "2")}) == 6
        assert t.sync({"a": ("a", "up", "1"), "b": ("b", "up", "2")}) == 0
        assert t.sync({"a": ("a", "down", "1"), "b": ("b", "up", "3")}) == 2
        assert t.cell("a", "state") == "down"
        await pilot.pause()  # the layout follows the rows
        assert shown(t)[:3] == [" name  state  step", " a     down   1", " b     up     3"]
        t.move_cursor(row=1)
        t.sync({"a": ("a", "down", "1"), "c": ("c", "up", "0"), "b": ("b", "up", "3")})
        assert t.row_keys() == ["a", "c", "b"]
        assert t.selected == "b", "the cursor stays on the row it was on"
        t.sync({"c": ("c", "up", "0")})
        assert t.row_keys() == ["c"]
        assert t.selected == "c"
        t.clear()
        assert t.row_count == 0 and t.selected is None
        assert shown(t)[1] == ""


async def test_cells_are_shown_as_written_not_as_markup_and_columns_fit_them() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)) as pilot:
        t = app.query_one(LiveTable)
        t.sync({"x": ("[red]host[/red]", "up", "1")})
        await pilot.pause()
        assert shown(t)[1].startswith(" [red]host[/red]  up")
        assert t.column_width("name") == len("[red]host[/red]")
        t.sync({"x": ("h", "up", "1")})
        assert t.column_width("name") == len("[red]host[/red]"), "a value shrinking: no shift"
        t.sync({"y": ("h", "up", "1")})
        assert t.column_width("name") == len("name"), "shrinks back as the row goes"
        await pilot.pause()
        assert shown(t)[1].startswith(" h     up")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from("abcdef"),
            st.tuples(st.text("xy▇界", max_size=6), st.text("z", max_size=3)),
            max_size=6,
        ),
        min_size=1,
        max_size=8,
    )
)
def test_column_widths_always_fit_the_widest_cell_shown(
    snapshots: list[dict[str, tuple[str, str]]],
) -> None:
    """A column is as wide as its widest cell shown, or wider only by a value that shrank
    since its row came (a changed value does not narrow it; rows going do)."""
    t = LiveTable(("c1", "c2"))  # widths are kept as rows come and go, measured once per cell
    widest_since: dict[str, list[int]] = {}
    for rows in snapshots:
        t.sync(rows)
        widest_since = {
            k: [max(w, cell_len(c)) for w, c in zip(widest_since.get(k, [0, 0]), r, strict=True)]
            for k, r in rows.items()
        }
        for i, name in enumerate(("c1", "c2")):
            widest = max([cell_len(name)] + [cell_len(r[i]) for r in rows.values()])
            kept = max([cell_len(name)] + [w[i] for w in widest_since.values()])
            assert widest <= t.column_width(name) <= kept
        assert t.row_keys() == list(rows)


async def test_the_cursor_scrolls_into_view_and_the_header_stays() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)) as pilot:
        t = app.query_one(LiveTable)
        t.sync({f"h{i:02}": (f"h{i:02}", "up", str(i)) for i in range(50)})
        await pilot.pause()
        await pilot.press("end")
        assert t.selected == "h49"
        lines = shown(t)
        assert lines[0].startswith(" name") and lines[-1].startswith(" h49")
        await pilot.press("home", "down", "down", "pagedown")
        assert t.cursor_row == 2 + t.size.height - 2
        assert shown(t)[0].startswith(" name")
        assert t.selected in " ".join(shown(t))
        cursor = t.render_line(1 + t.cursor_row - int(t.scroll_y))
        other = t.render_line(1 + t.cursor_row - int(t.scroll_y) - 1)
        assert cursor.text.startswith(f" {t.selected}")
        assert {s.style for s in cursor} != {s.style for s in other}, "the cursor row stands out"


async def test_enter_and_a_click_on_the_cursor_row_select_it() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)) as pilot:
        t = app.query_one(LiveTable)
        t.sync({"a": ("a", "up", "1"), "b": ("b", "up", "2"), "c": ("c", "up", "3")})
        await pilot.pause()
        await pilot.press("down", "enter")
        await pilot.click(LiveTable, offset=(2, 3))  # the row of c: the cursor moves
        assert t.selected == "c"
        await pilot.click(LiveTable, offset=(2, 3))  # again: opens it
        await pilot.click(LiveTable, offset=(2, 0))  # the header: nothing
        await pilot.pause()
        assert app.selected == ["b", "c"]


async def test_a_sync_before_the_table_is_mounted_is_shown_once_it_is() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)):
        early = LiveTable(("a", "b"))  # composed but not mounted yet
        assert early.sync({"x": ("1", "2")}) == 2
        await app.mount(early)
        assert early.row_keys() == ["x"]
        assert early.sync({"x": ("1", "2")}) == 0


def test_cells_render_progress_and_ages() -> None:
    assert progress_bar(50, 200, width=4) == "█░░░  50/200  25%", "as wide as at 200/200"
    assert progress_bar(0, 0, width=2).startswith("░░ 0/0")
    assert age(3.25) == "3.2s"
    assert age(300) == "5m"
    assert age(None) == "-"


def test_a_sparkline_shows_the_last_values_scaled_with_gaps_for_unknowns() -> None:
    from collections import deque

    values = deque([100.0, 0.0, 50.0, None, math.nan, 1e9, -5.0, math.inf], maxlen=8)
    assert spark(values, width=7) == "▁▅  █▁█"
    assert spark(values, width=20) == "█▁▅  █▁█"
    assert spark([], width=4) == ""
    assert spark([3.0], top=0.0) == "▁"


def test_a_newer_progress_event_replaces_a_queued_one_for_the_same_job() -> None:
    from console.records.journal import Event, Kind
    from console.ui.messages import JournalEvent

    def msg(kind: Kind, job: str) -> JournalEvent:
        return JournalEvent(Event(t=0.0, kind=kind, job=job))

    assert msg(Kind.PROGRESS, "j").can_replace(msg(Kind.PROGRESS, "j"))
    assert not msg(Kind.PROGRESS, "j").can_replace(msg(Kind.PROGRESS, "k"))
    assert not msg(Kind.ALERT, "j").can_replace(msg(Kind.ALERT, "j"))


async def test_a_redraw_tick_while_the_app_shuts_down_is_ignored(tmp_path: Path) -> None:
    from support.uibed import fixed_app

    app = fixed_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = asyncio.get_running_loop().time() + 30
        while app.redraws == 0:  # the ticks do draw while the app runs
            assert asyncio.get_running_loop().time() < deadline, "no redraw while running"
            await pilot.pause(0.05)
    drawn = app.redraws
    app.redraw()  # no screen left on the stack: nothing to do, and no ScreenStackError
    assert app.redraws == drawn, "a tick after the end draws nothing"
