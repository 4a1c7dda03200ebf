"""Deploys of one bundle to one host at once: every one succeeds, and a bundle folder in
place is always whole (checked on disk by a watcher while they race), on both transports."""

from __future__ import annotations

import asyncio
import io
import shutil
import sys
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from support.fleetbed import write_inventory

from console.inventory import load
from console.reach.deploy import MARKER, Bundle, build_bundle, bundle_dir, deploy
from console.reach.transport.base import Transport
from console.reach.transport.factory import open_transport
from console.reach.transport.local import LocalTransport

ROUNDS = 6
AT_ONCE = 4


def _members(bundle: Bundle) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(bundle.tarball)) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def _missing_or_wrong(folder: Path, want: dict[str, bytes]) -> list[str]:
    """Bundle files not in ``folder`` with their bytes (an empty list: the folder is whole)."""
    out = []
    for name, data in want.items():
        try:
            if (folder / name).read_bytes() != data:
                out.append(f"{name} (wrong bytes)")
        except OSError:
            out.append(f"{name} (missing)")
    return out


class Watcher(threading.Thread):
    """Polls the bundle's place from outside the console: whenever its marker is there, every
    file must be too. Records what it saw, never trusting deploy()'s answer."""

    def __init__(self, dest: Path, want: dict[str, bytes]) -> None:
        super().__init__(daemon=True)
        self.dest, self.want = dest, want
        self.stop = threading.Event()
        self.whole_seen = 0
        self.torn: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            if (self.dest / MARKER).exists():
                bad = _missing_or_wrong(self.dest, self.want)
                if bad and (self.dest / MARKER).exists():
                    self.torn.append(", ".join(bad[:3]))
                elif not bad:
                    self.whole_seen += 1
            self.stop.wait(0.002)


async def _race(
    make: Callable[[], Transport], root: Path, bundle: Bundle, stale: bool = False
) -> None:
    """ROUNDS times: AT_ONCE deploys of one bundle to one empty root, each on its own
    connection (as two consoles, or two jobs, would), watched from outside."""
    want = _members(bundle) | {MARKER: bundle.hash.encode()}
    for round_ in range(ROUNDS):
        dest = Path(bundle_dir(str(root), bundle))
        if stale:  # a folder an older console left half unpacked, without its marker
            (dest / "executors").mkdir(parents=True)
            (dest / "executors" / "cli.py").write_bytes(b"half")
        watcher = Watcher(dest, want)
        watcher.start()
        transports = [make() for _ in range(AT_ONCE)]
        try:
            results = await asyncio.gather(
                *(deploy(t, str(root), sys.executable, bundle) for t in transports),
                return_exceptions=True,
            )
            deadline = asyncio.get_running_loop().time() + 10
            while watcher.whole_seen == 0 and watcher.is_alive():  # the watcher did look
                assert asyncio.get_running_loop().time() < deadline, "the watcher never saw it"
                await asyncio.sleep(0.01)
        finally:
            watcher.stop.set()
            watcher.join(timeout=10)
            for t in transports:
                await t.close()
        assert watcher.whole_seen > 0, f"round {round_}: the watcher never saw the marked bundle"
        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors == [], f"round {round_}: {errors}"
        assert {r.path for r in results} == {str(dest)}  # type: ignore[union-attr]
        assert sum(r.uploaded for r in results) == 1, "exactly one copy was put in place"  # type: ignore[union-attr]
        assert watcher.torn == [], f"round {round_}: a marked bundle was not whole"
        assert _missing_or_wrong(dest, want) == []
        assert sorted(p.name for p in dest.parent.iterdir()) == [bundle.hash], (
            "no staging folder, tarball or stale copy is left beside it"
        )
        assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == set(
            want
        ), "nothing but the bundle's files in its folder"
        shutil.rmtree(dest.parent)


async def test_concurrent_local_deploys_all_succeed_and_the_bundle_is_whole(
    tmp_path: Path,
) -> None:
    await _race(lambda: LocalTransport("h"), tmp_path / "root", build_bundle())


async def test_a_stale_half_unpacked_folder_is_replaced_by_a_whole_bundle(tmp_path: Path) -> None:
    await _race(lambda: LocalTransport("h"), tmp_path / "root", build_bundle(), stale=True)


async def test_a_failed_unpack_leaves_nothing_and_a_later_deploy_works(tmp_path: Path) -> None:
    bundle = build_bundle()
    root = tmp_path / "root"
    broken = Bundle(hash=bundle.hash, tarball=b"not a tarball")
    with pytest.raises(Exception, match="unpacking the executor bundle"):
        await deploy(LocalTransport("h"), str(root), sys.executable, broken)
    assert list((root / "bundles").iterdir()) == [], "the failed staging folder is removed"
    done = await deploy(LocalTransport("h"), str(root), sys.executable, bundle)
    assert done.uploaded
    assert _missing_or_wrong(Path(done.path), _members(bundle)) == []


async def test_concurrent_ssh_deploys_all_succeed_and_the_bundle_is_whole(
    ssh_hosts, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    (h,) = ssh_hosts(1)
    inv = load(
        write_inventory(tmp_path / "inventory.toml", hosts={"h": h.inventory_table()}, jobs={})
    )
    await _race(lambda: open_transport(inv, "h"), h.root, build_bundle())
