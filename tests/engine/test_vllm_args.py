"""Extra vLLM arguments that set what the engine sets itself are refused, decided by the installed
vLLM's own parser (no vLLM server runs; the parser runs in one child process per module)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from spyre_engine.launch import vllm_command
from spyre_engine.settings import ServeSettings
from spyre_engine.vllm_args import MANAGED, SECRETS, ParseResult, parse_with_vllm, refusal
from spyre_operator.api.v1alpha1 import MANAGED_ARG_ABBREVIATIONS, MANAGED_ARG_PATTERN

# Each vLLM setting the engine manages: its option and a value it accepts.
MANAGED_OPTIONS = {
    "served_model_name": ("--served-model-name", "other-name"),
    "tensor_parallel_size": ("--tensor-parallel-size", "2"),
    "max_model_len": ("--max-model-len", "4096"),
    "max_num_seqs": ("--max-num-seqs", "8"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "256"),
    "runner": ("--runner", "pooling"),
    "convert": ("--convert", "embed"),
    "enable_prefix_caching": ("--enable-prefix-caching", None),
    "host": ("--host", "0.0.0.0"),
    "port": ("--port", "9000"),
    "shutdown_timeout": ("--shutdown-timeout", "1"),
    "model": ("--model", "/elsewhere"),
    "api_key": ("--api-key", "s3cret"),
    "hf_token": ("--hf-token", "hf_s3cret"),
}


def forms(option: str, value: str | None) -> dict[str, list[str]]:
    """The spellings vLLM's parser accepts for one option (abbreviation: one letter short)."""
    underscored = "--" + option[2:].replace("-", "_")
    if value is None:
        return {"dashes": [option], "underscores": [underscored], "abbreviated": [option[:-1]]}
    return {
        "dashes": [option, value],
        "equals": [f"{option}={value}"],
        "underscores": [underscored, value],
        "underscores-equals": [f"{underscored}={value}"],
        "abbreviated": [option[:-1], value],
    }


CASES: dict[str, list[str]] = {
    f"{dest} {form}": args
    for dest, (option, value) in MANAGED_OPTIONS.items()
    for form, args in forms(option, value).items()
    if not (dest == "model" and form == "abbreviated")  # --mode is ambiguous in vLLM
}
CASES |= {  # the shortest abbreviation the admission rule refuses (MANAGED_ARG_ABBREVIATIONS)
    f"{dest} shortest abbreviation": [option[:MANAGED_ARG_ABBREVIATIONS[option]],
                                      *([value] if value is not None else [])]
    for dest, (option, value) in MANAGED_OPTIONS.items()
    if option in MANAGED_ARG_ABBREVIATIONS
}
CASES |= {
    "tensor_parallel_size -tp": ["-tp", "2"],
    "enable_prefix_caching --no-": ["--no-enable-prefix-caching"],
    "enable_prefix_caching --no_ abbreviated": ["--no_enable_prefix_cach"],
    "max_model_len after a harmless one": ["--seed", "3", "--max_model_len", "1k"],
}
REFUSED_BY_VLLM = {
    "unknown": (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    "ambiguous": (["--max-num", "3"], "ambiguous option: --max-num could match"),
}
ALLOWED = {
    "seed": ["--seed", "3"],
    "dtype underscores": ["--enforce_eager"],
    "none": [],
}
# The engine's own command lines: a generate model with a chunk and prefix caching, a pooling one.
OWN = {
    "generate": vllm_command(
        ServeSettings(
            model="/m", artifact_dir=Path("/a"), max_num_batched_tokens=128, served_name="x"
        ),
        "/m",
        host="127.0.0.1",
        port=8001,
        prefix_caching=True,
    ),
    "pooling": vllm_command(
        ServeSettings(model="/m", artifact_dir=Path("/a"), task="embed", warmup_shapes="64x4"),
        "/m",
        host="127.0.0.1",
        port=8001,
    ),
}


@pytest.fixture(scope="module")
def parsed() -> dict[str, ParseResult]:
    """Every case above parsed by vLLM's parser, in one child process."""
    argsets = {
        **CASES,
        **ALLOWED,
        **{k: args for k, (args, _) in REFUSED_BY_VLLM.items()},
        **{f"own {k}": cmd[5:] for k, cmd in OWN.items()},
    }
    results = parse_with_vllm(list(argsets.values()))
    return dict(zip(argsets, results, strict=True))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_form_of_a_managed_flag_is_refused(parsed: dict[str, ParseResult], case: str) -> None:
    dest = case.split()[0]
    result = parsed[case]
    assert result.error is None, result.error
    message = refusal(result)
    assert message is not None, f"{CASES[case]} was not refused: {result}"
    field = MANAGED[dest].spyre_field
    assert f"vLLM's {dest}" in message and field in message and MANAGED[dest].engine_flag in message
    given = [a for a in CASES[case] if a.startswith("-")][-1]
    if dest in SECRETS:  # the option as written, never the secret
        given = given.split("=", 1)[0] + ("=…" if "=" in given else "")
        assert "s3cret" not in message, message
    assert f"{given!r} sets" in message  # the argument as the user wrote it


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_other_vllm_arguments_pass(parsed: dict[str, ParseResult], case: str) -> None:
    assert refusal(parsed[case]) is None, parsed[case]


@pytest.mark.parametrize("kind", sorted(OWN))
def test_the_engine_sets_only_managed_settings(parsed: dict[str, ParseResult], kind: str) -> None:
    """The list of managed settings is the engine's own command line as vLLM reads it."""
    result = parsed[f"own {kind}"]
    assert result.error is None, result.error
    dests = {s.dest for s in result.settings} - {"model_tag", "disable_uvicorn_access_log"}
    assert dests <= set(MANAGED), dests - set(MANAGED)
    assert {"max_model_len", "max_num_seqs", "tensor_parallel_size", "port", "host"} <= dests


@pytest.mark.parametrize("case", sorted(REFUSED_BY_VLLM))
def test_vllm_refusing_the_arguments_is_reported(parsed: dict[str, ParseResult], case: str) -> None:
    message = refusal(parsed[case]) or ""
    assert message.startswith("vLLM does not accept the extra arguments: ")
    assert REFUSED_BY_VLLM[case][1] in message


@pytest.mark.parametrize("command", ["serve", "precompile"])
def test_the_engine_refuses_before_it_starts(tmp_path: Path, command: str) -> None:
    """Both modes stop with InvalidSettings (exit 2) and say which field to set instead; nothing
    is resolved or compiled (the model directory does not even exist)."""
    log = tmp_path / "termination-log"
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", command, "--model", str(tmp_path / "none"),
         "--artifact-dir", str(tmp_path / "art"), "--termination-log", str(log),
         "--", "--seed", "1", "--max_model_len=4096"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    doc = json.loads(log.read_text())
    assert doc["reason"] == "InvalidSettings"
    assert "'--max_model_len=4096' sets vLLM's max_model_len" in doc["message"]
    assert "--max-model-len (SpyreModel spec.compile.maxModelLen)" in doc["message"]
    assert not (tmp_path / "art").exists()


OPTIONS_SCRIPT = """
import json
from spyre_engine.vllm_args import _serve_parser
_, serve = _serve_parser()
print("OPTIONS " + json.dumps({o: a.dest for a in serve._actions for o in a.option_strings}))
"""


def test_the_admission_rule_refuses_the_managed_options_abbreviated_and_nothing_else() -> None:
    """The CRD's extraArgs rule (MANAGED_ARG_PATTERN) against the installed vLLM's options:
    each prefix of a managed option it refuses is a prefix of that option alone (vLLM reads it
    as that option), and no option of another setting is refused (issue 31, 12: abbreviations
    were refused only when the serving pod started, after the rollout began)."""
    import re

    out = subprocess.run([sys.executable, "-c", OPTIONS_SCRIPT], capture_output=True,
                         text=True, timeout=600, check=True).stdout
    options: dict[str, str] = json.loads(out.split("OPTIONS ", 1)[1].splitlines()[0])
    managed = set(MANAGED)
    wrongly = [o for o, dest in options.items()
               if dest not in managed and re.match(MANAGED_ARG_PATTERN, o)]
    assert wrongly == [], wrongly
    for option, shortest in MANAGED_ARG_ABBREVIATIONS.items():
        assert options.get(option) in managed, option
        for n in range(shortest, len(option) + 1):
            prefix = option[:n]
            assert re.match(MANAGED_ARG_PATTERN, prefix), prefix
            assert re.match(MANAGED_ARG_PATTERN, prefix.replace("-", "_").replace("__", "--", 1))
            assert [o for o in options if o.startswith(prefix)] == [option], prefix
        shorter = option[:shortest - 1]
        assert not re.match(MANAGED_ARG_PATTERN, shorter) or shorter in options, shorter
