"""Checkpoint layouts by framework name: ``[command] layout = "nanogpt"`` stands for the keys
that script's checkpoints and output need, in one place.

A layout only fills keys the table leaves out (a key written in the table wins), and it sets
nothing about ``argv``: the script still needs its own flags that point it at
``{checkpoint_dir}`` and ``{resume_from}`` (each layout's ``argv`` note says which). It is
expanded when a job table is read (``expand``), before the table becomes a ``CommandSpec``,
so every later reader (the executor, the console, ``hotspare check``) sees plain keys.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, NamedTuple

from protocol.config import _key_path, find_line
from protocol.errors import ConfigError


class Layout(NamedTuple):
    keys: dict[str, Any]
    """What it sets (where the table does not)."""
    argv: str
    """What the script's own argv needs, for the docs and the error of a bad layout."""


LAYOUTS: dict[str, Layout] = {
    "nanogpt": Layout(
        {
            "checkpoint_file": "ckpt.pt",
            "resume_argv": ["--init_from=resume"],
            "progress_regex": r"iter (?P<step>\d+): loss (?P<loss>[0-9.]+)",
        },
        'karpathy/nanoGPT train.py: "--out_dir={checkpoint_dir}" (ckpt.pt rewritten in place, '
        "resumed by --init_from=resume from that fixed path)",
    ),
    "lightning": Layout(
        {"checkpoint_glob": "*step=*.ckpt", "step_regex": r"step=(?P<step>\d+)"},
        "PyTorch Lightning ModelCheckpoint(dirpath=...) with its default file names "
        "(epoch=E-step=S.ckpt; last.ckpt is not one): dirpath {checkpoint_dir}, and "
        "trainer.fit(..., ckpt_path={resume_from})",
    ),
    "hf_trainer": Layout(
        {
            "checkpoint_glob": "checkpoint-*",
            "step_regex": r"checkpoint-(?P<step>\d+)$",
            "complete_marker": "trainer_state.json",
        },
        "Hugging Face Trainer: output_dir {checkpoint_dir} (checkpoint-N/ folders, each "
        "complete once its trainer_state.json, which Trainer._save_checkpoint writes last, is "
        "there and closed), and trainer.train(resume_from_checkpoint={resume_from})",
    ),
    "torchtitan": Layout(
        {
            "checkpoint_glob": "step-*",
            "step_regex": r"step-(?P<step>\d+)$",
            "complete_marker": ".metadata",
            "progress_regex": r"step:\s*(?P<step>\d+)\s.*?loss:\s*(?P<loss>[0-9.]+)",
        },
        "torchtitan (torch.distributed.checkpoint): its checkpoint folder at {checkpoint_dir} "
        "(step-N/ folders, complete once DCP wrote .metadata); it resumes from the newest "
        "step-N/ there by itself",
    ),
}


def expand(table: dict[str, Any], *, file: Path, text: str, keys: list[str]) -> dict[str, Any]:
    """``table`` (a job's, as read) with its ``command.layout`` filled in; ConfigError naming
    the file, line and key for a layout that is not one of ``LAYOUTS``."""
    command = table.get("command")
    if not isinstance(command, dict) or "layout" not in command:
        return table
    name = command["layout"]
    layout = LAYOUTS.get(name) if isinstance(name, str) else None
    if layout is None:
        where = [*keys, "command", "layout"]
        line = find_line(text, where)
        guess = difflib.get_close_matches(str(name), LAYOUTS, n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise ConfigError(
            f"{file}:{line or '?'}: {_key_path(where)}: {name!r} is not a layout{hint}; "
            f"known: {', '.join(sorted(LAYOUTS))}"
        )
    if "checkpoint_file" in command:  # one file in place: the glob-and-step keys do not apply
        filled = {
            k: v for k, v in layout.keys.items() if k not in ("checkpoint_glob", "step_regex")
        }
    else:
        filled = dict(layout.keys)
    return {**table, "command": {**filled, **command}}


__all__ = ["LAYOUTS", "Layout", "expand"]
