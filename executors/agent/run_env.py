"""The run's identity in the training's environment: one run across restarts and failovers.

Experiment trackers continue a run when told its id (``wandb.init(id=..., resume="allow")``,
MLflow's ``run_id``, a TensorBoard log dir), so every start of a job gets the same
``HOTSPARE_RUN_ID`` (kept by the console), with ``HOTSPARE_JOB``, ``HOTSPARE_EPOCH`` (rises
at each start) and ``HOTSPARE_RESUMED_FROM_STEP``: the step of the checkpoint this start
restored, ``0`` on a fresh start (as the ``{step}`` placeholder). ``HOTSPARE_RUN_ID`` is ""
when the executor was started without a console (``hotspare-executor run``).

A command gets them in its environment. The torch kind sets them in the executor's own
environment: the first three before the workload's module is imported and its factory runs,
``HOTSPARE_RESUMED_FROM_STEP`` once the checkpoint has loaded, before the first step (a
factory does not see it).
"""

from __future__ import annotations

import os

from executors.agent.control import Control

RUN_ID = "HOTSPARE_RUN_ID"
JOB = "HOTSPARE_JOB"
EPOCH = "HOTSPARE_EPOCH"
RESUMED_FROM_STEP = "HOTSPARE_RESUMED_FROM_STEP"
NAMES = frozenset({RUN_ID, JOB, EPOCH, RESUMED_FROM_STEP})
"""What changes between runs of one job (a warm command's zygote is not remade for them)."""


def run_env(job: str, control: Control, resumed_from: int) -> dict[str, str]:
    """The variables of this start of ``job``."""
    return {
        RUN_ID: control.run_id,
        JOB: job,
        EPOCH: str(control.epoch),
        RESUMED_FROM_STEP: str(resumed_from),
    }


def export(job: str, control: Control) -> None:
    """Into this process's environment, before an in-process workload (the torch kind) is
    imported and built; the resumed-from step is unknown until its checkpoint has loaded."""
    os.environ.update({RUN_ID: control.run_id, JOB: job, EPOCH: str(control.epoch)})
    os.environ.pop(RESUMED_FROM_STEP, None)


def export_resumed(step: int) -> None:
    """The checkpoint has loaded (``step``; 0: a fresh start): before the first step."""
    os.environ[RESUMED_FROM_STEP] = str(step)
