"""Errors shared by both ends of the wire, and the root of every error hotspare raises.

Every error hotspare raises on purpose derives from ``HotspareError`` and says whether trying
the same thing again can succeed (``permanent``): a caller retries a temporary one (a dropped
connection, a full disk, a lost lead) and reports a permanent one at once (a bad config, a
refused order, a corrupt checkpoint). ``tests/protocol/test_errors.py`` checks that every
error class of the packages derives from it and says which it is.
"""

from __future__ import annotations

from typing import ClassVar


class HotspareError(Exception):
    """An error hotspare raised on purpose; ``str()`` is one line, fit to show as is."""

    permanent: ClassVar[bool]
    """True: the same attempt cannot succeed (report it); False: it may (retry it). Every
    subclass says which (no default here: one that forgot is caught by a test)."""


def retryable(error: BaseException) -> bool:
    """Whether trying again may succeed: a temporary ``HotspareError``."""
    return isinstance(error, HotspareError) and not error.permanent


class ProtocolError(HotspareError):
    """A peer sent bytes that are not a valid frame or message; the connection must close.

    The message says what was wrong in one line, so it can be logged and shown as is.
    """

    permanent = True


class ConfigError(HotspareError):
    """A configuration file (job spec, inventory) is invalid; permanent, never retried.

    ``str(err)`` is one line naming the file, the key path and, where known, the line.
    """

    permanent = True
