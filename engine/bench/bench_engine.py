"""Engine benchmark (not a test): warm vs cold start, wrapper overhead, SIGTERM behaviour.

Run with ``make bench-engine``. Builds the tiny model offline, then measures in one run:
1. time-to-ready of ``spyre-engine serve --backend inductor`` on a precompiled artifact vs on an
   empty one (cold: inductor compiles at start-up);
2. ``spyre-engine serve --backend eager`` vs plain ``vllm serve``: time-to-ready and request
   latency through the front (the wrapper's overhead);
3. SIGTERM with streams in flight: failed requests and exit time, spyre-engine vs plain vLLM
   (default ``--shutdown-timeout 0`` and ``--shutdown-timeout 10``);
4. where the time goes: ``spyre-engine serve`` on the precompiled inductor artifact (read-only,
   as the serving pods mount it) vs on an eager one, sequential starts, each broken into phases
   from the lines the engine, vLLM and the plugin print (``--phases-only`` runs just this).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
from spyre_engine.testing.process import EngineProcess, free_port, http_status, kill_tree
from spyre_engine.testing.tiny_model import build_tiny_model

SHAPE = ["--max-model-len", "512", "--max-num-seqs", "4", "--max-num-batched-tokens", "128"]
# The eager servers get a long context so one SIGTERM stream (LONG tokens) outlasts the drain.
EAGER_SHAPE = ["--max-model-len", "2048", "--max-num-seqs", "4", "--max-num-batched-tokens", "128"]
SHORT, LONG = 40, 1900
MODEL = "tiny"
STARTUP_TIMEOUT = 600.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_url(url: str, proc: subprocess.Popen[bytes], timeout: float = STARTUP_TIMEOUT) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if http_status(url) == 200:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(url)


def precompile(
    model: Path, art: Path, backend: str, workdir: Path, shape: list[str] = SHAPE
) -> dict[str, object]:
    term = workdir / f"{art.name}.{backend}.term"
    args = [sys.executable, "-m", "spyre_engine.cli", "precompile", "--model", str(model)]
    args += ["--artifact-dir", str(art), "--backend", backend, "--termination-log", str(term)]
    started = time.monotonic()
    with open(workdir / f"precompile-{art.name}.log", "wb") as out:
        subprocess.run(args + shape, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=1800)
    summary: dict[str, object] = json.loads(term.read_text())
    summary["wallSeconds"] = time.monotonic() - started  # the whole command, imports included
    return summary


def start_spyre(
    model: Path, art: Path, backend: str, workdir: Path, drain: float, shape: list[str] = SHAPE
) -> EngineProcess:
    port = free_port()
    args = ["serve", "--model", str(model), "--artifact-dir", str(art), "--backend", backend]
    args += ["--served-name", MODEL, "--port", str(port), "--host", "127.0.0.1"]
    args += ["--drain-timeout", str(drain), "--termination-log", str(workdir / "serve.term")]
    return EngineProcess(args + shape, log_path=workdir / f"spyre-{backend}-{port}.log", port=port)


class PlainVllm:
    """Plain ``vllm serve`` with the plugin env, for comparison."""

    def __init__(self, model: Path, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        env = dict(os.environ)
        env.update(
            VLLM_PLUGINS="sendnn_inference",
            SENDNN_INFERENCE_DYNAMO_BACKEND="eager",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            VLLM_NO_USAGE_STATS="1",
        )
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model)]
        cmd += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--disable-uvicorn-access-log", *EAGER_SHAPE, *extra]
        self._log = open(workdir / f"vllm-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> float:
        return wait_url(self.url + "/health", self.proc)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


def warmup_seconds(log_path: Path) -> float | None:
    """The plugin's own warmup time ("[WARMUP] Finished in X s") from an engine log."""
    import re

    found = re.findall(r"\[WARMUP\] Finished in ([0-9.]+)s", log_path.read_text(errors="replace"))
    return float(found[-1]) if found else None


def latency(urls: dict[str, str], n: int) -> dict[str, dict[str, float]]:
    """Per server: mean/p50 of ``n`` short completions and the mean 64-token stream duration.

    Requests alternate between the servers so background load hits both alike.
    """
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 8, "ignore_eos": True}
    stream_body = {**body, "max_tokens": 64, "stream": True}
    times: dict[str, list[float]] = {name: [] for name in urls}
    streams: dict[str, list[float]] = {name: [] for name in urls}
    with httpx.Client(timeout=60) as client:
        for url in urls.values():
            client.post(url + "/v1/completions", json=body).raise_for_status()  # warm
        for i in range(n):
            for name, url in urls.items():
                t0 = time.perf_counter()
                client.post(url + "/v1/completions", json=body).raise_for_status()
                times[name].append(time.perf_counter() - t0)
                if i % 2 == 0:
                    t0 = time.perf_counter()
                    with client.stream("POST", url + "/v1/completions", json=stream_body) as r:
                        for _ in r.iter_lines():
                            pass
                    streams[name].append(time.perf_counter() - t0)
    return {
        name: {
            "mean_ms": statistics.mean(times[name]) * 1000,
            "p50_ms": statistics.median(times[name]) * 1000,
            "stream64_s": statistics.mean(streams[name]),
        }
        for name in urls
    }


def sigterm_run(url: str, proc: subprocess.Popen[bytes], streams: list[int], cap: float) -> dict:
    """Start streams, SIGTERM the server, count failures and time the exit (capped)."""
    import threading

    results: list[dict[str, object]] = []
    first = threading.Barrier(len(streams) + 1, timeout=120)

    def run(max_tokens: int) -> None:
        res: dict[str, object] = {"max_tokens": max_tokens, "done": False, "error": None}
        results.append(res)
        body = {
            "model": MODEL,
            "prompt": "the quick brown fox",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        signalled = False
        try:
            with httpx.Client(timeout=httpx.Timeout(cap, connect=5)) as client:
                with client.stream("POST", url + "/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if not signalled and line.startswith("data: "):
                            signalled = True
                            first.wait()
                        if line.startswith("data: ") and '"error"' in line:
                            res["error"] = "error event"
                        if line == "data: [DONE]":
                            res["done"] = True
        except Exception as exc:  # noqa: BLE001
            res["error"] = res["error"] or type(exc).__name__
            if not signalled:
                first.abort()

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in streams]
    for t in threads:
        t.start()
    first.wait()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=cap)
        exit_s: float | None = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        exit_s = None
    for t in threads:
        t.join(5)
    failed = sum(1 for r in results if r["error"] or not r["done"])
    return {
        "streams": len(streams),
        "failed": failed,
        "exit_s": exit_s,
        "exit_code": proc.poll(),
        "detail": results,
    }


def fake_inductor_artifact(art: Path) -> None:
    """Make an eager (graph-less) artifact pass serve's checks for inductor, so the cold run
    compiles at start-up. serve refuses such an artifact on purpose; only the benchmark wants
    to measure the compile the artifact saves."""
    from spyre_engine import catalog

    entries = catalog.read_catalog(art)
    for entry in entries:
        entry["dynamo_backend"] = "inductor"
    catalog.catalog_path(art).write_text(json.dumps(entries))
    (art / "inductor").mkdir(parents=True, exist_ok=True)
    (art / "inductor" / ".bench-cold").write_text("no graphs\n")


# --------------------------------------------------------------------------- start-up phases
# Where a start on a precompiled inductor artifact spends the time an eager start does not.
# Milestones are lines the engine and vLLM print, stamped by the benchmark when they arrive (vLLM's
# own timestamps have 1 s resolution); a phase runs from the previous milestone to its own. The
# messages come from spyre_engine.serve, vllm (api_utils.py, v1/engine/core.py, api_server.py,
# uvicorn) and sendnn_inference (v1/worker/spyre_worker.py). A milestone a start does not print
# folds its phase into the next one.
READY = "(bench: /health/startup 200)"
MILESTONES: list[tuple[str, str]] = [
    ("wrapper: interpreter, imports, checks, artifact verify", "spyre_engine.serve: Listening on"),
    ("wrapper: vLLM env (inductor: private cache dirs)", "spyre_engine.serve: Starting vLLM on"),
    ("API server: interpreter, vLLM + torch imports, config", "vLLM server version"),
    ("engine core: process, imports, config", "Initializing a V1 LLM engine"),
    ("worker: init, distributed env", "load model..."),
    ("model load (weights; torch.compile wrapper)", "load model took"),
    ("KV cache sizing", "[WARMUP] Prefill ["),
    ("warmup prefill (inductor: Dynamo trace + compiled-graph load)", "[WARMUP] Decode..."),
    ("warmup decode (inductor: Dynamo re-trace, dynamic shapes)", "[WARMUP] Deploying prefill"),
    ("warmup deploy prefill + decode", "[WARMUP] Finished in"),
    ("engine core: scheduler, handshake; API server: routes", "Starting vLLM server on"),
    ("API server: uvicorn start-up", "Application startup complete"),
    ("wrapper: its health poll sees vLLM", "spyre_engine.serve: vLLM is serving"),
    ("probe: /health/startup answers 200", READY),
]
# torch's step log (TORCH_LOGS=dynamo,inductor; only in the extra detail start).
_TORCH_STEPS = {
    "trace_start": "Step 1: torchdynamo start tracing",
    "trace_done": "Step 1: torchdynamo done tracing",
    "backend_start": "Step 2: calling compiler function",
    "backend_done": "Step 2: done compiler function",
}


def readonly_command(art: Path, cmd: list[str]) -> list[str]:
    """``cmd`` seeing ``art`` read-only, as the serving pods mount the cache claim.

    As root (modes do not stop root) in a private mount namespace with a read-only bind mount of
    ``art`` (EROFS, exactly the pod's case); otherwise the modes are enough.
    """
    if os.geteuid() == 0:
        script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            str(art),
        ] + cmd
    subprocess.run(["chmod", "-R", "a-w", str(art)], check=True)
    return cmd


class TimedStart:
    """``spyre-engine serve`` whose output lines are stamped (monotonic, since spawn) on arrival."""

    def __init__(
        self,
        model: Path,
        art: Path,
        backend: str,
        workdir: Path,
        *,
        read_only: bool,
        env: dict[str, str] | None = None,
        tag: str = "",
    ) -> None:
        from spyre_engine.testing.process import engine_command

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = ["serve", "--model", str(model), "--artifact-dir", str(art), "--backend", backend]
        args += ["--served-name", MODEL, "--port", str(self.port), "--host", "127.0.0.1"]
        args += ["--termination-log", str(workdir / "serve.term"), *SHAPE]
        cmd = engine_command(*args)
        if read_only:
            cmd = readonly_command(art, cmd)
        # The engine's temp dir (where serve puts its private inductor dirs), one per start; short,
        # as a pod's /tmp: vLLM puts its ZMQ sockets there (at most 107 characters).
        self.tmp = Path(tempfile.mkdtemp(prefix="sb-", dir="/tmp"))
        full_env = {**os.environ, "TMPDIR": str(self.tmp), **(env or {})}
        self.lines: list[tuple[float, str]] = []
        self.log_path = workdir / f"phases-{backend}{tag}-{self.port}.log"
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        import threading

        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "w") as out:
            for raw in iter(self.proc.stdout.readline, b""):
                t = time.monotonic() - self.t0
                line = raw.decode(errors="replace").rstrip()
                self.lines.append((t, line))
                out.write(f"{t:9.3f} {line}\n")

    def wait_ready(self) -> float:
        ready = wait_url(self.url + "/health/startup", self.proc)
        self.lines.append((time.monotonic() - self.t0, READY))
        return ready

    def startup_metric(self) -> dict[str, float]:
        """``spyre_engine_startup_phase_seconds`` by phase, from the engine's /metrics."""
        import re

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        found = re.findall(
            r'spyre_engine_startup_phase_seconds\{phase="(\w+)"\} ([0-9.e+-]+)', text
        )
        return {name: float(value) for name, value in found}

    def kill(self) -> None:
        """Kill the engine and every descendant's process group (vLLM runs in its own)."""
        kill_tree(self.proc)
        self._pump.join(timeout=5)


def split_phases(lines: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds per MILESTONES phase from stamped lines (a missing milestone joins the next)."""
    out: dict[str, float] = {}
    prev, i = 0.0, 0
    for name, marker in MILESTONES:
        found = next((k for k in range(i, len(lines)) if marker in lines[k][1]), None)
        if found is None:
            out[name] = 0.0
            continue
        out[name] = lines[found][0] - prev
        prev, i = lines[found][0], found + 1
    return out


def torch_detail(lines: list[tuple[float, str]]) -> dict[str, float | int]:
    """Dynamo tracing vs the inductor backend (graph load on a cache hit), from torch's step log.

    Sums over compiled frames; ``first_backend_s`` is the first frame's backend call, which pays
    the one-time costs (inductor's imports, the C++ header check, loading the kernels).
    """
    trace = backend = first_backend = 0.0
    frames = hits = misses = 0
    started: dict[str, float] = {}
    for t, line in lines:
        for key, marker in _TORCH_STEPS.items():
            if marker in line:
                if key.endswith("_start"):
                    started[key] = t
                elif key == "trace_done" and "trace_start" in started:
                    trace += t - started.pop("trace_start")
                    frames += 1
                elif key == "backend_done" and "backend_start" in started:
                    spent = t - started.pop("backend_start")
                    first_backend = first_backend or spent
                    backend += spent
        hits += "fx graph cache hit" in line
        misses += "fx graph cache miss" in line
    return {
        "frames": frames,
        "dynamo_trace_s": trace,
        "inductor_backend_s": backend,
        "first_backend_s": first_backend,
        "fx_cache_hits": hits,
        "fx_cache_misses": misses,
    }


def private_dirs_report(tmp: Path, started_at: float) -> dict[str, object]:
    """What serve put in its private dirs: their size, and whether inductor's precompiled C++
    header was rebuilt there (a regular ``.gch`` file written after the start) or reused."""
    scratch = sorted(tmp.glob("spyre-engine-inductor-*"))
    if not scratch:
        return {"private_dirs": False}
    size = 0
    rebuilt = False
    for path in scratch[0].rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        size += path.stat().st_size
        if path.name.endswith(".gch") and path.stat().st_mtime >= started_at:
            rebuilt = True
    return {"private_dirs": True, "private_bytes": size, "pch_rebuilt": rebuilt}


def phases(model: Path, ind_art: Path, eager_art: Path, work: Path, rounds: int) -> dict:  # type: ignore[type-arg]
    """Sequential starts, inductor (read-only, as in the pods) vs eager, order alternating."""
    runs: dict[str, list[dict[str, object]]] = {"inductor": [], "eager": []}
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        order = ["inductor", "eager"] if r % 2 == 0 else ["eager", "inductor"]
        for backend in order:
            art = ind_art if backend == "inductor" else eager_art
            log(f"phases round {r + 1}/{rounds}: spyre-engine serve --backend {backend}")
            wall = time.time()
            start = TimedStart(
                model, art, backend, work, read_only=backend == "inductor", tag=f"-r{r}"
            )
            try:
                ready = start.wait_ready()
                metric = start.startup_metric()
            finally:
                start.kill()
            run: dict[str, object] = {
                "ready_s": ready,
                "phases": split_phases(start.lines),
                "metric": metric,
                "log": str(start.log_path),
            }
            if backend == "inductor":
                run.update(private_dirs_report(start.tmp, wall))
            shutil.rmtree(start.tmp, ignore_errors=True)
            runs[backend].append(run)
            load.append(os.getloadavg()[0])
    # One more inductor start with torch's step log on, to split the warmup (not in the means).
    log("phases detail: inductor start with TORCH_LOGS=dynamo,inductor")
    detail_start = TimedStart(
        model, ind_art, "inductor", work, read_only=True,
        env={"TORCH_LOGS": "dynamo,inductor"}, tag="-detail",
    )  # fmt: skip
    try:
        detail_ready = detail_start.wait_ready()
    finally:
        detail_start.kill()
    shutil.rmtree(detail_start.tmp, ignore_errors=True)
    detail: dict[str, object] = {"ready_s": detail_ready, **torch_detail(detail_start.lines)}
    detail["phases"] = split_phases(detail_start.lines)
    load.append(os.getloadavg()[0])
    return {"rounds": rounds, "runs": runs, "torch_detail": detail, "loadavg_1m": load}


def print_phases(res: dict) -> None:  # type: ignore[type-arg]
    runs = res["runs"]

    def mean(backend: str, get: object) -> float:
        return statistics.mean(get(run) for run in runs[backend])  # type: ignore[operator]

    ind_total, eag_total = (
        mean("inductor", lambda r: r["ready_s"]),
        mean("eager", lambda r: r["ready_s"]),
    )
    gap = ind_total - eag_total
    load = res["loadavg_1m"]
    print(
        f"\n## start-up phases: spyre-engine serve, inductor (precompiled, read-only) vs eager; "
        f"mean of {res['rounds']} sequential starts each, order alternating; 1-min load "
        f"{min(load):.1f}-{max(load):.1f}"
    )
    print("| phase | inductor s | eager s | difference s | share of the gap |")
    print("|---|---|---|---|---|")
    for name, _ in MILESTONES:
        i = mean("inductor", lambda r, n=name: r["phases"][n])
        e = mean("eager", lambda r, n=name: r["phases"][n])
        print(f"| {name} | {i:.2f} | {e:.2f} | {i - e:+.2f} | {(i - e) / gap:.0%} |")
    print(f"| **total to ready** | {ind_total:.2f} | {eag_total:.2f} | {gap:+.2f} | 100% |")
    print(f"inductor/eager: {ind_total / eag_total:.2f}x")
    for key in ("engine_start", "verify", "output_check", "total"):
        i = mean("inductor", lambda r, k=key: r["metric"].get(k, 0.0))
        e = mean("eager", lambda r, k=key: r["metric"].get(k, 0.0))
        print(
            f"spyre_engine_startup_phase_seconds{{phase={key!r}}}: inductor {i:.2f}, eager {e:.2f}"
        )
    check = mean("inductor", lambda r: r["metric"].get("output_check", 0.0))
    compiled = float((res.get("precompile") or {}).get("compileSeconds") or 0.0)
    print(
        f"output check (the artifact's reference prompts answered and compared before Ready): "
        f"{check:.2f} s = {check / ind_total:.0%} of the inductor start to ready"
        + (f", {check / compiled:.1%} of its compile ({compiled:.1f} s)" if compiled else "")
    )
    wall = float((res.get("precompile") or {}).get("wallSeconds") or 0.0)
    if compiled and wall:
        print(
            f"inductor precompile: {wall:.1f} s in all, its compile {compiled:.1f} s; the rest "
            f"({wall - compiled:.1f} s = {(wall - compiled) / wall:.0%}) is mostly the reference "
            "answers' eager vLLM (its start and the prompts), with the imports and the manifest"
        )
    rebuilt = [r.get("pch_rebuilt") for r in runs["inductor"]]
    private = [r.get("private_bytes", 0) / 1e6 for r in runs["inductor"]]  # type: ignore[operator]
    print(
        f"inductor private dirs: {', '.join(f'{p:.1f} MB' for p in private)} written; "
        f"C++ precompiled header rebuilt at start-up: {rebuilt}"
    )
    d = res["torch_detail"]
    warm = d["phases"]
    print(
        f"torch detail (one extra inductor start, TORCH_LOGS=dynamo,inductor, ready "
        f"{d['ready_s']:.1f} s): {d['frames']} frames traced by Dynamo in "
        f"{d['dynamo_trace_s']:.2f} s; inductor backend {d['inductor_backend_s']:.2f} s "
        f"(first frame {d['first_backend_s']:.2f} s); FX graph cache {d['fx_cache_hits']} hits, "
        f"{d['fx_cache_misses']} misses; warmup prefill + decode "
        f"{warm[MILESTONES[7][0]] + warm[MILESTONES[8][0]]:.2f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-inductor", action="store_true", help="skip the warm/cold part")
    parser.add_argument("--requests", type=int, default=30, help="latency samples per server")
    parser.add_argument("--drain", type=float, default=10.0, help="spyre-engine drain timeout")
    parser.add_argument(
        "--phases-only", action="store_true", help="only the inductor vs eager start-up phases"
    )
    parser.add_argument("--rounds", type=int, default=2, help="start-up phase rounds")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="spyre-bench-"))
    log(f"work dir {work}")
    model = build_tiny_model(work / "tiny-granite")
    out: dict[str, object] = {}

    if args.phases_only:
        log("precompile inductor and eager for the phases")
        out["precompile_inductor"] = precompile(model, work / "art-inductor", "inductor", work)
        precompile(model, work / "art-eager-phases", "eager", work)
        res = phases(model, work / "art-inductor", work / "art-eager-phases", work, args.rounds)
        res["precompile"] = out["precompile_inductor"]
        out["phases"] = res
        print(json.dumps(out, indent=2, default=str))
        print_phases(res)
        return 0

    if not args.skip_inductor:
        warm_art = work / "art-inductor"
        log("precompile inductor (cold compile)")
        out["precompile_inductor"] = precompile(model, warm_art, "inductor", work)
        log("serve inductor on the precompiled artifact (warm)")
        eng = start_spyre(model, warm_art, "inductor", work, args.drain)
        try:
            warm = eng.wait_started(STARTUP_TIMEOUT)
        finally:
            eng.kill()
        warm_warmup = warmup_seconds(eng.log_path)
        cold_art = work / "art-inductor-cold"
        precompile(model, cold_art, "eager", work)  # catalog entry only, no graphs
        fake_inductor_artifact(cold_art)
        log("serve inductor on an empty artifact (cold)")
        eng = start_spyre(model, cold_art, "inductor", work, args.drain)
        try:
            cold = eng.wait_started(STARTUP_TIMEOUT)
        finally:
            eng.kill()
        cold_warmup = warmup_seconds(eng.log_path)
        out["inductor"] = {
            "warm_ready_s": warm,
            "cold_ready_s": cold,
            "cold_over_warm": cold / warm,
            "warm_plugin_warmup_s": warm_warmup,
            "cold_plugin_warmup_s": cold_warmup,
        }
        precompile(model, work / "art-eager-phases", "eager", work)
        out["phases"] = phases(model, warm_art, work / "art-eager-phases", work, args.rounds)
        out["phases"]["precompile"] = out["precompile_inductor"]  # type: ignore[index]

    eager_art = work / "art-eager"
    precompile(model, eager_art, "eager", work, EAGER_SHAPE)
    log("plain vllm serve (eager)")
    plain = PlainVllm(model, work)
    eng: EngineProcess | None = None
    try:
        # Sequential starts (concurrent ones would share the 2 cores); the proxy's idle cost
        # during the other's start is negligible.
        plain_ready = plain.wait_ready()
        log("spyre-engine serve (eager)")
        eng = start_spyre(model, eager_art, "eager", work, args.drain, EAGER_SHAPE)
        spyre_ready = eng.wait_started(STARTUP_TIMEOUT)
        log("latency, alternating between the two")
        lat = latency({"spyre": eng.url, "vllm": plain.url}, args.requests)
        spyre_lat, plain_lat = lat["spyre"], lat["vllm"]
        log(f"SIGTERM spyre-engine serve (drain {args.drain}s)")
        spyre_term = sigterm_run(eng.url, eng.proc, [SHORT, SHORT, SHORT, LONG], cap=40)
        log("SIGTERM plain vllm serve (default --shutdown-timeout 0)")
        plain_term = sigterm_run(plain.url, plain.proc, [SHORT, SHORT, SHORT, LONG], cap=40)
    finally:
        if eng is not None:
            eng.kill()
        plain.kill()
    log("plain vllm serve --shutdown-timeout 10")
    plain10 = PlainVllm(model, work, "--shutdown-timeout", "10")
    try:
        plain10.wait_ready()
        plain10_term = sigterm_run(plain10.url, plain10.proc, [SHORT, SHORT, SHORT, LONG], cap=40)
    finally:
        plain10.kill()

    out["eager"] = {
        "spyre_ready_s": spyre_ready,
        "vllm_ready_s": plain_ready,
        "ready_ratio": spyre_ready / plain_ready,
        "spyre_latency": spyre_lat,
        "vllm_latency": plain_lat,
        "latency_ratio": spyre_lat["mean_ms"] / plain_lat["mean_ms"],
        "stream_ratio": spyre_lat["stream64_s"] / plain_lat["stream64_s"],
    }
    out["sigterm"] = {
        "spyre_engine": spyre_term,
        "vllm_shutdown_timeout_0": plain_term,
        "vllm_shutdown_timeout_10": plain10_term,
    }
    print(json.dumps(out, indent=2, default=str))
    print_table(out)
    if isinstance(out.get("phases"), dict):
        print_phases(out["phases"])  # type: ignore[arg-type]
    return 0


def print_table(out: dict) -> None:  # type: ignore[type-arg]
    def f(x: object) -> str:
        return "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))

    print("\n## spyre-engine benchmark")
    if "inductor" in out:
        i = out["inductor"]
        print(
            f"inductor time-to-ready: warm {f(i['warm_ready_s'])} s, cold {f(i['cold_ready_s'])} s,"
            f" cold/warm {f(i['cold_over_warm'])}x (precompile "
            f"{f(out['precompile_inductor']['compileSeconds'])} s, "
            f"{out['precompile_inductor']['sizeBytes'] / 1e6:.0f} MB); plugin warmup alone: "
            f"warm {f(i['warm_plugin_warmup_s'])} s, cold {f(i['cold_plugin_warmup_s'])} s"
        )
    e = out["eager"]
    print(
        f"eager time-to-ready: spyre-engine {f(e['spyre_ready_s'])} s, vllm {f(e['vllm_ready_s'])}"
        f" s, ratio {f(e['ready_ratio'])}"
    )
    print(
        f"latency (8-token completion): spyre-engine {f(e['spyre_latency']['mean_ms'])} ms, vllm "
        f"{f(e['vllm_latency']['mean_ms'])} ms, ratio {f(e['latency_ratio'])}; 64-token stream "
        f"ratio {f(e['stream_ratio'])}"
    )
    for name, r in out["sigterm"].items():
        print(
            f"SIGTERM {name}: failed {r['failed']}/{r['streams']} streams, exit "
            f"{f(r['exit_s'])} s (code {r['exit_code']})"
        )


if __name__ == "__main__":
    sys.exit(main())
