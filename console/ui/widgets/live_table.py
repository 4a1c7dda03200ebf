"""A DataTable fed whole snapshots that touches only the cells that changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual.widgets import DataTable


class LiveTable(DataTable[str]):
    """Rows keyed by a domain name (host, job); ``sync`` diffs against what is shown."""

    def __init__(self, columns: Sequence[str], **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._column_names = tuple(columns)
        self._shown: dict[str, tuple[str, ...]] = {}

    def on_mount(self) -> None:
        for name in self._column_names:
            self.add_column(name, key=name)

    def sync(self, rows: Mapping[str, tuple[str, ...]]) -> int:
        """Show exactly ``rows`` (in their order); returns how many cells were written."""
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
        for key, row in rows.items():
            before = self._shown.get(key)
            if before is None:
                self.add_row(*row, key=key)
                written += len(row)
            else:
                for column, old, new in zip(self._column_names, before, row, strict=True):
                    if old != new:
                        self.update_cell(key, column, new, update_width=True)
                        written += 1
            self._shown[key] = row
        return written

    def cell(self, key: str, column: str) -> str:
        """The text shown in one cell (for tests and the help of actions)."""
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
