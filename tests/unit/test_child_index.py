"""What the operator keeps of the ConfigMaps it watches (issue 45, 2): every ConfigMap in the
watched namespaces reaches its index, and a tenant's labelled ConfigMaps were kept with their
whole bodies, so megabyte ConfigMaps in one namespace grew the operator toward its memory limit
for everyone. Only the operator's own ConfigMap (a model's ``<model>-output-check``, owned by
that model) is kept whole; any other is a stub (name, labels, owners)."""

from __future__ import annotations

import json
from typing import Any

from spyre_operator.desired import names
from spyre_operator.desired.verified import build_verified_configmap
from spyre_operator.handlers import index_named_children

from .samples import GENERATE, model
from .test_reconcile import plan_for

MANAGED = {names.MANAGED_BY: names.MANAGED_BY_VALUE}


def _index(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    out = index_named_children(namespace=meta["namespace"], name=meta["name"],  # type: ignore[arg-type]
                               body=body)
    return dict(out[(meta["namespace"], meta["name"])])


def _configmap(name: str, data: dict[str, str], labels: dict[str, str] | None = None,
               owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                            "labels": labels or {}}  # fmt: skip
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "serving.spyre.dev/v1alpha1",
                                    "kind": "SpyreModel", "name": owner, "uid": f"uid-{owner}",
                                    "controller": True}]  # fmt: skip
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_the_operators_own_configmap_is_kept_whole() -> None:
    m = model("m", GENERATE)
    plan = plan_for(m)
    own = build_verified_configmap(plan, plan.key, None).to_dict()
    own["metadata"]["uid"] = "uid-cm"
    kept = _index(own)
    assert kept["data"] == own["data"] and kept["data"], kept


def test_a_tenants_labelled_configmaps_are_stubs_whatever_their_size() -> None:
    big = {"blob": "x" * 1_000_000}
    cases = [
        _configmap("anything", big, MANAGED),  # the operator's labels alone
        _configmap(names.verified_name("m"), big, MANAGED),  # its name, no owner
        _configmap("m-other", big, MANAGED, owner="m"),  # owned, not the derived name
    ]
    for cm in cases:
        kept = _index(cm)
        assert "data" not in kept, cm["metadata"]
        assert kept["metadata"]["name"] == cm["metadata"]["name"]
        assert kept["metadata"]["labels"] == cm["metadata"]["labels"]
    # unlabelled: not indexed at all (the watch and the re-list ask for the label; an older
    # kopf still sends them), looked up by name before a write instead (test_configmap_watch)
    unlabelled = _configmap(names.verified_name("m"), big)
    meta = unlabelled["metadata"]
    assert index_named_children(namespace=meta["namespace"], name=meta["name"],  # type: ignore[arg-type]
                                body=unlabelled) == {}
    # two thousand of them: what the index keeps stays small
    total = sum(len(json.dumps(_index(_configmap(f"cm-{i}", {"blob": "y" * 100_000}, MANAGED))))
                for i in range(2000))
    assert total < 2000 * 1000, total
