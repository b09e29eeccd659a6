"""Watches of optional APIs: custom resources whose CRD may not be installed.

kopf cannot watch such a resource: its indices must all be filled before any handler runs,
so one index over an absent CRD would stop the whole operator, and its watch of a missing
resource fails in a loop. An :class:`OptionalApiWatch` lists and watches one resource itself
(per watched namespace, or cluster-wide) into an in-memory cache, and records whether the
API server serves it at all. A 404 ("the server could not find the requested resource")
means the CRD is absent: the watch says so once (the models that asked for the resource
report it in a condition), then checks again every ``recheck_seconds`` with one LIST per
namespace and nothing else; once the CRD is installed the watch fills its cache and the
models are reconciled. A reconcile therefore never sends a GET for these objects, and an
idle operator sends no extra requests while the CRD exists.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.core.exceptions import NotReadyError

from ..decide import API_FORBIDDEN, API_NOT_SERVED, API_SERVED, API_UNKNOWN

log = logging.getLogger(__name__)

#: How often an absent (or forbidden) API is looked for again.
DEFAULT_RECHECK_SECONDS = 60.0
#: Pause before re-listing after an unexpected error (a dropped connection, an API restart).
ERROR_PAUSE_SECONDS = 2.0

ObjKey = tuple[str, str]  # (namespace, name)


def _slim(obj: Any) -> dict[str, Any]:
    raw: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    meta = dict(raw.get("metadata") or {})
    meta.pop("managedFields", None)
    raw["metadata"] = meta
    return raw


def _http_status(e: BaseException) -> tuple[int | None, str]:
    """The HTTP status code and message of a failed request, if it was an HTTP answer.

    An unknown API group answers a plain-text 404 ("404 page not found") that lightkube
    raises as its HTTP library's status error, not as an ApiError with a Status.
    """
    if isinstance(e, ApiError) and e.status is not None and e.status.code:
        return e.status.code, e.status.message or ""
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    if not isinstance(code, int):
        return None, ""
    try:
        text = str(response.text).strip()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a streamed body that was not read
        text = ""
    return code, text


class OptionalApiWatch:
    """List + watch of one namespaced resource that may not exist in the cluster.

    ``on_object(namespace, body)`` is called for every change of an object (``body`` is the
    slim object, or the last known one when it was deleted); ``on_state()`` whenever
    :attr:`state` changes (Served, NotServed, Forbidden).
    """

    def __init__(
        self,
        client: AsyncClient,
        resource: type,
        namespaces: list[str] | None,
        on_object: Callable[[str, Mapping[str, Any]], None],
        on_state: Callable[[], None],
        recheck_seconds: float = DEFAULT_RECHECK_SECONDS,
    ) -> None:
        self.client = client
        self.resource = resource
        #: None or empty: cluster-wide.
        self.namespaces: list[str | None] = list(namespaces) if namespaces else [None]
        self.on_object = on_object
        self.on_state = on_state
        self.recheck_seconds = recheck_seconds
        self.cache: dict[ObjKey, dict[str, Any]] = {}
        self._states: dict[str | None, tuple[str, str]] = {
            ns: (API_UNKNOWN, "") for ns in self.namespaces
        }
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> str:
        """Served once any scope lists; else NotServed/Forbidden; Unknown before any answer."""
        states = [s for s, _ in self._states.values()]
        for s in (API_SERVED, API_FORBIDDEN, API_NOT_SERVED):
            if s in states:
                return s
        return API_UNKNOWN

    @property
    def message(self) -> str:
        """The API server's message for a scope that is not served or forbidden."""
        return next((m for s, m in self._states.values() if s == self.state and m), "")

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object, if any."""
        return self.cache.get((namespace, name))

    def _set_state(self, ns: str | None, state: str, message: str = "") -> None:
        before = self.state
        self._states[ns] = (state, message)
        if self.state != before:
            log.info("%s: API %s", self.resource.__name__, self.state)
            self.on_state()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """One task per namespace (or one cluster-wide)."""
        for ns in self.namespaces:
            self._tasks.append(
                asyncio.create_task(self._run(ns), name=f"watch-{self.resource.__name__}-{ns}")
            )

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # ------------------------------------------------------------------ the watch

    def _replace(self, ns: str | None, fresh: dict[ObjKey, dict[str, Any]]) -> None:
        """A new listing of scope ``ns``: report what appeared, changed or went."""
        old = {k: v for k, v in self.cache.items() if ns is None or k[0] == ns}
        for k in old.keys() - fresh.keys():
            body = self.cache.pop(k)
            self.on_object(k[0], body)
        for k, body in fresh.items():
            if old.get(k) != body:
                self.cache[k] = body
                self.on_object(k[0], body)

    async def _list_and_watch(self, ns: str | None) -> None:
        listing: Any = self.client.list(self.resource, namespace=ns if ns is not None else "*")
        fresh: dict[ObjKey, dict[str, Any]] = {}
        async for obj in listing:
            body = _slim(obj)
            meta = body["metadata"]
            fresh[(meta["namespace"], meta["name"])] = body
        try:
            version: str | None = listing.resourceVersion
        except NotReadyError:
            version = None
        self._replace(ns, fresh)
        self._set_state(ns, API_SERVED)
        watch: Any = self.client.watch(
            self.resource, namespace=ns if ns is not None else "*", resource_version=version
        )
        async for op, obj in watch:
            body = _slim(obj)
            meta = body["metadata"]
            key = (meta["namespace"], meta["name"])
            if op == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = body
            self.on_object(key[0], body)

    async def _run(self, ns: str | None) -> None:
        while True:
            try:
                await self._list_and_watch(ns)
                continue  # the watch ended (server timeout): list again
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - classified below; the watch must survive
                code, message = _http_status(e)
                if code == 404:
                    self._replace(ns, {})
                    self._set_state(ns, API_NOT_SERVED, message)
                    await asyncio.sleep(self.recheck_seconds)
                    continue
                if code in (401, 403):
                    self._set_state(ns, API_FORBIDDEN, message)
                    await asyncio.sleep(self.recheck_seconds)
                    continue
                if code != 410:  # 410 Gone: the resourceVersion expired, list again at once
                    # a dropped connection, an API server restart: list again shortly
                    log.warning("%s watch: %s: %s", self.resource.__name__, type(e).__name__, e)
                    await asyncio.sleep(ERROR_PAUSE_SECONDS)
