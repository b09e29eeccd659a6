"""Which vLLM settings the extra ``vllm serve`` arguments set, decided by vLLM's own parser.

The engine appends the user's vLLM arguments (a SpyreModel's ``serving.extraArgs``) after its
own, so the last one wins. vLLM's parser (``FlexibleArgumentParser``) turns underscores into
dashes (``--max_model_len=4096``), has short forms (``-tp``), accepts any unambiguous
abbreviation (``--max-num-seq``) and reads ``--config FILE``: a list of refused prefixes cannot
follow all of that. So this module builds the parser the way ``vllm serve`` builds it
(``vllm/entrypoints/cli/main.py``: a ``FlexibleArgumentParser`` with the serve sub-command, i.e.
``FrontendArgs`` + ``AsyncEngineArgs.add_cli_args`` and the platform plugin's additions), parses
the arguments and records which destination each one sets. An argument that sets a destination
the engine derives from its own flags (the shape, the model, the ports) is refused with a message
naming the engine flag and the SpyreModel field to use instead.

The parse runs in a child process (``python -m spyre_engine.vllm_args``, the arguments as JSON on
stdin): building vLLM's parser imports torch and activates the platform plugin, seconds and
hundreds of MB that the engine process (which only spawns vLLM) must not keep.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The line of the child's stdout that carries the result (vLLM logs to stdout as well).
RESULT_PREFIX = "SPYRE_VLLM_ARGS "
#: Stands for the model path in the parse (the engine always passes the model positionally).
MODEL_PLACEHOLDER = "/spyre-engine/model"
# vLLM moves ``--model X`` in front of the other arguments before parsing (the same pattern as
# FlexibleArgumentParser.parse_args); after the engine's positional model it is a second model.
_MODEL_OPTION = re.compile(r"^--model(=.+|$)")


@dataclass(frozen=True)
class Managed:
    """A vLLM setting the engine sets itself: from which engine flag and SpyreModel field."""

    engine_flag: str
    spyre_field: str


#: vLLM destinations (``args.<dest>`` of ``vllm serve``) the engine derives from its settings.
#: A test parses the engine's own command with vLLM's parser and checks it sets no other one.
MANAGED: dict[str, Managed] = {
    "model_tag": Managed("--model", "spec.model.uri"),
    "model": Managed("--model", "spec.model.uri"),
    "served_model_name": Managed("--served-name", "spec.model.servedName"),
    "tensor_parallel_size": Managed("--tensor-parallel-size", "spec.compile.tensorParallelSize"),
    "max_model_len": Managed("--max-model-len", "spec.compile.maxModelLen"),
    "max_num_seqs": Managed("--max-num-seqs", "spec.compile.maxNumSeqs"),
    "max_num_batched_tokens": Managed(
        "--max-num-batched-tokens", "spec.compile.maxNumBatchedTokens"
    ),
    "runner": Managed("--task", "spec.task"),
    "convert": Managed("--task", "spec.task"),
    "enable_prefix_caching": Managed("--prefix-caching", "spec.serving.prefixCaching"),
    # vLLM listens on a loopback port; the engine serves the public one and proxies to it.
    "host": Managed("--host", "spec.serving.port"),
    "port": Managed("--port", "spec.serving.port"),
    # vLLM's stop budget; the engine's drain before it is the model's shutdown grace period.
    "shutdown_timeout": Managed("--drain-timeout", "spec.serving.shutdownGracePeriodSeconds"),
    # Secrets: as arguments they are in the pod spec, the model's status and the log.
    "api_key": Managed("VLLM_API_KEY", "spec.serving.apiKey"),
    "hf_token": Managed("HF_TOKEN", "spec.model.tokenSecret"),
}


#: The managed settings that carry secrets: a refusal names their option, not their value.
SECRETS = frozenset({"api_key", "hf_token"})


@dataclass(frozen=True)
class Setting:
    """One argument and the vLLM destination it sets."""

    dest: str
    option: str | None  # the option vLLM matched (full name); None for a positional
    given: str  # the argument as written


@dataclass(frozen=True)
class ParseResult:
    """What vLLM's parser made of one argument list: the settings, or its refusal."""

    settings: tuple[Setting, ...] = ()
    error: str | None = None


class CheckFailed(Exception):
    """The child process that runs vLLM's parser did not answer."""


def parse_with_vllm(
    argsets: Sequence[Sequence[str]],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> list[ParseResult]:
    """Parse each argument list (what follows the model in ``vllm serve MODEL ...``) with
    vLLM's parser in one child process. Raises CheckFailed if the child gives no result."""
    child_env = dict(os.environ if env is None else env)
    # As the engine runs vLLM: the Spyre plugin (it may add arguments), nothing sent anywhere.
    for key, value in (
        ("VLLM_PLUGINS", "sendnn_inference"),
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
        ("HF_HUB_OFFLINE", "1"),
    ):
        child_env.setdefault(key, value)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "spyre_engine.vllm_args"],
            input=json.dumps([list(a) for a in argsets]),
            capture_output=True,
            text=True,
            env=child_env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"vLLM's argument parser did not answer within {timeout:.0f}s") from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise CheckFailed(
            f"vLLM's argument parser exited with code {proc.returncode}: {' | '.join(tail)}"
        )
    return [
        ParseResult(tuple(Setting(*s) for s in r["settings"]), r["error"])
        for r in json.loads(lines[-1][len(RESULT_PREFIX) :])
    ]


def refusal(result: ParseResult) -> str | None:
    """Why these vLLM arguments may not be used (one line), or None when they may."""
    if result.error is not None:
        return f"vLLM does not accept the extra arguments: {result.error}"
    problems = []
    for s in result.settings:
        managed = MANAGED.get(s.dest)
        if managed is None or (s.dest == "model_tag" and s.given == MODEL_PLACEHOLDER):
            continue
        given = s.given
        if s.dest in SECRETS and "=" in given:
            given = given.split("=", 1)[0] + "=…"  # a refusal is logged: not the secret
        problems.append(
            f"{given!r} sets vLLM's {s.dest}, which the engine sets from "
            f"{managed.engine_flag} (SpyreModel {managed.spyre_field}): set that instead"
        )
    return "; ".join(problems) or None


def check_vllm_args(args: Sequence[str], *, env: Mapping[str, str] | None = None) -> str | None:
    """The extra vLLM arguments' refusal (see :func:`refusal`), or None; none given: None
    without starting vLLM's parser. Raises CheckFailed if the parser could not be run."""
    if not args:
        return None
    return refusal(parse_with_vllm([args], env=env)[0])


# ----------------------------------------------------------------- in the child process


class _Refused(Exception):
    """vLLM's parser refused the arguments (its ``error``/``exit``)."""


def _serve_parser() -> Any:
    """``vllm serve``'s parser as vllm/entrypoints/cli/main.py builds it; errors raise."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str) -> Any:  # type: ignore[override]
            raise _Refused(message)

        def exit(self, status: int = 0, message: str | None = None) -> Any:  # type: ignore[override]
            raise _Refused(message or f"--help or --version: vLLM's parser exited ({status})")

    parser = Parser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    return parser, ServeSubcommand().subparser_init(subparsers)


def _record_actions(parser: Any, events: list[tuple[str, str | None]]) -> None:
    """Make every action of ``parser`` append (dest, option string) to ``events`` when used."""
    classes: dict[type, type] = {}
    for action in parser._actions:
        base = type(action)
        if base not in classes:

            def call(self: Any, p: Any, ns: Any, values: Any, option: Any = None, b=base) -> None:
                events.append((self.dest, option))
                b.__call__(self, p, ns, values, option)

            classes[base] = type(f"Recording{base.__name__}", (base,), {"__call__": call})
        action.__class__ = classes[base]


def _normalised(arg: str) -> str:
    """An argument's name as FlexibleArgumentParser normalises it (``--a_b=1`` -> ``--a-b``)."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _given(option: str, args: list[str], used: set[int]) -> str:
    """The first unused argument that names ``option`` (or an abbreviation of it); vLLM's
    parser takes the arguments in order, so the n-th use of an option is its n-th mention."""
    for i, arg in enumerate(args):
        name = _normalised(arg)
        if i not in used and len(name) > 1 and name != "--" and option.startswith(name):
            used.add(i)
            return arg
    return option  # e.g. read from a --config file


def parse_one(args: Sequence[str]) -> ParseResult:
    """Parse ``vllm serve MODEL *args`` with vLLM's parser (in the child process)."""
    args = list(args)
    settings: list[Setting] = []
    rest: list[str] = []
    skip = False
    for i, arg in enumerate(args):  # vLLM's own --model rule, applied before its parser
        if skip:
            skip = False
        elif _MODEL_OPTION.match(arg):
            settings.append(Setting("model", "--model", arg))
            skip = arg == "--model" and i + 1 < len(args)
        else:
            rest.append(arg)
    parser, serve = _serve_parser()
    events: list[tuple[str, str | None]] = []
    _record_actions(serve, events)
    try:
        parser.parse_args(["serve", MODEL_PLACEHOLDER, *rest])
    except Exception as exc:  # _Refused, or e.g. a --config file that cannot be read
        return ParseResult(tuple(settings), str(exc) or type(exc).__name__)
    used: set[int] = set()
    for dest, option in events:
        given = MODEL_PLACEHOLDER if option is None else _given(option, rest, used)
        settings.append(Setting(dest, option, given))
    return ParseResult(tuple(settings))


def main() -> int:
    """Child process: a JSON list of argument lists on stdin, the results on one stdout line."""
    results = [parse_one(args) for args in json.load(sys.stdin)]
    doc = [
        {"settings": [[s.dest, s.option, s.given] for s in r.settings], "error": r.error}
        for r in results
    ]
    print(RESULT_PREFIX + json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
