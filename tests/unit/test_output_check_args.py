"""spec.serving.outputCheck reaches the engine as the setting it means (issue 30): the operator's
serve arguments, parsed by the engine's own parser and settings; and what the engine's
precompile recorded of its reference answers reaches status."""

from __future__ import annotations

import pytest
from spyre_engine.cli import build_parser, load_settings
from spyre_engine.settings import PrecompileSettings, ServeSettings, split_passthrough
from spyre_engine.summary import PrecompileSummary
from spyre_operator.decide import Observed, decide
from spyre_operator.desired.deployment import serve_args
from spyre_operator.desired.job import build_precompile_job

from .samples import GENERATE, model
from .test_reconcile import NOW, job_obj, plan_for
from .test_reconcile_correctness import bound


def _engine_settings(mode: str | None) -> tuple[list[str], ServeSettings]:
    spec = {**GENERATE, **({"serving": {"outputCheck": mode}} if mode else {})}
    plan = plan_for(model("m", spec))
    args = serve_args(plan, plan.key)
    ours, passthrough = split_passthrough(args)
    flags = {k: v for k, v in vars(build_parser().parse_args(ours)).items() if k != "command"}
    settings = load_settings("serve", flags, passthrough)
    assert isinstance(settings, ServeSettings)
    return args, settings


@pytest.mark.parametrize(("mode", "engine"), [("Warn", "warn"), ("Off", "off")])
def test_a_models_output_check_setting_is_the_engines(mode: str, engine: str) -> None:
    _, settings = _engine_settings(mode)
    assert settings.output_check == engine


def test_the_default_passes_no_flag_so_an_older_engine_still_starts() -> None:
    """An engine image from before the check knows no --output-check: the default (Enforce,
    the engine's own default) is not passed."""
    for mode in (None, "Enforce"):
        args, settings = _engine_settings(mode)
        assert "--output-check" not in args
        assert settings.output_check == "enforce"


def test_the_precompiles_reference_summary_is_in_the_artifacts_status() -> None:
    """The engine's own summary line (PrecompileSummary.to_line, as the Job's termination log
    holds it) to status.artifact.references; absent when the precompile recorded none."""
    m = model("m", GENERATE)
    refs = {"source": "eager", "prompts": 4, "tokens": 64, "tolerance": 0.08}

    def artifact(references: dict[str, object] | None) -> dict[str, object]:
        line = PrecompileSummary(key=plan_for(m).key, path="/cache/x", compileSeconds=3,
                                 sizeBytes=10, references=references).to_line()  # fmt: skip
        obs = Observed(cache_pvc=bound(), job=job_obj(m, "Complete"),
                       job_pods=[{"name": "p", "terminated": {"exitCode": 0, "message": line}}])
        art: dict[str, object] = decide(m, obs, NOW).status["artifact"]
        return art

    assert artifact(refs)["references"] == refs
    assert "references" not in artifact(None)


@pytest.mark.parametrize(("mode", "engine"), [(None, "record"), ("Enforce", "record"),
                                              ("Warn", "record"), ("Off", "off")])
def test_a_precompile_under_off_records_no_reference_answers(mode: str | None, engine: str
                                                             ) -> None:
    """Nothing will be checked under Off: the precompile records no reference answers (on
    eager they cost a vLLM start of their own); the Job's arguments, parsed by the engine."""
    spec = {**GENERATE, **({"serving": {"outputCheck": mode}} if mode else {})}
    job = build_precompile_job(plan_for(model("m", spec)), []).to_dict()
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    ours, passthrough = split_passthrough(args)
    flags = {k: v for k, v in vars(build_parser().parse_args(ours)).items() if k != "command"}
    settings = load_settings("precompile", flags, passthrough)
    assert isinstance(settings, PrecompileSettings)
    assert settings.reference_answers == engine
    assert ("--reference-answers" in args) == (mode == "Off")  # an older engine: no new flag
