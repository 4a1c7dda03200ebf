"""A key the screen has but may not take now (check_action says None) is drawn dim on the key bar, not a crash: the bar
added the string "dim" to a rich Style (found by mypy), which raises as soon as a shown
binding is disabled."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding

from console.ui.widgets.key_bar import KeyBar


class Bar(App[None]):
    BINDINGS = [
        Binding("x", "nothing_now", "Not now"),
        Binding("y", "fine", "Fine"),
    ]

    def compose(self) -> ComposeResult:
        yield KeyBar()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return None if action == "nothing_now" else True  # None: shown, disabled

    def action_fine(self) -> None:
        pass


async def test_a_disabled_key_is_drawn_dim() -> None:
    app = Bar()
    async with app.run_test(size=(80, 5)) as pilot:
        await pilot.pause()
        bar = app.query_one(KeyBar)
        line = bar.render()
        assert "Not now" in line.plain and "Fine" in line.plain
        dim = [s for s in line.spans if s.style and getattr(s.style, "dim", False)]
        assert [line.plain[s.start : s.end] for s in dim] == ["Not now "]
