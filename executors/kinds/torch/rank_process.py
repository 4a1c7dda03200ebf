"""A follower: local rank K > 0 of a host, started by local rank 0 for one run
(``executors.kinds.torch.local_ranks``), given its ``RankOrder`` on stdin (its command line's
``--workdir`` and ``--local-rank`` only say what it trains, for ``ps`` and /proc).

It trains the same step loop as local rank 0 (``Trainer`` with ``local_rank``), dies with its
parent (first thing, before torch is imported), ignores SIGINT and SIGTERM (a stop reaches it
through the step boundary's agreement), and says its faults and warnings on stderr (its log);
what the console sees is local rank 0's account. Exit 0 when its run ended as local rank 0's
did (finished or stopped), else the run's exit code (1 for a crash, its traceback logged).
"""

from __future__ import annotations

import signal
import sys
import traceback


def main() -> int:
    import msgspec

    from executors.fencing.fence import die_with_parent
    from executors.kinds.torch.local_ranks import RankOrder

    order = msgspec.json.decode(sys.stdin.buffer.read(), type=RankOrder)
    if not die_with_parent(order.parent):
        print(f"local rank {order.local_rank}: its executor is gone already", file=sys.stderr)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    from executors.threadname import name_os_thread

    name_os_thread("hotspare-train")  # as local rank 0's training thread is named
    from pathlib import Path

    import torch

    from executors import exitcodes
    from executors.agent.control import Control
    from executors.kinds.torch.trainer import Trainer
    from protocol.messages import ExecutorMessage, Fault, Log

    def say(msg: ExecutorMessage) -> None:
        if isinstance(msg, (Fault, Log)):
            text = msg.message if isinstance(msg, Fault) else msg.text
            print(f"local rank {order.local_rank}: {text}", file=sys.stderr, flush=True)

    control = Control(epoch=order.epoch, rendezvous=order.rendezvous, run_id=order.run_id)
    trainer = Trainer(
        order.spec,
        Path(order.workdir),
        say,
        control=control,
        device=torch.device(order.device),
        local_rank=order.local_rank,
    )
    outcome = trainer.run()
    return 0 if outcome.exit_code in (exitcodes.OK, exitcodes.STOPPED) else outcome.exit_code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - the log is where a follower's crash is read from
        traceback.print_exc()
        sys.exit(1)
