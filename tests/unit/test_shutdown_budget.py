"""The shutdown budget from the engine's drain deadline to the kubelet's SIGKILL, in one chain:
vLLM's TP workers (their own grace, then vLLM's SIGTERM and 4 s) fit inside the engine core's
``--shutdown-timeout``, which fits inside the engine's wait for the process group, which fits
inside the engine's watchdog, which fires before the operator's terminationGracePeriodSeconds.
A number raised on one side only (as the cold run's TP=2 force-kill needed) fails here."""

from __future__ import annotations

import inspect

from spyre_engine import launch, serve
from spyre_operator.desired import plan
from vllm.v1.executor.multiproc_executor import MultiprocExecutor

# vLLM's MultiprocExecutor._ensure_worker_termination: after the grace, SIGTERM, then 4 s.
VLLM_SIGTERM_WAIT = 4


def test_vllm_waits_four_seconds_after_its_sigterm_to_the_workers() -> None:
    source = inspect.getsource(MultiprocExecutor._ensure_worker_termination)
    assert "envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS" in source
    assert f"wait_for_termination(active_procs(), {VLLM_SIGTERM_WAIT})" in source


def test_the_workers_fit_the_engine_cores_shutdown_timeout() -> None:
    workers = launch.WORKER_SHUTDOWN_TIMEOUT + VLLM_SIGTERM_WAIT
    # The engine core's own teardown and exit follow the workers: leave it at least as long.
    assert launch.VLLM_SHUTDOWN_TIMEOUT >= 2 * workers


def test_the_engine_waits_for_vllm_before_killing_the_group() -> None:
    assert launch.STOP_GRACE > launch.VLLM_SHUTDOWN_TIMEOUT
    assert serve.CHILD_STOP_GRACE == launch.STOP_GRACE


def test_the_watchdog_fires_before_the_kubelet_kills() -> None:
    assert serve.HARD_EXIT_AFTER_DEADLINE > serve.ABORT_GRACE + launch.STOP_GRACE
    assert plan.TERMINATION_MARGIN_SECONDS >= serve.HARD_EXIT_AFTER_DEADLINE + 1


def test_a_precompile_stops_before_its_pods_default_grace() -> None:
    """The precompile Job's pod keeps Kubernetes' default grace period (30 s): a SIGTERM
    mid-compile must end vLLM's process group (its SIGKILL at the latest) well before."""
    assert launch.PRECOMPILE_STOP_GRACE > launch.PRECOMPILE_SHUTDOWN_TIMEOUT
    assert launch.PRECOMPILE_STOP_GRACE + 5 <= 30
