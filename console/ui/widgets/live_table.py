"""A DataTable fed whole snapshots that touches only the cells that changed.

At a thousand rows the costs that matter are DataTable's: every cell written drops its cache
of rendered lines, and ``update_width=True`` re-measures the whole column for each narrower
cell. So cells are plain ``Text`` (no markup parsing, and a host called ``[red]x`` shows as
written), only rows in or near the viewport are written (the others catch up when they
scroll into view), and column widths are set once per sync from the plain strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

VISIBLE_MARGIN = 20
"""Rows written beyond the viewport, above and below."""


class LiveTable(DataTable[Text]):
    """Rows keyed by a domain name (host, job); ``sync`` diffs against what is shown."""

    def __init__(self, columns: Sequence[str], **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._column_names = tuple(columns)
        self._shown: dict[str, tuple[str, ...]] = {}
        self._widths = [cell_len(name) for name in columns]

    def on_mount(self) -> None:
        for name in self._column_names:
            self.add_column(name, key=name)

    def sync(self, rows: Mapping[str, tuple[str, ...]]) -> int:
        """Show ``rows`` (in their order); returns how many cells were written."""
        if not self.ordered_columns:  # not mounted yet: a redraw can come before on_mount
            return 0
        written = 0
        keys = list(rows)
        if keys != list(self._shown):
            kept = [k for k in self._shown if k in rows]
            if keys[: len(kept)] != kept:
                self.clear()
                self._shown.clear()
            for key in [k for k in self._shown if k not in rows]:
                self.remove_row(key)
                del self._shown[key]
        top = int(self.scroll_y) - VISIBLE_MARGIN
        bottom = int(self.scroll_y) + self.size.height + VISIBLE_MARGIN
        for index, (key, row) in enumerate(rows.items()):
            before = self._shown.get(key)
            if before is None:
                self.add_row(*(Text(cell) for cell in row), key=key)
                written += len(row)
            elif not top <= index <= bottom:
                continue
            else:
                for column, old, new in zip(self._column_names, before, row, strict=True):
                    if old != new:
                        self.update_cell(key, column, Text(new))
                        written += 1
            self._shown[key] = row
        if written:
            self._fit_columns()
        return written

    def _fit_columns(self) -> None:
        for i, name in enumerate(self._column_names):
            width = max(
                max((cell_len(r[i]) for r in self._shown.values()), default=0), cell_len(name)
            )
            if width != self._widths[i]:
                self._widths[i] = width
                self.columns[ColumnKey(name)].content_width = width
                self._require_update_dimensions = True

    def cell(self, key: str, column: str) -> str:
        """The text last written to one cell (for tests and the help of actions)."""
        return self._shown[key][self._column_names.index(column)]

    def row_keys(self) -> list[str]:
        """The row keys shown, in order."""
        return list(self._shown)

    @property
    def selected(self) -> str | None:
        """The row key under the cursor, if any."""
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value
