"""Failure detection rules, as pure functions of time: no false failover on a blip.

A host is suspect only after a time window *and* a count of missed heartbeats; it is down
only once its lease has surely ended (the console's send time + ttl + clock skew).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DetectionSettings:
    heartbeat_s: float
    missed_heartbeats: int
    suspect_after_s: float
    lease_s: float
    clock_skew_s: float


def is_suspect(now: float, last_seen: float, s: DetectionSettings) -> bool:
    silence = now - last_seen
    return silence >= s.suspect_after_s and silence >= s.missed_heartbeats * s.heartbeat_s


def renew_every(s: DetectionSettings) -> float:
    """Renew three times per lease, so two lost renewals do not end it."""
    return s.lease_s / 3
