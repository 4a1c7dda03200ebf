"""The current screen's keys on one line, k9s style.

Textual's Footer builds one widget per key and rebuilds them all whenever a screen's
bindings change, which includes every view switch; at a thousand hosts that CSS work was
a third of the time from pressing ``1`` to seeing the Fleet view. This bar is one widget
that renders the bindings as a line of text.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget

PINNED = frozenset({"app.help", "app.quit"})
"""Keys shown however narrow the terminal (at the bar's right end): what the keys are, and
how to leave."""
DIM = Style(dim=True)
"""A key the screen has but may not take now (its check_action says no): drawn dim."""


@runtime_checkable
class KeyFilter(Protocol):
    """An app that keeps some bound keys off the bar (a read-only console's actions)."""

    def key_shown(self, binding: Binding) -> bool: ...


class KeyBar(Widget):
    """Key and description of every shown binding, in the order Textual resolves them."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"key-bar--key", "key-bar--description"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        color: $footer-foreground;
        & > .key-bar--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        & > .key-bar--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
    }
    """

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        if self.is_attached and screen is self.screen:
            self.refresh()

    def render(self) -> Text:
        """The screen's keys from the left, the pinned ones (``PINNED``) at the right end; keys
        that do not fit between them are cut whole, with ``…`` where they were."""
        keys: list[Text] = []
        pinned: list[Text] = []
        actions: set[str] = set()
        app = self.app
        for _node, binding, enabled, _tip in self.screen.active_bindings.values():
            if not binding.show or binding.action in actions:
                continue
            if isinstance(app, KeyFilter) and not app.key_shown(binding):
                continue
            actions.add(binding.action)
            (pinned if binding.id in PINNED else keys).append(self._key(binding, enabled))
        tail = Text(end="").join(pinned)
        room = self.size.width - tail.cell_len if self.size.width else None
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if room is not None and line.cell_len + key.cell_len + (0 if last else 2) > room:
                line.append(" …", self.get_component_rich_style("key-bar--description"))
                break
            line.append_text(key)
        if room is not None:
            line.pad_right(max(0, room - line.cell_len))
        line.append_text(tail)
        return line

    def _key(self, binding: Binding, enabled: bool) -> Text:
        key_style = self.get_component_rich_style("key-bar--key")
        text_style = self.get_component_rich_style("key-bar--description")
        text = Text(end="")
        text.append(f" {self.app.get_key_display(binding)} ", key_style)
        text.append(f"{binding.description} ", text_style if enabled else text_style + DIM)
        return text
