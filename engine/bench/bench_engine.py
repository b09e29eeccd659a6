"""Engine benchmark (not a test): warm vs cold start, wrapper overhead, SIGTERM behaviour.

Run with ``make bench-engine``. Builds the tiny model offline, then measures in one run:
1. time-to-ready of ``spyre-engine serve --backend inductor`` on a precompiled artifact vs on an
   empty one (cold: inductor compiles at start-up);
2. ``spyre-engine serve --backend eager`` vs plain ``vllm serve``: time-to-ready and request
   latency through the front (the wrapper's overhead);
3. SIGTERM with streams in flight: failed requests and exit time, spyre-engine vs plain vLLM
   (default ``--shutdown-timeout 0`` and ``--shutdown-timeout 10``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx
from spyre_engine.testing.process import EngineProcess, free_port
from spyre_engine.testing.tiny_model import build_tiny_model

SHAPE = ["--max-model-len", "512", "--max-num-seqs", "4", "--max-num-batched-tokens", "128"]
# The eager servers get a long context so one SIGTERM stream (LONG tokens) outlasts the drain.
EAGER_SHAPE = ["--max-model-len", "2048", "--max-num-seqs", "4", "--max-num-batched-tokens", "128"]
SHORT, LONG = 40, 1900
MODEL = "tiny"
STARTUP_TIMEOUT = 600.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def wait_url(url: str, proc: subprocess.Popen[bytes], timeout: float = STARTUP_TIMEOUT) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if status(url) == 200:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(url)


def precompile(
    model: Path, art: Path, backend: str, workdir: Path, shape: list[str] = SHAPE
) -> dict[str, object]:
    term = workdir / f"{art.name}.{backend}.term"
    args = [sys.executable, "-m", "spyre_engine.cli", "precompile", "--model", str(model)]
    args += ["--artifact-dir", str(art), "--backend", backend, "--termination-log", str(term)]
    with open(workdir / f"precompile-{art.name}.log", "wb") as out:
        subprocess.run(args + shape, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=1800)
    return json.loads(term.read_text())  # type: ignore[no-any-return]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-inductor", action="store_true", help="skip the warm/cold part")
    parser.add_argument("--requests", type=int, default=30, help="latency samples per server")
    parser.add_argument("--drain", type=float, default=10.0, help="spyre-engine drain timeout")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="spyre-bench-"))
    log(f"work dir {work}")
    model = build_tiny_model(work / "tiny-granite")
    out: dict[str, object] = {}

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
