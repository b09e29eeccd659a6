"""The operator's memory against a tenant's ConfigMaps (`make bench BENCH_PARTS=configmaps`,
issue 45, 2).

The API server sends the operator only the ConfigMaps with its label (a server-side selector
on its watch and its periodic re-list; a same-named one of someone else's is looked up by name
before a write), and lists in pages; of those, only a model's own ``<model>-output-check`` is
kept whole, any other as a stub (name, labels, owners). Before, every ConfigMap of the watched
namespaces reached the watch and the re-list listed them all whole every 30 s: a tenant's
megabyte ConfigMaps grew the operator toward its memory limit for every tenant.

A fresh operator watches a fresh namespace; ``--count`` ConfigMaps of ``--kib`` KiB each, with
the operator's labels, are created there, half of them named like a model's output-check
ConfigMap (``<name>-output-check``). Printed: the operator's resident memory before, after the
watch delivered them all, and its peak; the bytes created. No assertion: a printed number.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_operator import proc_stats  # noqa: E402
from tests.cluster.controlplane import ControlPlane, wait_until  # noqa: E402
from tests.integration.conftest import CRD_FILE, OperatorProcess  # noqa: E402

LABELS = {"app.kubernetes.io/managed-by": "spyre-model-operator"}


def configmap(ns: str, i: int, kib: int, labelled: bool = True) -> dict[str, object]:
    name = f"cm{i:05d}" + ("-output-check" if i % 2 else "")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": LABELS if labelled else {}},
            "data": {"blob": "x" * (kib * 1024 - 64)}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000, help="ConfigMaps (default 2000)")
    ap.add_argument("--kib", type=int, default=256, help="KiB each (default 256)")
    ap.add_argument("--unlabelled", action="store_true",
                    help="without the operator's labels (a tenant's ordinary ConfigMaps)")
    args = ap.parse_args(argv)
    cp = ControlPlane()
    cp.up()
    cp.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    ns = f"bench-cm-{uuid.uuid4().hex[:5]}"
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    op = OperatorProcess(cp.kubeconfig, cp.root / ".cluster" / "logs",
                         args=["--namespace", ns, "--log-level", "warning"])  # fmt: skip
    op.start()
    assert op.proc is not None
    try:
        time.sleep(2.0)  # settled after its start (its watches listed an empty namespace)
        before = proc_stats(op.proc.pid)
        t0 = time.monotonic()
        batch = 50
        for start in range(0, args.count, batch):
            items = [configmap(ns, i, args.kib, not args.unlabelled)
                     for i in range(start, min(start + batch, args.count))]  # fmt: skip
            cp.apply(items)
        created = time.monotonic() - t0

        # No event of a foreign ConfigMap shows outside the operator: its memory is read until
        # it stops growing (three reads a second apart within 1 MiB) once all exist, and for
        # at least one round of its periodic re-list (resync.py, every 30 s), which listed
        # every ConfigMap whole.
        reads: list[float] = []

        def settled() -> bool:
            reads.append(proc_stats(op.proc.pid)["rss_mib"])  # type: ignore[union-attr]
            return len(reads) >= 40 and max(reads[-3:]) - min(reads[-3:]) < 1.0

        wait_until(settled, 300, "the operator's memory settled", interval=1.0)
        after = proc_stats(op.proc.pid)
        total = args.count * args.kib / 1024
        kind = "unlabelled" if args.unlabelled else "labelled"
        print(f"{args.count} {kind} ConfigMaps of {args.kib} KiB ({total:.0f} MiB) created in "
              f"{created:.0f}s in the watched namespace")
        print(f"operator RSS: {before['rss_mib']:.0f} MiB before, {after['rss_mib']:.0f} MiB "
              f"after (+{after['rss_mib'] - before['rss_mib']:.0f} MiB, "
              f"{(after['rss_mib'] - before['rss_mib']) / total:.0%} of the bytes created); "
              f"peak {before['peak_rss_mib']:.0f} MiB before, {after['peak_rss_mib']:.0f} MiB "
              f"while they arrived ({after['peak_rss_mib'] / total:.1f}x the bytes created)")
    finally:
        op.stop()
        cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
