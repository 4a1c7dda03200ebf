"""The zygote's own program: import the command's modules once, then fork warm runs of it.

executors/kinds/command/zygote.py runs this file's text as ``PYTHON -c TEXT FD CONFIG`` with the command's
interpreter, environment (the run token a placeholder of the token's length) and cwd, so a
forked run sees the interpreter, ``sys.path`` and import-time environment a ``PYTHON
script.py`` would. It imports only the standard library and nothing of hotspare: what it
leaves in ``sys.modules`` is stdlib, and the executor bundle's folder is taken off
``sys.path``. ``FD`` is its end of a SOCK_SEQPACKET link to the executor (JSON messages, file
descriptors beside them); ``CONFIG`` is JSON: ``preload``, ``path0``, ``bundle``, ``parent``
(the executor's pid), ``mark`` (the placeholder token entry), ``title``.

Fork safety: the zygote must hold no lock another thread could own at the fork, so it starts
no thread and refuses to serve when a preloaded module left a Python thread running. Native
pools started at import are counted and reported (OpenBLAS, loaded with numpy or torch, starts
one and stops it around ``fork`` itself); libgomp's is started only by the first parallel
op, which the zygote never runs (nor ``torch.get_num_threads``, nor anything of CUDA: a
preload that initialises CUDA or only loads its driver, as ``torch.cuda.is_available()``
does, is refused, a forked child could not use it).

Messages to the executor: ``ready`` (the pid of the spare, a child forked ahead and waiting
for its orders), ``failed`` (why the zygote cannot serve, one line), ``started`` (the spare
that took a ``run``), ``exited`` (a child's pid and its exit code as ``Popen`` gives it:
negative for a signal). A spare becomes a run like this: its own session (``setsid``, done
when forked), killed if the zygote dies (``PR_SET_PDEATHSIG``), the run token written over
the placeholder in its initial environment (``/proc/PID/environ``, what the reaper reads),
its command line written over the zygote's (``/proc/PID/cmdline``, what ``ps`` shows),
stdout and stderr the pipes the executor sent, ``os.environ``, cwd, ``sys.argv`` and
``sys.path[0]`` those of the command, then ``runpy`` as ``__main__``; it ends like the
interpreter would (``SystemExit``'s code; 1 and the traceback on stderr for an exception).
The executor's link closing (it died) ends the zygote, and with it its spare.
"""

import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1
MAX_MESSAGE = 4 << 20
OWN_CODE = "<string>"
"""The file name of this program's frames (it runs as ``-c``)."""


def send(sock, msg, fds=()):
    socket.send_fds(sock, [json.dumps(msg).encode()], list(fds))


def receive(sock):
    """One message and the file descriptors beside it; (None, []) when the other end closed."""
    data, fds, _flags, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
    if not data:
        return None, fds
    return json.loads(data), fds


def die_with_parent(parent):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(137)


def memory_region(first, last):
    """(start, end) of this process's initial argv (first=45) or environment (47) in memory."""
    with open("/proc/self/stat", "rb") as f:
        raw = f.read()
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[first]), int(fields[last])


def rewrite_cmdline(argv):
    """What /proc/PID/cmdline (ps) shows: ``argv``, cut to the room the zygote's had."""
    start, end = memory_region(45, 46)
    data = b"\0".join(a.encode(errors="replace") for a in argv)[: end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def find_entry(entry):
    """(address, length) of ``entry`` in this process's initial environment, or None."""
    start, end = memory_region(47, 48)
    entries = ctypes.string_at(start, end - start).split(b"\0")
    at = 0
    for e in entries:
        if e == entry.encode():
            return start + at, len(e)
        at += len(e) + 1
    return None


def mark_environ(old, new):
    """Write ``new`` over the entry ``old`` (same length) of the initial environment."""
    found = find_entry(old)
    if found is None or found[1] != len(new.encode()):
        return False
    ctypes.memmove(found[0], new.encode(), found[1])
    return True


def set_path0(path0):
    """``sys.path[0]`` as ``PYTHON script.py`` (the script's folder) or ``-m`` (cwd) sets it."""
    if not getattr(sys.flags, "safe_path", False) and sys.path:
        sys.path[0] = path0


def preload(config):
    set_path0(config["path0"])
    bundle = os.path.realpath(config["bundle"])
    sys.path[:] = [p for p in sys.path if os.path.realpath(p) != bundle]
    for name in config["preload"]:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - any failure is reported in one line
            return f"preload {name!r}: {type(e).__name__}: {e}".splitlines()[0]
    import threading

    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate()[1:])
        return f"the preloaded modules started Python threads ({names}); forking would be unsafe"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "the preloaded modules initialised CUDA; a forked child could not use it"
    with open("/proc/self/maps") as f:
        if "/libcuda.so" in f.read():  # cuInit ran (torch.cuda.is_available() does it)
            return "the preloaded modules loaded the CUDA driver; a forked child could not use it"
    if find_entry(config["mark"]) is None:
        return "the run token's placeholder is not in the zygote's initial environment"
    return None


class Spare:
    """A child forked ahead, in its own session, waiting for its orders on ``link``."""

    def __init__(self, pid, link):
        self.pid, self.link = pid, link


def fork_spare(ctl, wakeup):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    pid = os.fork()
    if pid:
        theirs.close()
        return Spare(pid, ours)
    # the spare: nothing of the zygote's plumbing stays open in it
    ours.close()
    ctl.close()
    signal.set_wakeup_fd(-1)
    for fd in wakeup:
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    die_with_parent(parent)
    os.setsid()
    orders, fds = receive(theirs)
    theirs.close()
    if orders is None:
        os._exit(0)
    raise Become(orders, fds)


class Become(BaseException):
    """Raised in a spare that took its orders: it unwinds the zygote's loop and runs them."""

    def __init__(self, orders, fds):
        self.orders, self.fds = orders, fds


def serve(ctl, config):
    die_with_parent(config["parent"])
    error = preload(config)
    if error is not None:
        send(ctl, {"op": "failed", "error": error})
        sys.exit(1)
    threads = len(os.listdir("/proc/self/task"))
    sys.stdout.flush()
    sys.stderr.flush()
    rewrite_cmdline(config["title"])
    wakeup = os.pipe()
    for fd in wakeup:
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wakeup[1], warn_on_full_buffer=False)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(wakeup[0], selectors.EVENT_READ, "child")
    spare = fork_spare(ctl, wakeup)
    send(ctl, {"op": "ready", "pid": spare.pid, "threads": threads})
    while True:
        for key, _ in sel.select():
            if key.data == "child":
                while os.read(wakeup[0], 512) == 512:
                    pass
                spare = reap(ctl, spare, wakeup)
                continue
            msg, fds = receive(ctl)
            if msg is None:  # the executor is gone: so is this zygote (its children die with it)
                sys.exit(0)
            spare = run(ctl, spare, wakeup, msg, fds)


def run(ctl, spare, wakeup, msg, fds):
    """Hand ``msg`` and ``fds`` to the spare; say which pid took them; fork the next spare."""
    for _ in range(3):
        try:
            send(spare.link, msg, fds)
            taken = spare
            break
        except OSError:  # the spare died (killed from outside): a new one takes the orders
            spare.link.close()
            spare = fork_spare(ctl, wakeup)
    else:
        send(ctl, {"op": "failed", "error": "no spare would take the run"})
        sys.exit(1)
    for fd in fds:
        os.close(fd)
    taken.link.close()
    send(ctl, {"op": "started", "pid": taken.pid})
    spare = fork_spare(ctl, wakeup)
    send(ctl, {"op": "ready", "pid": spare.pid})
    return spare


def reap(ctl, spare, wakeup):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return spare
        if pid == 0:
            return spare
        send(ctl, {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
        if pid == spare.pid:  # the waiting spare was killed: fork another
            spare.link.close()
            spare = fork_spare(ctl, wakeup)
            send(ctl, {"op": "ready", "pid": spare.pid})


def become(orders, fds):
    """The spare turns into the command; what raises out of here ends the process. It joins
    the run's cgroup before a line of the command runs."""
    out, err = fds
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    mark_environ(orders["mark"], orders["token_entry"])
    os.environ.clear()
    os.environ.update(orders["env"])
    os.chdir(orders["cwd"])
    rewrite_cmdline(orders["argv"])
    sys.orig_argv = list(orders["argv"])
    set_path0(orders["path0"])
    sys.path[:] = [p for p in sys.path if os.path.realpath(p) != os.path.realpath(orders["bundle"])]
    try:
        with open(os.path.join(orders["cgroup"], "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError as e:
        os.write(2, f"hotspare: the run's cgroup refused it: {e.strerror}\n".encode())
        os._exit(126)
    generator = sys.modules.get("numpy.random")
    if generator is not None:  # its global generator was seeded at the zygote's import: reseed
        generator.seed()
    import runpy

    try:
        if orders["module"] is not None:
            sys.argv = [orders["module"], *orders["args"]]
            runpy.run_module(orders["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [orders["script"], *orders["args"]]
            runpy.run_path(orders["script"], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise  # the interpreter ends as it would (the code; a KeyboardInterrupt by SIGINT)
    except BaseException as e:  # noqa: BLE001 - the interpreter's own end for an uncaught error
        tb = e.__traceback__
        while tb is not None and (
            tb.tb_frame.f_code.co_filename == OWN_CODE
            or tb.tb_frame.f_globals.get("__name__") == "runpy"
        ):
            tb = tb.tb_next  # the frames of the zygote and runpy: a fresh Python shows none
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)


if __name__ == "__main__":
    _became = None
    try:
        serve(socket.socket(fileno=int(sys.argv[1])), json.loads(sys.argv[2]))
    except Become as b:
        _became = (b.orders, b.fds)
        del b
    if _became is not None:  # outside the handler: the run's errors chain to nothing of ours
        become(*_became)
