"""Programs the console runs on a host with the host's own interpreter (``python -c SOURCE
ARGS...``, each argument one argv entry, never spliced into a shell or into the source).

Each is a real module: the standard library only, linted, type-checked and unit-tested here
as any other module, and shipped by its own source text (``source``). ``console/reach/remote.py``
is the Python API that runs them and reads their answers. The workdir's file names they use
are ``executors/agent/workdir.py``'s (a test keeps the two in step: the console never imports the
executor's package)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def source(*modules: ModuleType) -> str:
    """The program made of these modules' source, in order (a later one may use what an
    earlier one defined: see the guarded imports in ``promote``)."""
    return "\n".join(Path(m.__file__ or "").read_text(encoding="utf-8") for m in modules)
