"""Who acts on an incident: the policy. Recovery strategies are chosen by name; unknown names list the valid ones."""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    MANUAL = "manual"
    """Failovers wait for an operator's approval; restarts in place and planned moves go ahead."""
    AUTO = "auto"
    """Act without asking, including proactive moves off a host with a GPU WARN."""
    OBSERVE = "observe"
    """Never act, only alert: every recovery waits for an operator (``approval.approved``), a
    failing GPU drains nothing (``gpu_health``); an operator's own drain still moves the job."""

    @classmethod
    def parse(cls, name: str) -> Policy:
        try:
            return cls(name)
        except ValueError:
            raise ValueError(
                f"unknown policy {name!r}; choose one of: {', '.join(p.value for p in cls)}"
            ) from None


class Decision(StrEnum):
    ACT = "act"
    ASK = "ask"
    """Wait for an operator's approval."""
    ALERT = "alert"
    """Do nothing but alert."""


def decide(policy: Policy, *, failover: bool, operator: bool = False) -> Decision:
    """``failover``: the action moves a job to another host; ``operator``: an operator asked for it."""
    if operator:
        return Decision.ACT
    if policy is Policy.OBSERVE:
        return Decision.ALERT
    if policy is Policy.MANUAL and failover:
        return Decision.ASK
    return Decision.ACT
