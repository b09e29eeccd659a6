"""Fixtures of the contract tests: one SpyreModel whose Job and Deployment run on the real node.

The operator (a local process, this module's namespace only) reconciles a generate model on the
tiny model (``pvc://models/tiny``) with the CPU backend ``eager``; the precompile Job and the
serving pod it writes run for real on ``spyre-real-0`` from the engine image.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .realpods import RealEnv, model_spec, real_env_fixture, wait_ready

env = real_env_fixture("contract")

MODEL = "gen"


@dataclass
class Served:
    """The contract model once Ready, and what the operator wrote for it."""

    name: str
    model: dict[str, Any]
    ready_after: float


@pytest.fixture(scope="module")
def served(env: RealEnv) -> Iterator[Served]:
    t0 = time.monotonic()
    env.kube.apply_model(MODEL, model_spec(env.image))
    model = wait_ready(env.kube, MODEL)
    took = time.monotonic() - t0
    print(f"{MODEL}: apply -> Ready in {took:.0f}s")
    yield Served(MODEL, model, took)
