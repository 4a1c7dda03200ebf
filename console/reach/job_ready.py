"""Is a ``command``-kind job's code and data on a host? ``hotspare check`` asks every host the
job may run on: its ``host`` or a group's ``hosts``, and its ``spares`` (a job that names no
host may start on any). Looked for there: ``cwd``, ``argv[0]``, the script of ``PYTHON
script.py`` or the module of ``PYTHON -m MODULE``, and the ``[command]`` table's ``needs``
(paths) and ``imports`` (modules).

One probe per host, a short Python script run with the host's interpreter (the jobs as one
JSON argument, never shell text), prints one JSON line: each problem as (job, key, what). It
only looks: nothing is created, and a module is found with ``importlib.util.find_spec`` on
its top-level package, by the job's interpreter in a process of its own, never imported.
Argv elements and ``needs`` entries holding a placeholder (``{``) are not looked for.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from console.inventory import Inventory
from console.reach.deploy import job_dir
from console.reach.transport.base import Transport, TransportError

_PROBE = r"""
import json, os, shutil, subprocess, sys, time

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
order = json.loads(sys.argv[1])
deadline = time.monotonic() + order["timeout"]
problems = []


def python_target(argv):
    # (index, script) or (index, "-m", module) after an interpreter's own options; None for -c
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


def find(python, path0, names, env):
    # name -> True (found), False (not found) or why it could not be asked
    left = deadline - time.monotonic()
    if left <= 0:
        return dict.fromkeys(names, "no time left (command_timeout_s)")
    try:
        r = subprocess.run([python, "-c", FIND, path0] + names, env=env, timeout=left,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return dict.fromkeys(names, "%s did not answer in time" % python)
    except OSError as e:
        return dict.fromkeys(names, "%s does not run: %s" % (python, e))
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        return dict.fromkeys(names, "%s does not run: %s" % (python, tail))


for job in order["jobs"]:
    def say(key, what):
        problems.append([job["job"], key, what])

    def where(given):
        # the path as the command sees it, and what to add to a problem about it
        if os.path.isabs(given):
            return given, ""
        return os.path.normpath(os.path.join(cwd, given)), " (cwd %s)" % cwd

    try:
        env = dict(os.environ)
        env.update(job["env"])
        cwd, argv = os.path.realpath(job["cwd"]), job["argv"]  # as the executor resolves it
        cwd_ok = os.path.isdir(cwd)
        if job["check_cwd"] and not cwd_ok:
            say("command.cwd", "%s %s" % (cwd, "is not a folder" if os.path.lexists(cwd)
                                           else "does not exist"))
        judge = cwd_ok or not job["check_cwd"]  # a missing cwd is said once, not per path
        python, path0, modules = sys.executable, cwd, []
        program = argv[0]
        if "{" not in program:
            if "/" in program:
                path, note = where(program)
                if not (os.path.isabs(program) or judge):
                    pass
                elif not os.path.lexists(path):
                    say("command.argv[0]", "%s does not exist%s" % (path, note))
                elif not (os.path.isfile(path) and os.access(path, os.X_OK)):
                    say("command.argv[0]", "%s is not an executable file%s" % (path, note))
                else:
                    program = path
            else:
                found = shutil.which(program, path=env.get("PATH", os.defpath))
                if found is None:
                    say("command.argv[0]", "%s is not found on PATH (%s)"
                        % (program, env.get("PATH", os.defpath)))
                else:
                    program = found
        is_python = os.path.basename(argv[0]).startswith("python")
        if is_python and "{" not in argv[0]:  # the job's own interpreter answers for it
            python = program if os.path.isabs(program) else None
        target = python_target(argv) if is_python else None
        if target is not None and len(target) == 2:
            i, script = target
            if "{" not in script and (os.path.isabs(script) or judge):
                path, note = where(script)
                if not os.path.exists(path):
                    say("command.argv[%d]" % i, "%s does not exist%s" % (path, note))
                path0 = os.path.dirname(path)
        elif target is not None and "{" not in target[2] and judge:
            modules.append(("command.argv[%d]" % target[0], target[2]))
        for k, need in enumerate(job["needs"]):
            if "{" in need or not (os.path.isabs(need) or judge):
                continue
            path, note = where(need)
            if not os.path.lexists(path):
                say("command.needs[%d]" % k, "%s does not exist%s" % (path, note))
        for k, name in enumerate(job["imports"]):
            modules.append(("command.imports[%d]" % k, name))
        if modules and python is not None:  # None: argv[0] is not there, said above
            tops = sorted({name.split(".")[0] for _, name in modules})
            answers = find(python, path0, tops, env)
            for key, name in modules:
                top = name.split(".")[0]
                answer = answers.get(top, "no answer")
                if answer is True:
                    continue
                named = name if top == name else "%s (of %s)" % (top, name)
                if answer is False:
                    on = "cwd" if path0 == cwd else "sys.path[0]"
                    say(key, "module %s is not found by %s (%s %s)" % (named, python, on, path0))
                else:
                    say(key, "module %s: cannot ask: %s" % (named, answer))
    except Exception as e:
        say("command", "cannot be checked: %s: %s" % (type(e).__name__, e))
print(json.dumps({"problems": problems}))
"""


def hosts_of(inv: Inventory, job: str) -> list[str]:
    """Every host ``job`` may run on: its members and spares (any host, when it names none)."""
    p = inv.jobs[job].placement
    members = inv.members(job)
    if not members:
        return list(inv.hosts)
    return [*members, *(s for s in p.spares if s not in members)]


def jobs_on(inv: Inventory, host: str) -> list[str]:
    """The ``command``-kind jobs that may run on ``host``, in the inventory's order."""
    return [
        name
        for name, job in inv.jobs.items()
        if job.spec.executor == "command"
        and job.spec.command is not None
        and host in hosts_of(inv, name)
    ]


def _order(inv: Inventory, host: str, job: str) -> dict[str, Any]:
    cs = inv.jobs[job].spec.command
    assert cs is not None
    workdir = job_dir(inv.host_root(host), job)
    return {
        "job": job,
        "cwd": posixpath.join(workdir, cs.cwd) if cs.cwd else workdir,
        "check_cwd": cs.cwd is not None,  # the workdir: the executor makes it
        "argv": list(cs.argv),
        "env": {k: v for k, v in cs.env.items() if "{" not in v},
        "needs": list(cs.needs),
        "imports": list(cs.imports),
    }


async def check_jobs(t: Transport, inv: Inventory, host: str) -> list[str]:
    """One line per problem of the jobs that may run on ``host``: ``job J on host H: KEY:
    WHAT``; none when every one's code and data are there (or none may run there).
    ``t`` is connected."""
    jobs = jobs_on(inv, host)
    if not jobs:
        return []
    timeout = inv.console.command_timeout_s
    order = {"timeout": timeout * 0.8, "jobs": [_order(inv, host, j) for j in jobs]}
    python = inv.python(host)
    try:
        result = await t.run([python, "-c", _PROBE, json.dumps(order)], timeout=timeout)
    except TransportError as e:
        return [f"job {j} on host {host}: command: not checked: {e}" for j in jobs]
    try:
        problems = json.loads(result.stdout.strip().splitlines()[-1])["problems"]
    except (json.JSONDecodeError, IndexError, KeyError, TypeError):
        tail = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        what = f"the look for its code and data failed: {tail}"
        return [_printable(f"job {j} on host {host}: command: {what}") for j in jobs]
    return [_printable(f"job {job} on host {host}: {key}: {what}") for job, key, what in problems]


def _printable(line: str) -> str:
    """One line, whatever the paths in it hold: control characters as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)


def on_host(line: str, host: str) -> bool:
    """Whether ``line`` is one of ``check_jobs``'s about ``host`` (it names the host itself)."""
    return line.startswith("job ") and f" on host {host}: " in line


__all__ = ["check_jobs", "hosts_of", "jobs_on", "on_host"]
