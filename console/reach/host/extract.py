"""The unpacking program of a deploy: the bundle's tarball unpacked into a folder, and every
file and folder of it fsynced, so it is whole on disk before it is renamed into place. Run on
the host as ``python -c SOURCE TARBALL FOLDER``. Only plain files with safe relative names are
unpacked (``tarfile``'s ``data`` filter where the host's Python has it). The standard library
only."""

from __future__ import annotations

import os
import sys
import tarfile


def main(argv: list[str]) -> int | str:
    tarball, folder = argv[:2]
    with tarfile.open(tarball) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(folder, filter="data")
        else:  # Python < 3.11.4: allow only plain files with safe relative names
            for m in t.getmembers():
                if not m.isfile() or m.name.startswith("/") or ".." in m.name.split("/"):
                    return f"unsafe member in bundle: {m.name!r}"
            t.extractall(folder)  # every member checked just above
    for where, _, names in os.walk(folder):
        for name in [*names, "."]:
            fd = os.open(os.path.join(where, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
