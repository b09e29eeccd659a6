"""The engine's canary judge and fault injector (engine/spyre_engine/canary.py), and its
readiness grace against the operator's probe (issue 30)."""

from __future__ import annotations

from spyre_engine import canary
from spyre_engine.cli import build_parser, load_settings
from spyre_engine.serve import CANARY_UNREADY_SECONDS
from spyre_engine.settings import ServeSettings, split_passthrough
from spyre_operator.desired.deployment import build_deployment, serve_args
from spyre_operator.desired.plan import ENDPOINT_GRACE_SECONDS

from .samples import GENERATE, model
from .test_reconcile import plan_for

BOUNDS = canary.CanaryBounds(seconds=60, max_error_ratio=0.2, min_requests=5)


def _tally(ok: int, errors: int, seconds: float = 0.1) -> canary.Tally:
    t = canary.Tally()
    for _ in range(errors):
        t.add(500, seconds)
    for _ in range(ok):
        t.add(200, seconds)
    return t


def test_nothing_is_judged_before_min_requests() -> None:
    assert canary.verdict(BOUNDS, _tally(0, 4)) is None  # 4 of 4 failed, but only 4


def test_a_share_of_server_errors_above_the_bound_fails() -> None:
    assert canary.verdict(BOUNDS, _tally(4, 1)) is None  # 20%: at the bound
    why = canary.verdict(BOUNDS, _tally(3, 2))
    assert why is not None and "2 of its 5 requests" in why and "40%" in why and "20%" in why
    # client errors are the client's
    t = _tally(3, 0)
    t.add(404, 0.1)
    t.add(400, 0.1)
    assert canary.verdict(BOUNDS, t) is None


def test_a_mean_latency_above_the_bound_fails_only_when_bounded() -> None:
    assert canary.verdict(BOUNDS, _tally(5, 0, seconds=9.0)) is None
    slow = canary.CanaryBounds(60, 0.2, 5, max_mean_latency=2.0)
    assert canary.verdict(slow, _tally(5, 0, seconds=1.5)) is None
    why = canary.verdict(slow, _tally(5, 0, seconds=3.0))
    assert why is not None and "3.00 s on average" in why


def test_the_fault_injector_fails_an_even_share() -> None:
    for ratio, n, want in ((0.0, 10, 0), (1.0, 7, 7), (0.5, 10, 5), (0.25, 8, 2), (0.1, 30, 3)):
        f = canary.FaultInjector(ratio)
        assert sum(f.fails_next() for _ in range(n)) == want, ratio
    f = canary.FaultInjector(0.5)
    assert [f.fails_next() for _ in range(4)] == [False, True, False, True]


def test_only_the_apis_posts_are_judged() -> None:
    assert canary.is_inference("POST", "/v1/completions")
    assert canary.is_inference("POST", "/v1/chat/completions")
    assert not canary.is_inference("GET", "/v1/models")
    assert not canary.is_inference("POST", "/tokenize")


def test_the_flags_the_operator_passes_are_the_engines() -> None:
    """A canary Deployment's serve arguments, parsed by the engine's own parser and settings."""
    m = model("m", {**GENERATE, "serving": {"canary": {"durationSeconds": 90,
                                                        "maxErrorRatio": 0.1, "minRequests": 3,
                                                        "maxMeanLatencySeconds": 2.5}}})
    plan = plan_for(m)
    ours, passthrough = split_passthrough(serve_args(plan, plan.key, plan.spec.serving.canary))
    flags = {k: v for k, v in vars(build_parser().parse_args(ours)).items() if k != "command"}
    s = load_settings("serve", flags, passthrough)
    assert isinstance(s, ServeSettings)
    assert (s.canary_seconds, s.canary_max_error_ratio, s.canary_min_requests,
            s.canary_max_mean_latency) == (90.0, 0.1, 3, 2.5)  # fmt: skip
    # the main Deployment's pods are no canary
    ours, passthrough = split_passthrough(serve_args(plan, plan.key))
    flags = {k: v for k, v in vars(build_parser().parse_args(ours)).items() if k != "command"}
    main = load_settings("serve", flags, passthrough)
    assert isinstance(main, ServeSettings) and main.canary_seconds == 0


def test_a_failed_canary_leaves_the_service_before_it_drains() -> None:
    """Readiness fails at once; the operator's probe needs period x failureThreshold to see it
    and the endpoint update its grace: the canary keeps answering until then."""
    plan = plan_for(model("m", GENERATE))
    probe = build_deployment(plan, plan.key).spec.template.spec.containers[0].readinessProbe
    assert probe is not None and probe.periodSeconds and probe.failureThreshold
    needed = probe.periodSeconds * probe.failureThreshold + ENDPOINT_GRACE_SECONDS
    assert CANARY_UNREADY_SECONDS >= needed


def test_an_idle_window_keeps_judging_until_min_requests_and_reports_its_count() -> None:
    """Issue 44: below minRequests nothing was judged, and a window that saw no traffic passed.
    The engine judges past its window until minRequests are judged, and says how many it has
    (GET /health/canary: what the operator holds the rollout on)."""
    b = canary.CanaryBounds(seconds=60, max_error_ratio=0.1, min_requests=3)
    t = canary.Tally()
    assert canary.judging(b, t, window_over=False) and canary.judging(b, t, window_over=True)
    for _ in range(3):
        t.add(200, 0.5)
    assert canary.judging(b, t, window_over=False), "the window runs its time"
    assert not canary.judging(b, t, window_over=True), "settled: window over, count reached"
    assert canary.report(b, t, 0.0) == {
        "canary": True, "judged": 3, "errors": 0, "meanSeconds": 0.5, "minRequests": 3,
        "windowLeftSeconds": 0.0, "judging": False}
    assert canary.report(b, canary.Tally(), None)["judging"] is False, "not Ready yet"
    assert canary.report(b, canary.Tally(), -5.0)["judging"] is True


def test_the_pods_limits_reach_the_engine_and_default_to_the_models_batch() -> None:
    """Issue 45, 5: serving.maxInFlight and bodyTimeoutSeconds, parsed by the engine's own
    parser; unset, no flag is passed (an older engine image knows none) and the engine's
    defaults follow the model's batch."""
    from spyre_engine.serve import max_in_flight

    def settings(serving: dict[str, object]) -> ServeSettings:
        m = model("m", {**GENERATE, "serving": serving})
        plan = plan_for(m)
        ours, passthrough = split_passthrough(serve_args(plan, plan.key))
        flags = {k: v for k, v in vars(build_parser().parse_args(ours)).items()
                 if k != "command"}  # fmt: skip
        s = load_settings("serve", flags, passthrough)
        assert isinstance(s, ServeSettings)
        return s

    s = settings({"maxInFlight": 5, "bodyTimeoutSeconds": 7})
    assert (max_in_flight(s), s.body_timeout) == (5, 7.0)
    s = settings({})
    assert (s.max_in_flight, s.body_timeout) == (None, 60.0)
    assert max_in_flight(s) == max(64, 8 * s.max_num_seqs)
    assert max_in_flight(s.model_copy(update={"max_num_seqs": 32})) == 256
