"""The operator counts its writes and reconciles per namespace, so a test counts its own model's."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from lightkube.models.core_v1 import ServicePort, ServiceSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Service
from lightkube.resources.policy_v1 import PodDisruptionBudget
from spyre_operator.control.controller import Caches, Controller, Stats
from spyre_operator.kube.apply import Applier, with_applied_hash
from spyre_operator.runtime import metrics


class RecordingClient:
    """Accepts every write (the Applier's counting is under test, not the API server)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def apply(self, obj: Any, **_: Any) -> None:
        self.calls.append(f"apply {type(obj).__name__}")

    async def create(self, obj: Any) -> None:
        self.calls.append(f"create {type(obj).__name__}")

    async def delete(self, resource: type, name: str, **_: Any) -> None:
        self.calls.append(f"delete {resource.__name__}")


def service(ns: str) -> Service:
    return Service(metadata=ObjectMeta(name="m", namespace=ns),
                   spec=ServiceSpec(ports=[ServicePort(port=8000)]))


def test_writes_are_counted_per_namespace_and_rendered() -> None:
    client = RecordingClient()
    applier = Applier(client)  # type: ignore[arg-type]

    async def writes() -> None:
        await applier.apply(service("team-a"), None)
        live = with_applied_hash(service("team-a").to_dict())
        await applier.apply(service("team-a"), live)  # unchanged: no write
        await applier.apply_status("m", "team-a", {"observedGeneration": 1}, None)
        await applier.event({"metadata": {"name": "m", "namespace": "team-a"}}, "Normal",
                            "Created", "hi")
        await applier.delete(PodDisruptionBudget, "m", "team-b")

    asyncio.run(writes())
    assert len(client.calls) == 4, client.calls
    assert applier.namespace_writes == Counter({"team-a": 3, "team-b": 1})
    assert sum(applier.writes.values()) == 4  # the by-kind counter is unchanged
    controller = Controller(client=client, caches=Caches())  # type: ignore[arg-type]
    controller.applier = applier
    controller.stats = Stats(reconciles=3, namespace_reconciles=Counter({"team-a": 2, "team-b": 1}))
    text = metrics.render(controller)
    assert 'spyre_operator_namespace_writes_total{namespace="team-a"} 3.0\n' in text, text
    assert 'spyre_operator_namespace_writes_total{namespace="team-b"} 1.0\n' in text, text
    assert 'spyre_operator_namespace_reconciles_total{namespace="team-a"} 2.0\n' in text, text
    assert "spyre_operator_reconciles_total 3.0\n" in text, text
