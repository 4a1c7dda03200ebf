"""The journal as the console reads it back: recent events by job and host, and incidents.

A restarted console sees what happened before it, read once at start: every incident event
(there are few, picked out of the file without decoding the rest) and the recent events of
the journal's last ``TAIL_BYTES``, so startup does not grow with a journal months long.
After that, events arrive as they are recorded. Memory is bounded: the newest events per job
and per host, and every incident event.
"""

from __future__ import annotations

from collections import defaultdict, deque

from console.records.incidents import Incident, incidents
from console.records.journal import TAIL_BYTES, Event, Journal, Kind, read

PER_KEY = 500
"""Events kept per job and per host."""
QUIET = frozenset({Kind.PROGRESS})
"""Kinds too frequent to be worth keeping in a timeline."""


class Timeline:
    def __init__(self, journal: Journal) -> None:
        self._by_job: defaultdict[str, deque[Event]] = defaultdict(lambda: deque(maxlen=PER_KEY))
        self._by_host: defaultdict[str, deque[Event]] = defaultdict(lambda: deque(maxlen=PER_KEY))
        self._incidents: list[Incident] | None = None
        self._incident_events: list[Event] = list(read(journal.path, kinds=(Kind.INCIDENT,)))
        for event in read(journal.path, tail_bytes=TAIL_BYTES):
            self._add_recent(event)
        journal.subscribe(self.add)

    def add(self, e: Event) -> None:
        self._add_recent(e)
        if e.kind is Kind.INCIDENT:
            self._incident_events.append(e)
            self._incidents = None

    def _add_recent(self, e: Event) -> None:
        if e.kind in QUIET:
            return
        if e.job:
            self._by_job[e.job].append(e)
        if e.host:
            self._by_host[e.host].append(e)

    def for_job(self, job: str, n: int = PER_KEY) -> list[Event]:
        """The newest ``n`` events of one job, oldest first."""
        return list(self._by_job.get(job, ()))[-n:]

    def for_host(
        self, host: str, kinds: frozenset[Kind] | None = None, n: int = PER_KEY
    ) -> list[Event]:
        """The newest ``n`` events about one host (of ``kinds``, if given), oldest first."""
        found = [e for e in self._by_host.get(host, ()) if kinds is None or e.kind in kinds]
        return found[-n:]

    def incidents(self, job: str | None = None) -> list[Incident]:
        """Every incident (of ``job``, if given) rebuilt from its events, oldest first."""
        if self._incidents is None:
            self._incidents = incidents(self._incident_events)
        return [i for i in self._incidents if job is None or i.job == job]

    def incident(self, n: int) -> Incident | None:
        return next((i for i in self.incidents() if i.id == n), None)
