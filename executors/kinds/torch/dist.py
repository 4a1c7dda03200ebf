"""The process group of one epoch of a multi-host job: joined when a run starts, left when it ends.

Each host has ``procs_per_host`` ranks: local rank 0 in the executor's own training thread,
the others in processes it starts for the run (``executors.kinds.torch.local_ranks``), all in
torch.distributed's default group. The group is always destroyed at the end of the run, and a failed join forgotten, so a
run restarted in place at a higher epoch (same process, new rendezvous) can join the next
epoch's group beside fresh executors. Each step needs two collectives of every rank, in the
same order: ``agree`` at the step boundary (so every rank checkpoints and stops at the same
steps) and ``average`` (``average_in_order`` for an elastic job's deterministic reduce) after
the backward pass.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psutil
import torch
import torch.distributed as dist

from executors.kinds.torch.logical import Layout, block
from protocol.errors import ConfigError, HotspareError
from protocol.messages import Rendezvous

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
Warn = Callable[[str], None]


@dataclass(frozen=True)
class Agreed:
    """What every rank decided at a step boundary: the logical OR of each rank's wishes."""

    save: bool
    stop: bool
    checkpoint: bool
    """Stop with a checkpoint at this step first."""


class Group:
    """This host's rank in the epoch's group, and the collectives of a step."""

    def __init__(
        self,
        rv: Rendezvous,
        device: torch.device,
        side: dist.ProcessGroup | None = None,
        local_rank: int = 0,
    ) -> None:
        self.side = side
        """A gloo group beside the default one (a sharded job's checkpoints), if asked for."""
        self.node_rank = rv.node_rank
        self.nnodes = rv.nnodes
        self.local_rank = local_rank
        self.procs_per_host = rv.procs_per_host
        self.rank = rv.node_rank * rv.procs_per_host + local_rank
        self.world_size = rv.world_size
        self.device = device

    def host_states(self, mine: object) -> list[Any]:
        """Every rank of this host's ``mine``, by local rank (a collective of every rank: the
        whole world's are gathered, this host's kept). Over the default group, the step loop's
        own: the side group may be busy with a checkpoint still being written."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        first = self.node_rank * self.procs_per_host
        return gathered[first : first + self.procs_per_host]

    def barrier(self) -> None:
        """Every rank has come this far (a collective over the default group)."""
        dist.barrier()

    def average(
        self, model: torch.nn.Module, loss: torch.Tensor, over: int | None = None
    ) -> tuple[list[torch.nn.Parameter], float]:
        """Every rank's gradients and loss summed as one flat tensor, then divided by ``over``
        (the world size, or an elastic job's logical ranks: each rank's gradients are then the
        sum over its logical ranks). What DDP does, without wrapping the model: its state_dict
        keys stay. The gradients are replaced in place (a missing one counts as zeros); returns
        the parameters and the mean loss, the same on every rank."""
        params = trained(model)
        flat = flatten(params, loss)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= over or self.world_size
        return params, unflatten(params, flat)

    def mean_loss(self, loss: torch.Tensor, over: int | None = None) -> float:
        """Every rank's loss summed, divided by ``over`` (the world size, or the logical ranks):
        the same on every rank (a sharded job's step, whose gradients FSDP reduces)."""
        total = loss.detach().reshape(1).float().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return float(total[0]) / (over or self.world_size)

    def most(self, count: int) -> int:
        """The largest ``count`` of any rank (one tiny all-reduce)."""
        t = torch.tensor([count], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0])

    def average_in_order(
        self, model: torch.nn.Module, vectors: list[torch.Tensor], layout: Layout
    ) -> tuple[list[torch.nn.Parameter], float]:
        """The deterministic reduce: ``vectors`` are this rank's logical ranks' own gradients and
        loss (``flatten``, in block order); every rank gathers every logical rank's and sums them
        in logical order 0..L-1 before dividing by L, so the bits do not depend on how the
        logical ranks were spread over the ranks. The gradients are replaced in place."""
        params = trained(model)
        width = layout.widest_block
        mine = torch.zeros((width, vectors[0].numel()), dtype=vectors[0].dtype, device=self.device)
        for i, v in enumerate(vectors):
            mine[i].copy_(v)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        ordered = [
            gathered[p][i]
            for p in range(self.world_size)
            for i in range(len(block(p, self.world_size, layout.logical_ranks)))
        ]
        acc = ordered[0].clone()
        for v in ordered[1:]:
            acc += v
        acc /= layout.logical_ranks
        return params, unflatten(params, acc)

    def agree(self, *, save: bool, stop: bool, checkpoint: bool) -> Agreed:
        """One tiny all-reduce (MAX) of this rank's wishes at a step boundary."""
        flags = torch.tensor([save, stop, checkpoint], dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        save_all, stop_all, checkpoint_all = (bool(f) for f in flags.tolist())
        return Agreed(save=save_all, stop=stop_all, checkpoint=checkpoint_all)


def trained(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters a step reduces (those that require a gradient), in the model's order."""
    return [p for p in model.parameters() if p.requires_grad]


def flatten(params: list[torch.nn.Parameter], loss: torch.Tensor) -> torch.Tensor:
    """The gradients of ``params`` and the loss as one new float vector; a parameter without a
    gradient is given zeros (so every rank's vector has the same layout)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]
    return torch.cat([g.reshape(-1).float() for g in grads] + [loss.reshape(1).float()])


def unflatten(params: list[torch.nn.Parameter], flat: torch.Tensor) -> float:
    """Copy a ``flatten`` vector back into the gradients; returns its loss."""
    offset = 0
    for p in params:
        g = p.grad
        assert g is not None
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return float(flat[-1])


def check(rv: Rendezvous, device: torch.device, local_rank: int = 0) -> None:
    """What the torch kind can run: this host among the members, this rank among its ranks."""
    if rv.backend == "nccl" and device.type != "cuda":
        raise ConfigError(f"backend: nccl needs a CUDA device; this executor trains on {device}")
    if not 0 <= local_rank < rv.procs_per_host:
        raise ConfigError(f"local rank {local_rank} outside 0..{rv.procs_per_host - 1}")
    if device.type == "cuda" and rv.procs_per_host > 1:
        first, have = device.index or 0, torch.cuda.device_count()
        if first + rv.procs_per_host > have:
            raise ConfigError(
                f"procs_per_host: {rv.procs_per_host} ranks take a GPU each from cuda:{first}; "
                f"this host has {have}"
            )
    if not 0 <= rv.node_rank < rv.nnodes:
        raise ConfigError(f"rendezvous: node rank {rv.node_rank} outside 0..{rv.nnodes - 1}")
    if rv.logical_ranks is not None and not 1 <= rv.world_size <= rv.logical_ranks:
        raise ConfigError(
            f"logical_ranks: {rv.logical_ranks} logical ranks cannot spread over "
            f"{rv.world_size} ranks (each rank needs at least one)"
        )


def import_ahead() -> None:
    """Import what a run would import lazily, before this rank joins an epoch (``joined``):
    ``torch._dynamo``, which every torch optimizer's first call imports (1.3 CPU s here, the
    largest piece of a run's start by far; its first step takes 0.03 s). Imported after the
    join, it sat between the join and the first collective, and on a loaded machine a cold
    rank (a local rank's process) came to that collective past its timeout while a warm one
    waited there ("Timed out waiting 15000ms for recv operation", run B)."""
    import torch._dynamo  # noqa: F401


@contextlib.contextmanager
def joined(
    rv: Rendezvous,
    device: torch.device,
    warn: Warn,
    *,
    side: bool = False,
    local_rank: int = 0,
    abandoned: Callable[[], bool] = lambda: False,
) -> Iterator[Group]:
    """Join this epoch's group as ``local_rank`` of this host (waits for every rank up to
    ``rv.join_timeout_s``, or until ``abandoned()``, then for a collective up to
    ``rv.timeout_s``), with ``side`` a gloo group beside it (``Group.side``); always leave
    them."""
    check(rv, device, local_rank)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # NCCL's rank k of a host uses its device k, not 0
    timeout = timedelta(seconds=rv.timeout_s)
    rank = rv.node_rank * rv.procs_per_host + local_rank
    import_ahead()  # an executor did so before serving (no lease held then)
    _name_the_group_as_a_fresh_process_would()
    with _gloo_bound_to(rv, warn, gloo=side):
        store = _met(rv, rank, abandoned)
        store.set_timeout(timeout)  # from here on, a peer is waited for a collective's time
        dist.init_process_group(
            rv.backend, store=store, rank=rank, world_size=rv.world_size, timeout=timeout
        )
        # made here, bound as the default group is: made after, in a network namespace gloo
        # bound it to loopback and its peers were refused (test_fsdp_ssh)
        side_group = dist.new_group(backend="gloo", timeout=timeout) if side else None
    try:
        yield Group(rv, device, side_group, local_rank)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _name_the_group_as_a_fresh_process_would() -> None:
    """torch names the default group (the prefix of every key its members wait on in the store)
    from a process-wide count, raised by every join, and reset only when a joined group is
    destroyed. A join that failed (a peer never came) leaves it raised, so this process would
    wait on group "1" where a fresh executor beside it waits on "0", and neither would ever
    meet. Each epoch has a store of its own, so every join may start from 0."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is None or not hasattr(world, "group_count"):
        raise RuntimeError("this torch has no process-group count to reset (torch changed)")
    world.group_count = 0


JOINED, ALL_JOINED = "hotspare/joined", "hotspare/all-joined"
"""The store's count of the ranks joined, and the key the last of them sets: every rank waits
for it before the group is made."""
JOIN_POLL_S = 0.05
"""How often a joining rank looks for the last rank's key, and whether it was abandoned."""
CONNECT_TRY_S = 2.0
"""A rank other than 0 dials the store in tries this long (torch retries within each), so a
join abandoned while rank 0 never serves (its host lost at the epoch's start) ends then."""
SERVED_POLL_S = 0.05
"""How often a joining rank tries rank 0's store port while nothing listens there."""


class JoinAbandoned(HotspareError):
    """The console said this epoch's group will not form (``Abandon``): the next may."""

    permanent = False


def _met(rv: Rendezvous, rank: int, abandoned: Callable[[], bool]) -> dist.TCPStore:
    """The epoch's store (rank 0's process serves it, as a ``tcp://`` rendezvous does) once every
    rank has joined it, each waiting up to ``rv.join_timeout_s`` for the slowest one's start,
    unless ``abandoned()`` first. Made by torch from a ``tcp://`` address, the store waited the
    collective timeout for the last rank, and a follower still importing torch on a loaded host
    failed the whole epoch. Waited for in torch's own calls, a join whose peer was lost before
    it came sat out the whole join timeout, past its lease (the executor then started afresh,
    cold, where a failed join leaves it warm)."""
    deadline = time.monotonic() + rv.join_timeout_s
    store = _dialled(rv, rank, deadline, abandoned)
    if store.add(JOINED, 1) == rv.world_size:
        store.set(ALL_JOINED, "1")
    while not _joined_all(store, abandoned):
        if abandoned():
            raise JoinAbandoned(
                "epoch abandoned by the console before every rank joined "
                f"({_count(store)}/{rv.world_size} had)"
            )
        if time.monotonic() > deadline:
            raise dist.DistStoreError(
                f"Timed out after {rv.join_timeout_s:g} s waiting for every rank to join "
                f"({_count(store)}/{rv.world_size} had)"
            )
        time.sleep(JOIN_POLL_S)
    return store


def _joined_all(store: dist.TCPStore, abandoned: Callable[[], bool]) -> bool:
    """Whether the last rank's key is set. Rank 0 gone, its store's connection fails here; one
    that left because the epoch was abandoned is that abandonment, not a crash (run J: rank 1
    read rank 0's closed store before its own Abandon)."""
    try:
        return bool(store.check([ALL_JOINED]))
    except dist.DistError:
        if abandoned():
            raise JoinAbandoned("epoch abandoned by the console before every rank joined") from None
        raise


def _count(store: dist.TCPStore) -> str:
    """How many ranks have joined, as far as the store can still say."""
    try:
        return str(store.add(JOINED, 0))
    except dist.DistError:
        return "?"


def _dialled(
    rv: Rendezvous, rank: int, deadline: float, abandoned: Callable[[], bool]
) -> dist.TCPStore:
    """Rank 0 serves the store (waiting for no one here); every other rank dials it in tries of
    ``CONNECT_TRY_S`` until the deadline, or until abandoned."""
    host, within = rv.master_addr.strip("[]"), timedelta(seconds=rv.join_timeout_s)
    if rank == 0:
        return dist.TCPStore(
            host,
            rv.master_port,
            rv.world_size,
            is_master=True,
            timeout=within,
            wait_for_workers=False,
            multi_tenant=True,
        )
    while True:
        _served(host, rv.master_port, deadline, abandoned)
        left = deadline - time.monotonic()
        try:
            store = dist.TCPStore(
                host,
                rv.master_port,
                rv.world_size,
                is_master=False,
                timeout=timedelta(seconds=max(0.1, min(CONNECT_TRY_S, left))),
                multi_tenant=True,
            )
        except dist.DistNetworkError:
            if abandoned():
                raise JoinAbandoned("epoch abandoned by the console before rank 0 served") from None
            if time.monotonic() > deadline:
                raise
            continue
        store.set_timeout(within)
        return store


def _served(host: str, port: int, deadline: float, abandoned: Callable[[], bool]) -> None:
    """Until rank 0's store takes a connection (a plain one, closed at once), or the deadline,
    or abandoned. A store client dialling a port not served yet logged torch's C++ error and
    stack trace into executor.log at every try, while rank 0 was still starting."""
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(CONNECT_TRY_S, left))):
                return
        except OSError as e:
            if abandoned():
                raise JoinAbandoned("epoch abandoned by the console before rank 0 served") from None
            if time.monotonic() > deadline:
                raise dist.DistNetworkError(
                    f"rank 0's store at {host}:{port} was not served in time ({e})"
                ) from None
        time.sleep(SERVED_POLL_S)


@contextlib.contextmanager
def _gloo_bound_to(rv: Rendezvous, warn: Warn, *, gloo: bool = False) -> Iterator[None]:
    """Gloo binds to wherever this machine's hostname resolves, and to loopback when that address
    is not here (a network namespace): bind it to the interface holding this member's own data
    address instead, for the groups' creation only (gloo reads the variable then). ``gloo``: a
    gloo group is made whatever the backend."""
    uses_gloo = rv.backend == "gloo" or gloo
    if not uses_gloo or GLOO_IFNAME in os.environ or _is_loopback(rv.address):
        yield
        return
    name = interface_of(rv.address)
    if name is None:
        warn(f"data address {rv.address} is on no interface here; gloo picks its own")
        yield
        return
    os.environ[GLOO_IFNAME] = name
    try:
        yield
    finally:
        os.environ.pop(GLOO_IFNAME, None)


def _ips(address: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """An address literal, or what a host name resolves to (the resolver's own timeouts)."""
    host = address.strip("[]").split("%")[0]
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}


def _is_loopback(address: str) -> bool:
    ips = _ips(address)
    return bool(ips) and all(ip.is_loopback for ip in ips)


def interface_of(address: str) -> str | None:
    """The network interface that holds ``address`` (IPv4 or IPv6), or None."""
    wanted = _ips(address)
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(a.address.split("%")[0]) in wanted:
                    return name
    return None
