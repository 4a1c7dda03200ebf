"""Errors shared by both ends of the wire."""

from __future__ import annotations


class ProtocolError(Exception):
    """A peer sent bytes that are not a valid frame or message; the connection must close.

    The message says what was wrong in one line, so it can be logged and shown as is.
    """


class ConfigError(Exception):
    """A configuration file (job spec, inventory) is invalid; permanent, never retried.

    ``str(err)`` is one line naming the file, the key path and, where known, the line.
    """
