"""Messages from the controller to the app."""

from __future__ import annotations

from textual.message import Message

from console.records.journal import Event, Kind

COALESCED = frozenset({Kind.PROGRESS, Kind.REPLICA})
"""Kinds where only the newest event for a job matters to the view."""


class JournalEvent(Message):
    """One journal event; a newer progress or replica event for a job replaces a queued one."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event

    def can_replace(self, message: Message) -> bool:
        return (
            isinstance(message, JournalEvent)
            and self.event.kind in COALESCED
            and message.event.kind is self.event.kind
            and message.event.job == self.event.job
        )
