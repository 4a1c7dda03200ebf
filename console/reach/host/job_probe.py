"""The job probe of ``hotspare check``: is a ``command``-kind job's code and data on this host?
Run on the host as ``python -c SOURCE ORDER``, ``ORDER`` one JSON argument (``timeout`` and the
``jobs``: each its ``job``, ``cwd``, ``check_cwd``, ``argv``, ``env``, ``needs``,
``imports``), never shell text; prints one JSON line, ``{"problems": [[job, key, what],
...]}``. It only looks: nothing is created, and a module is found with
``importlib.util.find_spec`` on its top-level package, by the job's own interpreter in a
process of its own (``FIND``), never imported. Argv elements and ``needs`` entries holding a
placeholder (``{``) are not looked for. The standard library only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

FIND = (
    "import importlib.util, json, sys\n"
    "sys.path[0] = sys.argv[1]\n"
    "out = {}\n"
    "for name in sys.argv[2:]:\n"
    "    try:\n"
    "        out[name] = importlib.util.find_spec(name) is not None\n"
    "    except Exception as e:\n"
    "        out[name] = '%s: %s' % (type(e).__name__, e)\n"
    "print(json.dumps(out))\n"
)
"""Run by the job's interpreter (``FIND PATH0 NAME...``): each name found, not, or why not."""


def python_target(argv: list[str]) -> tuple[int, str] | tuple[int, str, str] | None:
    """(index, script) or (index, "-m", module) after an interpreter's own options; None for
    ``-c`` or ``-``."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m" or (a.startswith("-m") and len(a) > 2):
            module = a[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            return (i + 1 if a == "-m" else i, "-m", module) if module else None
        if a.startswith("-c") or a == "-":
            return None
        if a in ("-X", "-W", "--check-hash-based-pycs"):
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return (i, a)
    return None


def find(
    python: str, path0: str, names: list[str], env: dict[str, str], deadline: float
) -> dict[str, Any]:
    """Name -> True (found), False (not found) or why it could not be asked."""
    left = deadline - time.monotonic()
    if left <= 0:
        return dict.fromkeys(names, "no time left (command_timeout_s)")
    try:
        r = subprocess.run(
            [python, "-c", FIND, path0, *names],
            env=env,
            timeout=left,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
    except subprocess.TimeoutExpired:
        return dict.fromkeys(names, f"{python} did not answer in time")
    except OSError as e:
        return dict.fromkeys(names, f"{python} does not run: {e}")
    try:
        answers: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return dict.fromkeys(names, f"{python} does not run: {tail}")
    return answers


class Job:
    """One job's look: its problems as (job, key, what)."""

    def __init__(self, job: dict[str, Any], deadline: float) -> None:
        self.job, self.deadline = job, deadline
        self.problems: list[list[str]] = []
        self.cwd = ""

    def say(self, key: str, what: str) -> None:
        self.problems.append([self.job["job"], key, what])

    def where(self, given: str) -> tuple[str, str]:
        """The path as the command sees it, and what to add to a problem about it."""
        if os.path.isabs(given):
            return given, ""
        return os.path.normpath(os.path.join(self.cwd, given)), f" (cwd {self.cwd})"

    def check(self) -> list[list[str]]:
        try:
            self._check()
        except Exception as e:  # noqa: BLE001 - whatever stops the look is the finding
            self.say("command", f"cannot be checked: {type(e).__name__}: {e}")
        return self.problems

    def _check(self) -> None:
        job, say, where = self.job, self.say, self.where
        env = dict(os.environ)
        env.update(job["env"])
        self.cwd = cwd = os.path.realpath(job["cwd"])  # as the executor resolves it
        argv: list[str] = job["argv"]
        cwd_ok = os.path.isdir(cwd)
        if job["check_cwd"] and not cwd_ok:
            what = "is not a folder" if os.path.lexists(cwd) else "does not exist"
            say("command.cwd", f"{cwd} {what}")
        judge = cwd_ok or not job["check_cwd"]  # a missing cwd is said once, not per path
        python: str | None = sys.executable
        path0, modules = cwd, []
        program = argv[0]
        if "{" not in program:
            if "/" in program:
                path, note = where(program)
                if not (os.path.isabs(program) or judge):
                    pass
                elif not os.path.lexists(path):
                    say("command.argv[0]", f"{path} does not exist{note}")
                elif not (os.path.isfile(path) and os.access(path, os.X_OK)):
                    say("command.argv[0]", f"{path} is not an executable file{note}")
                else:
                    program = path
            else:
                search = env.get("PATH", os.defpath)
                found = shutil.which(program, path=search)
                if found is None:
                    say("command.argv[0]", f"{program} is not found on PATH ({search})")
                else:
                    program = found
        is_python = os.path.basename(argv[0]).startswith("python")
        if is_python and "{" not in argv[0]:  # the job's own interpreter answers for it
            python = program if os.path.isabs(program) else None
        target = python_target(argv) if is_python else None
        if target is not None and len(target) == 2:
            i, script = target[0], target[1]
            if "{" not in script and (os.path.isabs(script) or judge):
                path, note = where(script)
                if not os.path.exists(path):
                    say(f"command.argv[{i}]", f"{path} does not exist{note}")
                path0 = os.path.dirname(path)
        elif target is not None and len(target) == 3 and "{" not in target[2] and judge:
            modules.append((f"command.argv[{target[0]}]", target[2]))
        for k, need in enumerate(job["needs"]):
            if "{" in need or not (os.path.isabs(need) or judge):
                continue
            path, note = where(need)
            if not os.path.lexists(path):
                say(f"command.needs[{k}]", f"{path} does not exist{note}")
        for k, name in enumerate(job["imports"]):
            modules.append((f"command.imports[{k}]", name))
        if modules and python is not None:  # None: argv[0] is not there, said above
            tops = sorted({name.split(".")[0] for _, name in modules})
            answers = find(python, path0, tops, env, self.deadline)
            for key, name in modules:
                top = name.split(".")[0]
                answer = answers.get(top, "no answer")
                if answer is True:
                    continue
                named = name if top == name else f"{top} (of {name})"
                if answer is False:
                    on = "cwd" if path0 == cwd else "sys.path[0]"
                    say(key, f"module {named} is not found by {python} ({on} {path0})")
                else:
                    say(key, f"module {named}: cannot ask: {answer}")


def main(argv: list[str]) -> int:
    order = json.loads(argv[0])
    deadline = time.monotonic() + order["timeout"]
    problems = [p for job in order["jobs"] for p in Job(job, deadline).check()]
    print(json.dumps({"problems": problems}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
