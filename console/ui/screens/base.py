"""What every live screen shares (redrawn from the controller, actions), and the list views.

A list view (Fleet, Jobs, Incidents) is one live table with the conventions operators know
from k9s: `/` filters, Space tags rows so one action applies to all of them, Enter drills
down, Esc goes back (or clears the filter and the tags).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Header, Input, Static

from console.ui.actions import Action
from console.ui.view import TAG_MARK, Row, filtered, sorted_rows, tagged
from console.ui.widgets.key_bar import KeyBar
from console.ui.widgets.live_table import LiveTable

if TYPE_CHECKING:
    from console.controller import Controller
    from console.ui.app import HotspareApp


FRESH_S = 0.1
"""A screen drawn this recently is not drawn again when it is shown."""


class LiveScreen(Screen[None]):
    """A screen the app redraws at a fixed rate from the controller's state."""

    TITLE_TEXT = ""
    NOUN = "row"
    """What a row is, in messages: host, job, incident."""

    @property
    def hotspare(self) -> HotspareApp:
        return cast("HotspareApp", self.app)

    @property
    def ctl(self) -> Controller:
        return self.hotspare.ctl

    ready = False
    """Composed and mounted: the app's redraw timer may call ``redraw`` (not before)."""

    drawn_at = -math.inf
    """When ``draw`` last ran (monotonic seconds)."""

    def on_mount(self) -> None:
        self.ready = True
        self.draw()

    def on_screen_resume(self) -> None:
        if time.monotonic() - self.drawn_at > FRESH_S:  # not just drawn by the app's switch
            self.draw()

    def draw(self) -> None:
        """Redraw from the controller's state now."""
        self.redraw()
        self.drawn_at = time.monotonic()

    def redraw(self) -> None:
        raise NotImplementedError

    def act(self, what: str, do: Callable[[], object], *, confirm: str | None = None) -> None:
        self.hotspare.act(what, do, confirm=confirm)

    def perform(self, action: Action, keys: list[str]) -> None:
        if keys:
            self.hotspare.perform(action, keys, self.NOUN)


class ViewScreen(LiveScreen):
    """One live table with filter, tags and drill-down."""

    LABEL = ""
    """Its name in the view bar (``1 Fleet  2 Jobs  3 Incidents``)."""
    NOTE = ""
    """Said after the view bar: how the rows are ordered, say."""
    COLUMNS: tuple[str, ...] = ()
    WIDTHS: ClassVar[dict[str, int]] = {}
    """Room kept for a column's usual values (``LiveTable``'s ``min_widths``)."""
    NARROW_COLUMNS: tuple[str, ...] = ()
    """The columns shown below ``NARROW_BELOW`` terminal columns (empty: all of them)."""
    NARROW_BELOW = 100
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "filter", id="view.filter"),
        Binding("space", "tag", "tag row", id="view.tag", show=False),
        Binding("escape", "clear", "clear filter/tags", id="view.clear", show=False),
        Binding(
            "greater_than_sign",
            "sort(1)",
            "sort",
            tooltip="sort by the next column",
            id="view.sort",
        ),
        Binding(
            "less_than_sign",
            "sort(-1)",
            "sort by the column before",
            id="view.sort_back",
            show=False,
        ),
        Binding("I", "sort_reverse", "reverse the sort", id="view.sort_reverse", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.filter_text = ""
        self.tags: set[str] = set()
        self.sort_by: str | None = None
        """The column the rows are sorted by (within their group); None: the view's order."""
        self.sort_reverse = False
        self._cursor_placed = False
        """The cursor has been put on the first item (not a group header) once."""

    @property
    def table(self) -> LiveTable:
        return self.query_one(LiveTable)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(self.view_bar(), classes="view-title", markup=False)
        yield Static("", classes="hint", markup=False)
        yield LiveTable(self.COLUMNS, min_widths=self.WIDTHS)
        yield Input(
            placeholder="filter: any text in a row; Enter keeps it, Esc clears", id="filter"
        )
        yield Static("", classes="last-event", markup=False)
        yield KeyBar()

    def rows(self) -> dict[str, Row]:
        raise NotImplementedError

    def is_item(self, key: str) -> bool:
        """Whether a row is something to act on (not a group header)."""
        return True

    def marks(self, keys: Iterable[str]) -> dict[str, str]:
        """Rows to colour, and how (``LiveTable.MARKS``): a host down, say."""
        return {}

    def hint(self) -> str:
        """One line under the title for a newcomer (what to press, what to watch); '' hides it."""
        return ""

    def redraw(self) -> None:
        rows = filtered(self.rows(), self.filter_text, self.is_item)
        if self.sort_by is not None:
            column = self.COLUMNS.index(self.sort_by)
            rows = sorted_rows(rows, column, self.sort_reverse, self.is_item)
        self.tags &= set(rows)
        table = self.table
        table.show_columns(self.columns_for(self.size.width))
        table.show_sort(self.sort_by, self.sort_reverse)
        table.sync(tagged(rows, self.tags), self.marks(rows))
        if not self._cursor_placed and (first := next(filter(self.is_item, rows), None)):
            self._cursor_placed = True  # opened on the first host, not its region's header
            table.move_cursor(row=table.get_row_index(first))
        hint = self.hint()
        box = self.query_one(".hint", Static)
        box.display = bool(hint)
        box.update(hint)
        self.query_one(".view-title", Static).update(self.view_bar())
        self.query_one(".last-event", Static).update(self.hotspare.last_event)

    def columns_for(self, width: int) -> tuple[str, ...] | None:
        """The columns a terminal ``width`` wide shows: the chosen few when narrow, else all."""
        narrow = self.NARROW_COLUMNS and 0 < width < self.NARROW_BELOW
        return self.NARROW_COLUMNS if narrow else None

    def on_resize(self) -> None:
        if self.ready:
            self.table.show_columns(self.columns_for(self.size.width))

    def view_bar(self) -> Text:
        """``1 Fleet  2 Jobs  3 Incidents``, this view marked, then its filter and tags.

        The filter is the operator's text: appended as text, never read as markup."""
        bar = Text(no_wrap=True, overflow="ellipsis", end="")
        for key, label, shown in self.hotspare.view_keys():
            bar.append(f" {key} {label} ", "reverse bold" if shown is self else "")
        notes = [self.NOTE] if self.NOTE else []
        if self.filter_text:
            notes.append(f"/{self.filter_text}")
        if self.tags:
            notes.append(f"{TAG_MARK} {len(self.tags)} tagged (Esc clears)")
        if self.sort_by is not None:
            notes.append(f"sorted by {self.sort_by} {'▼' if self.sort_reverse else '▲'}")
        if notes:
            bar.append("   " + "   ".join(notes))
        return bar

    # ---------------------------------------------------------------- sorting

    def action_sort(self, step: int) -> None:
        """``>``: sort by the next column shown (``<``: the one before); past the last, back to
        the view's own order. The cursor stays on its row."""
        order: list[str | None] = [None, *self.table.columns_shown]
        at = order.index(self.sort_by) if self.sort_by in order else 0
        self.sort_by = order[(at + step) % len(order)]
        self.redraw()

    def action_sort_reverse(self) -> None:
        """``I`` (as in htop): the other way round, sorting by the first column if none."""
        if self.sort_by is None:
            self.sort_by = self.table.columns_shown[0]
        else:
            self.sort_reverse = not self.sort_reverse
        self.redraw()

    # ---------------------------------------------------------------- selection

    def selected(self) -> list[str]:
        """The tagged rows, else the row under the cursor; empty (with a note) if none."""
        if self.tags:
            return [k for k in self.table.row_keys() if k in self.tags]
        key = self.table.selected
        if key is None or not self.is_item(key):
            self.notify(f"select a {self.NOUN} first", severity="warning", markup=False)
            return []
        return [key]

    def one(self) -> str | None:
        """The single row an action needs: the cursor row (tags are ignored)."""
        key = self.table.selected
        if key is None or not self.is_item(key):
            self.notify(f"select a {self.NOUN} first", severity="warning", markup=False)
            return None
        return key

    def action_tag(self) -> None:
        key = self.table.selected
        if key is None or not self.is_item(key):
            return
        self.tags ^= {key}
        self.redraw()
        table = self.table
        table.action_cursor_down()
        if (below := table.selected) is not None and not self.is_item(below):
            table.action_cursor_down()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.filter_text = event.value.strip()
            self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            event.input.display = bool(self.filter_text)
            self.table.focus()

    def action_clear(self) -> None:
        box = self.query_one("#filter", Input)
        if self.filter_text or box.display:
            box.value = ""
            box.display = False
            self.filter_text = ""
        else:
            self.tags.clear()
        self.table.focus()
        self.redraw()

    def on_live_table_row_selected(self, event: LiveTable.RowSelected) -> None:
        if self.is_item(event.key):
            self.open(event.key)

    def open(self, key: str) -> None:
        """Enter on a row: drill down."""

    def action_open(self) -> None:
        if key := self.one():
            self.open(key)
