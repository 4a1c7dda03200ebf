"""The torch kind's built-in workloads, as both sides know them: each name, and the schema of
its ``[config]`` table.

The console checks a job against this before anything starts (``hotspare check`` and ``run``):
a misspelt workload or config key is one line there, not a failure on the host seconds later.
It imports no torch, so the console can. A ``"module:factory"`` workload is the host's to
resolve; its config is its own.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from protocol.config import _key_path, convert, find_line
from protocol.errors import ConfigError

T = TypeVar("T")


class CharLMConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``charlm``: a small character-level transformer language model."""

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 64
    dropout: float = 0.1
    global_batch: int = 16
    micro_batch: int | None = None
    """Defaults to the global batch (no accumulation)."""
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 20
    decay_steps: int = 2000
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    corpus: str = "builtin"
    """``builtin`` (generated text) or the path of a UTF-8 text file on the host."""
    corpus_chars: int = 200_000

    def __post_init__(self) -> None:
        """What the workload's build refuses, said before it is built."""
        if self.n_head <= 0 or self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        micro = self.micro_batch or self.global_batch
        if micro <= 0 or self.global_batch <= 0 or self.global_batch % micro:
            raise ValueError(
                f"micro_batch {micro} must be positive and divide global_batch {self.global_batch}"
            )


BUILTIN_WORKLOADS: dict[str, type[msgspec.Struct]] = {"charlm": CharLMConfig}
"""Built-in workload name -> its config schema (the executor's ``executors.kinds.torch.workload.BUILTIN``
names the same ones; ``tests/console/test_check_jobs.py`` holds the two together)."""


def is_factory(workload: str) -> bool:
    """``"module:factory"``: a workload the host imports, not one of the built-in names."""
    module, sep, attr = workload.partition(":")
    return bool(sep and module and attr)


def unknown_workload(workload: str) -> str:
    """The one line saying ``workload`` is neither built in nor ``module:factory``."""
    guess = difflib.get_close_matches(workload, BUILTIN_WORKLOADS, n=1)
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    return (
        f"unknown workload {workload!r}{hint}; built in: {', '.join(sorted(BUILTIN_WORKLOADS))},"
        " or give 'module:factory'"
    )


def convert_config(config: dict[str, Any], tp: type[T]) -> T:
    """A workload's ``[config]`` table as a typed record; errors name the key under ``config.``."""
    try:
        return msgspec.convert(config, tp)
    except msgspec.ValidationError as e:
        text = str(e).replace("`$.", "`config.").replace("`$`", "`config`")
        raise ConfigError(f"config: {text}") from None


def check_workload(
    executor: str,
    workload: str,
    config: dict[str, Any],
    *,
    file: Path | None = None,
    text: str = "",
    keys: Sequence[str] = (),
) -> None:
    """A built-in workload's name and ``[config]``, refused as the workload's build would
    refuse them, with no torch imported: the console as the inventory loads (``file``,
    ``text`` and ``keys``: the error names ``FILE:LINE: jobs.NAME.config...``), and an
    executor told to run a job, which said a typo only after seconds of importing torch. A
    kind other than ``torch`` and a ``"module:factory"`` workload are the host's to judge."""
    if executor != "torch" or is_factory(workload):
        return
    schema = BUILTIN_WORKLOADS.get(workload)
    if schema is None:
        if file is None:
            raise ConfigError(f"workload: {unknown_workload(workload)}")
        where = [*keys, "workload"]
        line = find_line(text, where)
        at = f"{file}:{line}" if line else str(file)
        raise ConfigError(f"{at}: {_key_path(where)}: {unknown_workload(workload)}")
    if file is None:
        convert_config(config, schema)
    else:
        convert(config, schema, file=file, text=text, prefix=[*keys, "config"])


__all__ = [
    "BUILTIN_WORKLOADS",
    "CharLMConfig",
    "check_workload",
    "convert_config",
    "is_factory",
    "unknown_workload",
]
