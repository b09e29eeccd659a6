"""Foreign objects are routed to the model they conflict with by the child's name (issue 31, 4).

A model's children are named after it, but not always with its name: a name with a dot, or one
too long for a label, gets a derived name (``names.server_name``), and the engine, cold-start
and mirror objects have suffixes. Events of a same-named foreign object (it appeared, changed,
went) were routed to the model of the object's own name: deleting the foreign object never woke
the model, which stayed ``NameConflict`` until some other event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.desired import names
from spyre_operator.desired.inference_pool import inference_pool_name
from spyre_operator.handlers import child_names, index_child_names, on_foreign_child

from .test_reconcile import NOW

MODELS = ["granite.instruct", "m" * 70, "plain"]


def _controller() -> Controller:
    index: dict[Any, list[str]] = {}
    for m in MODELS:
        for k, v in index_child_names(namespace="ns", name=m).items():
            index.setdefault(k, []).append(v)
    return Controller(client=None, caches=Caches({"child_names": index}),  # type: ignore[arg-type]
                      workers=1, clock=lambda: NOW)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("child", [names.server_name, names.engine_service_name,
                                   names.coldstart_service_name, names.mirror_slice_name,
                                   inference_pool_name])
def test_a_foreign_objects_event_wakes_the_model_whose_child_it_names(model: str,
                                                                      child: Any) -> None:
    c = _controller()
    name = child(model)

    async def run() -> None:
        await on_foreign_child(namespace="ns", name=name, memo={"controller": c})  # type: ignore[arg-type]
        assert list(c.queue._queued) == [("ns", model)], (name, list(c.queue._queued))
        c.queue._queued.clear()
        # the optional watches (InferencePool, KEDA's objects) route the same way
        obj = {"metadata": {"name": name, "namespace": "ns"}}
        assert c.router.models_for_routing_object("ns", obj) == [("ns", model)]
        await c.stop()

    asyncio.run(run())


def test_derived_names_differ_from_the_models_and_are_all_listed() -> None:
    assert names.server_name("granite.instruct") != "granite.instruct"
    assert names.server_name("m" * 70) != "m" * 70
    assert names.server_name("plain") == "plain"
    assert child_names("plain") == {"plain", "plain-engine", "plain-coldstart", "plain-interceptor"}
