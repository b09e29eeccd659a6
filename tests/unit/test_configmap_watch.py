"""What reaches the operator of the cluster's ConfigMaps (issue 45, 2): only those with its
label, by a server-side selector on the watch and on the re-list, in pages; a same-named
``<model>-output-check`` of someone else's, which neither sees, is looked up by name before the
first write and reported, never written over.

(tests/bench/bench_configmaps.py measures the operator's memory beside a tenant's 1000
ConfigMaps of 128 KiB; tests/integration/test_reconcile_correctness.py runs the lookup against
the API server.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kopf._cogs.structs.references import Resource
from spyre_operator import handlers
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.control.execute import UNWATCHED_RECHECK_SECONDS, Writer
from spyre_operator.control.resync import Resync
from spyre_operator.decide import Decision, Observed
from spyre_operator.desired import names
from spyre_operator.desired.verified import build_verified_configmap

from .samples import GENERATE, model
from .test_reconcile import NOW, plan_for

MANAGED = f"{names.MANAGED_BY}={names.MANAGED_BY_VALUE}"


def _resource(group: str, plural: str, kind: str) -> Resource:
    return Resource(group=group, version="v1", plural=plural, kind=kind, namespaced=True)


@pytest.mark.skipif(not hasattr(kopf.OperatorSettings().watching, "label_selectors"),
                    reason="kopf < 1.45 (the lowest versions pyproject allows) has no selectors")
def test_the_watches_ask_for_labelled_configmaps_only_and_list_in_pages() -> None:
    settings = kopf.OperatorSettings()
    handlers.watch_selectors(settings)
    selectors = settings.watching.label_selectors
    assert selectors.collect(_resource("", "configmaps", "ConfigMap")) == [MANAGED]
    # the kinds whose foreign same-named objects the operator must see stay unfiltered
    for group, plural, kind in (("apps", "deployments", "Deployment"),
                                ("", "services", "Service"), ("", "pods", "Pod")):  # fmt: skip
        assert selectors.collect(_resource(group, plural, kind)) == [], kind
    assert settings.watching.chunk_size == handlers.WATCH_PAGE_SIZE > 0


def test_a_kopf_without_the_selectors_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """An older kopf (pyproject allows 1.37) is sent every ConfigMap again: said in a warning,
    not silently (the index keeps only labelled ones either way: test_child_index)."""
    old = SimpleNamespace(watching=SimpleNamespace(server_timeout=None))
    handlers.watch_selectors(old)  # type: ignore[arg-type]
    assert "kopf 1.45 or later" in caplog.text


def test_the_relist_asks_for_what_the_watch_asks_for() -> None:
    """The periodic re-list listed every ConfigMap of the cluster, whole, every 30 s."""
    cm = {"metadata": {"name": "m-output-check", "namespace": "ns", "uid": "uid-cm"}}
    caches = Caches({"configmaps": {("ns", "m-output-check"): [cm]}})
    asked: list[tuple[str, dict[str, Any]]] = []

    class Client:
        def list(self, resource: type, namespace: str | None = None, **kw: Any) -> Any:
            asked.append((resource.__name__, kw))

            async def gen() -> Any:
                yield SimpleNamespace(metadata=SimpleNamespace(**cm["metadata"]))
            return gen()

    c = Controller(client=Client(), caches=caches, workers=1,  # type: ignore[arg-type]
                   clock=lambda: NOW)  # fmt: skip

    async def run() -> None:
        assert await Resync(c, Client(), ["ns"], period=0).once() == []  # type: ignore[arg-type]
        await c.stop()

    asyncio.run(run())
    [(kind, kw)] = asked
    assert kind == "ConfigMap" and kw["labels"] == {names.MANAGED_BY: names.MANAGED_BY_VALUE}
    assert kw["chunk_size"] > 0, kw


class Named:
    """The API server's answer to a list by name: ``found`` or nothing."""

    def __init__(self, found: dict[str, Any] | None) -> None:
        self.found = found
        self.asked: list[tuple[str, str, str]] = []

    async def named(self, resource: type, name: str, namespace: str) -> dict[str, Any] | None:
        self.asked.append((resource.__name__, name, namespace))
        return self.found


def _lookup(found: dict[str, Any] | None, obs: Observed | None = None
            ) -> tuple[Observed, Decision, Named]:  # fmt: skip
    m = model("m", GENERATE)
    plan = plan_for(m)
    d = Decision()
    d.apply = [build_verified_configmap(plan, plan.key, None)]
    obs = obs or Observed()
    applier = Named(found)
    applier.requeued = []  # type: ignore[attr-defined]
    queue = SimpleNamespace(add_after=lambda key, delay: applier.requeued.append((key, delay)))  # type: ignore[attr-defined]
    writer = Writer(SimpleNamespace(applier=applier, queue=queue))  # type: ignore[arg-type]
    asyncio.run(writer._find_unwatched_foreign("ns", "m", obs, d))
    return obs, d, applier


def _configmap(owner: str | None) -> dict[str, Any]:
    refs = [{"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel", "name": owner,
             "uid": "uid-x", "controller": True}] if owner else []  # fmt: skip
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": {"mine": "yes"},
            "metadata": {"name": names.verified_name("m"), "namespace": "ns",
                         "ownerReferences": refs}}  # fmt: skip


def test_someone_elses_configmap_is_found_before_the_first_write_and_left_alone() -> None:
    obs, d, applier = _lookup(_configmap(None))
    assert applier.asked == [("ConfigMap", names.verified_name("m"), "ns")]
    assert "ConfigMap" in obs.foreign and "not managed by the operator" in obs.foreign["ConfigMap"]
    assert not [o for o in d.apply if o.kind == "ConfigMap"], "it would be written over"
    # its deletion sends no event: the model is looked at again
    assert applier.requeued == [(("ns", "m"), UNWATCHED_RECHECK_SECONDS)]  # type: ignore[attr-defined]


def test_none_there_or_its_own_is_written() -> None:
    obs, d, applier = _lookup(None)
    assert not obs.foreign and [o.kind for o in d.apply] == ["ConfigMap"]
    assert applier.requeued == []  # type: ignore[attr-defined]
    own = _configmap("m")
    obs, d, _ = _lookup(own)  # ours, the cache not there yet: an update of it
    assert not obs.foreign and obs.verified_configmap is own
    assert [o.kind for o in d.apply] == ["ConfigMap"]


def test_the_cache_answers_when_it_has_the_operators_own() -> None:
    obs, _, applier = _lookup(_configmap(None), Observed(verified_configmap=_configmap("m")))
    assert applier.asked == [] and not obs.foreign
