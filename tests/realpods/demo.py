"""``make demo``: the real thing on the real node (driven by operator/scripts/demo.sh).

    python -m tests.realpods.demo up     # cluster + node, images, chart, tiny model, SpyreModel,
                                         # a completion twice, /metrics, timings
    python -m tests.realpods.demo down   # helm uninstall + delete the demo namespace (if any)

What runs for real: the control plane, the real node (kubelet, containerd, runc, CNI,
kube-proxy), the operator image installed by the Helm chart (its RBAC, its restricted pod), the
engine image (vLLM + the Spyre plugin), the precompile Job that records the
artifact on the cache PVC, the serving pod that loads it from the read-only cache, the Service.
What stands in: the CPU backend ``eager`` for the Spyre cards (``sendnn``), a tiny
random-weight model (so the answer is gibberish) on a model PVC instead of a hub download, and
Kubernetes' own admission policies for OpenShift's restricted-v2 SCC: both namespaces assign
each pod its uid and fsGroup from an annotated range (the chart's ``podUser: assigned``).

``up --scale-to-zero`` (``make demo DEMO_ARGS=--scale-to-zero``) also starts KEDA and its HTTP
add-on (built from their Go modules, tests/cluster/keda.py: the same programs a site installs
with their charts, here as processes with the cluster's kubeconfig), installs the chart with
``scaleToZero.enabled``, gives the model ``autoscaling.minReplicas: 0`` with a 30 s idle
time, and shows it going to zero once idle and waking for the next request, which waits in
KEDA's interceptor meanwhile.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.cluster.controlplane import wait_until
from tests.realpods import support as s

OPERATOR_NS = os.environ.get("SPYRE_DEMO_OPERATOR_NAMESPACE", "spyre-system")
MODEL_NS = os.environ.get("SPYRE_DEMO_NAMESPACE", "spyre-demo")
#: The kwok-only demo's namespace (operator/scripts/demo-kwok.sh): `down` removes it too.
KWOK_NS = "spyre-demo-kwok"
MODEL = "tiny"
#: ~300 tokens: several KV blocks, so the repeat is served from the prefix cache.
WORDS = ("the quick brown fox jumps over a lazy dog while spyre accelerators serve large "
         "language models with vllm on kubernetes clusters operators reconcile custom resources "
         "and precompile graphs into artifacts so that servers start fast").split()
PROMPT = " ".join(WORDS[i % len(WORDS)] for i in range(300))
#: --scale-to-zero: the model's idle time before KEDA takes it to zero (the API's minimum).
IDLE_SECONDS = 30
METRICS = ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
           "vllm:prefix_cache_hits_total")


def say(msg: str) -> None:
    print(f"\n\033[1m==> {msg}\033[0m", flush=True)


def info(msg: str) -> None:
    print(f"    {msg}", flush=True)


def _kwok_demo_operator_stop(cp_root: Path) -> None:
    pidfile = cp_root / ".cluster" / "operator-demo.pid"
    if pidfile.exists():
        try:
            os.kill(int(pidfile.read_text().strip()), 15)
            info("stopped the kwok demo's operator (make demo-kwok)")
        except (ValueError, ProcessLookupError, PermissionError):
            pass
        pidfile.unlink(missing_ok=True)


def _delete_namespace(cp: s.ControlPlane, ns: str, timeout: float = 180) -> bool:
    if cp.kubectl("get", "namespace", ns, check=False).returncode != 0:
        return False
    cp.kubectl("delete", "namespace", ns, "--wait=true", f"--timeout={int(timeout)}s",
               timeout=timeout + 30, check=False)
    cp.recycle_pvs()
    return True


def up(args: argparse.Namespace) -> int:
    steps: list[tuple[str, float]] = []
    t_all = time.monotonic()

    say("Local control plane + the real node spyre-real-0 (kubelet, containerd, runc, CNI)")
    t0 = time.monotonic()
    cp = s.ensure_cluster(log=info)
    _kwok_demo_operator_stop(cp.root)
    steps.append(("cluster + real node", time.monotonic() - t0))
    for line in cp.kubectl("get", "nodes", "-L", "spyre.dev/real-node").stdout.splitlines():
        info(line)

    say("Images: operator and engine, built here with buildah (cached), imported into the node")
    t0 = time.monotonic()
    refs = s.ensure_images(cp.node, log=info)
    steps.append(("images (build or reuse + import)", time.monotonic() - t0))

    t0 = time.monotonic()
    if s.uninstall_operator(cp, OPERATOR_NS) | _delete_namespace(cp, MODEL_NS):
        say("Removed the previous demo (every run installs and compiles afresh)")
        steps.append(("previous demo removed", time.monotonic() - t0))

    say(f"Namespace {MODEL_NS} (PodSecurity restricted, OpenShift's restricted-v2 emulated) "
        f"with the tiny model on PVC "
        f"{s.MODEL_CLAIM}")
    t0 = time.monotonic()
    s.ensure_namespace(cp, MODEL_NS)
    uri = s.create_model_pvc(cp, MODEL_NS)
    steps.append(("namespace + model PVC", time.monotonic() - t0))
    info(f"model URI {uri} (2 layers, hidden 128, random weights; built offline, no hub)")

    say(f"Operator: Helm chart into {OPERATOR_NS} (its image, RBAC, restricted pod), "
        f"watching {MODEL_NS}")
    t0 = time.monotonic()
    values: dict[str, Any] = {}
    if args.scale_to_zero:
        say("KEDA and its HTTP add-on (built from their Go modules, run with the cluster's "
            "kubeconfig)")
        t0 = time.monotonic()
        from tests.cluster.keda import KedaStack

        KedaStack(cp).up()
        steps.append(("KEDA + HTTP add-on up", time.monotonic() - t0))
        values = {"scaleToZero": {"enabled": True}}
        t0 = time.monotonic()
    pod = s.install_operator(cp, OPERATOR_NS, refs["operator"], watch_namespaces=[MODEL_NS],
                             values=values, log=info)
    steps.append(("operator installed, pod Ready", time.monotonic() - t0))
    uid = pod["spec"].get("securityContext", {}).get("runAsUser")
    info(f"pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}, uid {uid} "
         f"(assigned by {OPERATOR_NS}'s range), "
         f"image {pod['spec']['containers'][0]['image']}")

    spec = s.tiny_model_spec(refs["engine"], uri, backend=args.backend, output_check="Enforce",
                             override={
        "autoscaling": {"minReplicas": 0, "maxReplicas": 1, "scaleToZero": {
            "idleSeconds": IDLE_SECONDS, "maxWaitSeconds": 300,
            "responseTimeoutSeconds": 300}}} if args.scale_to_zero else None)
    say(f"Applying SpyreModel {MODEL}: backend {args.backend} (CPU, standing in for sendnn), "
        f"TP 1, maxModelLen {spec['compile']['maxModelLen']}, prefix caching on")
    s.apply_model(cp, MODEL_NS, MODEL, spec)
    tl = s.Timeline(time.monotonic())
    s.wait_model_ready(cp, MODEL_NS, MODEL, timeout=args.timeout, timeline=tl, on_change=info)
    for line in cp.kubectl("get", "spyremodel,jobs,pods,pvc,svc", "-n", MODEL_NS,
                           "-o", "wide").stdout.splitlines():
        info(line)
    m = s.get_model(cp, MODEL_NS, MODEL) or {}
    art = (m.get("status") or {}).get("artifact") or {}
    info(f"artifact {art.get('key', '?')[:16]}... on claim {art.get('claim')}: "
         f"compiled in {art.get('compileSeconds')}s, {art.get('sizeBytes')} bytes")
    srv = s.server_pods(cp, MODEL_NS, MODEL)[0]
    mounts = {v["name"]: v.get("readOnly", False)
              for v in srv["spec"]["containers"][0].get("volumeMounts", [])}
    info(f"serving pod {srv['metadata']['name']}: volume mounts (name: readOnly) {mounts}")

    say("A completion at the model's status.endpoint (its Service, by name, from a client pod)")
    s.ensure_client_pod(cp, MODEL_NS, refs["engine"])
    url = s.service_url(cp, MODEL_NS, MODEL)
    info(f"POST {url}/v1/completions  (prompt: {len(PROMPT.split())} words)")
    first = s.completion(cp, MODEL_NS, MODEL, PROMPT, max_tokens=16, temperature=0)
    t_first = time.monotonic()
    info(f"answer ({first['usage']['prompt_tokens']} prompt tokens, "
         f"{first['_seconds']:.2f}s): {first['choices'][0]['text']!r}")
    before = s.parse_metrics(s.metrics_text(cp, MODEL_NS, MODEL))
    say("The same prompt again")
    again = s.completion(cp, MODEL_NS, MODEL, PROMPT, max_tokens=16, temperature=0)
    info(f"answer ({again['_seconds']:.2f}s): {again['choices'][0]['text']!r}")

    say("/metrics through the Service")
    text = s.metrics_text(cp, MODEL_NS, MODEL)
    for line in s.metric_lines(text, METRICS):
        info(line)
    after = s.parse_metrics(text)
    hits = s.metric(after, "vllm:prefix_cache_hits_total")
    new_hits = hits - s.metric(before, "vllm:prefix_cache_hits_total")
    info(f"prefix cache hits from the repeat: {new_hits:.0f} tokens")

    if args.scale_to_zero:
        say(f"Idle for {IDLE_SECONDS}s: KEDA takes the model to zero (its card is free)")
        t0 = time.monotonic()
        replicas = lambda: int((s.get_model(cp, MODEL_NS, MODEL) or {})  # noqa: E731
                               .get("spec", {}).get("replicas", 1))
        wait_until(lambda: replicas() == 0, IDLE_SECONDS + 300, "KEDA scaled the model to 0", 2)
        wait_until(lambda: not s.server_pods(cp, MODEL_NS, MODEL), 300,
                   "the serving pods are gone", 2)
        ready = s.condition(s.get_model(cp, MODEL_NS, MODEL), "Ready") or {}
        steps.append(("idle -> zero (pods gone)", time.monotonic() - t0))
        info(f"spec.replicas 0, no serving pod; Ready={ready.get('status')} "
             f"{ready.get('reason')}; the Service keeps its address ({url})")
        say("A request at zero: held by KEDA's interceptor while the model wakes")
        t0 = time.monotonic()
        woke = s.completion(cp, MODEL_NS, MODEL, "wake up", max_tokens=8, timeout=600)
        steps.append(("request at zero -> answer", time.monotonic() - t0))
        info(f"answered after {woke['_seconds']:.1f}s: {woke['choices'][0]['text']!r}; "
             f"spec.replicas {replicas()}")

    say("How long each step took")
    for what, sec in steps:
        info(f"{what:<38} {sec:7.1f}s")
    info(f"{'apply -> precompile Job complete':<38} {tl.since(tl.job_complete):>8}")
    info(f"{'apply -> serving pod Ready':<38} {tl.since(tl.pod_ready):>8}")
    info(f"{'apply -> model Ready':<38} {tl.since(tl.model_ready):>8}")
    info(f"{'apply -> first answer':<38} {tl.since(t_first):>8}")
    info(f"{'whole demo':<38} {time.monotonic() - t_all:7.1f}s")

    kc = cp.kubeconfig
    print(f"""
Look around:
  export KUBECONFIG={kc} PATH={cp.root}/.cluster/bin:$PATH
  kubectl -n {MODEL_NS} get spyremodels -o wide
  kubectl -n {MODEL_NS} logs deploy/{MODEL}           # the engine (vLLM)
  kubectl -n {OPERATOR_NS} logs deploy/{s.RELEASE}    # the operator
Stop:
  make demo-down      # helm uninstall the operator and delete namespace {MODEL_NS}
  make cluster-down   # or stop the whole cluster (the demo goes with it)
  (make test stops the demo by itself before it runs)""")
    if new_hits <= 0:
        print("ERROR: the repeated prompt did not hit the prefix cache", file=sys.stderr)
        return 1
    return 0


def down(args: argparse.Namespace) -> int:
    from tests.cluster.controlplane import ControlPlane

    cp = ControlPlane()
    _kwok_demo_operator_stop(cp.root)
    if not (cp._load_state() and cp.apiserver_ready()):
        if not args.quiet:
            info("the cluster is not running: nothing to stop")
        return 0
    removed = s.uninstall_operator(cp, OPERATOR_NS)
    ns = _delete_namespace(cp, MODEL_NS)
    _delete_namespace(cp, KWOK_NS)
    from tests.cluster.keda import KedaStack

    keda = KedaStack(cp)
    if keda.running():  # `up --scale-to-zero` started it
        keda.down()
        info("stopped KEDA and its HTTP add-on")
    if removed or ns or not args.quiet:
        info(f"demo stopped: operator release {'uninstalled' if removed else 'not installed'}, "
             f"namespace {MODEL_NS} {'deleted' if ns else 'absent'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo")
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("--backend", default="eager", choices=["eager", "inductor"])
    u.add_argument("--timeout", type=float, default=1800)
    u.add_argument("--scale-to-zero", action="store_true",
                   help="with KEDA + its HTTP add-on: the model goes to zero and wakes")
    d = sub.add_parser("down")
    d.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    try:
        return up(args) if args.cmd == "up" else down(args)
    except (AssertionError, RuntimeError, TimeoutError, subprocess.CalledProcessError) as e:
        print(f"\nFAILED: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
