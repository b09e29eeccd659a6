"""Fixtures of the contract tests: SpyreModels whose Job and Deployment run on the real node.

The operator (a local process, this module's namespace only) reconciles generate models on the
tiny model (``pvc://models/tiny``): ``gen`` with the CPU backend ``eager`` (compiles nothing,
records the shape) and ``embed``, a pooling model with warmup shapes. An inductor artifact
(really compiled into the claim, served without compiling) is tests/realpods/test_output_check's
first artifact (issue 43: one inductor compile on the real node, not two).
The precompile Jobs and serving pods the operator writes run for real on ``spyre-real-0`` from
the engine image, all on one cache claim.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .realpods import RealEnv, model_spec, real_env_fixture, wait_ready

env = real_env_fixture("contract")

#: name -> spec override.
CASES: dict[str, dict[str, Any]] = {
    "gen": {},
    # A pooling model compiled for static warmup shapes.
    "embed": {"task": "embed", "compile": {"warmupShapes": [{"promptLen": 64, "batchSize": 4}]}},
}
PARAMS = [pytest.param(c, id=c) for c in CASES]


@dataclass
class Served:
    """A contract model once Ready, and what the operator wrote for it."""

    name: str
    model: dict[str, Any]
    ready_after: float


@pytest.fixture(scope="module")
def served_models(env: RealEnv, request: pytest.FixtureRequest) -> dict[str, Served]:
    """Every case selected in this session, applied at once (their Jobs run side by side)."""
    selected = {getattr(item, "callspec").params.get("served")  # noqa: B009
                for item in request.session.items if hasattr(item, "callspec")}  # fmt: skip
    wanted = {c for c in CASES if c in selected} | {"gen"}
    t0 = time.monotonic()
    for name in CASES:
        if name in wanted:
            env.kube.apply_model(name, model_spec(env.image, **CASES[name]))
    out = {}
    for name in CASES:
        if name in wanted:
            model = wait_ready(env.kube, name)
            took = time.monotonic() - t0
            print(f"{name}: apply -> Ready in {took:.0f}s")
            out[name] = Served(name, model, took)
    return out


@pytest.fixture
def served(served_models: dict[str, Served], request: pytest.FixtureRequest) -> Iterator[Served]:
    yield served_models[getattr(request, "param", None) or "gen"]
