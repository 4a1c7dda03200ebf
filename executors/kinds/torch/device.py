"""The torch device the step loop trains on: which one, its deterministic kernels, and how an
out-of-memory error from it looks."""

from __future__ import annotations

import os

import torch


def pick_device(name: str | None = None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_deterministic(device: torch.device) -> None:
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic kernels, but no NaN-filling of every torch.empty: that fill cost ~18% of
    # the steps/s of a small charlm on CPU (benchmarks/executor_overhead.py), and results of
    # ops that never read uninitialised memory are the same either way.
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e)
    )
