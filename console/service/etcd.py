"""etcd v3, as much as standby controllers need, through its JSON gateway (HTTP).

etcd 3.4 (Debian's ``etcd-server``) serves the v3 API as JSON on its client port: keys and
values base64, numbers as strings. Every call has a timeout and tries the members in turn,
starting with the one that last answered; a member cut off from its quorum does not answer in
time and the next is tried. No client library: four requests, each a POST of one JSON object.
Blocking calls; the controller runs them in a thread (``asyncio.to_thread``) except where the
state must be written before an action (``leader.py``).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from protocol.errors import HotspareError

CALL_S = 1.0
"""The most one request to one member may take."""


class EtcdError(HotspareError):
    """No member answered (each one's why, in one line), or etcd refused the request."""

    permanent = False


@dataclass(frozen=True)
class Kv:
    value: bytes
    create_revision: int
    mod_revision: int


def b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


class Etcd:
    def __init__(self, endpoints: list[str], timeout_s: float = CALL_S) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.urls = [e if "://" in e else f"http://{e}" for e in endpoints]
        self.timeout_s = timeout_s
        self._first = 0

    def call(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> Any:
        """POST ``body`` to ``/v3/<path>`` on the first member that answers; its JSON reply."""
        whys = []
        n = len(self.urls)
        for i in range(n):
            at = (self._first + i) % n
            url = f"{self.urls[at]}/v3/{path}"
            req = urllib.request.Request(
                url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as r:
                    reply = json.loads(r.read().decode() or "{}")
            except urllib.error.HTTPError as e:
                whys.append(f"{self.urls[at]}: HTTP {e.code}")
                continue
            except (OSError, ValueError) as e:  # refused, timed out, reset; a torn reply
                whys.append(f"{self.urls[at]}: {getattr(e, 'reason', None) or e}")
                continue
            if isinstance(reply, dict) and "error" in reply:
                raise EtcdError(f"etcd {path}: {reply.get('message') or reply['error']}")
            self._first = at
            return reply
        raise EtcdError(f"etcd {path}: no member answered ({'; '.join(whys)})")

    # ------------------------------------------------------------ leases

    def grant(self, ttl_s: float) -> int:
        """A new etcd lease of ``ttl_s`` (whole seconds, rounded up); its id."""
        reply = self.call("lease/grant", {"TTL": max(1, int(-(-ttl_s // 1)))})
        return int(reply["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``; the seconds it now has, 0 once it has expired (it is gone)."""
        reply = self.call("lease/keepalive", {"ID": str(lease)})
        return int(reply.get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now; its keys go with it."""
        self.call("lease/revoke", {"ID": str(lease)})

    # ------------------------------------------------------------ keys

    def get(self, key: str, revision: int = 0) -> Kv | None:
        """``key`` now, or as it was at ``revision`` (etcd keeps history until compacted)."""
        body: dict[str, Any] = {"key": b64(key)}
        if revision:
            body["revision"] = str(revision)
        reply = self.call("kv/range", body)
        kvs = reply.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> tuple[bool, int, list[Any]]:
        """An atomic if/then/else: (whether every compare held, the revision after, the
        responses of the branch taken)."""
        reply = self.call(
            "kv/txn", {"compare": compare, "success": success, "failure": failure or []}
        )
        revision = int(reply.get("header", {}).get("revision", 0))
        return bool(reply.get("succeeded")), revision, reply.get("responses") or []


def created_at(key: str, revision: int) -> dict[str, Any]:
    """A compare: ``key`` was created at ``revision`` (0: it does not exist)."""
    return {"key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": revision}


def put(key: str, value: bytes | str, lease: int | None = None) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease is not None:
        req["lease"] = str(lease)
    return {"request_put": req}


def get(key: str) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def range_kv(response: Any) -> Kv | None:
    """The key a txn branch's ``get`` found, or None."""
    kvs = (response.get("response_range") or {}).get("kvs") or []
    return _kv(kvs[0]) if kvs else None


def _kv(raw: dict[str, Any]) -> Kv:
    return Kv(
        value=base64.b64decode(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
    )
