"""The Textual operator console: a view of a controller.

``hotspare`` attaches to the controller that holds the inventory's state dir (``hotspare
serve``, ``hotspare run``, or one an earlier ``hotspare`` started); with none running it starts
one detached first, as tmux starts its server. Quitting the view leaves training to the
controller; ``hotspare stop`` ends it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from console.inventory import Inventory
from console.supervise.policy import Policy
from protocol.errors import ConfigError

if TYPE_CHECKING:
    from console.reach.transport.ssh_dial import SshTarget
    from console.service.tunnel import ControllerAt, ControllerTunnel


@dataclass(frozen=True)
class Attach:
    """A controller on another machine (``--attach``) and how to dial it."""

    at: ControllerAt
    target: SshTarget


ANSWER_S = 10.0
"""How long a view waits for a controller that holds the state dir to answer on its socket
(one that is starting binds it a moment after it takes the lock)."""


def run_tui(
    inv: Inventory,
    policy: Policy,
    *,
    read_only: bool,
    policy_given: bool,
    attach: Attach | None = None,
) -> int:
    """Open a view on ``inv``'s controller (started detached if none runs and the view acts),
    or on the controller ``attach`` names on another machine."""
    if attach is not None:
        return _remote(inv, policy, attach, read_only=read_only, policy_given=policy_given)
    hello = _controller(inv, policy, read_only=read_only)
    return _view(inv, policy, hello, read_only=read_only, policy_given=policy_given)


def _view(
    inv: Inventory,
    policy: Policy,
    hello: dict[str, Any] | None,
    *,
    read_only: bool,
    policy_given: bool,
    via: ControllerTunnel | None = None,
) -> int:
    from console.controller import Controller
    from console.service.attach import Attachment
    from console.ui.app import HotspareApp

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
        at = inv.state_dir if via is None else via.local
        attached = Attachment(at, hello, acting=not read_only, via=via)
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
    answered = _answer(inv.state_dir)
    if answered is None and not read_only:
        raise ConfigError(
            f"{inv.state_dir}: a console holds this state dir but does not answer on its "
            "control socket (an older release?); `hotspare --read-only` can watch beside it"
        )
    return answered


def _remote(
    inv: Inventory, policy: Policy, attach: Attach, *, read_only: bool, policy_given: bool
) -> int:
    """A view on another machine's controller: its socket and state files over SSH; the hosts
    watched from here, with this inventory's transports, as any view watches them."""
    from console.service.tunnel import ControllerTunnel, TunnelError

    tunnel = ControllerTunnel(attach.at, attach.target)
    try:
        try:
            tunnel.open(attach.target.connect_timeout * 3)
        except TunnelError as e:
            print(f"hotspare: --attach {attach.at}: {e}", file=sys.stderr)
            return 1
        hello = _answer(tunnel.local)
        if hello is None:
            print(
                f"hotspare: --attach {attach.at}: no controller answers on "
                f"{attach.at.state_dir}/control.sock (is `hotspare serve` running there?)",
                file=sys.stderr,
            )
            return 1
        console = msgspec.structs.replace(inv.console, state_dir=str(tunnel.state_dir))
        mirrored = dataclasses.replace(inv, console=console)
        return _view(
            mirrored, policy, hello, read_only=read_only, policy_given=policy_given, via=tunnel
        )
    finally:
        tunnel.close()


def _answer(state_dir: Path) -> dict[str, Any] | None:
    from console.service.client import ControllerGone, Remote

    remote = Remote(state_dir)
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
