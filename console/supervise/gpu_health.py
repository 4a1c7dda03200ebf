"""What a host's GPU health asks of the job on it, the same for a single host's job and a
group's member: a FAIL finding (lost GPU, uncorrectable ECC, a fatal XID) drains the host and
moves the job (or the member's rank) off it; a warning (throttle, temperature, PCIe replays)
in ``WARN_IN_A_ROW`` samples in a row moves it off under the auto policy, the host kept,
where a fit host is free to take it (else it trains on, slower, and the journal says why: a
warning is no reason to stop training).

Under the observe policy a FAIL is alerted once per streak, and nothing is drained or moved
(it drained the host and moved the job, acting where the policy says it only alerts).

Found in the merge of the two message paths (issue 30): a group's member whose GPU warned
sample after sample was never moved; only a single host's job was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from console.fleet.hosts import Fleet
from console.records.journal import Kind
from console.states import HostState
from console.supervise.policy import Policy
from protocol.faults import StopReason
from protocol.messages import Health

WARN_IN_A_ROW = 5
"""Health samples in a row with a GPU warning before the job is moved: one is a blip."""
WARN_RULES = ("throttle", "temperature", "pcie_replays")


@dataclass(frozen=True)
class GpuCall:
    move: StopReason
    """``GPU_FAIL`` (the host is drained too) or ``MIGRATE`` (a warning in every one of the
    last ``WARN_IN_A_ROW`` samples: auto policy only, a fit host free)."""
    why: str
    """The findings, as the alert and the incident say them."""
    acts: bool = True
    """False under the observe policy: the call is alerted, and nothing is drained or moved."""

    def said(self, host: str) -> str:
        word = "GPU FAIL" if self.move is StopReason.GPU_FAIL else "GPU WARN"
        return f"{word} on {host}: {self.why}"


class GpuWatch:
    """Each host's Health samples into the fleet, and what they ask of the job."""

    def __init__(self, fleet: Fleet, policy: Callable[[], Policy], *, acts: bool = True) -> None:
        self._fleet = fleet
        self._policy = policy
        self._acts = acts
        """False for a read-only console: samples are recorded, nothing is asked or journalled."""
        self._warned: dict[str, int] = {}
        """Samples in a row with a GPU warning, by host."""
        self._failing: set[str] = set()
        """Hosts failing now, already said under the observe policy (said once per streak)."""

    def heard(self, host: str, msg: Health) -> GpuCall | None:
        """Record the sample (always: a read-only console shows it too) and say whether the
        job must leave ``host``: a FAIL at every sample; a lasting warning once per streak,
        under the auto policy, where a fit host is free."""
        fleet = self._fleet
        fleet.observe(host, msg)
        failing = fleet.failing(host)
        warns = [f for f in fleet.hosts[host].findings if f.rule in WARN_RULES]
        self._warned[host] = self._warned.get(host, 0) + 1 if warns and not failing else 0
        if not self._acts:
            return None
        if failing:
            why = "; ".join(f.message for f in failing)
            if self._policy() is not Policy.OBSERVE:
                return GpuCall(StopReason.GPU_FAIL, why)
            if host in self._failing:  # "never act, only alert": said once per streak
                return None
            self._failing.add(host)
            return GpuCall(StopReason.GPU_FAIL, why, acts=False)
        self._failing.discard(host)
        if self._warned[host] != WARN_IN_A_ROW or self._policy() is not Policy.AUTO:
            return None
        if not fleet.usable():
            fleet.journal.record(
                Kind.ACTION,
                f"{host}: GPU WARN in {WARN_IN_A_ROW} samples in a row ({warns[0].message}): "
                "no fit host is free to move to; it trains on",
                host=host,
                data={"rule": warns[0].rule, "moved": False},
            )
            return None
        return GpuCall(StopReason.MIGRATE, warns[0].message)

    def mark(self, call: GpuCall, host: str, job: str, leave: dict[str, str]) -> str:
        """What ``call`` does to ``host`` before ``job``'s rank on it is drained, for either
        kind: a FAIL drains the host; a lasting warning marks it to be left by the job
        (``LiveJob.leave``: its planned stop does not restart there). Returns the alert. A
        call that does not act (the observe policy) marks nothing: the caller moves nothing."""
        if not call.acts:
            return f"{call.said(host)}: the observe policy drains nothing; {job} trains on there"
        if call.move is StopReason.GPU_FAIL:
            self._fleet.set_state(host, HostState.DRAINING, f"GPU FAIL: {call.why}")
            return f"{host}: GPU FAIL ({call.why}): draining it and moving {job} off"
        leave[host] = "its GPU warned sample after sample"
        return f"{call.said(host)}: moving {job} off it"
