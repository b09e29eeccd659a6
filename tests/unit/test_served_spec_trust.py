"""What the operator re-applies while a new artifact compiles comes from its own record
(issue 45, 2). The serving Deployment carries the spec it was built from in an annotation,
and anyone who may edit Deployments in the namespace may edit that annotation: it was read
back, re-planned without the image allow-list and applied, and its spec was recorded as the
last good one. Status (``servingArtifactKey``, ``servedSpec``) is written by the operator
alone: when it names the live Deployment's artifact, it is what is re-applied."""

from __future__ import annotations

import copy
import json
from typing import Any

from spyre_operator.decide import Observed, decide
from spyre_operator.desired import names

from .samples import GENERATE, model
from .test_reconcile import job_obj
from .test_rollback import CLAIM, T0, _a_rolled_out, _with_status

TAMPERED_IMAGE = "evil.example/engine:latest"


def _tampered(dep: dict[str, Any]) -> dict[str, Any]:
    """``dep`` with its served-spec annotation rewritten by a namespace editor."""
    out = copy.deepcopy(dep)
    ann = out["metadata"]["annotations"]
    spec = json.loads(ann[names.SERVED_SPEC_ANNOTATION])
    spec["engine"] = {**spec.get("engine", {}), "image": TAMPERED_IMAGE}
    spec.setdefault("serving", {})["env"] = [{"name": "EXTRA", "value": "1"}]
    ann[names.SERVED_SPEC_ANNOTATION] = json.dumps(spec)
    return out


def _image(d: Any) -> str:
    dep = next(o for o in d.apply if o.kind == "Deployment").to_dict()
    return str(dep["spec"]["template"]["spec"]["containers"][0]["image"])


def test_a_tampered_served_spec_annotation_is_not_re_applied_nor_recorded() -> None:
    served, d = _a_rolled_out()
    image = _image(d)
    assert image != TAMPERED_IMAGE and d.status["servedSpec"]
    # the spec edited (another engine image): its artifact compiles while the old one serves
    b = _with_status(model("m", {**GENERATE, "engine": {"image": "registry.local/engine:2"}},
                           generation=2), d.status)
    obs = Observed(cache_pvc=CLAIM, job=job_obj(b, None))
    obs.deployment = _tampered(served)
    d = decide(b, obs, T0)
    assert _image(d) == image, "the annotation's spec was re-applied"
    dep = next(o for o in d.apply if o.kind == "Deployment").to_dict()
    env = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0].get("env") or []}
    assert "EXTRA" not in env
    assert TAMPERED_IMAGE not in (d.status.get("lastGoodServedSpec") or ""), d.status
    assert TAMPERED_IMAGE not in d.status["servedSpec"]
