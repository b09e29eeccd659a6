"""Real-node benchmarks (issue 15 parts 2 and 3; `make bench`): scale-up against a bare model
load, and rollouts under a steady request rate. Benchmarks, not tests: they print numbers.

Runs on the real node ``spyre-real-0`` (started if needed) with the engine image; the operator
runs as a local process watching a fresh namespace, as in the real-pod tests
(``tests/contract/realpods.py``: :class:`RealEnv`). Requests go from the namespace's client pod
(``tests/bench/podclient.py`` via ``kubectl exec``): no cluster DNS, no route from the host.

``scaleup`` (part 2)
    A SpyreModel (tiny model, backend ``eager`` unless ``--backend``) with its artifact already
    compiled, at 1 replica. Each round, alternating the order (ABBA):

    - *operator*: ``kubectl scale spyremodel --replicas 2`` at t0; the new pod's first answer
      to a completion on its pod IP and its ``Ready`` (what puts it behind the Service);
    - *bare*: a Deployment created directly (no operator, no ``spyre-engine`` wrapper, no
      probes), same image, node, volumes, env and security context, running the very
      ``vllm serve`` command the operator's pod ran, with ``eager`` and nothing to load from a
      cache; ``kubectl scale --replicas 1`` at t0; its first answer on its pod IP.

    Then scaled back. Per start: the pod's own timestamps (created, scheduled, container started,
    Ready; 1 s resolution), the engine's ``spyre_engine_startup_phase_seconds`` (its /metrics),
    and sub-second observations on the host (pod seen, first answer, Ready seen).
``rollout`` (part 3)
    For ``maxSurge`` 0 and 1 (``spec.serving.rollout``; ``maxUnavailable`` 1 resp. 0), 2
    replicas: a client at ``--rate`` requests/s (open loop, 4-token completions) through the
    Service while (a) a compile-affecting edit (``compile.maxNumSeqs``) compiles and rolls out,
    (b) a serving pod is deleted. Requests sent, failed, p50/p99 latency before / during / after;
    failed requests with their error and what the Service's endpoints held at that moment.

``canary`` (issue 44)
    What ``spec.serving.canary`` adds to a promotion: rounds of a compile-affecting edit with
    and without a canary (1 replica, maxSurge 1, a client at ``--rate``), ABBA; the artifact
    Ready, the canary pod available and passed, the switch, the canary pod's seconds
    (:func:`part_canary`).

Results: printed, ``bench-results/realpods-<stamp>.json``, and with ``--markdown`` the
sections of ``tests/bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spyre_operator.desired import names  # noqa: E402

from tests.bench.bench_operator import MARKDOWN, machine  # noqa: E402
from tests.cluster.controlplane import free_ports  # noqa: E402
from tests.cluster.keda import KedaStack, coldstart_args, host_coldstart_service  # noqa: E402
from tests.contract.realpods import RealEnv, model_spec  # noqa: E402
from tests.realpods import support  # noqa: E402

PODCLIENT = (Path(__file__).resolve().parent / "podclient.py").read_text()
MODEL = "bench"
BARE = "bare-vllm"
BODY = json.dumps({"model": support.SERVED_NAME, "prompt": "hello world", "max_tokens": 4,
                   "ignore_eos": True})  # fmt: skip
#: Engine env that ties vLLM to the artifact or the serve-time checks: not in a bare load.
ARTIFACT_ENV = ("SENDNN_INFERENCE_REQUIRE_PRECOMPILED", "TORCH_SENDNN_CACHE", "TORCHINDUCTOR",
                "TRITON_CACHE")  # fmt: skip


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ts(stamp: str | None) -> float | None:
    """RFC 3339 (Kubernetes, 1 s resolution) to epoch seconds."""
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def cond_time(pod: dict[str, Any], type_: str) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return ts(c.get("lastTransitionTime"))
    return None


def started_at(pod: dict[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        running = (c.get("state") or {}).get("running")
        if running:
            return ts(running.get("startedAt"))
    return None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


class PodClient:
    """``podclient.py`` in the namespace's client pod."""

    def __init__(self, env: RealEnv) -> None:
        self.base = [str(env.cp.bin_dir / "kubectl"), "--kubeconfig", str(env.cp.kubeconfig),
                     "exec", "-n", env.ns]  # fmt: skip

    def argv(self, *args: str, stdin: bool = False) -> list[str]:
        return [*self.base, *(["-i"] if stdin else []), support.CLIENT_POD, "--",
                "python3", "-c", PODCLIENT, *args]  # fmt: skip

    def until_ok(self, url: str, deadline: float = 900) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv("until-ok", url, BODY, "--deadline", str(deadline)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def rate(self, url: str, per_second: float) -> RateClient:
        return RateClient(subprocess.Popen(
            self.argv("rate", url, BODY, "--rate", str(per_second), "--timeout", "60",
                      stdin=True),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


class RateClient:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.results: list[dict[str, Any]] = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.results.append(json.loads(line))

    def stop(self) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.t.join(10)
        return list(self.results)


# --------------------------------------------------------------------------- part 2: scale-up


def _pods(env: RealEnv, selector: str) -> list[dict[str, Any]]:
    return [p for p in env.kube.items("pods", selector)
            if not p["metadata"].get("deletionTimestamp")]


def follow_new_pod(env: RealEnv, selector: str, old: set[str], t0: float, port: int,
                   want_ready: bool, timeout: float = 900) -> dict[str, Any]:
    """Follow the pod (not in ``old``) that appears after ``t0``: when it was seen, when it first
    answered a completion on its pod IP and (``want_ready``) when it was seen Ready."""
    client = PodClient(env)
    seen: dict[str, Any] = {}
    poller: subprocess.Popen[str] | None = None
    pod: dict[str, Any] = {}
    deadline = time.time() + timeout
    while time.time() < deadline:
        new = [p for p in _pods(env, selector) if p["metadata"]["name"] not in old]
        now = time.time()
        if new:
            pod = new[0]
            seen.setdefault("pod_seen", now)
            ip = (pod.get("status") or {}).get("podIP")
            if ip and poller is None:
                seen["ip_seen"] = now
                seen["ip"] = ip
                poller = client.until_ok(f"http://{ip}:{port}/v1/completions")
            if want_ready and support.pod_ready(pod):
                seen.setdefault("ready_seen", now)
        if poller is not None and poller.poll() is not None and "first_answer" not in seen:
            out = poller.stdout.read() if poller.stdout else ""
            res = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            seen["first_answer"] = res.get("t_ok")
            seen["answer_attempts"] = res.get("statuses")
            if res.get("t_ok") is None:
                raise AssertionError(f"the new pod never answered: {res} "
                                     f"{poller.stderr.read() if poller.stderr else ''}")
        if "first_answer" in seen and (not want_ready or "ready_seen" in seen):
            break
        time.sleep(0.25)
    else:
        raise AssertionError(f"no new serving pod in {timeout:.0f}s: {seen}\n"
                             + support.describe(env.cp, env.ns, MODEL))
    pod = env.kube.get("pod", pod["metadata"]["name"])
    seen["name"] = pod["metadata"]["name"]
    seen["created"] = ts(pod["metadata"]["creationTimestamp"])
    seen["scheduled"] = cond_time(pod, "PodScheduled")
    seen["container_started"] = started_at(pod)
    seen["ready"] = cond_time(pod, "Ready")
    seen["t0"] = t0
    return seen


def engine_phases(env: RealEnv, ip: str, port: int) -> dict[str, float]:
    res = support.http(env.cp, env.ns, f"http://{ip}:{port}/metrics", timeout=60)
    samples = support.parse_metrics(res.text)
    out = {}
    for k, v in samples.items():
        if k.startswith("spyre_engine_startup_phase_seconds{"):
            out[k.split('phase="')[1].split('"')[0]] = round(v, 2)
    return out


def scale_operator(env: RealEnv, replicas: int, port: int) -> dict[str, Any] | None:
    sel = ",".join(f"{k}={v}" for k, v in names.server_selector(MODEL).items())
    old = {p["metadata"]["name"] for p in _pods(env, sel)}
    t0 = time.time()
    env.kube.kubectl("scale", "spyremodel", MODEL, f"--replicas={replicas}")
    if replicas <= len(old):
        env.kube.wait(lambda: len(support.server_pods(env.cp, env.ns, MODEL)) == replicas, 300,
                      f"{MODEL} at {replicas} pods")
        return None
    dep_seen: list[float] = []

    def deployment_scaled() -> None:  # when the operator's write reached the Deployment
        while not dep_seen and time.time() - t0 < 120:
            d = env.kube.get("deployment", names.server_name(MODEL))
            if d and d["spec"]["replicas"] >= replicas:
                dep_seen.append(time.time())
            time.sleep(0.2)

    th = threading.Thread(target=deployment_scaled, daemon=True)
    th.start()
    seen = follow_new_pod(env, sel, old, t0, port, want_ready=True)
    th.join(5)
    seen["deployment_scaled"] = dep_seen[0] if dep_seen else None
    seen["phases"] = engine_phases(env, seen["ip"], port)
    return seen


def bare_deployment(env: RealEnv, port: int) -> dict[str, Any]:
    """A Deployment like the operator's (image, node, volumes, env, security, resources) that
    runs the operator pod's own ``vllm serve`` command directly: backend eager, no artifact,
    no wrapper, no probes, no preStop."""
    dep = env.kube.get("deployment", names.server_name(MODEL))
    pod = next(p for p in support.server_pods(env.cp, env.ns, MODEL) if support.pod_ready(p))
    logs = env.kube.kubectl("logs", pod["metadata"]["name"])
    line = next(ln for ln in logs.splitlines() if "Starting vLLM on" in ln)
    cmd = shlex.split(line.split("Starting vLLM on ", 1)[1].split(": ", 1)[1])
    for flag, value in (("--host", "0.0.0.0"), ("--port", str(port))):
        cmd[cmd.index(flag) + 1] = value
    tmpl = copy.deepcopy(dep["spec"]["template"])
    labels = {"app.kubernetes.io/name": BARE}
    tmpl["metadata"] = {"labels": labels}
    c = tmpl["spec"]["containers"][0]
    c["command"], c["args"] = cmd, []
    for k in ("startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        c.pop(k, None)
    env_list = [e for e in c.get("env") or [] if not e["name"].startswith(ARTIFACT_ENV)]
    forced = {"SENDNN_INFERENCE_DYNAMO_BACKEND": "eager", "VLLM_PLUGINS": "sendnn_inference",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "VLLM_NO_USAGE_STATS": "1",
              "HF_HUB_OFFLINE": "1"}  # fmt: skip
    env_list = [e for e in env_list if e["name"] not in forced]
    c["env"] = env_list + [{"name": k, "value": v} for k, v in forced.items()]
    doc = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": BARE, "namespace": env.ns},
           "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": tmpl}}
    env.cp.apply(doc)
    return {"command": cmd}


def scale_bare(env: RealEnv, replicas: int, port: int) -> dict[str, Any] | None:
    sel = f"app.kubernetes.io/name={BARE}"
    old = {p["metadata"]["name"] for p in _pods(env, sel)}
    t0 = time.time()
    env.kube.kubectl("scale", "deployment", BARE, f"--replicas={replicas}")
    if replicas == 0:
        env.kube.wait(lambda: not env.kube.items("pods", sel), 300, "bare pods gone")
        return None
    return follow_new_pod(env, sel, old, t0, port, want_ready=False)


def breakdown(s: dict[str, Any]) -> dict[str, float | None]:
    """Seconds per step of one start. The pod's own timestamps (created, scheduled, container
    started) have 1 s resolution; the first answer and "Ready seen" are sub-second."""

    def d(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 2)

    ph = s.get("phases") or {}
    engine_ready = s["first_answer"]
    out = {
        "scale → Deployment scaled": d(s["t0"], s.get("deployment_scaled")),
        "scale → pod seen (host poll, ≤0.5 s late)": d(s["t0"], s["pod_seen"]),
        "created → scheduled": d(s["created"], s["scheduled"]),
        "scheduled → container started": d(s["scheduled"], s["container_started"]),
        "container started → first answer": d(s["container_started"], engine_ready),
        "  interpreter + imports (before the engine's clock)":
            d(s["container_started"], engine_ready - ph["total"]) if "total" in ph else None,
        "  validate + resolve_model": round(ph["validate"] + ph["resolve_model"], 2)
            if "validate" in ph else None,
        "  vLLM start (engine_start)": ph.get("engine_start"),
        "first answer → Ready seen (probe)": d(engine_ready, s.get("ready_seen")),
        "scale → first answer (pod IP)": d(s["t0"], engine_ready),
        "scale → Ready (in the Service)": d(s["t0"], s.get("ready_seen")),
    }  # fmt: skip
    return out


def part_scaleup(env: RealEnv, args: argparse.Namespace) -> dict[str, Any]:
    port = 8000
    spec = model_spec(env.image, replicas=1, compile={"backend": args.backend},
                      serving={"port": port})
    t0 = time.monotonic()
    env.kube.apply_model(MODEL, spec)
    support.wait_model_ready(env.cp, env.ns, MODEL, timeout=1800)
    log(f"{MODEL} ({args.backend}) Ready in {time.monotonic() - t0:.0f}s (compile + first pod)")
    bare = bare_deployment(env, port)
    starts: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = ["operator", "bare"] if rnd % 2 == 0 else ["bare", "operator"]
        for mode in order:
            wait_node_healthy(env)
            load = os.getloadavg()[0]
            if mode == "operator":
                s = scale_operator(env, 2, port)
                assert s is not None
                scale_operator(env, 1, port)
            else:
                s = scale_bare(env, 1, port)
                assert s is not None
                scale_bare(env, 0, port)
            s.update(mode=mode, round=rnd + 1, load=round(load, 2), steps=breakdown(s),
                     evictions=evictions(env))
            log(f"round {rnd + 1} {mode}: {json.dumps(s['steps'])}")
            starts.append(s)
            time.sleep(args.pause)
    return {"backend": args.backend, "bare_command": bare["command"], "starts": starts}


def scaleup_table(res: dict[str, Any]) -> str:
    starts = res["starts"]
    op = [s for s in starts if s["mode"] == "operator"]
    bare = [s for s in starts if s["mode"] == "bare"]
    keys = list(op[0]["steps"]) if op else []

    def med(rows: list[dict[str, Any]], k: str) -> str:
        vals = [r["steps"][k] for r in rows if r["steps"].get(k) is not None]
        return f"{statistics.median(vals):.1f}" if vals else "–"

    lines = [f"| step (median of {len(op)} / {len(bare)} starts, s) | operator, {res['backend']} "
             "artifact, scale 1→2 | bare vLLM (eager), Deployment 0→1 |", "|---|---|---|"]
    lines += [f"| {k} | {med(op, k)} | {med(bare, k)} |" for k in keys]
    per_round_ready, per_round_answer = [], []
    for rnd in sorted({s["round"] for s in starts}):
        o = next((s for s in op if s["round"] == rnd), None)
        b = next((s for s in bare if s["round"] == rnd), None)
        if o and b:
            bt = b["steps"]["scale → first answer (pod IP)"]
            per_round_ready.append(o["steps"]["scale → Ready (in the Service)"] / bt)
            per_round_answer.append(o["steps"]["scale → first answer (pod IP)"] / bt)
    loads = ", ".join(f"{s['load']:.1f}" for s in starts)
    if per_round_ready:
        rr = ", ".join(f"{r:.2f}" for r in per_round_ready)
        ra = ", ".join(f"{r:.2f}" for r in per_round_answer)
        lines += [
            "",
            "Ratio operator / bare, scale → serving: "
            f"**{statistics.median(per_round_ready):.2f}×** to Ready behind the Service "
            f"(per round {rr}); {statistics.median(per_round_answer):.2f}× to the first answer "
            f"on the pod IP (per round {ra}). Target ≤ 1.2×. "
            f"Load average (1 min) before each start: {loads}.",
        ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- part 3: rollouts


class EndpointLog:
    """Polls the Service's EndpointSlices: (time, ready IPs, serving-but-terminating IPs)."""

    def __init__(self, env: RealEnv, service: str) -> None:
        self.env, self.service = env, service
        self.changes: list[tuple[float, list[str], list[str]]] = []
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        last: tuple[list[str], list[str]] | None = None
        while not self.stop_ev.is_set():
            try:
                slices = self.env.kube.items(
                    "endpointslices", f"kubernetes.io/service-name={self.service}")
            except Exception:  # noqa: BLE001 - a missed poll is fine
                time.sleep(0.3)
                continue
            ready, term = [], []
            for s in slices:
                for ep in s.get("endpoints") or []:
                    cond = ep.get("conditions") or {}
                    (ready if cond.get("ready") else term if cond.get("serving") else []).extend(
                        ep.get("addresses", []))
            cur = (sorted(ready), sorted(term))
            if cur != last:
                self.changes.append((time.time(), *cur))
                last = cur
            time.sleep(0.3)

    def at(self, t: float) -> dict[str, Any]:
        before = [c for c in self.changes if c[0] <= t]
        c = before[-1] if before else (0.0, [], [])
        return {"ready": c[1], "terminating": c[2]}

    def stop(self) -> list[tuple[float, list[str], list[str]]]:
        self.stop_ev.set()
        self.t.join(5)
        return self.changes


def rolled_out(env: RealEnv, replicas: int) -> bool:
    dep = env.kube.get("deployment", names.server_name(MODEL))
    if not dep:
        return False
    st = dep.get("status") or {}
    pods = [p for p in support.server_pods(env.cp, env.ns, MODEL)]
    return (st.get("observedGeneration") == dep["metadata"]["generation"]
            and st.get("updatedReplicas") == replicas and st.get("availableReplicas") == replicas
            and st.get("replicas") == replicas and len(pods) == replicas
            and all(support.pod_ready(p) for p in pods))  # fmt: skip


def wait_switched(env: RealEnv, old_key: str, replicas: int, timeout: float = 1200) -> None:
    def ok() -> bool:
        m = env.kube.model(MODEL)
        st = m.get("status") or {}
        key = (st.get("artifact") or {}).get("key")
        return bool(st.get("observedGeneration") == m["metadata"]["generation"] and key
                    and key != old_key and st.get("servingArtifactKey") == key
                    and rolled_out(env, replicas))  # fmt: skip

    env.kube.wait(ok, timeout, "the new artifact rolled out")


def phase_stats(results: list[dict[str, Any]], a: float, b: float) -> dict[str, Any]:
    rs = [r for r in results if a <= r["t0"] < b]
    ok = [r["t1"] - r["t0"] for r in rs if r["status"] == 200]
    last = max((r["t0"] for r in rs), default=a)
    return {"sent": len(rs), "failed": len(rs) - len(ok), "seconds": round(min(b, last) - a, 1),
            "p50": pct(ok, 0.5), "p99": pct(ok, 0.99)}  # fmt: skip


def traffic_run(env: RealEnv, args: argparse.Namespace, what: str,
                action: Any, surge: int) -> dict[str, Any]:
    wait_node_healthy(env)
    url = support.service_url(env.cp, env.ns, MODEL)
    eps = EndpointLog(env, names.server_name(MODEL))
    client = PodClient(env).rate(url + "/v1/completions", args.rate)
    load = os.getloadavg()[0]
    t_start = time.time()
    time.sleep(args.steady)
    t_event = time.time()
    info = action() or {}
    t_done = time.time()
    time.sleep(args.steady)
    results = client.stop()
    t_end = time.time()
    changes = eps.stop()
    failed = [{**{k: r.get(k) for k in ("status", "error", "body")},
               "at": round(r["t0"] - t_event, 2), "endpoints": eps.at(r["t0"])}
              for r in results if r["status"] != 200]  # fmt: skip
    kinds: dict[str, int] = {}
    for f in failed:
        k = str(f["status"]) if f["status"] else (f.get("error") or "?").split("(")[0]
        kinds[k] = kinds.get(k, 0) + 1
    out = {
        "what": what, "maxSurge": surge, "load": round(load, 2), "rate": args.rate,
        "before": phase_stats(results, t_start, t_event),
        "during": phase_stats(results, t_event, t_done),
        "after": phase_stats(results, t_done, t_end + 120),
        "failed_kinds": kinds, "failed": failed[:20],
        "endpoints": [(round(t - t_event, 2), r, tm) for t, r, tm in changes],
        **info,
    }  # fmt: skip
    out["evictions"] = evictions(env)
    log(f"{what} maxSurge {surge}: sent {len(results)}, failed {len(failed)} {kinds}; "
        f"during {out['during']['seconds']}s; evictions {out['evictions']}")
    for f in failed[:10]:
        log(f"  failed: {json.dumps(f)[:500]}")
    return out


def evictions(env: RealEnv) -> list[str]:
    """Pods the node evicted in the namespace (disk or memory pressure: a disturbed run)."""
    return [f"{p['metadata']['name']}: {(p.get('status') or {}).get('message', '')[:120]}"
            for p in env.kube.items("pods")
            if (p.get("status") or {}).get("reason") == "Evicted"]


def wait_node_healthy(env: RealEnv, timeout: float = 600) -> None:
    """No pressure taint on the real node (another process filling the disk evicts pods)."""

    seen: list[list[str]] = [[]]

    def ok() -> bool:
        node = env.cp.kubectl_json("get", "node", support.NODE_NAME)
        bad = [t["key"] for t in node["spec"].get("taints") or []
               if t["key"].startswith("node.kubernetes.io/")]
        if bad and bad != seen[-1]:
            log(f"waiting: the node has taints {bad}")
        seen.append(bad)
        return not bad

    env.kube.wait(ok, timeout, "the real node without pressure taints")


def part_rollout(env: RealEnv, args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    seqs = 2
    for surge in args.surges:
        rollout = {"maxSurge": surge, "maxUnavailable": 0 if surge else 1}

        def spec(seqs: int, rollout: dict[str, int] = rollout) -> dict[str, Any]:
            return model_spec(env.image, replicas=2, compile={"maxNumSeqs": seqs},
                              serving={"rollout": rollout,
                                       "shutdownGracePeriodSeconds": args.drain})

        env.kube.apply_model(MODEL, spec(seqs))
        support.wait_model_ready(env.cp, env.ns, MODEL, timeout=1800)
        env.kube.wait(lambda: rolled_out(env, 2), 900, "2 serving pods")

        def edit(surge: int = surge) -> dict[str, Any]:
            nonlocal seqs
            old_key = env.kube.model(MODEL)["status"]["servingArtifactKey"]
            seqs = 3 if seqs == 2 else 2
            t = time.time()
            env.kube.apply_model(MODEL, spec(seqs))
            wait_switched(env, old_key, 2)
            return {"rolled_out_seconds": round(time.time() - t, 1)}

        def delete() -> dict[str, Any]:
            victim = support.server_pods(env.cp, env.ns, MODEL)[0]["metadata"]["name"]
            t = time.time()
            env.kube.kubectl("delete", "pod", victim, "--wait=false")
            env.kube.wait(lambda: not env.kube.get("pod", victim) and rolled_out(env, 2), 900,
                          "the pod replaced")
            return {"replaced_seconds": round(time.time() - t, 1)}

        runs.append(traffic_run(env, args, "compile-affecting edit", edit, surge))
        runs.append(traffic_run(env, args, "serving pod deleted", delete, surge))
    return runs


def rollout_table(runs: list[dict[str, Any]]) -> str:
    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}"

    lines = ["| event | maxSurge | phase | seconds | sent | failed | p50 s | p99 s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for ph in ("before", "during", "after"):
            s = r[ph]
            lines.append(f"| {r['what']} | {r['maxSurge']} | {ph} | {s['seconds']:.0f} | "
                         f"{s['sent']} | {s['failed']} | {f(s['p50'])} | {f(s['p99'])} |")
    total = sum(r[p]["sent"] for r in runs for p in ("before", "during", "after"))
    failed = sum(r[p]["failed"] for r in runs for p in ("before", "during", "after"))
    loads = ", ".join(f"{r['load']:.1f}" for r in runs)
    lines += ["", f"{total} requests at {runs[0]['rate']:g}/s, **{failed} failed** (target 0). "
                  f"Load average (1 min) at each start: {loads}."]  # fmt: skip
    for r in runs:
        if r["failed_kinds"]:
            lines.append(f"- {r['what']}, maxSurge {r['maxSurge']}: failed {r['failed_kinds']}; "
                         f"first: {json.dumps(r['failed'][:3])[:600]}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- part 4: wake-up


WAKE_MODEL_IDLE = 30  # autoscaling.scaleToZero.idleSeconds: the API's minimum


def _replicas(env: RealEnv) -> int:
    return int(env.kube.model(MODEL)["spec"].get("replicas", 1))


def part_wakeup(env: RealEnv, args: argparse.Namespace) -> dict[str, Any]:
    """A model with minReplicas 0 (KEDA + HTTP add-on), idle until at zero; then ``--held``
    requests at once through its Service (one streamed chat, the others completions): the time
    to the stream's first token and each request's wait, against the bare ``vllm serve``
    Deployment's 0 -> 1 (first answer on its pod IP) in the same round, ABBA."""
    port = 8000
    spec = model_spec(env.image, replicas=1, compile={"backend": args.backend},
                      serving={"port": port}, autoscaling={
                          "minReplicas": 0, "maxReplicas": 1,
                          "scaleToZero": {"idleSeconds": WAKE_MODEL_IDLE,
                                          "maxWaitSeconds": 600}})  # fmt: skip
    t0 = time.monotonic()
    env.kube.apply_model(MODEL, spec)
    support.wait_model_ready(env.cp, env.ns, MODEL, timeout=1800)
    first_ready = time.monotonic() - t0
    log(f"{MODEL} ({args.backend}, zero allowed) Ready in {first_ready:.0f}s")
    url = support.service_url(env.cp, env.ns, MODEL)
    # the bare Deployment copies a serving pod's command: wake the model if it is at zero
    woke = env.client.run("once", f"{url}/v1/completions", BODY, "--timeout", "900",
                          timeout=960)  # fmt: skip
    assert woke["status"] == 200, woke
    sel = ",".join(f"{k}={v}" for k, v in names.server_selector(MODEL).items())
    env.kube.wait(lambda: any(support.pod_ready(p) for p in _pods(env, sel)), 300,
                  "a serving pod")  # fmt: skip
    bare = bare_deployment(env, port)
    chat = json.dumps({"model": support.SERVED_NAME, "stream": True, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hello"}]})  # fmt: skip
    rounds: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = ["wake", "bare"] if rnd % 2 == 0 else ["bare", "wake"]
        row: dict[str, Any] = {"round": rnd + 1}
        for mode in order:
            wait_node_healthy(env)
            if mode == "bare":
                s = scale_bare(env, 1, port)
                assert s is not None
                scale_bare(env, 0, port)
                row["bare_first_answer"] = round(s["first_answer"] - s["t0"], 2)
                continue
            z0 = time.monotonic()
            env.kube.wait(lambda: _replicas(env) == 0 and not _pods(env, sel), 600,
                          f"{MODEL} at zero")  # fmt: skip
            row["idle_to_zero_wait"] = round(time.monotonic() - z0, 1)
            row["load"] = round(os.getloadavg()[0], 2)
            stream = env.client.start("stream", f"{url}/v1/chat/completions", chat,
                                      "--timeout", "900")  # fmt: skip
            many = env.client.run("many", f"{url}/v1/completions", BODY,
                                  "--count", str(max(0, args.held - 1)), "--timeout", "900",
                                  timeout=960) if args.held > 1 else {"results": []}  # fmt: skip
            out, _ = stream.communicate(timeout=960)
            st = json.loads(out.strip().splitlines()[-1])
            if st.get("status") != 200 or not st.get("first_event_at"):
                raise AssertionError(f"the held stream failed: {st}")
            waits = [round(r["t1"] - r["t0"], 2) for r in many["results"]]
            failed = [r for r in many["results"] if r.get("status") != 200]
            row.update(wake_first_token=round(st["first_event_at"] - st["t0"], 2),
                       held=1 + len(many["results"]), held_failed=len(failed),
                       held_waits=sorted(waits), pods=len(_pods(env, sel)))
        log(f"round {rnd + 1}: {json.dumps(row)}")
        rounds.append(row)
    return {"backend": args.backend, "first_ready": round(first_ready, 1),
            "bare_command": bare["command"], "rounds": rounds}


def wakeup_table(res: dict[str, Any]) -> str:
    rows = res["rounds"]
    lines = ["| round | at zero → first token (held stream) | held requests, waits (s) | "
             "bare vLLM 0→1 → first answer | ratio | load |", "|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        ratio = r["wake_first_token"] / r["bare_first_answer"]
        ratios.append(ratio)
        lines.append(f"| {r['round']} | {r['wake_first_token']:.1f} s | {r['held']} "
                     f"({r['held_failed']} failed): {r['held_waits']} | "
                     f"{r['bare_first_answer']:.1f} s | {ratio:.2f}× | {r['load']:.1f} |")
    if ratios:
        lines += ["", f"Wake-up from zero / bare `vllm serve` start ({res['backend']} artifact): "
                      f"**{statistics.median(ratios):.2f}×** median of {len(ratios)} rounds "
                      "(goal ≤ 1.3×). The held requests are counted from when each was sent; "
                      f"the model's first start (compile + first replica) took "
                      f"{res['first_ready']:.0f} s."]  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


# --------------------------------------------------------------------------- part 5: canary


def _canary_spec(env: RealEnv, args: argparse.Namespace, seqs: int,
                 canary: bool) -> dict[str, Any]:
    serving: dict[str, Any] = {"rollout": {"maxSurge": 1, "maxUnavailable": 0}}
    if canary:
        serving["canary"] = {"replicas": 1, "durationSeconds": args.canary_window,
                             "minRequests": 3}
    return model_spec(env.image, replicas=1, compile={"maxNumSeqs": seqs}, serving=serving)


def _canary_edit(env: RealEnv, args: argparse.Namespace, seqs: int,
                 canary: bool) -> dict[str, Any]:
    """One compile-affecting edit under traffic; the first time (s after the edit) each step
    was seen, polled every 0.5 s."""
    old_key = env.kube.model(MODEL)["status"]["servingArtifactKey"]
    url = support.service_url(env.cp, env.ns, MODEL)
    client = PodClient(env).rate(url + "/v1/completions", args.rate)
    seen: dict[str, float] = {}
    t0 = time.time()
    env.kube.apply_model(MODEL, _canary_spec(env, args, seqs, canary))
    canary_name = names.canary_name(MODEL)
    try:
        while "switched" not in seen:
            assert time.time() - t0 < 1800, f"no switch after 1800 s: {seen}"
            now = time.time() - t0
            st = env.kube.model(MODEL).get("status") or {}
            art = st.get("artifact") or {}
            if art.get("key") not in (None, old_key) and art.get("phase") == "Ready":
                seen.setdefault("artifact", now)
            dep = env.kube.get("deployment", canary_name)
            if dep is not None:
                seen.setdefault("canary created", now)
                if (dep.get("status") or {}).get("availableReplicas"):
                    seen.setdefault("canary available", now)
            elif "canary created" in seen:
                seen.setdefault("canary gone", now)
            if (st.get("canary") or {}).get("phase") == "Passed":
                seen.setdefault("canary passed", now)
            if (seen.get("artifact") is not None and st.get("servingArtifactKey") == art.get("key")
                    and rolled_out(env, 1)):  # fmt: skip
                seen["switched"] = now
            time.sleep(0.5)
    finally:
        results = client.stop()
    out = {k: round(v, 1) for k, v in seen.items()}
    out["requests"] = len(results)
    out["failed"] = sum(r["status"] != 200 for r in results)
    if canary and "canary created" in seen:
        out["canary pod seconds"] = round(seen.get("canary gone", seen["switched"])
                                          - seen["canary created"], 1)  # fmt: skip
    return out


def part_canary(env: RealEnv, args: argparse.Namespace) -> dict[str, Any]:
    """Issue 44's benchmark: what a canary adds to a promotion. 1 replica, maxSurge 1 (the old
    pod serves throughout either way), a client at ``--rate`` through the Service. Rounds of a
    compile-affecting edit (``compile.maxNumSeqs``) without and with ``spec.serving.canary``
    (1 pod, ``--canary-window`` s, minRequests 3), ABBA; from the edit: the artifact Ready
    (its precompile, the output check's references included), the canary pod available, its
    pass, the switch rolled out (the canary gone)."""
    runs = []
    seqs = 2
    env.kube.apply_model(MODEL, _canary_spec(env, args, seqs, canary=False))
    support.wait_model_ready(env.cp, env.ns, MODEL, timeout=1800)
    env.kube.wait(lambda: rolled_out(env, 1), 900, "1 serving pod")
    order = [False, True, True, False] * math.ceil(args.rounds / 2)
    for canary in order[:2 * args.rounds]:
        wait_node_healthy(env)
        # the mode first, on the same artifact (no rollout), then the edit under it
        env.kube.apply_model(MODEL, _canary_spec(env, args, seqs, canary))
        env.kube.wait(lambda: rolled_out(env, 1), 900, "1 serving pod")
        seqs = 3 if seqs == 2 else 2
        run = {"canary": canary, "load": round(os.getloadavg()[0], 2),
               **_canary_edit(env, args, seqs, canary)}
        log(f"canary {canary}: {run}")
        runs.append(run)
    return {"window": args.canary_window, "rate": args.rate, "runs": runs}


def canary_table(res: dict[str, Any]) -> str:
    def med(canary: bool, key: str) -> float | None:
        vals = [r[key] for r in res["runs"] if r["canary"] is canary and key in r]
        return statistics.median(vals) if vals else None

    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.1f}"

    #: per mode, the seconds from the artifact Ready to the switch
    after: dict[bool, list[float]] = {
        canary: [r["switched"] - r["artifact"] for r in res["runs"]
                 if r["canary"] is canary and "artifact" in r]
        for canary in (False, True)}  # fmt: skip
    lines = ["| promotion | artifact Ready s | canary available s | canary passed s | "
             "switched s | switch after the artifact s | canary pod s | requests (failed) |",
             "|---|---|---|---|---|---|---|---|"]
    for canary in (False, True):
        rs = [r for r in res["runs"] if r["canary"] is canary]
        lines.append(
            f"| {'with a canary' if canary else 'plain (maxSurge 1)'} | "
            f"{f(med(canary, 'artifact'))} | {f(med(canary, 'canary available'))} | "
            f"{f(med(canary, 'canary passed'))} | {f(med(canary, 'switched'))} | "
            f"{f(statistics.median(after[canary]) if after[canary] else None)} | "
            f"{f(med(canary, 'canary pod seconds'))} | "
            f"{sum(r['requests'] for r in rs)} ({sum(r['failed'] for r in rs)}) |")
    plain, with_c = after[False], after[True]
    if plain and with_c:
        a, b = statistics.median(plain), statistics.median(with_c)
        lines += ["", f"Medians of {len(plain)} edits each (ABBA), window {res['window']} s, "
                      f"{res['rate']:g} requests/s. From the artifact to the switch, a canary "
                      f"takes {b / a:.1f}x the plain rollout's time (+{b - a:.0f} s: its pod's "
                      "start, its window, then the main Deployment's own rollout)."]  # fmt: skip
    return "\n".join(lines)


def write_section(title: str, text: str, stamp: str) -> None:
    section = f"## {title}\n\nRun {stamp} on {machine()}.\n\n{text}\n"
    old = MARKDOWN.read_text()
    if f"## {title}\n" in old:
        before, rest = old.split(f"## {title}\n", 1)
        after = rest[rest.find("\n## ") + 1:] if "\n## " in rest else ""
        MARKDOWN.write_text(before + section + ("\n" + after if after else ""))
    else:
        MARKDOWN.write_text(old.rstrip() + "\n\n" + section)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="scaleup,rollout",
                   help="comma-separated: scaleup, rollout, wakeup, canary (others, e.g. "
                        "operator, are ignored)")
    p.add_argument("--backend", default="eager", help="scaleup: the model's compile backend")
    p.add_argument("--rounds", type=int, default=2,
                   help="scaleup: operator+bare pairs; canary: plain+canary pairs (ABBA)")
    p.add_argument("--pause", type=float, default=5, help="scaleup: seconds between starts")
    p.add_argument("--rate", type=float, default=3.0, help="rollout: requests per second")
    p.add_argument("--steady", type=float, default=20, help="rollout: seconds before and after")
    p.add_argument("--surges", default="0,1", help="rollout: maxSurge values")
    p.add_argument("--drain", type=int, default=30,
                   help="rollout: serving.shutdownGracePeriodSeconds (the API's default: 30)")
    p.add_argument("--canary-window", type=int, default=30,
                   help="canary: spec.serving.canary.durationSeconds")
    p.add_argument("--held", type=int, default=4,
                   help="wakeup: requests sent at once to the model at zero")
    p.add_argument("--out", default=str(ROOT / "bench-results"))
    p.add_argument("--markdown", action="store_true", help=f"write {MARKDOWN.name} sections")
    p.add_argument("--keep", action="store_true", help="keep the namespace")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: stop the operator
    args.surges = [int(x) for x in args.surges.split(",") if x.strip()]
    parts = {x.strip() for x in args.parts.split(",")} & {"scaleup", "rollout", "wakeup",
                                                           "canary"}
    if not parts:
        return 0
    cp = support.ensure_cluster()
    # The kubelet's image GC removes the pause image when another process fills the disk.
    cp.node.ensure_base_images()
    results: dict[str, Any] = {"machine": machine()}
    texts: dict[str, str] = {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for part in ("scaleup", "rollout", "wakeup", "canary"):
        if part not in parts:
            continue
        keda = None
        if part == "wakeup":  # KEDA + the HTTP add-on; the responder on a free host port
            keda = KedaStack(cp)
            keda.up()
            (port,) = free_ports(1)
            env = RealEnv(cp, cp.node, f"bench-{part}", operator_args=coldstart_args(port))
            host_coldstart_service(cp, env.ns, cp.node.host_ip, port)
        else:
            env = RealEnv(cp, cp.node, f"bench-{part}")
        try:
            t0 = time.monotonic()
            if part == "wakeup":
                res = part_wakeup(env, args)
                texts[f"Wake-up from zero against a bare start ({args.backend}): latest run"] = (
                    wakeup_table(res))
            elif part == "canary":
                res = part_canary(env, args)
                texts["A canary's whole cost: latest run"] = canary_table(res)
            elif part == "scaleup":
                res = part_scaleup(env, args)
                texts["Scale-up against a bare model load: latest run"] = scaleup_table(res)
            else:
                res = {"runs": part_rollout(env, args)}
                texts["Rollouts under traffic: latest run"] = rollout_table(res["runs"])
            res["seconds"] = round(time.monotonic() - t0)
            results[part] = res
        finally:
            if args.keep:
                os.environ["SPYRE_KEEP_REALPODS"] = "1"
            env.close()
            if keda is not None:
                keda.down()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"realpods-{stamp}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    for title, text in texts.items():
        print(f"\n## {title}\n\n{text}")
        if args.markdown:
            write_section(title, text, stamp)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
