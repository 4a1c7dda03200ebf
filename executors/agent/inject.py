"""Test hooks: faults injected on purpose, so each recovery path can be exercised for real.

Set ``HOTSPARE_INJECT`` to a comma-separated list; each entry fires once per process (a run
restarted in place runs in the same process, so ``crash@90,crash@91`` is a crash loop):

- ``oom@STEP``      raise an out-of-memory error in the first micro-batch of STEP
- ``oom_late@STEP`` raise it in the last micro-batch of STEP instead, once the ones before it
  have accumulated their gradients (only where STEP accumulates over two or more)
- ``nan@STEP``      make the loss of STEP NaN
- ``slow_write@S``  sleep S seconds in every write call of a checkpoint (to kill inside a write)
- ``crash@STEP``    raise an exception in the workload at STEP (an executor crash)
- ``slow_step@S``   sleep S seconds in every step (a slower machine: paces a run without
  changing what it computes)
- ``slow_warmup@S`` an idle executor's warm-up repeats its torch step for S seconds (or until
  the executor ends), to stop one mid-warm-up

GPU faults come from the fake NVML instead (``HOTSPARE_FAKE_NVML``, see executors.testing.gpu_fake).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from protocol.errors import ConfigError

ENV = "HOTSPARE_INJECT"


@dataclass
class Injections:
    oom: set[int] = field(default_factory=set)
    oom_late: set[int] = field(default_factory=set)
    nan: set[int] = field(default_factory=set)
    crash: set[int] = field(default_factory=set)
    slow_write_s: float = 0.0
    slow_step_s: float = 0.0
    slow_warmup_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Injections:
        inj = cls()
        for raw in filter(None, (p.strip() for p in text.split(","))):
            kind, sep, arg = raw.partition("@")
            try:
                if not sep:
                    raise ValueError
                if kind in ("oom", "oom_late", "nan", "crash"):
                    getattr(inj, kind).add(int(arg))
                elif kind == "slow_write":
                    inj.slow_write_s = float(arg)
                elif kind == "slow_step":
                    inj.slow_step_s = float(arg)
                elif kind == "slow_warmup":
                    inj.slow_warmup_s = float(arg)
                else:
                    raise ValueError
            except ValueError:
                raise ConfigError(
                    f"{ENV}: cannot read {raw!r}; expected oom@STEP, oom_late@STEP, nan@STEP, crash@STEP or "
                    "slow_write@SECONDS, slow_step@SECONDS or slow_warmup@SECONDS"
                ) from None
        return inj

    @classmethod
    def from_env(cls) -> Injections:
        return cls.parse(os.environ.get(ENV, ""))

    def take(self, kind: str, step: int) -> bool:
        """True once for a step listed under ``kind``."""
        steps: set[int] = getattr(self, kind)
        if step in steps:
            steps.discard(step)
            return True
        return False
