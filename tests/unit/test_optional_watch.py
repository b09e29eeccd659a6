"""OptionalApiWatch: an API that may be absent, with a fake client (the real API server is in
tests/integration/test_routing.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from spyre_operator.control import optional
from spyre_operator.control.optional import OptionalApiWatch
from spyre_operator.decide import API_FORBIDDEN, API_NOT_SERVED, API_SERVED, API_UNKNOWN
from spyre_operator.desired.inference_pool import InferencePool


def http_error(code: int, body: str) -> httpx.HTTPStatusError:
    req = httpx.Request("GET", "https://api/apis/inference.networking.k8s.io/v1/inferencepools")
    return httpx.HTTPStatusError(body, request=req, response=httpx.Response(code, text=body,
                                                                             request=req))


def api_error(code: int, message: str) -> ApiError:
    return ApiError(status=Status(code=code, message=message))


class Listing:
    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.resourceVersion = "10"

    async def __aiter__(self) -> AsyncIterator[Any]:
        for i in self.items:
            yield i


def pool(name: str, owner: str) -> Any:
    return InferencePool.from_dict({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "9",
                     "ownerReferences": [{"apiVersion": "serving.spyre.dev/v1alpha1",
                                          "kind": "SpyreModel", "name": owner, "uid": "u"}]},
        "spec": {},
    })


class FakeClient:
    """Answers LISTs from a script of outcomes; a watch waits for events put on a queue."""

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes
        self.lists = 0
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def list(self, resource: type, namespace: str | None = None) -> Any:
        self.lists += 1
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return Listing(outcome)

    async def watch(self, resource: type, namespace: str | None = None,
                    resource_version: str | None = None) -> AsyncIterator[tuple[str, Any]]:
        while True:
            yield await self.events.get()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def run_watch(outcomes: list[Any], script: Any) -> Any:
    async def main() -> Any:
        client = FakeClient(outcomes)
        seen: list[tuple[str, str]] = []
        states: list[str] = []
        w = OptionalApiWatch(
            client, InferencePool, ["ns"],  # type: ignore[arg-type]
            on_object=lambda ns, body: seen.append((ns, body["metadata"]["name"])),
            on_state=lambda: states.append(w.state),
            recheck_seconds=0.01,
        )
        assert w.state == API_UNKNOWN
        w.start()
        try:
            return await script(w, client, seen, states)
        finally:
            await w.stop()

    return asyncio.run(main())


def test_plain_text_404_means_not_served_then_the_crd_appears() -> None:
    async def script(w: Any, client: FakeClient, seen: list[Any], states: list[str]) -> None:
        await settle()
        assert w.state == API_NOT_SERVED
        assert w.message == "404 page not found"
        lists = client.lists
        await asyncio.sleep(0.05)
        assert client.lists > lists  # looked again after recheck_seconds, quietly
        client.outcomes[:] = [[pool("a", "model-a")]]
        await asyncio.sleep(0.05)
        assert w.state == API_SERVED
        assert states == [API_NOT_SERVED, API_SERVED]  # each change reported once
        assert ("ns", "a") in seen and w.get("ns", "a") is not None
        client.events.put_nowait(("DELETED", pool("a", "model-a")))
        await settle()
        assert w.get("ns", "a") is None and seen[-1] == ("ns", "a")

    run_watch([http_error(404, "404 page not found")], script)


def test_forbidden_is_its_own_state() -> None:
    async def script(w: Any, client: FakeClient, seen: list[Any], states: list[str]) -> None:
        await settle()
        assert w.state == API_FORBIDDEN
        assert "cannot list" in w.message

    run_watch([api_error(403, 'inferencepools is forbidden: cannot list')], script)


def test_a_transient_error_lists_again_without_changing_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(optional, "ERROR_PAUSE_SECONDS", 0.02)

    async def script(w: Any, client: FakeClient, seen: list[Any], states: list[str]) -> None:
        await asyncio.sleep(0)
        assert w.state == API_UNKNOWN  # a 500 says nothing about the CRD
        await asyncio.sleep(0.1)
        assert w.state == API_SERVED
        assert states == [API_SERVED]

    run_watch([api_error(500, "storage is (re)initializing"), []], script)
