"""One root for every error hotspare raises, and each one says whether retrying can help.

The classes are found, not listed: every module of the three packages is imported and every
exception class defined there is checked, so a new error that forgot the root (or forgot to
say permanent or temporary) fails here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from protocol.errors import ConfigError, HotspareError, ProtocolError, retryable

OUTSIDE = {
    "executors.testing.gpu_fake.NVMLError": "stands in for pynvml's own NVMLError, which callers catch",
    "executors.kinds.command.zygote_server.Become": "control flow of a forked child (a BaseException)",
}
"""Exception classes deliberately outside the root, and why."""

HOST_PROGRAMS = "console.reach.host."
"""Programs run on a host from their source alone (standard library only): their errors never
leave them."""


def exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in ("protocol", "executors", "console"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.startswith(HOST_PROGRAMS) or info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == info.name
                ):
                    found[f"{info.name}.{name}"] = obj
    return found


def test_every_error_of_the_packages_has_the_one_root_and_says_if_retrying_helps() -> None:
    found = exception_classes()
    assert len(found) > 30, sorted(found)  # the walk found the packages' errors
    outside = sorted(n for n, c in found.items() if not issubclass(c, HotspareError))
    assert outside == sorted(OUTSIDE), "errors outside the root (add it, or say why not)"
    unsaid = sorted(
        n
        for n, c in found.items()
        if issubclass(c, HotspareError)
        and c is not HotspareError
        and not isinstance(getattr(c, "permanent", None), bool)
    )
    assert unsaid == [], "errors that do not say permanent or temporary"


@pytest.mark.parametrize(
    ("name", "permanent"),
    [
        ("protocol.errors.ConfigError", True),
        ("protocol.errors.ProtocolError", True),
        ("console.reach.transport.base.TemporaryTransportError", False),
        ("console.reach.transport.base.PermanentTransportError", True),
        ("console.replication.replica.SpareDiskFull", True),
        ("console.fleet.link.LinkError", False),
        ("console.records.state_store.Unsaved", False),
        ("console.supervise.refusal.Refused", True),
        ("executors.fencing.publish.Fenced", True),
        ("executors.fencing.publish.CorruptCheckpoint", True),
        ("executors.agent.workdir.WorkdirBusy", False),
    ],
)
def test_what_each_error_says_is_what_its_callers_do(name: str, permanent: bool) -> None:
    """The transport's temporary errors are the ones retried with backoff, a refused order or
    a bad config is reported at once, a busy workdir is waited for."""
    cls = exception_classes()[name]
    assert issubclass(cls, HotspareError) and cls.permanent is permanent


def test_retryable_is_a_temporary_hotspare_error_only() -> None:
    from console.fleet.link import LinkError

    assert retryable(LinkError("dropped"))
    assert not retryable(ConfigError("inventory.toml: bad"))
    assert not retryable(ProtocolError("garbage"))
    assert not retryable(OSError("not ours: never assumed worth retrying"))
