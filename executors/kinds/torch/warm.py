"""What an idle torch executor (a spare waiting for Start) does meanwhile, on its own thread:
warm torch up, then keep the newest checkpoint read and verified for the load after Start
(``TorchIdle``, the torch kind's ``executors.kinds.Idle``)."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil

from executors.fencing.publish import read_ahead

READ_AHEAD_EVERY_S = 0.2
READ_AHEAD_SHARE = 4
"""A checkpoint is read ahead only if it takes at most 1/4 of the memory available."""


def read_ahead_until(started: threading.Event, folder: Path) -> None:
    """Until Start: keep the newest checkpoint of ``folder`` read and verified (a failover
    target's replica lands there while the old lease runs out), so the load after Start takes
    it from memory (``executors.checkpoints.verified``)."""
    while not started.is_set():
        read_ahead(folder, psutil.virtual_memory().available // READ_AHEAD_SHARE)
        started.wait(READ_AHEAD_EVERY_S)


def warm_up(over: threading.Event, repeat_s: float = 0.0) -> None:
    """While idle (a spare waiting for Start): import the training code and run torch once.

    The first forward/backward/optimizer step of a process pays for lazy kernel setup; paying
    it before Start takes it off a failover's critical path. ``repeat_s`` (a test hook,
    ``slow_warmup@S``) keeps torch busy that long after, unless ``over`` is set first.
    """
    import time

    import torch

    import executors.checkpoints.checkpoint
    import executors.kinds.torch.trainer
    import executors.kinds.torch.workloads.charlm  # noqa: F401

    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))
    opt = torch.optim.AdamW(model.parameters())
    loss = torch.nn.functional.cross_entropy(
        model(torch.zeros(2, 8, dtype=torch.long)).reshape(-1, 64),
        torch.zeros(16, dtype=torch.long),
    )
    loss.backward()
    opt.step()
    if repeat_s > 0:  # the test hook: torch kept busy in its kernels, as a slow warm-up is
        busy, until = torch.nn.Linear(256, 256), time.monotonic() + repeat_s
        while not over.is_set() and time.monotonic() < until:
            busy(torch.randn(64, 256)).sum().backward()


class TorchIdle:
    """The torch kind's idle work (``executors.kinds.Idle``)."""

    def before_serving(self) -> None:
        """Import torch before serving, not only on the warm-up thread: the import holds the GIL
        for seconds at a time on a loaded machine (loading the library: 1.3 s at load 18 on 2
        cores, 3.7 s with two more busy loops), and on that thread it silenced the heartbeats of
        an executor already Started, past its lease (a group's members killed as hung 2 s into
        their first epoch). Before the socket exists no console holds a lease on it; what a
        run imports lazily is imported here too (``dist.import_ahead``)."""
        from executors.kinds.torch.dist import import_ahead

        import_ahead()

    def warm_up(self, over: threading.Event, repeat_s: float) -> None:
        warm_up(over, repeat_s)

    def until_started(self, started: threading.Event, workdir: Path) -> None:
        read_ahead_until(started, workdir / "checkpoints")
