"""A text corpus made on the spot: seeded pseudo-English, so nothing is downloaded at run time."""

from __future__ import annotations

import random

_SUBJECTS = [
    "the operator",
    "a spare host",
    "the console",
    "every executor",
    "the primary",
    "a tired engineer",
    "the scheduler",
    "one replica",
    "the fleet",
    "a new region",
]
_VERBS = [
    "watches",
    "replicates",
    "restores",
    "drains",
    "checkpoints",
    "migrates",
    "verifies",
    "leases",
    "resumes",
    "fences",
]
_OBJECTS = [
    "the newest checkpoint",
    "a stale epoch",
    "the training run",
    "every gradient",
    "the optimizer state",
    "a broken link",
    "the loss curve",
    "a quiet GPU",
    "the data position",
    "its heartbeat",
]
_TAILS = [
    "before dawn",
    "without losing a step",
    "under a higher epoch",
    "in the same region",
    "after the lease ends",
    "while the job keeps going",
    "bit for bit",
    "once more",
]


def make_corpus(chars: int, seed: int = 1234) -> str:
    """About ``chars`` characters of sentences; the same text for the same arguments."""
    rng = random.Random(seed)
    parts: list[str] = []
    n = 0
    while n < chars:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
        if rng.random() < 0.6:
            s += f" {rng.choice(_TAILS)}"
        s = s[0].upper() + s[1:] + rng.choice([". ", ". ", "! ", "? "])
        if rng.random() < 0.1:
            s += "\n"
        parts.append(s)
        n += len(s)
    return "".join(parts)[:chars]
