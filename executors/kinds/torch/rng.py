"""Every RNG a training step may draw from, captured and restored for bit-exact resume.

States are stored as tensors, ints and tuples only, so a checkpoint loads with weights_only=True.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    """Set every RNG as ``capture`` found it. The states are taken to the CPU first: a
    checkpoint loaded with ``map_location`` a GPU brings its byte tensors there, and torch's
    setters take CPU ByteTensors only (a CUDA run resumed from its own checkpoint crashed:
    "RNG state must be a torch.ByteTensor", found on an H100, tests/gpu/test_cuda_resume.py)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derived_seed(*parts: int) -> int:
    """A seed that is a stable function of ``parts`` (sha256, the same on every host and run):
    an elastic job seeds each logical rank's share of a step from (seed, logical rank, data
    position), so its dropout does not depend on which host runs it or on the world size."""
    digest = hashlib.sha256("/".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def params_sha256(model: torch.nn.Module) -> str:
    """sha256 over every parameter (name, dtype, shape, bytes), in name order."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
