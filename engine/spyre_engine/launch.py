"""How to start vLLM for a shape: resolve the model, build the plugin env and the command line.

Shared by ``precompile`` (which must compile) and ``serve`` (which must not), so both run the
exact same vLLM configuration and the graphs precompile writes are the ones serve looks up.
Nothing here imports vLLM: the engine process only spawns it.
"""

from __future__ import annotations

import collections
import contextlib
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

from spyre_engine.settings import EngineSettings, ServeSettings

_EXCEPTION_LINE = re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception): \S")


class ModelNotFound(Exception):
    """The model could not be resolved to a local directory with a config.json."""


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
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFound(f"hf://{ref}: download failed: {first}") from exc


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def plugin_env(
    settings: EngineSettings,
    *,
    require_precompiled: bool,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment vLLM runs in: ``base`` plus the plugin's settings.

    General settings (backend, MASTER_ADDR/PORT, require-precompiled for serve) are only set when
    not already set; the paths derived from ``--artifact-dir`` and the pooling shape always win.
    ``require_precompiled`` is False for precompile (it must compile) and True for serve.
    """
    env = dict(os.environ if base is None else base)
    artifact = Path(settings.artifact_dir).resolve()
    defaults: dict[str, str] = {
        "VLLM_PLUGINS": "sendnn_inference",
        "SENDNN_INFERENCE_DYNAMO_BACKEND": settings.backend,
        "TORCH_SENDNN_CACHE_ENABLE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    # Paths derived from --artifact-dir always win: an inherited value (torch sets
    # TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_<user> in any process that imported it, CI sets
    # TMPDIR) would silently put the graphs outside the artifact.
    forced: dict[str, str] = {"TORCH_SENDNN_CACHE_DIR": str(artifact)}
    if require_precompiled:
        defaults["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] = "1"
    else:
        # Precompile must be allowed to compile, whatever the image's default says.
        forced["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] = "0"
        env.pop("DISABLE_COMPILATION", None)
    if settings.backend == "inductor":
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
    """Inductor's cache dir and TMPDIR: the artifact's, or a private copy if serve cannot write it.

    Serving pods mount the cache claim read-only, but inductor takes file locks under its cache
    dir (``<cache>/locks``) even when every graph is a cache hit, so a read-only artifact fails
    with EROFS. Serve then works on a copy in the (writable) temp dir; the artifact is unchanged.
    """
    cache, tmp = artifact / "inductor", artifact / "tmp"
    if not serving or os.access(artifact, os.W_OK):
        return cache, tmp
    scratch = Path(tempfile.mkdtemp(prefix="spyre-engine-inductor-"))
    if cache.is_dir():
        shutil.copytree(cache, scratch / "inductor", symlinks=True)
    return scratch / "inductor", scratch / "tmp"


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
    if isinstance(settings, ServeSettings):
        # Our front owns graceful shutdown; vLLM itself should stop at once when told to.
        cmd += ["--shutdown-timeout", "0"]
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
            self.tail.append(raw.decode(errors="replace").rstrip())

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

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the group, SIGKILL what is left after ``grace`` seconds; return the exit code."""
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.05)
        # Stragglers (TP workers, engine core) may outlive the server process.
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        self._pump.join(timeout=1)
        return self.proc.poll()
