"""The light health probe: one Health sample from a host no executor reports on (a spare, an
idle host), taken by ``hotspare-executor health`` from the deployed bundle. It imports no
torch, so it costs a fraction of a second of one core, however often it runs.
"""

from __future__ import annotations

import posixpath

import msgspec

from console.reach.deploy import MARKER, build_bundle, bundle_dir, deploy, executor_command
from console.reach.transport.base import Transport, TransportError
from protocol.errors import HotspareError
from protocol.messages import Health

_decode = msgspec.json.Decoder(Health)


class HealthProbeFailed(HotspareError):
    """The probe gave no sample; ``str()`` is one line saying why (the host's own words where
    it had some). Temporary by nature: the next probe tries again."""

    permanent = False


class NotDeployed(HealthProbeFailed):
    """No bundle on the host, and this console may not deploy one: nothing is known, nothing
    is wrong."""


async def probe_health(
    t: Transport,
    *,
    root: str,
    python: str,
    timeout: float,
    env: dict[str, str] | None = None,
    may_deploy: bool = True,
) -> Health:
    """One sample of the host, measured on the filesystem of its ``root``.

    The bundle is deployed first when missing (once per code version; an idle host gets what a
    failover would deploy anyway) unless ``may_deploy`` is off (a read-only console writes
    nothing): then a host without it is a failed probe. Every call is bounded by ``timeout``.
    """
    try:
        await t.connect()
        if may_deploy:
            bundle = (await deploy(t, root, python)).path
        else:
            bundle = bundle_dir(root, build_bundle())
            if await t.stat(posixpath.join(bundle, MARKER), timeout=timeout) is None:
                raise NotDeployed("the executor bundle is not deployed there yet")
        argv, base = executor_command(python, bundle, ["health", "--workdir", root, "--json"])
        result = await t.run(argv, timeout=timeout, env={**base, **(env or {})})
    except TransportError as e:
        raise HealthProbeFailed(str(e)) from None
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise HealthProbeFailed(f"health probe exited with {result.returncode}: {tail[-200:]}")
    lines = result.stdout.strip().splitlines()
    try:
        return _decode.decode(lines[-1])
    except (IndexError, msgspec.DecodeError):
        raise HealthProbeFailed(
            f"health probe printed no Health sample: {result.stdout.strip()[-200:]!r}"
        ) from None
