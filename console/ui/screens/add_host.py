"""Add a host: a small form; the host is appended to inventory.toml (comments kept)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select

FIELDS = (
    ("name", "host name, e.g. gpu-9 (required)"),
    ("address", "ssh: address, or name in ~/.ssh/config (required for ssh)"),
    ("user", "ssh: user (optional)"),
    ("root", "root folder for its jobs: local path, or a path on the ssh host (required)"),
)
"""Each field and its placeholder, which says whether the inventory's loader requires it."""


def host_table(values: dict[str, str], region: str, transport: str, role: str) -> dict[str, Any]:
    """The ``[hosts.NAME]`` table for the form's values (empty fields left out)."""
    table: dict[str, Any] = {"region": region, "transport": transport, "role": role}
    for key in ("address", "user", "root"):
        if values.get(key):
            table[key] = values[key]
    return table


class AddHostScreen(ModalScreen[tuple[str, dict[str, Any]] | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel", id="add_host.cancel")]

    def __init__(self, regions: list[str]) -> None:
        super().__init__()
        self.regions = regions

    def compose(self) -> ComposeResult:
        with Vertical(id="add-host"):
            yield Label("[b]Add a host[/b] (appended to the inventory, comments kept)")
            for key, hint in FIELDS:
                yield Input(placeholder=hint, id=f"host-{key}")
            with Horizontal(classes="selects"):
                yield Select(
                    [(r, r) for r in self.regions], value=self.regions[0], id="host-region"
                )
                yield Select(
                    [("local", "local"), ("ssh", "ssh")], value="local", id="host-transport"
                )
                yield Select(
                    [("spare", "spare"), ("primary", "primary")], value="spare", id="host-role"
                )
            yield Label("", id="add-host-error", classes="error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Add", variant="primary", id="add")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#host-name", Input).focus()

    def on_input_submitted(self) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "add":
            self._submit()
        else:
            self.dismiss(None)

    def _submit(self) -> None:
        values = {key: self.query_one(f"#host-{key}", Input).value.strip() for key, _ in FIELDS}
        transport = str(self.query_one("#host-transport", Select).value)
        error = ""
        if not values["name"]:
            error = "a host needs a name"
        elif transport == "ssh" and not values["address"]:
            error = "an ssh host needs an address"
        elif not values["root"]:
            error = (
                f"a host needs a root folder ({'on the host' if transport == 'ssh' else 'here'})"
            )
        if error:
            self.query_one("#add-host-error", Label).update(error)
            return
        table = host_table(
            values,
            str(self.query_one("#host-region", Select).value),
            transport,
            str(self.query_one("#host-role", Select).value),
        )
        self.dismiss((values["name"], table))

    def action_cancel(self) -> None:
        self.dismiss(None)
