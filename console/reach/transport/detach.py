"""A command line that starts a process detached: own session, no stdin, output to a log, pid out.

Arguments travel as positional parameters of ``sh -c``, never spliced into the script, so
no value can inject shell; ssh joins the result with ``shlex.join``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_SCRIPT = 'cd "$1" || exit 97; log=$2; shift 2; setsid "$@" </dev/null >>"$log" 2>&1 & echo $!'


def detach_argv(
    argv: Sequence[str],
    *,
    log_path: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> list[str]:
    for key in env or {}:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"not an environment variable name: {key!r}")
    envs = [f"{k}={v}" for k, v in (env or {}).items()]
    command = ["env", *envs, *argv] if envs else list(argv)
    return ["sh", "-c", _SCRIPT, "sh", cwd or "/", log_path, *command]
