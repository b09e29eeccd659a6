"""How to start vLLM for a shape: resolve the model, build the plugin env and the command line.

Shared by ``precompile`` (which must compile) and ``serve`` (which must not), so both run the
exact same vLLM configuration and the graphs precompile writes are the ones serve looks up.
Nothing here imports vLLM: the engine process only spawns it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import spyre_contract as contract

from spyre_engine.ports import free_port
from spyre_engine.settings import COMPILE_ONLY_BACKEND, SENDNN_BACKENDS, Backend, EngineSettings

log = logging.getLogger(__name__)

# Seconds vLLM may take to stop its engine core and workers after SIGTERM (``--shutdown-timeout``),
# and how long the engine waits for the whole process group before SIGKILL (a bit longer, so vLLM's
# own escalation runs first). Inside it, the engine core gives its TP workers
# VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, then SIGTERM and 4 s, then SIGKILL; the API server's
# budget must cover that plus the core's own teardown and interpreter exit. An idle engine core
# normally exits in 1-3 s; on a loaded 2-core machine a TP=2 worker spent ~5 s in its own
# teardown (Python's final garbage collection of the model), and in a cold run the workers needed
# more than 6 + 4 s and the engine core was force-killed at 15 s: hence 10 s for the workers and
# 30 s in all. vLLM's SIGTERM to a worker does nothing once its death pipe has closed (the
# handler raises only the first time), so the worker's grace is its real budget.
VLLM_SHUTDOWN_TIMEOUT = 30
WORKER_SHUTDOWN_TIMEOUT = 10
STOP_GRACE = VLLM_SHUTDOWN_TIMEOUT + 3.0
# A precompile has nothing in flight to protect and its pod has Kubernetes' default grace (30 s):
# a SIGTERM mid-compile (an engine core inside a compile does not get to its handler) must end
# the process group well before the kubelet's SIGKILL.
PRECOMPILE_SHUTDOWN_TIMEOUT = 15
PRECOMPILE_STOP_GRACE = PRECOMPILE_SHUTDOWN_TIMEOUT + 3.0

# platform.py logs the configuration it settled on (after capping unknown configurations).
_SPYRE_CONFIG_LINE = re.compile(
    r"Configurations for Spyre\. max_model_len=(\d+), max_num_seqs=(\d+), block_size=\d+, "
    r"max_num_batched_tokens=(\d+)"
)
_EXCEPTION_LINE = re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception): \S")


class ModelNotFound(Exception):
    """The model could not be resolved to a local directory with a config.json."""

    reason = "ModelNotFound"


class ModelAccessDenied(ModelNotFound):
    """The hub refused the download (401/403): no or a wrong token, or a gated repo whose terms
    the token's user has not accepted."""

    reason = "ModelAccessDenied"


class ModelDownloadFailed(ModelNotFound):
    """The download failed for a reason other than the repository: the hub's name, a proxy,
    TLS, a timeout, the hub's own error or a full cache claim. The message names the cause and
    the setting that fixes it."""

    reason = "ModelDownloadFailed"


def model_revision(model_path: str) -> str | None:
    """The commit a hub snapshot resolved to (``.../snapshots/<commit>``), else None."""
    path = Path(model_path)
    return path.name if path.parent.name == "snapshots" else None


def package_versions() -> dict[str, str | None]:
    """Versions of the packages compiled graphs depend on (read from metadata, no imports)."""
    out: dict[str, str | None] = {}
    for key, dist in (
        ("sendnn_inference", "sendnn-inference"),
        ("vllm", "vllm"),
        ("torch", "torch"),
    ):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out


def resolve_model(settings: EngineSettings) -> str:
    """Turn ``--model`` into a local directory; downloads ``hf://`` models when a hub is reachable.

    Raises ModelNotFound with a one-line reason.
    """
    spec = settings.model
    if spec.startswith("hf://"):
        return _download_hf(spec[5:], settings.hf_cache_dir)
    if spec.startswith("pvc://"):
        path = settings.pvc_root / spec[6:].lstrip("/")
    elif spec.startswith("file://"):
        path = Path(spec[7:])
    else:
        path = Path(spec)
    if not path.is_dir():
        raise ModelNotFound(f"model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"model directory {path} has no config.json")
    return str(path)


def _download_hf(ref: str, cache_dir: Path | None) -> str:
    repo_id, _, revision = ref.strip("/").partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub comes with vLLM
        raise ModelNotFound(f"hf://{ref}: huggingface_hub is not installed") from exc
    revision_or_none = revision or None
    # A complete snapshot in the cache volume must work without a hub (air-gapped serving).
    with contextlib.suppress(Exception):
        return str(
            snapshot_download(
                repo_id, revision=revision_or_none, cache_dir=cache_dir, local_files_only=True
            )
        )
    try:
        return str(snapshot_download(repo_id, revision=revision_or_none, cache_dir=cache_dir))
    except Exception as exc:
        raise _download_error(ref, exc) from exc


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from (``__cause__``, else ``__context__``), outermost
    first; bounded, a cycle stops it."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 16 and all(cur is not x for x in out):
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _status(exc: BaseException) -> int | None:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


#: What a failed download's cause says to do: (label, remedy), by the first cause that matches.
_DOWNLOAD_CAUSES: tuple[tuple[str, str], ...] = (
    ("the cache claim is full",
     "free space on the claim (cache.volume.retention, or delete unused models) or grow it "
     "(cache.volume.size)"),
    ("a proxy refused the connection",
     "check HTTPS_PROXY / NO_PROXY in model.downloadEnv"),
    ("TLS failed",
     "if the hub's (or the proxy's) certificate is not trusted, name the CA that signed it in "
     "model.caBundle; else fix HF_ENDPOINT in model.downloadEnv (http:// or https://)"),
    ("the hub's name does not resolve",
     "check HF_ENDPOINT in model.downloadEnv and the cluster's DNS (a disconnected site needs a "
     "mirror, or a pvc:// model)"),
    ("the hub did not answer in time",
     "check the network path to the hub (HTTPS_PROXY in model.downloadEnv); the compile is "
     "retried"),
    ("the hub cannot be reached",
     "check HF_ENDPOINT / HTTPS_PROXY in model.downloadEnv and egress NetworkPolicies (a "
     "disconnected site needs a mirror, or a pvc:// model)"),
    ("the hub answered with an error",
     "the hub's own failure: the compile is retried with back-off"),
)


def _is_httpx(exc: BaseException, *names: str) -> bool:
    """``exc`` is an instance of one of httpx's exception classes ``names`` (by its class
    hierarchy: httpx comes with huggingface_hub, not as a dependency of the engine's own)."""
    return any(
        c.__module__.split(".")[0] == "httpx" and c.__name__ in names for c in type(exc).__mro__
    )


def _download_cause(exc: BaseException) -> int | None:
    """The index in :data:`_DOWNLOAD_CAUSES` of what made a download fail (None: unknown).
    Judged by exception types and errno codes along the chain, never by the text."""
    import errno
    import ssl

    chain = _chain(exc)
    tests = (
        lambda e: isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT),
        lambda e: _is_httpx(e, "ProxyError"),
        lambda e: isinstance(e, ssl.SSLError),
        lambda e: isinstance(e, socket.gaierror),
        lambda e: isinstance(e, TimeoutError) or _is_httpx(e, "TimeoutException"),
        lambda e: isinstance(e, ConnectionError) or _is_httpx(e, "ConnectError", "NetworkError"),
        lambda e: (_status(e) or 0) >= 500,
    )
    # the first test, in order, that any exception of the chain passes
    return next((i for i, test in enumerate(tests) if any(test(e) for e in chain)), None)


def _download_error(ref: str, exc: Exception) -> ModelNotFound:
    """ModelAccessDenied for 401/403 and gated repos; ModelNotFound when the hub has no such
    repository, revision or file; ModelDownloadFailed, naming the cause and its remedy, for
    the rest (DNS, proxy, TLS, timeouts, the hub's 5xx, a full claim). One line each."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0] if lines else type(exc).__name__
    detail = next((ln for ln in lines[1:] if "url" in ln.lower() or "access" in ln.lower()), "")
    chain = _chain(exc)
    status = next((s for e in chain if (s := _status(e)) is not None), None)
    names = {type(e).__name__ for e in chain}
    gated = "GatedRepoError" in names
    if gated or status in (401, 403):
        why = (
            "the repo is gated: accept its terms on the hub with the account of "
            "model.tokenSecret's token"
            if gated
            else "the repo is private or does not exist: check model.uri, or set "
            "model.tokenSecret to a Secret whose token may read it"
        )
        return ModelAccessDenied(
            f"hf://{ref}: access denied ({status or 'gated'}): {why}; {first} {detail}".strip()
        )
    missing = names & {"RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError"}
    if missing or status == 404:
        return ModelNotFound(
            f"hf://{ref}: no such repository, revision or file on the hub: check model.uri "
            f"(and its @revision); {first} {detail}".strip()
        )
    cause = _download_cause(exc)
    label, remedy = (
        _DOWNLOAD_CAUSES[cause]
        if cause is not None
        else ("download failed", "see the message; the compile is retried with back-off")
    )
    return ModelDownloadFailed(f"hf://{ref}: {label}: {remedy}; {first} {detail}".strip())


def plugin_env(
    settings: EngineSettings,
    *,
    require_precompiled: bool,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment vLLM runs in: ``base`` plus the plugin's settings.

    Everything the engine derives from its flags and its mode always wins over ``base`` (the
    image bakes ``SENDNN_INFERENCE_DYNAMO_BACKEND=sendnn``, a Deployment may carry
    ``TORCH_SENDNN_CACHE_ENABLE=0`` or a fixed ``MASTER_PORT``): the backend, the sendnn cache
    switch and dir, the free ``MASTER_PORT``, the require-precompiled settings, the inductor dirs
    and the pooling shape. Only site settings (``MASTER_ADDR``, offline hub, usage stats) are
    defaults that an inherited value keeps. ``require_precompiled`` is False for precompile (it
    must compile) and True for serve (it must not).
    """
    env = dict(os.environ if base is None else base)
    artifact = Path(settings.artifact_dir).resolve()
    defaults: dict[str, str] = {
        "VLLM_PLUGINS": "sendnn_inference",
        "MASTER_ADDR": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": str(WORKER_SHUTDOWN_TIMEOUT),
    }
    # Derived from the flags: an inherited value would run another backend than --backend, cache
    # nothing while precompile records a catalog entry, or share a port with another engine.
    # Paths derived from --artifact-dir win too: torch sets TORCHINDUCTOR_CACHE_DIR=/tmp/... in
    # any process that imported it, CI sets TMPDIR; either would put the graphs elsewhere.
    forced: dict[str, str] = {
        **contract.sendnn_cache_env(settings.backend, str(artifact)),
        "MASTER_PORT": str(free_port()),
    }
    if require_precompiled:
        forced["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] = "1"
        if settings.is_pooling:
            # Upstream's precompiled mode does not support pooling models ("This feature is
            # only available for generative models", docs/user_guide/configuration.md) and the
            # plugin returns early for them (compilation_utils.py). Their graphs load from
            # torch_sendnn's cache (TORCH_SENDNN_CACHE_DIR, filled by precompile for the same
            # warmup shapes); serve refuses before vLLM starts unless the catalog lists those
            # shapes and the manifest vouches for the files.
            env.pop("DISABLE_COMPILATION", None)
        else:
            # torch_sendnn loads graphs from the cache only; the plugin sets this itself for
            # decoders too (REQUIRE_PRECOMPILED_DECODERS=1).
            forced["DISABLE_COMPILATION"] = "true"
    else:
        # Precompile must be allowed to compile, whatever the image's default says.
        forced["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] = "0"
        env.pop("DISABLE_COMPILATION", None)
        if settings.backend in SENDNN_BACKENDS and getattr(settings, "require_known_config", False):
            # The plugin raises for a configuration model_configs.yaml does not list, instead
            # of capping it and compiling something nobody asked for.
            forced["SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG"] = "1"
    if settings.backend == COMPILE_ONLY_BACKEND:
        # The plugin sets this itself (platform.py); set here too, so every process vLLM
        # spawns has it whatever the image's FLEX_DEVICE says.
        forced["FLEX_DEVICE"] = "COMPILE"
    elif env.get("FLEX_DEVICE") == "COMPILE":
        # Inherited from a compile-only setup: with it nothing would run on the cards.
        log.warning("Ignoring inherited FLEX_DEVICE=COMPILE: --backend %s", settings.backend)
        env.pop("FLEX_DEVICE")
    if settings.backend == Backend.INDUCTOR:
        # Inductor keeps its graphs and ~150 MB of generated headers in these; both must live in
        # the artifact for a warm start.
        inductor_cache, inductor_tmp = inductor_dirs(artifact, serving=require_precompiled)
        forced["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache)
        forced["TMPDIR"] = str(inductor_tmp)
    if settings.is_pooling:
        # The plugin compares these with the catalog entry; they are the shape, so they win too.
        shapes = settings.warmup_shapes
        forced["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] = ",".join(str(s.prompt_len) for s in shapes)
        forced["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"] = ",".join(str(s.batch_size) for s in shapes)
    for key, value in defaults.items():
        env.setdefault(key, value)
    env.update(forced)
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        if key in forced:
            Path(forced[key]).mkdir(parents=True, exist_ok=True)
    return env


def inductor_dirs(artifact: Path, *, serving: bool) -> tuple[Path, Path]:
    """Inductor's cache dir and TMPDIR: the artifact's, or private ones if serve cannot write it.

    Serving pods mount the cache claim read-only, but inductor takes file locks under its cache
    dir (``<cache>/locks``) even when every graph is a cache hit, so a read-only artifact fails
    with EROFS. Serve then works in the (writable) temp dir; the artifact is unchanged: a copy of
    the cache (a few MB of graphs and kernels), and a TMPDIR that links to the artifact's files.
    That TMPDIR holds inductor's precompiled C++ header (~150 MB, under
    ``torchinductor_<user>/precompiled_headers``), which inductor looks for in every process that
    loads a C++ kernel, cache hit or not; an empty TMPDIR made each start rebuild it (4.5 s of a
    41 s start of the tiny model on 2 cores).
    """
    cache, tmp = artifact / "inductor", artifact / "tmp"
    if not serving or os.access(artifact, os.W_OK):
        return cache, tmp
    scratch = Path(tempfile.mkdtemp(prefix="spyre-engine-inductor-"))
    if cache.is_dir():
        shutil.copytree(cache, scratch / "inductor", symlinks=True)
    link_tree(tmp, scratch / "tmp")
    return scratch / "inductor", scratch / "tmp"


def link_tree(src: Path, dst: Path) -> None:
    """``dst``: ``src``'s directories (new, writable) with a symlink to each of its files.

    Lock files are left out: inductor opens them for writing, which a link into a read-only
    mount refuses; it creates its own next to the links.
    """
    dst.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        return
    for root, dirs, files in os.walk(src):
        here = dst / Path(root).relative_to(src)
        for name in dirs:
            if (Path(root) / name).is_symlink():  # os.walk does not enter it: link it whole
                (here / name).symlink_to(Path(root) / name)
            else:
                (here / name).mkdir(exist_ok=True)
        for name in files:
            if not name.endswith(".lock"):
                (here / name).symlink_to(Path(root) / name)


def served_name(settings: EngineSettings, model_path: str) -> str:
    """The OpenAI model name: ``--served-name``, else the hf repo, else the directory name."""
    if settings.served_name:
        return settings.served_name
    if settings.model.startswith("hf://"):
        return settings.model[5:].strip("/").partition("@")[0]
    return Path(model_path).name or model_path


def vllm_command(
    settings: EngineSettings,
    model_path: str,
    *,
    host: str,
    port: int,
    prefix_caching: bool | None = None,
    shutdown_timeout: int = VLLM_SHUTDOWN_TIMEOUT,
    logits_processors: list[str] | None = None,
) -> list[str]:
    """``vllm serve`` for this shape on ``host:port`` (the same interpreter as ours)."""
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        model_path,
        "--served-model-name",
        served_name(settings, model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(settings.tensor_parallel_size),
        "--max-model-len",
        str(settings.max_model_len),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--disable-uvicorn-access-log",
    ]
    if settings.max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    if settings.is_pooling:
        cmd += ["--runner", "pooling"]
        cmd += ["--convert", "embed" if settings.task == "embed" else "classify"]
    if prefix_caching is not None:
        cmd.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    # When the engine stops vLLM (after its own drain), vLLM gets these seconds to stop its engine
    # core and TP workers in order; with 0, vLLM's shutdown(procs, timeout=0) (v1/utils.py)
    # SIGKILLs the processes holding the cards at once.
    cmd += ["--shutdown-timeout", str(shutdown_timeout)]
    if logits_processors:  # the output check's (serve.py); before the user's arguments
        cmd += ["--logits-processors", *logits_processors]
    cmd += list(settings.vllm_args)
    return cmd


def _die_with_parent() -> None:
    """In the forked child: get SIGKILL if the engine process dies (Linux), so no orphan serves."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Child:
    """A vLLM process in its own process group, its output copied to ours with a kept tail."""

    def __init__(self, cmd: list[str], env: Mapping[str, str], tail_lines: int = 200) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.killed: list[int] = []
        # What the plugin logged it configured (max_model_len, max_num_seqs, chunk), if seen.
        self.spyre_config: dict[str, int] | None = None
        self.proc = subprocess.Popen(
            cmd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one group: TP workers and the engine core die with it
            preexec_fn=_die_with_parent,
        )
        self._pump = threading.Thread(target=self._copy_output, daemon=True)
        self._pump.start()

    def _copy_output(self) -> None:
        assert self.proc.stdout is not None
        out = sys.stdout.buffer
        for raw in iter(self.proc.stdout.readline, b""):
            with contextlib.suppress(Exception):
                out.write(raw)
                out.flush()
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            match = _SPYRE_CONFIG_LINE.search(line)
            if match:
                self.spyre_config = {
                    "max_model_len": int(match[1]),
                    "max_num_seqs": int(match[2]),
                    "max_num_batched_tokens": int(match[3]),
                }

    @property
    def pid(self) -> int:
        """PID (and process group id) of the vLLM server."""
        return self.proc.pid

    def alive(self) -> bool:
        """True while the vLLM server process runs."""
        return self.proc.poll() is None

    def last_error(self) -> str:
        """The most telling line of the output tail, for a termination message."""
        lines = [ln for ln in self.tail if ln.strip()]
        # An exception line ("FooError: why") says most, but not vLLM's wrapper, which only
        # points at the engine core's exception above it.
        for ln in reversed(lines):
            if _EXCEPTION_LINE.search(ln) and "See root cause above" not in ln:
                return ln.strip()[-400:]
        for ln in reversed(lines):
            if "Error" in ln or "error" in ln or "Exception" in ln:
                return ln.strip()[-400:]
        return lines[-1].strip()[-400:] if lines else "no output"

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (ignores a group that is gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def group_members(self) -> list[int]:
        """PIDs of the group's processes that still run (zombies are gone); reaps our own."""
        self.proc.poll()
        if self.proc.returncode is not None:
            # Orphans of the group are re-parented to us when we are PID 1 (or a subreaper).
            with contextlib.suppress(ChildProcessError, OSError):
                while os.waitpid(-self.proc.pid, os.WNOHANG)[0] > 0:
                    pass
        return group_members(self.proc.pid)

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """Stop vLLM in order: SIGTERM, wait for the whole group, SIGKILL what is left.

        SIGTERM goes to the vLLM server only, which stops its engine core and the TP workers
        itself within ``--shutdown-timeout``; only if the server is already gone does the whole
        group get it. After ``grace`` seconds whatever still runs in the group gets SIGKILL.
        Returns the server's exit code.
        """
        started = time.monotonic()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        else:
            self.signal_group(signal.SIGTERM)
        deadline = started + grace
        left = self.group_members()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.group_members()
        if left:
            log.warning(
                "vLLM process group still running %.1fs after SIGTERM; SIGKILL to %s",
                grace,
                left,
            )
            self.signal_group(signal.SIGKILL)
            self.killed = left
        else:
            log.info(
                "vLLM process group exited by itself %.1fs after SIGTERM (server exit code %s)",
                time.monotonic() - started,
                self.proc.returncode,
            )
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        self.group_members()  # reap
        self._pump.join(timeout=1)
        return self.proc.poll()


def group_members(pgid: int) -> list[int]:
    """PIDs of the running (not zombie) processes in process group ``pgid`` (Linux /proc)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members
