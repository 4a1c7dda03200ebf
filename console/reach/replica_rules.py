"""Which files of a spare's replica folder stay, and whether a copy fits: one source for both sides.

The console applies these rules itself on a host it reaches cheaply (a local folder), and
ships this very file, as text, at the head of the program that receives a replica on an SSH
host (``replica_receiver.py``), so the two can never disagree. Hence: the standard
library only, and nothing newer than the oldest Python a host may run.
"""

from __future__ import annotations

import re

REPLICA_NAME = re.compile(r"step-(\d{10})\.(pt|json)(\.part)?")


def survey(names: list[str]) -> tuple[list[int], list[str]]:
    """Steps of the complete replicas in a folder (oldest first), and the leftovers of copies
    that did not finish (parts, data without its manifest, a manifest without its data)."""
    found: dict[int, set[str]] = {}
    for name in names:
        match = REPLICA_NAME.fullmatch(name)
        if match is not None:
            found.setdefault(int(match.group(1)), set()).add(name)
    complete: list[int] = []
    leftovers: list[str] = []
    for step, have in sorted(found.items()):
        whole = {f"step-{step:010d}.pt", f"step-{step:010d}.json"}
        if whole <= have:
            complete.append(step)
            leftovers += sorted(have - whole)
        else:
            leftovers += sorted(have)
    return complete, leftovers


def split_older(complete: list[int], step: int, keep: int) -> tuple[list[int], list[int]]:
    """The complete replicas older than ``step``: those to retire, and the ``keep`` newest
    that stay (oldest first)."""
    older = [s for s in complete if s < step]
    cut = max(len(older) - keep, 0)
    return older[:cut], older[cut:]


def keep_before(replicas_kept: int) -> int:
    """Older replicas a copy leaves in place while it runs: never the newest complete one."""
    return max(replicas_kept - 1, 1)


def keep_after(replicas_kept: int) -> int:
    """Older replicas that stay once the copy is complete: with it, ``replicas_kept`` in all."""
    return replicas_kept - 1


def blocks(n: int, block: int) -> int:
    """Bytes a file of ``n`` bytes takes on disk: whole blocks."""
    return -(-n // block) * block


def room(size: int, manifest_bytes: int, block: int, floor: int) -> tuple[int, int]:
    """What a copy needs on the spare's disk, and what must stay free beside it: the
    ``floor`` (min_free_disk_gb), and at least room for one more checkpoint (a promoted
    spare writes its next one before pruning)."""
    need = blocks(size, block) + blocks(manifest_bytes, block)
    return need, max(floor, blocks(size, block))


def step_stem(step: int) -> str:
    return f"step-{step:010d}"
