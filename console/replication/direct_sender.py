"""The program that sends a replica from its source host straight to the spare, run on the
source as ``python -I -S -c`` by the console, which reads its answers.

Over stdin: one JSON line (the checkpoint's ``files``, [path, size] each: one for a file, a
folder checkpoint's in the order the receiver takes them; the ``ssh`` argv that
reaches the spare's forced receiver with the job's key, run in ``cwd``, the folder holding
that key, and the receiver's ``header``); after it
the console keeps stdin open, and its end (the console gave up, or its connection died)
kills the copy at once. The program relays the receiver's answer lines (``direct_receiver``:
``ready``, then ``ok`` or what went wrong) and streams the files, one after another, from the offset ``ready``
names. Its own lines: ``reach`` (the receiver was never reached: no ssh client, refused,
timed out, the key or host key refused), ``source`` (a file cannot be read as told, with
its errno), ``lost`` (the connection to the spare broke after it answered). The standard
library only.
"""

import json
import os
import shutil
import subprocess
import sys
import threading

BLOCK = 1 << 20


def say(**fields):
    os.write(1, (json.dumps(fields) + "\n").encode())


def read_order():
    data = b""
    while b"\n" not in data:
        block = os.read(0, 1 << 16)
        if not block:
            sys.exit(5)
        data += block
    return json.loads(data.partition(b"\n")[0])


def watch_console(proc):
    """The console's end of stdin ends this copy: the spare's receiver then sees its input
    end and keeps nothing."""
    while os.read(0, 1 << 16):
        pass
    proc.kill()
    os._exit(9)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def close(pipe):
    try:
        pipe.close()
    except BrokenPipeError:
        pass


def last_line(data):
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def stream(f, fd, offset, size):
    """The file from ``offset`` to ``size`` into ``fd`` (sendfile where the OS has it);
    False when the other end closed first."""
    try:
        while offset < size:
            try:
                n = os.sendfile(fd, f.fileno(), offset, min(BLOCK, size - offset))
            except (AttributeError, OSError) as e:
                if isinstance(e, BrokenPipeError):
                    raise
                f.seek(offset)
                block = f.read(min(BLOCK, size - offset))
                n = os.write(fd, block) if block else 0
            if n == 0:
                break
            offset += n
    except BrokenPipeError:
        return False
    return True


def open_all(files):
    """Each file opened and at least its size; None (said why) when one is not."""
    opened = []
    for path, size in files:
        try:
            f = open(path, "rb")  # noqa: SIM115 - held for the whole copy
        except OSError as e:
            say(source=path + ": " + (e.strerror or str(e)), errno=e.errno)
            return None
        opened.append((f, size))
        if os.fstat(f.fileno()).st_size < size:
            say(source=path + " is shorter than its manifest says", errno=None)
            return None
    return opened


def stream_all(opened, fd, offset):
    """The files' bytes, one after another, from ``offset`` of the whole into ``fd``."""
    at = 0
    for f, size in opened:
        start, at = max(offset - at, 0), at + size
        if start < size and not stream(f, fd, start, size):
            return False
    return True


def main():
    order = read_order()
    ssh = shutil.which(order["ssh"][0])
    if ssh is None:
        say(reach="no ssh client (" + order["ssh"][0] + ") on this host")
        return 3
    opened = open_all(order["files"])
    if opened is None:
        return 4
    proc = subprocess.Popen(
        [ssh, *order["ssh"][1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
        stderr=subprocess.PIPE,
        cwd=order["cwd"],
    )
    threading.Thread(target=watch_console, args=(proc,), daemon=True).start()
    try:
        write_all(proc.stdin.fileno(), (json.dumps(order["header"]) + "\n").encode())
    except BrokenPipeError:
        pass  # ssh is gone: its exit says why
    line = proc.stdout.readline()
    if not line:
        close(proc.stdin)
        err = proc.stderr.read()
        code = proc.wait()
        say(reach=last_line(err) or "ssh exited " + str(code), status=code)
        return 3
    os.write(1, line)
    answer = json.loads(line)
    if answer.get("ready"):
        stream_all(opened, proc.stdin.fileno(), int(answer["have"]))
    close(proc.stdin)
    answered = False
    for line in proc.stdout:
        os.write(1, line)
        answered = True
    err = proc.stderr.read()
    code = proc.wait()
    if answer.get("ready") and not answered:
        say(lost=last_line(err) or "ssh exited " + str(code), status=code)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
