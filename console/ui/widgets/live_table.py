"""A table of plain-text rows, fed whole snapshots, that redraws only what changed.

Textual's DataTable was the console's cost at a thousand hosts: any cell written (and any
screen switch, which re-applies CSS) dropped its whole cache of rendered cells, so a redraw
or a view switch re-rendered every visible cell through Rich. This table is a line-API
``ScrollView``: cells are plain strings (no markup, so a host called ``[red]x`` shows as
written), a line is a handful of segments built on demand, and a sync refreshes only the
lines whose text changed. The header stays on the first line while the rows scroll.

A column widens as its cells do and narrows only as rows go, never as a value shrinks back
(``9.5s``, ``12s``, ``9.8s``): the columns to its right do not shift with every redraw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

PAD = 1
"""Blank cells either side of each cell's text."""


class LiveTable(ScrollView, can_focus=True):
    """Rows keyed by a domain name (host, job); ``sync`` diffs against what is shown."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select", "select", show=False),
        Binding("up,k", "cursor_up", "up", show=False),
        Binding("down,j", "cursor_down", "down", show=False),
        Binding("pageup", "page_up", "page up", show=False),
        Binding("pagedown", "page_down", "page down", show=False),
        Binding("home", "first", "first row", show=False),
        Binding("end", "last", "last row", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "live-table--header",
        "live-table--cursor",
        "live-table--odd-row",
        "live-table--even-row",
        "live-table--error",
        "live-table--warning",
        "live-table--attention",
        "live-table--muted",
        "live-table--success",
    }
    DEFAULT_CSS = """
    LiveTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        &:focus {
            background-tint: $foreground 5%;
            & > .live-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
        & > .live-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .live-table--even-row {
            background: $surface-lighten-1 50%;
        }
        &:dark > .live-table--even-row {
            background: $surface-darken-1 40%;
        }
        & > .live-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        & > .live-table--error {
            color: $text-error;
        }
        & > .live-table--warning {
            color: $text-warning;
        }
        & > .live-table--attention {
            color: $text-primary;
            text-style: bold;
        }
        & > .live-table--muted {
            text-style: dim;
        }
        & > .live-table--success {
            color: $text-success;
        }
    }
    """
    MARKS = ("error", "warning", "attention", "muted", "success")
    """What a row may be marked as (``sync``'s ``marks``): its text is coloured so (attention:
    bold too, the operator's turn)."""

    class RowSelected(Message):
        """Enter (or a click on the cursor row) on a row."""

        def __init__(self, table: LiveTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> LiveTable:
            return self.table

    def __init__(
        self,
        columns: Sequence[str],
        *,
        min_widths: Mapping[str, int] | None = None,
        **kwargs: object,
    ) -> None:
        """``min_widths``: room kept from the start for a column's usual values, so the
        table does not shift right as a number grows a digit."""
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._column_names = tuple(columns)
        self._header = self._column_names
        """The names as drawn: the sorted column's carries an arrow (``show_sort``)."""
        self._base_min = [max(cell_len(n), (min_widths or {}).get(n, 0)) for n in columns]
        self._min = list(self._base_min)
        self._shown: dict[str, tuple[str, ...]] = {}
        self._marks: dict[str, str] = {}
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._widths = list(self._min)
        self._cell_widths: dict[str, list[int]] = {}
        """Each row's cell widths, so a column is measured again only where it may narrow."""
        self._refit: set[int] = set()
        self._widened = False
        """Widths changed since the last layout (wider or narrower)."""
        self._visible = tuple(range(len(self._column_names)))
        """The columns drawn (``show_columns``), by index."""
        self.cursor_row = 0
        self.virtual_size = Size(self._total_width(), 1)

    # ------------------------------------------------------------------ data

    def mark(self, key: str) -> str | None:
        """What a row is marked as (one of ``MARKS``), if anything."""
        return self._marks.get(key)

    def sync(
        self, rows: Mapping[str, tuple[str, ...]], marks: Mapping[str, str] | None = None
    ) -> int:
        """Show ``rows`` (in their order), those in ``marks`` coloured as marked there;
        returns how many cells changed."""
        written = 0
        keys = list(rows)
        reordered = keys != self._keys
        changed: list[int] = []
        marks = {k: m for k, m in (marks or {}).items() if k in rows}
        if marks != self._marks:
            for key in marks.keys() | self._marks.keys():
                if marks.get(key) != self._marks.get(key) and key in self._index:
                    changed.append(self._index[key])
            self._marks = marks
        widths = self._widths
        for index, (key, row) in enumerate(rows.items()):
            before = self._shown.get(key)
            if before == row:
                continue
            cells = self._cell_widths.get(key)
            if before is None or cells is None:
                written += len(row)
                cells = [cell_len(text) for text in row]
            else:
                changed.append(index)
                for i, (old, new) in enumerate(zip(before, row, strict=True)):
                    if old != new:  # a column narrows only as rows go: no shifting back
                        written += 1
                        cells[i] = cell_len(new)
            for i, width in enumerate(cells):
                if width > widths[i]:
                    widths[i] = width
                    self._widened = True
            self._shown[key] = row
            self._cell_widths[key] = cells
        if reordered:
            selected = self.selected
            gone = [k for k in self._shown if k not in rows]
            for key in gone:
                del self._cell_widths[key], self._shown[key]
            if gone:  # every column: one may be wider than any cell left, its value shrunk
                self._refit.update(range(len(widths)))
            self._keys = keys
            self._index = {key: i for i, key in enumerate(keys)}
            if selected in self._index:
                self.cursor_row = self._index[selected]
            self.cursor_row = max(0, min(self.cursor_row, len(keys) - 1))
        self._fit_columns()
        if reordered or self._widened:
            self._widened = False
            self.virtual_size = Size(self._total_width(), len(self._keys) + 1)
            self.refresh()
        else:
            top = int(self.scroll_y)
            bottom = top + self.size.height
            for index in changed:
                if top <= index < bottom:
                    self.refresh_line(index + 1)
        return written

    def _fit_columns(self) -> None:
        """Columns whose widest cell may have narrowed: measured again over every row."""
        for i in self._refit:
            width = max(
                max((cells[i] for cells in self._cell_widths.values()), default=0),
                self._min[i],
            )
            if width != self._widths[i]:
                self._widths[i] = width
                self._widened = True
        self._refit.clear()

    def show_sort(self, column: str | None, reverse: bool = False) -> None:
        """Mark the column the rows are sorted by in the header (``▲`` ascending, ``▼``)."""
        arrow = " ▼" if reverse else " ▲"
        header = tuple(n + arrow if n == column else n for n in self._column_names)
        if header == self._header:
            return
        self._header = header
        self._min = [max(m, cell_len(h)) for m, h in zip(self._base_min, header, strict=True)]
        self._refit.update(range(len(header)))
        self._widths = [max(w, m) for w, m in zip(self._widths, self._min, strict=True)]
        self._fit_columns()
        self.virtual_size = Size(self._total_width(), len(self._keys) + 1)
        self.refresh()

    def show_columns(self, columns: Sequence[str] | None) -> None:
        """Draw only ``columns`` (in the table's order; None: all). The rest are still kept,
        filtered on and read by ``cell``; a narrow terminal shows a chosen few."""
        names = self._column_names
        visible = tuple(i for i, name in enumerate(names) if columns is None or name in columns)
        if visible != self._visible:
            self._visible = visible
            self.virtual_size = Size(self._total_width(), len(self._keys) + 1)
            self.refresh()

    @property
    def columns_shown(self) -> tuple[str, ...]:
        return tuple(self._column_names[i] for i in self._visible)

    def _total_width(self) -> int:
        return sum(self._widths[i] + 2 * PAD for i in self._visible)

    def clear(self) -> None:
        self.sync({})

    def cell(self, key: str, column: str) -> str:
        """The text shown in one cell."""
        return self._shown[key][self._column_names.index(column)]

    def column_width(self, column: str) -> int:
        """The width of a column's text (without padding)."""
        return self._widths[self._column_names.index(column)]

    def row_keys(self) -> list[str]:
        """The row keys shown, in order."""
        return list(self._keys)

    @property
    def row_count(self) -> int:
        return len(self._keys)

    def get_row_index(self, key: str) -> int:
        return self._index[key]

    @property
    def selected(self) -> str | None:
        """The row key under the cursor, if any."""
        return self._keys[self.cursor_row] if self._keys else None

    # ---------------------------------------------------------------- cursor

    def move_cursor(self, *, row: int) -> None:
        """Put the cursor on ``row`` (clamped) and scroll it into view."""
        old = self.cursor_row
        self.cursor_row = max(0, min(row, len(self._keys) - 1))
        if self.cursor_row == old:
            return
        rows_shown = max(1, self.size.height - 1)
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + rows_shown:
            self.scroll_to(y=self.cursor_row - rows_shown + 1, animate=False, immediate=True)
        self.refresh_line(old + 1)
        self.refresh_line(self.cursor_row + 1)

    def action_cursor_up(self) -> None:
        self.move_cursor(row=self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(row=self.cursor_row + 1)

    def action_page_up(self) -> None:
        self.move_cursor(row=self.cursor_row - max(1, self.size.height - 2))

    def action_page_down(self) -> None:
        self.move_cursor(row=self.cursor_row + max(1, self.size.height - 2))

    def action_first(self) -> None:
        self.move_cursor(row=0)

    def action_last(self) -> None:
        self.move_cursor(row=len(self._keys) - 1)

    def action_select(self) -> None:
        if (key := self.selected) is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        row = offset.y - 1 + int(self.scroll_y)
        if row >= len(self._keys):
            return
        if row == self.cursor_row:
            self.action_select()
        else:
            self.move_cursor(row=row)

    # ---------------------------------------------------------------- render

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            line = self._line(self._header, base + self._style("live-table--header"))
        else:
            index = y - 1 + int(self.scroll_y)
            if index >= len(self._keys):
                return Strip.blank(width, base)
            if index == self.cursor_row and self._keys:
                part = "live-table--cursor"
            else:
                part = "live-table--odd-row" if index % 2 else "live-table--even-row"
            key = self._keys[index]
            style = base + self._style(part)
            if (mark := self._marks.get(key)) and part != "live-table--cursor":
                style += self.get_component_rich_style(f"live-table--{mark}", partial=True)
            line = self._line(self._shown[key], style)
        scroll_x = int(self.scroll_x)
        return line.crop_extend(scroll_x, scroll_x + width, base)

    def _style(self, part: str) -> Style:
        return self.get_component_rich_style(part)

    def _line(self, cells: Sequence[str], style: Style) -> Strip:
        pad = " " * PAD
        widths = self._widths
        return Strip(
            [Segment(pad + set_cell_size(cells[i], widths[i]) + pad, style) for i in self._visible],
            self._total_width(),
        )
