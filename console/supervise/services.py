"""What a job's supervisor uses of the fleet-wide controller, and nothing more.

The controller builds one ``JobServices`` and hands it to every supervisor (one host or a
group): the fleet's shared records (inventory, hosts, journal, state, incidents, replicas),
settings read at the start, and the few fleet-wide decisions a job asks for (which spares other
jobs hold, take a spare from a lower-priority job, wait for or provision a host, tell the
fleet a step was trained). A supervisor can be built without a controller from these alone,
and what it may reach is written here rather than found by reading its body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from console.fleet.detect import DetectionSettings
from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.records.incidents import IncidentLog
from console.records.journal import Journal
from console.records.state_store import StateStore
from console.replication.replicator import Replicator
from console.supervise.launcher import CleanUps
from console.supervise.live import Alert
from console.supervise.policy import Policy
from protocol.messages import Progress

if TYPE_CHECKING:
    from console.supervise.supervisor import Supervisor


class TakeSpare(Protocol):
    def __call__(self, host: str, from_job: str, *, by: str) -> None: ...


@dataclass(frozen=True)
class JobServices:
    inv: Inventory
    fleet: Fleet
    journal: Journal
    store: StateStore
    incidents: IncidentLog
    replicator: Replicator
    detection: DetectionSettings
    read_only: bool
    """A watching console's: it launches, grants and decides nothing."""
    console_id: str
    term: int
    """The leader's term, said to every executor (``console/service/leader.py``)."""
    executor_env: dict[str, dict[str, str]]
    """Extra environment for executors per host (test hooks)."""
    policy: Callable[[], Policy]
    """The policy now (an operator may change it while jobs run)."""
    alert: Alert
    alerted: Callable[[str], bool]
    reserved: Callable[[str], dict[str, str]]
    """Spares other live jobs hold (host -> job), for the job named."""
    priorities: Callable[[], dict[str, int]]
    take_spare: TakeSpare
    """Take a spare from a lower-priority job (journalled and alerted)."""
    need_host: Callable[[str], None]
    """A job needs a host and none is usable: provision one where the inventory can."""
    wait_for_hosts: Callable[[], Awaitable[None]]
    on_progress: Callable[[Supervisor, Progress], None]
    """A step was trained (the fleet's progress sinks, its rates)."""
    cleanups: CleanUps = field(default_factory=CleanUps)
    """Clean-ups that outlive a job's tasks; the console waits for them before it closes."""
