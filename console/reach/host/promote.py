"""The promoting program: one replica (and every older one kept beside it) made an executor's
checkpoints. Run on the host as ``python -c SOURCE REPLICAS CHECKPOINTS STEM``, with
``replica_rules``' source before it (``check_files``, hence the guarded import). Every manifest
is read and every path it lists checked before anything is written (a host's word is no path
to write to); a folder checkpoint's files are linked each by its path. An older replica that
cannot be placed is left out, whatever it held: the executor's loader skips a damaged newest
for the one before, as with its own checkpoints. Exits non-zero with a line on stderr when the
chosen one cannot be promoted. The standard library only."""

import glob
import json
import os
import shutil
import sys

try:  # on the host this is defined by replica_rules' source, run just before this file
    from console.replication.replica_rules import check_files
except ImportError:
    pass


def files_of(manifest: str) -> "list[str] | None":
    """A folder checkpoint's files (each a checked path under it); None for a file."""
    with open(manifest) as f:
        m = json.load(f)
    files = m.get("files")
    if files is None:
        return None
    listed = [(f["path"], f["size"], f["sha256"]) for f in files]
    why = check_files(listed, m["size"], m["sha256"])
    if why is not None:
        raise ValueError(why)
    return [p for p, _, _ in listed]


def link(a: str, b: str) -> None:
    try:
        os.link(a, b)
    except OSError:
        shutil.copyfile(a, b)


def place(src: str, dst: str, name: str, paths: "list[str] | None") -> None:
    a, b = os.path.join(src, name + ".pt"), os.path.join(dst, name + ".pt")
    if paths is None:
        link(a, b)
    else:
        os.makedirs(b)
        for rel in paths:
            os.makedirs(os.path.dirname(os.path.join(b, rel)), exist_ok=True)
            link(os.path.join(a, rel), os.path.join(b, rel))
    link(os.path.join(src, name + ".json"), os.path.join(dst, name + ".json"))


def remove(dst: str, name: str) -> None:
    for ext in (".json", ".pt"):
        p = os.path.join(dst, name + ext)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)


def main(argv: "list[str]") -> "int | str":
    """0, or why the chosen replica cannot be promoted (``sys.exit`` prints it)."""
    src, dst, stem = argv[:3]
    chosen = []
    for manifest in sorted(glob.glob(os.path.join(src, "step-*.json"))):
        name = os.path.basename(manifest)[: -len(".json")]
        if name > stem:
            continue
        if not os.path.exists(os.path.join(src, name + ".pt")):
            if name == stem:
                return f"{name}: its data is gone"
            continue
        try:
            chosen.append((name, files_of(manifest)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            if name == stem:
                return f"{name}: {e}"
    if stem not in [name for name, _ in chosen]:
        return f"{stem}: no such replica in {src}"
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    for name, paths in chosen:
        try:
            place(src, dst, name, paths)
        except OSError:
            if name == stem:
                raise
            remove(dst, name)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
