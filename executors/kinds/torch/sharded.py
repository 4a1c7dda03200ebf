"""The torch kind's ``parallel = "fsdp"``: the model sharded with FSDP2 over the epoch's ranks,
and each member's part of a checkpoint written and read with torch.distributed.checkpoint.

``shard`` wraps the workload's model (``fully_shard`` per block, then the root) and points its
optimizer at the sharded parameters. A checkpoint of a sharded job is a folder per step (as the
command kind's folders are, ``CheckpointManifest.files``), one member's part of the step:

- ``__R_0.distcp``: rank R's shards of the model and the optimizer (DCP's own file);
- ``__Q_0.distcp``, Q = R - 1 (mod the group's size): a copy of the previous rank's, sent to
  it at each save (``ring_copy``), so the members that are left after any one is lost still
  hold every shard of a committed step, and a shrunk group can load it resharded;
- ``.metadata``: DCP's index of every rank's shards, copied to every member so that any
  member's part names the whole step;
- ``trainer.pt``: what is not sharded (the step, the data position, the scheduler, this rank's
  RNG states), ``torch.save``d.

To load a step, the members first tell each other which files they hold (verified against their
own manifests), and every file some member lacks is sent to it over the epoch's checkpoint group
(``exchange``), checked against the sender's sha256. A member replaced by a spare holding its
rank's part then loads at the same world size, bit-exact; a group of another size loads the same
step resharded (DCP maps each new rank's shards onto the files). DCP's ``.metadata`` is a
pickle: it is read with an unpickler that knows only DCP's metadata classes
(``SafeFileSystemReader``), and each data file is loaded as DCP loads it, with
``weights_only``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from executors.durable import fsync_dir
from executors.fencing.publish import CorruptCheckpoint, discard
from executors.kinds.command.command_tree import safe_relpath, tree_digest
from protocol.spec import FolderFile

METADATA = ".metadata"
TRAINER = "trainer.pt"
PARTS = ("model", "optimizer")
"""What DCP writes (sharded); the rest of the state is in ``TRAINER``."""
_CHUNK = 8 << 20

__all__ = [
    "METADATA",
    "TRAINER",
    "Inventory",
    "SafeFileSystemReader",
    "copy_shard",
    "exchange",
    "full_digest",
    "load_part",
    "planned_files",
    "ring_copy",
    "save_part",
    "shard",
    "sharded_state",
    "sync_gradients",
    "verify_part",
]


# ----------------------------------------------------------------------------- wrapping


def units(model: torch.nn.Module, workload: object) -> list[torch.nn.Module]:
    """What ``fully_shard`` wraps before the root: the workload's ``shard_units()`` when it has
    one, else every element of every ``ModuleList`` (the transformer-blocks layout), else the
    model's direct children that hold parameters."""
    hook = getattr(workload, "shard_units", None)
    if callable(hook):
        return list(hook())
    blocks = [
        m
        for lst in model.modules()
        if isinstance(lst, torch.nn.ModuleList)
        for m in lst
        if any(True for _ in m.parameters())
    ]
    if blocks:
        return blocks
    return [c for c in model.children() if any(True for _ in c.parameters())]


def shard(workload: Any) -> None:
    """FSDP2 over the default group: each unit, then the root. The optimizer was built over the
    plain parameters; its groups are pointed at the sharded ones (same names, same settings),
    so the workload's optimizer and scheduler objects stay the ones it made."""
    model: torch.nn.Module = workload.model
    optimizer: torch.optim.Optimizer = workload.optimizer
    if optimizer.state:
        raise RuntimeError("the optimizer has state before sharding; shard a fresh workload")
    names = {id(p): n for n, p in model.named_parameters()}
    for unit in units(model, workload):
        fully_shard(unit)
    fully_shard(model)
    now = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [now[names[id(p)]] for p in group["params"]]


def sync_gradients(model: torch.nn.Module, sync: bool) -> None:
    """Reduce-scatter the gradients in the backward that follows (the last of a step) or not."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)


def full(t: torch.Tensor) -> torch.Tensor:
    """A tensor whole on every rank (a collective for a DTensor)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter gathered whole (name, dtype, shape, bytes), in name order:
    the same value ``rng.params_sha256`` gives for the unsharded model. A collective."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        t = full(p.detach()).to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and optimizer's sharded state (DTensors, optimizer keyed by parameter name)."""
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optimizer": osd}


def copy_shard(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a tensor of a sharded state (a DTensor: its own shard, still a DTensor),
    for ``checkpoint.snapshot``: training goes on while the copy is written."""
    if not isinstance(t, DTensor):
        return t.detach().to("cpu", copy=True)
    return DTensor.from_local(
        t.to_local().detach().to("cpu", copy=True),
        t.device_mesh,
        t.placements,
        run_check=False,
        shape=t.shape,
        stride=t.stride(),
    )


# ----------------------------------------------------------------------------- reading


_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", n)
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's metadata classes, torch's dtypes and sizes: nothing that can run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not DCP metadata")


def read_metadata(data: bytes) -> Metadata:
    """DCP's index from its bytes; CorruptCheckpoint for anything else."""
    try:
        meta = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - whatever the bytes are, they are not to be loaded
        raise CorruptCheckpoint(f"{METADATA} does not load: {type(e).__name__}: {e}") from None
    if not isinstance(meta, Metadata):
        raise CorruptCheckpoint(f"{METADATA} holds a {type(meta).__name__}, not DCP metadata")
    return meta


class SafeFileSystemReader(FileSystemReader):
    """DCP's reader with ``.metadata`` read by ``read_metadata`` (never a plain pickle)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(str(self.path)) / METADATA
        meta = read_metadata(path.read_bytes())
        meta.storage_meta = None
        return meta


# ----------------------------------------------------------------------------- writing


def save_part(
    tmp: Path,
    state: dict[str, Any],
    trainer: dict[str, Any],
    *,
    group: dist.ProcessGroup,
    procs: int = 1,
) -> list[FolderFile]:
    """Write this rank's part of a step into the folder ``tmp`` (a collective over ``group``:
    every rank calls it for the same step): DCP's files of ``state``, DCP's index (written by
    rank 0, then sent to every host), ``trainer``. With ``procs`` ranks per host, all write into
    their host's one folder: its first rank writes the index and ``trainer`` (which holds every
    local rank's RNG states) and, once every rank has written, hashes the folder. Returns the
    files, hashed as written (none on a host's other ranks)."""
    tmp.mkdir(parents=True, exist_ok=True)
    dcp.save(
        state,
        storage_writer=FileSystemWriter(tmp, single_file_per_rank=True, sync_files=True),
        process_group=group,
    )
    me = dist.get_rank(group)
    first = me % procs == 0  # this host's first rank: it writes what the host holds once
    index = [(tmp / METADATA).read_bytes() if me == 0 else None]
    dist.broadcast_object_list(index, group_src=0, group=group)
    if me != 0 and first:
        _write(tmp / METADATA, cast(bytes, index[0]))
    ring_copy(tmp, group, procs)
    if first:
        buf = io.BytesIO()
        torch.save(trainer, buf)
        _write(tmp / TRAINER, buf.getvalue())
    if procs > 1:
        dist.barrier(group=group)  # every local rank's files are in before they are hashed
    if not first:
        return []
    files = [FolderFile(path=p.name, size=size, sha256=sha) for p, (size, sha) in _hashed(tmp)]
    fsync_dir(tmp)
    return files


_DATA_FILE = re.compile(r"__[0-9]+_[0-9]+\.distcp")


def ring_copy(tmp: Path, group: dist.ProcessGroup, procs: int = 1) -> None:
    """Send this rank's DCP data file to the same local rank of the next host, and keep the
    previous host's here (a collective). Each step is then held whole by the members left after
    any one is lost."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    if world <= procs:  # one host holds every rank's file
        return
    (own,) = sorted(tmp.glob(f"__{me}_*.distcp"))  # DCP writes one file per rank
    data = torch.frombuffer(bytearray(own.read_bytes()), dtype=torch.uint8)
    said: list[Any] = [None] * world
    dist.all_gather_object(said, (own.name, data.numel()), group=group)
    prv, nxt = (me - procs) % world, (me + procs) % world
    name, size = said[prv]
    if not isinstance(name, str) or not _DATA_FILE.fullmatch(name) or name == own.name:
        raise RuntimeError(f"rank {prv} named its data file {name!r}")
    got = torch.empty(int(size), dtype=torch.uint8)
    sent = dist.isend(data, group=group, group_dst=nxt)
    received = dist.irecv(got, group=group, group_src=prv)
    for work in (sent, received):
        if work is not None:
            work.wait()
    _write(tmp / name, got.numpy().tobytes())


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _hashed(folder: Path) -> Iterator[tuple[Path, tuple[int, str]]]:
    for p in sorted(folder.iterdir()):
        sha, size = hashlib.sha256(), 0
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
                size += len(chunk)
        yield p, (size, sha.hexdigest())


# ----------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Inventory:
    """What one rank holds of the step to load: its files (verified) or why it holds none."""

    files: dict[str, tuple[int, str]]
    why: str = ""


def verify_part(folder: Path, files: list[FolderFile], size: int, sha256: str) -> Inventory:
    """This rank's part against its manifest: the files whose size and sha256 match (one that
    does not is left out, and said in ``why``: a peer's copy may stand in for it); none when
    the list itself does not match the manifest's digest."""
    if tree_digest(files) != sha256 or sum(f.size for f in files) != size:
        return Inventory({}, "its list of files does not match its size and sha256")
    got: dict[str, tuple[int, str]] = {}
    bad: list[str] = []
    for f in files:
        if not safe_relpath(f.path) or "/" in f.path:
            bad.append(f"{f.path!r} is not a file name in the part")
            continue
        try:
            found = _hash_one(folder / f.path)
        except OSError as e:
            bad.append(f"{f.path}: cannot read: {e.strerror or e}")
            continue
        if found != (f.size, f.sha256):
            bad.append(
                f"{f.path}: size {found[0]} and sha256 {found[1][:12]}… do not match the "
                f"manifest's {f.size} and {f.sha256[:12]}…"
            )
            continue
        got[f.path] = found
    return Inventory(got, "; ".join(bad))


def _hash_one(path: Path) -> tuple[int, str]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def exchange(
    mine: Inventory,
    folder: Path | None,
    into: Path,
    *,
    group: dist.ProcessGroup,
    own_trainer: bool,
    state: dict[str, Any],
) -> Path:
    """Put in ``into`` what this rank's load of ``state`` reads: its own verified files
    (linked), DCP's index, a ``TRAINER`` (its own where ``own_trainer``: a fixed-size group's
    RNG states; else the lowest rank's when it has none), and each data file its load plan
    reads that it lacks, sent by the lowest rank that holds it (point to point) and checked
    against that rank's sha256. A collective: every rank calls it, each with what it holds, and
    every rank raises CorruptCheckpoint alike when the ranks' parts do not make a whole step."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (mine.files, mine.why), group=group)
    held: list[dict[str, tuple[int, str]]] = [g[0] for g in gathered]
    _whole(gathered, own_trainer)
    owners: dict[str, int] = {}
    for r, files in enumerate(held):
        for name in files:
            owners.setdefault(name, r)
    discard(into)
    into.mkdir(parents=True)
    for name in held[me]:
        assert folder is not None
        os.link(folder / name, into / name)
    err = ""
    for name in (METADATA, TRAINER):  # small: sent to every rank that lacks one
        if all(name in files for files in held):
            continue
        src = owners[name]
        payload: list[bytes | None] = [None]
        if me == src and folder is not None:
            with contextlib.suppress(OSError):
                payload = [(folder / name).read_bytes()]
        dist.broadcast_object_list(payload, group_src=src, group=group)
        if name not in held[me]:
            err = err or _take(payload[0], held[src][name], into / name, f"{name} from rank {src}")
    wants: list[str] = []
    if not err:
        try:
            planned = planned_files(state, read_metadata((into / METADATA).read_bytes()))
            if lacking := sorted(planned - set(owners)):
                raise CorruptCheckpoint(f"no rank holds {', '.join(lacking)} of this step")
            wants = sorted(planned - set(held[me]))
        except CorruptCheckpoint as e:
            err = f"{e}{_said(gathered)}"
    asked: list[Any] = [None] * world
    dist.all_gather_object(asked, (wants, err), group=group)
    _raise_any([e for _, e in asked])
    for name, dst in sorted((n, r) for r, (w, _) in enumerate(asked) for n in w):
        src, (size, sha) = owners[name], held[owners[name]][name]
        if me == src:
            dist.send(_file_tensor(folder, name, size), group=group, group_dst=dst)
        elif me == dst:
            got = torch.empty(size, dtype=torch.uint8)
            dist.recv(got, group=group, group_src=src)
            data = got.numpy().tobytes()
            err = err or _take(data, (size, sha), into / name, f"{name} from rank {src}")
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, err, group=group)
    _raise_any(errors)
    return into


def planned_files(state: dict[str, Any], meta: Metadata) -> set[str]:
    """The data files a load of ``state`` (this rank's shards) reads, by DCP's own plan."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    planner = DefaultLoadPlanner()
    try:
        planner.set_up_planner(state, meta, is_coordinator=False)
        plan = planner.create_local_plan()
    except Exception as e:  # noqa: BLE001 - DCP's: the index does not fit this model
        text = " ".join(str(e).split())[:300]
        raise CorruptCheckpoint(f"{METADATA} does not fit this model: {text}") from None
    storage = meta.storage_data or {}
    try:
        return {str(storage[item.storage_index].relative_path) for item in plan.items}
    except KeyError as e:
        raise CorruptCheckpoint(f"{METADATA} names no file for {e}") from None


def _take(data: bytes | None, want: tuple[int, str], path: Path, what: str) -> str:
    """Write ``data`` at ``path`` if it is what the sender's manifest says; else why not."""
    if data is None or (len(data), hashlib.sha256(data).hexdigest()) != want:
        return f"{what} does not match the sha256 in its manifest"
    _write(path, data)
    return ""


def _file_tensor(folder: Path | None, name: str, size: int) -> torch.Tensor:
    """A file's bytes to send (zeros of its size when it cannot be read: the receiver's check
    fails, and nobody waits on a send that never comes)."""
    try:
        assert folder is not None
        data = bytearray((folder / name).read_bytes())
    except (OSError, AssertionError):
        data = bytearray(size)
    if len(data) != size:
        data = bytearray(size)
    return torch.frombuffer(data, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)


def _raise_any(errors: list[Any]) -> None:
    if failed := [(r, text) for r, text in enumerate(errors) if text]:
        rank, text = failed[0]
        raise CorruptCheckpoint(f"rank {rank}: {text}")


def _said(gathered: list[Any]) -> str:
    """What the ranks found wrong with their parts, for an error that says why."""
    said = [f"rank {r}: {why}" for r, (_, why) in enumerate(gathered) if why]
    return f" ({'; '.join(said)})" if said else ""


def _whole(gathered: list[Any], own_trainer: bool) -> None:
    """Whether the ranks' parts can make a whole step; CorruptCheckpoint (on every rank alike:
    each judges the same gathered lists) when they cannot."""
    held: list[dict[str, tuple[int, str]]] = [g[0] for g in gathered]
    if own_trainer:
        for r, (files, why) in enumerate(gathered):
            if TRAINER not in files:
                raise CorruptCheckpoint(
                    f"rank {r} has no usable part of this step: {why or 'none'}"
                )
    owned = {n for files in held for n in files}
    for name in (METADATA, TRAINER):
        if name not in owned:
            raise CorruptCheckpoint(f"no rank holds the step's {name}{_said(gathered)}")
    for name in owned - {TRAINER}:
        if len({files[name][1] for files in held if name in files}) > 1:
            raise CorruptCheckpoint(f"the ranks hold different files named {name}")


def load_part(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    whole: Path,
    *,
    group: dist.ProcessGroup,
    map_location: torch.device | str,
) -> dict[str, Any]:
    """Load the step in ``whole`` (``exchange``'s folder) into ``state`` (``sharded_state`` of
    the model and optimizer), then into them, resharded to this group; returns the trainer
    state (``weights_only``). A collective."""
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(whole), process_group=group)
    except CorruptCheckpoint:
        raise
    except Exception as e:  # noqa: BLE001 - DCP's own errors: the step does not load
        text = " ".join(str(e).split())[:500]
        raise CorruptCheckpoint(f"does not load: {type(e).__name__}: {text}") from None
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    try:
        data = (whole / TRAINER).read_bytes()
        return cast(
            dict[str, Any],
            torch.load(io.BytesIO(data), map_location=map_location, weights_only=True),
        )
    except Exception as e:  # noqa: BLE001 - unreadable or not weights: not to be used
        text = " ".join(str(e).split())[:500]
        raise CorruptCheckpoint(f"{TRAINER} does not load: {type(e).__name__}: {text}") from None
