"""``spyre-engine precompile|serve [flags] [-- vllm args]``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import spyre_contract as contract
from pydantic import ValidationError

from spyre_engine import compat
from spyre_engine.inuse import SERVICE_ACCOUNT_DIR, InUseCheck, InUseUnknown, api_lister
from spyre_engine.settings import (
    SENDNN_BACKENDS,
    Backend,
    CacheSettings,
    EngineSettings,
    PrecompileSettings,
    ServeSettings,
    add_arguments,
    env_name,
    settings_from_sources,
    split_passthrough,
)
from spyre_engine.summary import (
    REASON_ARTIFACT_CORRUPT,
    REASON_ARTIFACT_MISMATCH,
    REASON_CATALOG_ERROR,
    REASON_COMPILE_FAILED,
    REASON_ENGINE_FAILED,
    REASON_IN_USE_UNKNOWN,
    REASON_INVALID_SETTINGS,
    REASON_TERMINATED,
    REASON_UNSUPPORTED_BASE,
    FailureSummary,
    write_termination_log,
)
from spyre_engine.weights import ModelRef, parse_ref

log = logging.getLogger("spyre_engine")

DEFAULT_TERMINATION_LOG = contract.TERMINATION_LOG_PATH


class UsageError(Exception):
    """Bad command line (unknown flag, bad choice); reported as InvalidSettings."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per engine mode."""
    parser = _Parser(
        prog="spyre-engine",
        description="Precompile and serve LLMs on IBM Spyre with vLLM. Every flag can also be set "
        "by SPYRE_ENGINE_<FLAG> (flag wins). vLLM arguments go after --.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_arguments(
        sub.add_parser(contract.PRECOMPILE, help="Compile a shape into the artifact dir"),
        PrecompileSettings,
    )
    add_arguments(
        sub.add_parser(contract.SERVE, help="Serve the OpenAI API from a precompiled artifact"),
        ServeSettings,
    )
    add_arguments(
        sub.add_parser("usage", help="Report the size of every artifact on the cache volume"),
        CacheSettings,
    )
    add_arguments(
        sub.add_parser(
            contract.GC, help="Remove the given artifacts (skipping any being written), and orphans"
        ),
        CacheSettings,
    )
    sub.add_parser(
        "check-base",
        help="Print the image's vLLM and sendnn-inference versions; exit 1 unless supported",
    )
    return parser


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        flag = "--" + loc.replace("_", "-") if loc else ""
        parts.append(f"{flag}: {msg}" if flag else msg)
    return "; ".join(parts)


def _fail(termination_log: object, reason: str, message: str) -> int:
    summary = FailureSummary(reason=reason, message=message)
    log.error("%s: %s", reason, message)
    write_termination_log(termination_log, summary)  # type: ignore[arg-type]
    return 2 if reason == REASON_INVALID_SETTINGS else 1


def load_settings(
    command: str, flags: dict[str, object], passthrough: list[str] | None
) -> EngineSettings | CacheSettings:
    """Settings for ``command`` from flags, env and the vLLM args after ``--``."""
    if command in ("usage", "gc"):
        return settings_from_sources(CacheSettings, flags)  # type: ignore[no-any-return]
    model = PrecompileSettings if command == "precompile" else ServeSettings
    if passthrough is not None:
        flags["vllm_args"] = passthrough
    return settings_from_sources(model, flags)  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``spyre-engine`` console script."""
    process_started = time.monotonic()
    # What the engine (and the compiler under it) writes on the cache claim is group-writable:
    # where the platform assigns the uid (OpenShift), pods share the claim through its group
    # (the fsGroup, or group 0), not through the uid. World-readable as before.
    os.umask(0o002)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    ours, passthrough = split_passthrough(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(ours)
    except UsageError as exc:
        return _fail(_termination_log_early(ours), REASON_INVALID_SETTINGS, str(exc))
    if args.command == "check-base":
        return compat.report()
    flags = {k: v for k, v in vars(args).items() if k != "command"}
    # The termination log must be known even when the rest of the settings are invalid.
    termination_log = flags.get("termination_log") or os.environ.get(
        env_name("termination_log"), DEFAULT_TERMINATION_LOG
    )
    if args.command in ("precompile", "serve"):
        # First: on a base whose vLLM or plugin this engine does not support, nothing else
        # (settings, the vLLM argument check, a download, a compile) means anything.
        unsupported = compat.refusal()
        if unsupported is not None:
            return _fail(termination_log, REASON_UNSUPPORTED_BASE, unsupported)
    try:
        settings = load_settings(args.command, flags, passthrough)
    except ValidationError as exc:
        return _fail(termination_log, REASON_INVALID_SETTINGS, _validation_message(exc))
    if args.command in ("usage", "gc"):
        assert isinstance(settings, CacheSettings)
        return run_cache_command(args.command, settings)
    assert isinstance(settings, EngineSettings)
    refused = _refuse_managed_vllm_args(args.command, settings)
    if refused is not None:
        return _fail(termination_log, *refused)
    if args.command == "precompile":
        assert isinstance(settings, PrecompileSettings)
        return run_precompile(settings)
    assert isinstance(settings, ServeSettings)
    return run_serve(settings, process_started)


def _refuse_managed_vllm_args(command: str, settings: EngineSettings) -> tuple[str, str] | None:
    """(reason, message) when the vLLM arguments after ``--`` set what the engine sets itself
    (the shape, the model, the ports) or vLLM refuses them; decided by vLLM's own parser, before
    anything is downloaded, verified or compiled. None when they may be used."""
    from spyre_engine.vllm_args import CheckFailed, check_vllm_args

    try:
        problem = check_vllm_args(settings.vllm_args)
    except CheckFailed as exc:
        failed = REASON_COMPILE_FAILED if command == "precompile" else REASON_ENGINE_FAILED
        return failed, f"could not check the vLLM arguments {settings.vllm_args}: {exc}"
    if problem is None:
        return None
    return REASON_INVALID_SETTINGS, f"vLLM arguments (serving.extraArgs): {problem}"


def _termination_log_early(argv: Sequence[str]) -> str:
    """``--termination-log`` from raw argv (when argparse itself failed), else env or default."""
    for i, arg in enumerate(argv):
        if arg.startswith("--termination-log="):
            return arg.split("=", 1)[1]
        if arg == "--termination-log" and i + 1 < len(argv):
            return argv[i + 1]
    return os.environ.get(env_name("termination_log"), DEFAULT_TERMINATION_LOG)


class Terminated(BaseException):
    """SIGTERM/SIGINT during precompile (a BaseException, so no ``except Exception`` eats it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, frame: object) -> None:
    # Once: the cleanup that follows (stopping vLLM) must not be interrupted by a second signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def run_precompile(settings: PrecompileSettings) -> int:
    """``spyre-engine precompile``: exit 0 and a summary line, or non-zero and a reason.

    SIGTERM (a deleted Job) stops vLLM and its workers, records reason ``Terminated`` and exits
    128+15. Without a handler, PID 1 of a container ignores SIGTERM and the kubelet waits out the
    grace period before SIGKILL.
    """
    from spyre_engine.precompile import PrecompileError, precompile

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _terminate)
    try:
        summary = precompile(settings)
    except Terminated as exc:
        _fail(
            settings.termination_log,
            REASON_TERMINATED,
            f"precompile stopped by {exc} before it finished; no catalog entry was recorded",
        )
        return 128 + exc.signum
    except PrecompileError as exc:
        return _fail(settings.termination_log, exc.reason, exc.message)
    except Exception as exc:  # anything else still gets a reason in the termination log
        log.exception("Precompile failed")
        return _fail(
            settings.termination_log, REASON_COMPILE_FAILED, f"{type(exc).__name__}: {exc}"
        )
    log.info("Precompiled: %s", summary.to_line())
    write_termination_log(settings.termination_log, summary)
    print(summary.to_line(), flush=True)
    return 0


def run_cache_command(command: str, settings: CacheSettings) -> int:
    """``usage``: one JSON line with every artifact's size; ``gc``: remove ``--remove`` keys and
    report what was freed and what was skipped (being written, absent). Both write the line to
    stdout and the termination log."""
    import json

    from spyre_engine import gc

    try:
        in_use = _in_use_check(settings) if command == "gc" else None
    except InUseUnknown as exc:
        return _fail(settings.termination_log, REASON_IN_USE_UNKNOWN, f"{exc}; {NOTHING_REMOVED}")
    try:
        if command == "usage":
            doc = gc.usage(settings.cache_root)
        else:
            result = gc.gc(
                settings.cache_root,
                settings.remove,
                keep=settings.keep,
                orphans_unused_for=settings.orphans_unused_for,
                in_use=in_use,
                keep_models=_keep_models(settings.keep_models),
                models_in_use=in_use.models if in_use is not None else None,
            )
            if result.in_use_unknown and not result.removed:
                message = f"{result.in_use_unknown}; {NOTHING_REMOVED}"
                return _fail(settings.termination_log, REASON_IN_USE_UNKNOWN, message)
            doc = result.to_dict()
            left = gc.usage(settings.cache_root)
            doc["remainingBytes"] = left["totalBytes"]
            # the volume as the operator cannot see it (it mounts no claim): status.cache
            for field in ("volumeBytes", "freeBytes", "weightsBytes"):
                if field in left:
                    doc[field] = left[field]
    except OSError as exc:
        return _fail(settings.termination_log, REASON_CATALOG_ERROR, f"{command}: {exc}")
    line = gc.fit_summary(doc) if command == "gc" else json.dumps(doc, separators=(",", ":"))
    log.info("%s: %s", command, line)
    print(line, flush=True)
    if settings.termination_log is not None:
        try:
            Path(settings.termination_log).write_text(line + "\n")
        except OSError as exc:
            log.warning("Could not write termination log %s: %s", settings.termination_log, exc)
    return 0


NOTHING_REMOVED = "could not tell which artifacts are in use: nothing was removed"


def _keep_models(values: list[str] | None) -> list[ModelRef] | None:
    """``--keep-models`` parsed; None (no sweep of downloaded models) when unset or when any
    entry is not a model: keeping less than the operator asked could remove a used one."""
    if values is None:
        return None
    refs = [parse_ref(v) for v in values]
    if any(r is None for r in refs):
        log.warning("--keep-models has entries that are not models (%s): downloaded models "
                    "are left alone", [v for v, r in zip(values, refs, strict=True) if r is None])
        return None
    return [r for r in refs if r is not None]


def _in_use_check(settings: CacheSettings) -> InUseCheck | None:
    """With ``--claim``: the check gc runs before each removal (inuse.py); else None."""
    if not settings.claim:
        return None
    namespace = settings.namespace
    if not namespace:
        try:
            namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
        except OSError as exc:
            raise InUseUnknown(f"no --namespace and no ServiceAccount namespace ({exc})") from exc
    return InUseCheck(settings.claim, api_lister(namespace))


def _has_files(path: Path) -> bool:
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


class ArtifactMismatch(Exception):
    """The artifact has no catalog entry this server can use."""


def select_entry(
    settings: ServeSettings, entries: list[dict[str, Any]], model_path: str
) -> dict[str, Any]:
    """The catalog entry ``serve`` runs: usable by ``--backend`` and matching the effective shape
    (what the plugin will configure for these flags; with sendnn it caps unknown configurations)
    and the model. Raises ArtifactMismatch with a message naming what the catalog has."""
    from spyre_engine import catalog
    from spyre_engine.known_configs import read_config_json

    path = catalog.catalog_path(settings.artifact_dir)
    config_json = read_config_json(model_path)
    shape = catalog.entry_data(settings, model_path, config_json)
    shape.pop("MODEL_NAME")
    usable = [e for e in entries if catalog.serves_with(e, settings.backend)]
    if catalog.find_entry(usable, shape) is None:
        others = [e for e in entries if e not in usable]
        note = (
            f" ({len(others)} entr{'y' if len(others) == 1 else 'ies'} compiled with "
            f"{', '.join(sorted({str(e.get('dynamo_backend')) for e in others}))}, which "
            f"--backend {settings.backend} cannot serve)"
            if others
            else ""
        )
        raise ArtifactMismatch(
            f"{path} has no entry for {catalog.describe({'MODEL_NAME': settings.model, **shape})}"
            f" usable by --backend {settings.backend}{note}; it has: "
            f"{' | '.join(catalog.describe(e['data']) for e in entries)}"
        )
    entry = catalog.find_entry(usable, {"MODEL_NAME": model_path, **shape})
    if entry is None:
        models = sorted({str(e["data"].get("MODEL_NAME")) for e in entries})
        raise ArtifactMismatch(
            f"{path} has this shape only for model(s) {', '.join(models)}, not {model_path}"
        )
    if settings.backend in SENDNN_BACKENDS:
        stale = catalog.stack_mismatch(entry, catalog.compiler_stack())
        if stale:
            raise ArtifactMismatch(f"{path}: {stale}")
    missing = [k for k in catalog.OPTIONAL_KEYS if k in shape and k not in entry["data"]]
    if missing:
        log.warning("The catalog entry does not record %s; not checked", ", ".join(missing))
    inductor = Path(settings.artifact_dir) / "inductor"
    if settings.backend == Backend.INDUCTOR and not _has_files(inductor):
        raise ArtifactMismatch(
            f"{settings.artifact_dir} has a catalog entry but no inductor graphs "
            "(<artifact>/inductor is empty); serve does not compile: precompile again"
        )
    return entry


class ArtifactCorruptError(Exception):
    """The artifact does not match the manifest its precompile wrote."""


def verify_artifact(settings: ServeSettings) -> dict[str, Any] | None:
    """Check the artifact against its manifest (``--verify-artifact``) before anything loads it;
    None when verification is off. Raises ArtifactCorruptError with what is wrong."""
    from spyre_engine import manifest

    if settings.verify_artifact == "off":
        log.warning("--verify-artifact off: serving %s unchecked", settings.artifact_dir)
        return None
    try:
        doc = manifest.verify(settings.artifact_dir, settings.verify_artifact)
    except manifest.ArtifactCorrupt as exc:
        raise ArtifactCorruptError(str(exc)) from exc
    log.info(
        "Artifact verified (%s): %d files, %d bytes",
        settings.verify_artifact,
        len(doc["files"]),
        doc.get("totalBytes", 0),
    )
    return doc


def run_serve(settings: ServeSettings, process_started: float) -> int:
    """``spyre-engine serve``: refuse fast without a matching catalog entry, else serve."""
    from spyre_engine import catalog
    from spyre_engine.launch import ModelNotFound, resolve_model
    from spyre_engine.metrics import EngineMetrics

    metrics = EngineMetrics()
    t0 = time.monotonic()
    try:
        entries = catalog.read_catalog(settings.artifact_dir)
    except catalog.CatalogError as exc:
        return _fail(settings.termination_log, REASON_ARTIFACT_MISMATCH, str(exc))
    path = catalog.catalog_path(settings.artifact_dir)
    if not entries:
        return _fail(
            settings.termination_log,
            REASON_ARTIFACT_MISMATCH,
            f"no precompiled shapes in {path}: run spyre-engine precompile for this shape first",
        )
    t1 = time.monotonic()
    try:
        model_path = resolve_model(settings)
    except ModelNotFound as exc:
        return _fail(settings.termination_log, exc.reason, str(exc))
    t2 = time.monotonic()
    try:
        entry = select_entry(settings, entries, model_path)
    except ArtifactMismatch as exc:
        return _fail(settings.termination_log, REASON_ARTIFACT_MISMATCH, str(exc))
    t_selected = time.monotonic()
    try:
        verified = verify_artifact(settings)
    except ArtifactCorruptError as exc:
        return _fail(settings.termination_log, REASON_ARTIFACT_CORRUPT, str(exc))
    t3 = time.monotonic()
    from spyre_engine.launch import package_versions

    installed = package_versions()["sendnn_inference"]
    if entry.get("sendnn_inference_version") not in (None, installed):
        log.warning(
            "Artifact was compiled with sendnn-inference %s, running %s",
            entry.get("sendnn_inference_version"),
            installed,
        )
    metrics.startup_phase_seconds.labels("validate").set(
        (time.monotonic() - t3) + (t_selected - t2) + (t1 - t0)
    )
    metrics.startup_phase_seconds.labels("resolve_model").set(t2 - t1)
    if verified is not None:
        metrics.startup_phase_seconds.labels("verify").set(t3 - t_selected)

    from spyre_engine import answers
    from spyre_engine.serve import serve

    references, tolerance = None, answers.DEFAULT_TOLERANCE
    if settings.output_check != "off":
        try:
            found = answers.read(settings.artifact_dir)
        except ValueError as exc:  # covered by the manifest: a file the engine cannot read
            return _fail(settings.termination_log, REASON_ARTIFACT_CORRUPT, str(exc))
        if found is None:
            log.info("The artifact has no reference answers (built before the output check, "
                     "or with --reference-answers off): served without the check")
        else:
            references, doc = found
            tolerance = float(doc.get("tolerance") or tolerance)
            if answers.passed_before(doc, Path(model_path), settings.output_verified):
                references = None
    try:
        return serve(settings, model_path, metrics, process_started, references, tolerance)
    except Exception as exc:  # e.g. the port is taken: still leave a reason
        log.exception("Serve failed")
        return _fail(settings.termination_log, REASON_ENGINE_FAILED, f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
