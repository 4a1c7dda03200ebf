"""An operator action that would change nothing, or may not be done now, is refused: said in
the views and journalled as refused (``data["refused"]``), never as done."""

from __future__ import annotations

from protocol.errors import HotspareError


class Refused(HotspareError, ValueError):
    """Permanent for this target as it stands now; ``str`` is the one-line reason."""

    permanent = True


__all__ = ["Refused"]
