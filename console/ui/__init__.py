"""The Textual operator console: a view of a controller.

``hotspare`` attaches to the controller that holds the inventory's state dir (``hotspare
serve``, ``hotspare run``, or one an earlier ``hotspare`` started); with none running it starts
one detached first, as tmux starts its server. Quitting the view leaves training to the
controller; ``hotspare stop`` ends it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from console.inventory import Inventory
from console.jobs.policy import Policy
from protocol.errors import ConfigError

ANSWER_S = 10.0
"""How long a view waits for a controller that holds the state dir to answer on its socket
(one that is starting binds it a moment after it takes the lock)."""


def run_tui(inv: Inventory, policy: Policy, *, read_only: bool, policy_given: bool) -> int:
    """Open a view on ``inv``'s controller (started detached if none runs and the view acts)."""
    from console.jobs.controller import Controller
    from console.service.attach import Attachment
    from console.ui.app import HotspareApp

    hello = _controller(inv, policy, read_only=read_only)
    if hello is not None and hello.get("standby"):
        print(
            f"hotspare: this machine's controller (pid {hello.get('pid')}) is "
            f"{hello['standby']}; open the view on the leader's machine",
            file=sys.stderr,
        )
        return 1
    if hello is not None and policy_given and hello.get("policy") != policy.value:
        print(
            f"hotspare: the running controller's policy is {hello.get('policy')}, not "
            f"{policy.value}; `hotspare stop` and start again to change it",
            file=sys.stderr,
        )
    attached = None
    if hello is not None:
        attached = Attachment(inv.state_dir, hello, acting=not read_only)
        policy = Policy.parse(str(hello.get("policy", policy.value)))
    ctl = Controller(inv, policy, read_only=True)
    app = HotspareApp(ctl, freeze_startup=True, attached=attached)
    app.run()
    print(f"hotspare: {app.quit_note}", file=sys.stderr)
    return 0


def _controller(inv: Inventory, policy: Policy, *, read_only: bool) -> dict[str, Any] | None:
    """The hello of the controller to attach to, started detached if none runs (a read-only
    view starts none: None, it watches the state dir alone)."""
    from console.records.console_lock import held
    from console.service.spawn import start_detached

    if not held(inv.state_dir):
        if read_only:
            return None
        try:
            hello = start_detached(inv.path, inv.state_dir, policy.value)
        except ConfigError:
            if not held(inv.state_dir):
                raise
            # another view started one at the same moment: attach to that one
        else:
            print(
                f"hotspare: started a controller (pid {hello['pid']}, policy {policy.value})",
                file=sys.stderr,
            )
            return hello
    answered = _answer(inv)
    if answered is None and not read_only:
        raise ConfigError(
            f"{inv.state_dir}: a console holds this state dir but does not answer on its "
            "control socket (an older release?); `hotspare --read-only` can watch beside it"
        )
    return answered


def _answer(inv: Inventory) -> dict[str, Any] | None:
    from console.service.client import ControllerGone, Remote

    remote = Remote(inv.state_dir)
    deadline = time.monotonic() + ANSWER_S
    try:
        while True:
            try:
                return remote.hello()
            except ControllerGone:
                if time.monotonic() > deadline:
                    return None
            time.sleep(0.1)
    finally:
        remote.close()
