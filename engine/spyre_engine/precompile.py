"""``spyre-engine precompile``: compile every graph of a shape into the artifact dir; record it.

The plugin compiles during engine start-up (its warmup), so precompiling is starting vLLM with the
shape and the cache env pointing into the artifact dir, waiting until it reports healthy, and
stopping it. Then the catalog entry serve looks for is added.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

from spyre_engine import answers, catalog, known_configs, manifest, space
from spyre_engine.disk import directory_size
from spyre_engine.gc import writing
from spyre_engine.known_configs import read_config_json
from spyre_engine.launch import (
    PRECOMPILE_SHUTDOWN_TIMEOUT,
    PRECOMPILE_STOP_GRACE,
    Child,
    ModelNotFound,
    model_revision,
    package_versions,
    plugin_env,
    resolve_model,
    served_name,
    vllm_command,
)
from spyre_engine.ports import free_port
from spyre_engine.settings import COMPILE_ONLY_BACKEND, Backend, PrecompileSettings
from spyre_engine.summary import (
    REASON_CATALOG_ERROR,
    REASON_COMPILE_FAILED,
    REASON_INSUFFICIENT_CACHE_SPACE,
    REASON_UNSUPPORTED_CONFIGURATION,
    FailureSummary,
    PrecompileSummary,
    Versions,
)

log = logging.getLogger(__name__)


class PrecompileError(Exception):
    """Precompile failed; carries the CamelCase reason for the termination log."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def summary(self) -> FailureSummary:
        """The failure line for the termination log."""
        return FailureSummary(reason=self.reason, message=self.message)


def remove_dead_sockets(path: Path) -> int:
    """Remove the IPC socket files a stopped vLLM left in ``path``; how many were removed.

    vLLM binds its ZMQ sockets under TMPDIR, which is ``<art>/tmp`` for inductor, and does not
    unlink them when stopped; left there they make copying or archiving the artifact fail.
    """
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    os.unlink(entry.path)
                    removed += 1
    return removed


def wait_healthy(child: Child, port: int, timeout: float) -> None:
    """Block until vLLM's /health answers 200; raise PrecompileError if it dies or times out."""
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise PrecompileError(
                REASON_COMPILE_FAILED,
                f"vLLM exited with code {child.proc.returncode} during warmup: "
                f"{child.last_error()}",
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.5)
    raise PrecompileError(REASON_COMPILE_FAILED, f"warmup did not finish within {timeout:.0f}s")


def run_warmup(
    settings: PrecompileSettings, model_path: str, env: dict[str, str],
    references: dict[str, object] | None = None,
) -> dict[str, int] | None:
    """Start vLLM with the shape so the plugin's warmup compiles every graph, then stop it.
    With ``references`` (a dict to fill), the engine's reference answers are recorded into it
    while vLLM runs (record_references).

    Returns what the plugin logged it configured (max_model_len, max_num_seqs, chunk), if seen.
    """
    port = free_port()
    cmd = vllm_command(
        settings, model_path, host="127.0.0.1", port=port,
        shutdown_timeout=PRECOMPILE_SHUTDOWN_TIMEOUT,
    )  # fmt: skip
    log.info("Starting vLLM to compile the shape: %s", " ".join(cmd))
    child = Child(cmd, env)
    try:
        wait_healthy(child, port, settings.compile_timeout)
        if references is not None:
            references.update(record_references(settings, model_path, port))
        return child.spyre_config
    finally:
        child.stop(PRECOMPILE_STOP_GRACE)
        tmp = Path(env.get("TMPDIR") or "/")
        if tmp.is_relative_to(Path(settings.artifact_dir).resolve()):  # only ever our own dir
            remove_dead_sockets(tmp)


#: The compile backends whose precompile vLLM runs the model (sendnn_compile_only builds graphs
#: it cannot run; eager compiles nothing).
RUNS_THE_MODEL = (Backend.SENDNN, Backend.INDUCTOR)


def reference_backend(settings: PrecompileSettings) -> str | None:
    """The backend this precompile records the artifact's reference answers on (None: none).

    Decoders only. A reference is worth what its backend is trusted for: a compiled backend's
    own answers would only show a later change, never its compiler's mistake. So the CPU
    compile backends get theirs from a second vLLM of the same shape on ``eager`` on the same
    node, after the compile: ``sendnn_compile_only``, which runs nothing (it builds the cards'
    graphs on a CPU node; upstream's tests compare the cards with CPU outputs), and
    ``inductor``, whose generated kernels are what the check is for. ``sendnn`` compiling on
    the cards (precompile.onCards) records on the vLLM that compiled: its pods are then checked
    against the cards' own first answers (a later change shows, a compiler's mistake does
    not; the default compile-only path is the one checked against CPU). ``eager`` compiles
    nothing, so its reference checks what else can change under an unchanged artifact key:
    the model's weights (changed under the same name) and the engine's answers to the shapes
    of answers.shaped_prompts; its precompile starts vLLM for that alone.
    """
    if settings.reference_answers != "record" or settings.is_pooling:
        return None
    return {Backend.SENDNN: Backend.SENDNN, Backend.INDUCTOR: Backend.EAGER,
            COMPILE_ONLY_BACKEND: Backend.EAGER, Backend.EAGER: Backend.EAGER}.get(settings.backend)


def record_references_on(
    settings: PrecompileSettings, model_path: str, backend: str
) -> dict[str, object]:
    """The reference answers from a vLLM of the same shape on ``backend`` (another than the
    artifact's), started for nothing else and stopped after; it writes nothing to the artifact."""
    other = settings.model_copy(update={"backend": backend})
    log.info("Recording the reference answers on %s, apart from the %s compile", backend,
             settings.backend)
    references: dict[str, object] = {}
    run_warmup(other, model_path, plugin_env(other, require_precompiled=False), references)
    references["source"] = backend
    return references


def _post_json(url: str, body: dict[str, object], timeout: float = 600) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer: dict[str, object] = json.loads(resp.read())
        return answer


def record_references(
    settings: PrecompileSettings, model_path: str, port: int
) -> dict[str, object]:
    """The running engine's greedy answers to the default prompts (answers.py), each
    tokenized by vLLM's /tokenize, and to the two of answers.shaped_prompts (longer than the
    shape's prefill chunk, and a repeat of its prefix), as the reference document: answered
    one at a time."""
    base = f"http://127.0.0.1:{port}"
    name = served_name(settings, model_path)
    tolerance = answers.QUANTIZED_TOLERANCE if quantization(
        read_config_json(model_path)) else answers.DEFAULT_TOLERANCE
    try:
        prompts = []
        for i, text in enumerate(answers.DEFAULT_PROMPTS):
            tokens = _post_json(f"{base}/tokenize", {"model": name, "prompt": text})["tokens"]
            prompts.append((f"p{i}", [int(t) for t in tokens]))  # type: ignore[attr-defined]
        chunk = settings.max_num_batched_tokens or known_configs.DEFAULT_CHUNK_SIZE
        prompts = answers.shaped_prompts(prompts, chunk, settings.max_model_len,
                                         settings.reference_max_tokens)

        async def post(body: dict[str, object]) -> dict[str, object]:
            return await asyncio.to_thread(_post_json, f"{base}/v1/completions", body)

        got = asyncio.run(answers.record(post, name, prompts, settings.reference_max_tokens))
        # The same prompts the way a serving pod's check asks them (a batch, then the prefix
        # repeat): a compiling backend builds those shapes into the artifact here, not in
        # every pod at start-up; and the engine agreeing with itself is logged.
        verdict = asyncio.run(answers.check(post, name, got, tolerance, inject=False))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise PrecompileError(
            REASON_COMPILE_FAILED, f"recording the reference answers failed: {exc}"
        ) from exc
    if verdict.ok:
        log.info("Asked together, the prompts were answered as one at a time: %s",
                 verdict.message())
    else:
        log.warning("Asked together, the prompts were not answered as one at a time: %s",
                    verdict.message())
    versions = {k: v for k, v in package_versions().items() if v}
    log.info("Recorded reference answers: %d prompts, %d tokens", len(got),
             sum(len(a.token_ids) for a in got))
    return answers.document(got, "self", settings.backend, versions, tolerance,
                            settings.reference_max_tokens)


def record_what_was_compiled(
    data: dict[str, object], logged: dict[str, int] | None, pooling: bool
) -> None:
    """Make the entry say what the plugin configured, when it logged something else.

    The entry is computed by :func:`spyre_engine.known_configs.effective_shape`; the plugin's own
    ``Configurations for Spyre`` line is the truth. A difference means that function is out of
    date with the plugin; the entry records the truth (serve will then refuse the shape and name
    both) and the log says so.
    """
    if not logged or pooling:
        return
    truth = {
        "VLLM_DT_MAX_CONTEXT_LEN": logged["max_model_len"],
        "VLLM_DT_MAX_BATCH_SIZE": logged["max_num_seqs"],
        "VLLM_DT_CHUNK_LEN": logged["max_num_batched_tokens"],
    }
    for key, value in truth.items():
        if data.get(key) != value:
            log.warning(
                "The plugin configured %s=%s, not the %s the engine predicted; recording %s",
                key,
                value,
                data.get(key),
                value,
            )
            data[key] = value


def check_known(settings: PrecompileSettings, model_path: str, env: dict[str, str]) -> None:
    """Fail before starting vLLM when the plugin would refuse an unknown configuration: its
    own model registry decides, on vLLM's own config object (known_configs.plugin_check)."""
    warmup = [(s.prompt_len, s.batch_size) for s in settings.warmup_shapes] or None
    try:
        check = known_configs.plugin_check(
            model_path,
            settings.tensor_parallel_size,
            settings.max_model_len,
            settings.max_num_seqs,
            warmup,
            env,
        )
    except Exception as exc:  # the plugin's own error (e.g. an unreadable model_configs.yaml)
        raise PrecompileError(
            REASON_UNSUPPORTED_CONFIGURATION,
            f"the plugin cannot check the configuration: {type(exc).__name__}: {exc}",
        ) from exc
    if not check.known:
        raise PrecompileError(
            REASON_UNSUPPORTED_CONFIGURATION,
            f"{check.message}: use a listed shape, set compile.supportedModel for a fine-tune "
            "or a mirror of a listed model, or compile.requireKnownConfiguration: false to let "
            "the plugin cap the shape (spyre-engine's --no-require-known-config)",
        )


def quantization(config_json: dict[str, object]) -> str | None:
    """The quantization a model's config.json declares (``quantization_config``, top level or
    the text model's), e.g. ``fp8``; None for an unquantized model. vLLM sets
    ``model_config.quantization`` from it, which the plugin reads as "FP8 model"."""
    for scope in (config_json, config_json.get("text_config")):
        if isinstance(scope, dict) and scope.get("quantization_config"):
            qc = scope["quantization_config"]
            method = qc.get("quant_method") if isinstance(qc, dict) else None
            return str(method or "quantized")
    return None


def check_compile_only(settings: PrecompileSettings, config_json: dict[str, object]) -> None:
    """Refuse sendnn_compile_only for a quantized model: upstream's own graph tests compile
    those with sendnn on the cards ("On pytorch 2.10 currently the eager and
    sendnn_compile_only backends do not work for quantized models", sendnn-inference
    tests/aftu/test_compare_graphs.py)."""
    method = quantization(config_json)
    if settings.backend == COMPILE_ONLY_BACKEND and method is not None:
        raise PrecompileError(
            REASON_UNSUPPORTED_CONFIGURATION,
            f"the model is quantized ({method}) and {COMPILE_ONLY_BACKEND} does not compile "
            "quantized (FP8) models: precompile it on the cards (SpyreModel "
            "precompile.onCards: true, or --backend sendnn)",
        )


def check_space(
    settings: PrecompileSettings,
    artifact: Path,
    model_path: str,
    config_json: dict[str, object],
    env: dict[str, str],
) -> None:
    """Refuse with InsufficientCacheSpace, before compiling, an artifact that would not fit on
    the claim by the size of the last one of its shape there (space.py)."""
    data = catalog.entry_data(settings, model_path, config_json, env)
    est = space.estimate(artifact, settings.backend, data)
    if est is None:
        log.info("No earlier artifact of this shape on the cache claim: its size is not "
                 "estimated, free space not checked")
        return
    needed = int(est.size_bytes * space.MARGIN)
    free = space.free_bytes(artifact)
    missing = space.shortfall(needed, directory_size(artifact), free)
    if free is None or missing is None:
        log.info("The last artifact of this shape (%s) took %s; %s free on the cache claim",
                 est.key, space.human(est.size_bytes),
                 "unknown" if free is None else space.human(free))
        return
    raise PrecompileError(
        REASON_INSUFFICIENT_CACHE_SPACE,
        space.insufficient_space_message(est, needed, free, artifact.parent))


def invalidate_manifest(artifact: Path) -> None:
    """Before compiling into ``artifact``: files the manifest says are damaged are removed (so
    they are compiled anew, not reused), then the manifest itself, so a compile that dies half
    way leaves a dir serve refuses instead of one whose old manifest vouches for new files."""
    removed = manifest.remove_damaged(artifact)
    if removed:
        log.warning(
            "Removed %d damaged file(s) of the previous artifact before compiling: %s",
            len(removed),
            ", ".join(removed[:5]),
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(manifest.manifest_path(artifact))


def precompile(settings: PrecompileSettings) -> PrecompileSummary:
    """Compile the shape into ``artifact_dir`` and add its catalog entry; idempotent. The dir's
    writer lock is held throughout, so ``spyre-engine gc`` never removes it meanwhile."""
    try:
        model_path = resolve_model(settings)
    except ModelNotFound as exc:
        raise PrecompileError(exc.reason, str(exc)) from exc
    artifact = Path(settings.artifact_dir)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(writing(artifact))
        except OSError as exc:
            raise PrecompileError(REASON_CATALOG_ERROR, f"cannot lock {artifact}: {exc}") from exc
        return _precompile_locked(settings, model_path, artifact)


def _precompile_locked(
    settings: PrecompileSettings, model_path: str, artifact: Path
) -> PrecompileSummary:
    """:func:`precompile` while holding the dir's writer lock (gc leaves the dir alone)."""
    try:
        artifact.mkdir(parents=True, exist_ok=True)
        catalog.read_catalog(artifact)  # fail before compiling when the catalog is corrupt
    except (OSError, catalog.CatalogError) as exc:
        raise PrecompileError(REASON_CATALOG_ERROR, str(exc)) from exc

    versions = package_versions()
    env = plugin_env(settings, require_precompiled=False)
    config_json = read_config_json(model_path)
    check_compile_only(settings, config_json)
    if env.get("SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG") == "1":
        check_known(settings, model_path, env)
    check_space(settings, artifact, model_path, config_json, env)
    started = time.monotonic()
    logged = None
    recorded_on = reference_backend(settings)
    # The compiling vLLM answers the prompts whenever it runs the model and a reference is
    # recorded: on sendnn those answers are the reference; on inductor they compile the shapes
    # the serving pods' check then takes into the artifact (else every pod compiled them at
    # start-up, in a private dir), and eager's answers replace them as the reference.
    answered: dict[str, object] | None = (
        {} if recorded_on is not None and settings.backend in RUNS_THE_MODEL else None)
    # Before any load: the reference answers are those of the files as they were then.
    weights = answers.weights_fingerprint(Path(model_path)) if recorded_on else None
    files = answers.files_signature(Path(model_path)) if recorded_on else None
    if settings.backend == Backend.EAGER:
        log.info("Backend eager compiles nothing; recording the shape%s",
                 " and the reference answers" if recorded_on else " only")
    else:
        invalidate_manifest(artifact)
        logged = run_warmup(settings, model_path, env, answered)
    compile_seconds = time.monotonic() - started
    references = answered if recorded_on == settings.backend else None
    if recorded_on is not None and (answered is None or recorded_on != settings.backend):
        references = record_references_on(settings, model_path, recorded_on)
    # Before the catalog entry and the manifest (whose checksums cover the file); an earlier
    # compile's answers never stay beside graphs they were not recorded with.
    (artifact / answers.REFERENCE_FILENAME).unlink(missing_ok=True)
    if references:
        if weights is not None and files == answers.files_signature(Path(model_path)):
            # A serving pod finding the same files, on an artifact that passed before, need
            # not check again (serve's --output-verified).
            references["weights"] = weights
        elif weights is not None:
            log.warning("The model's files changed while the precompile ran: every serving "
                        "pod checks its answers")
        answers.write(artifact, references)

    stack = catalog.compiler_stack()
    entry = catalog.make_entry(
        settings, model_path, versions["sendnn_inference"] or "unknown", config_json, env, stack
    )
    record_what_was_compiled(entry["data"], logged, settings.is_pooling)
    try:
        added = catalog.add_entry(artifact, entry)
    except (OSError, catalog.CatalogError) as exc:
        raise PrecompileError(REASON_CATALOG_ERROR, str(exc)) from exc
    log.info(
        "%s catalog entry %s",
        "Added" if added else "Kept existing",
        catalog.describe(entry["data"]),
    )
    # Last: the manifest exists only once the graphs and the catalog entry are complete.
    try:
        doc = manifest.write_manifest(artifact)
    except OSError as exc:
        raise PrecompileError(REASON_CATALOG_ERROR, f"cannot write the manifest: {exc}") from exc
    log.info(
        "Wrote %s: %d files, %d bytes",
        manifest.MANIFEST_FILENAME,
        len(doc["files"]),
        doc["totalBytes"],
    )
    return PrecompileSummary(
        key=settings.artifact_key,
        path=str(artifact.resolve()),
        compileSeconds=round(compile_seconds, 3),
        sizeBytes=directory_size(artifact),
        modelRevision=model_revision(model_path),
        versions=Versions(**versions, **stack),
        references=_references_summary(references),
    )


def _references_summary(doc: dict[str, object] | None) -> dict[str, object] | None:
    """What status shows of the reference answers: how many prompts and tokens, from where."""
    if not doc:
        return None
    prompts = doc.get("prompts") or []
    assert isinstance(prompts, list)
    return {
        "source": doc.get("source"),
        "prompts": len(prompts),
        "tokens": sum(len(p.get("tokenIds") or []) for p in prompts),
        "tolerance": doc.get("tolerance"),
    }
