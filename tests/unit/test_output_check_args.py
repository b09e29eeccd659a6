"""spec.serving.outputCheck reaches the engine as the setting it means (issue 30): the operator's
serve arguments, parsed by the engine's own parser and settings."""

from __future__ import annotations

import pytest
from spyre_engine.cli import build_parser, load_settings
from spyre_engine.settings import ServeSettings, split_passthrough
from spyre_operator.desired.deployment import serve_args

from .samples import GENERATE, model
from .test_reconcile import plan_for


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
