"""Render the chart's "Spyre models" dashboard to a PNG from a real Prometheus after a load run.

    .venv/bin/python -m tests.engine.dashboard_png
    # writes charts/spyre-model-operator/dashboards/spyre-models.png

What is real: one ``spyre-engine serve`` (vLLM + the Spyre plugin on CPU, eager backend, the
tiny generated model, the engine tests' shape: chunk 128, 4 sequences), Debian's Prometheus
scraping its ``/metrics`` every 2 s with the labels the chart's PodMonitor attaches
(``namespace``, ``pod``, ``serving_spyre_dev_model``), and a load of concurrent streamed
completions (more than the 4 sequences the engine batches, so requests queue) that share long
prompt prefixes. Every panel's PromQL is taken from the dashboard JSON unchanged (variables
substituted) and evaluated by Prometheus' ``query_range``/``query`` API.

What stands in: Grafana. This script draws the panels itself with Pillow (lines per series,
panel titles and legends as in the JSON), because no Grafana is installable here. No operator
runs, so the panels of its series (replicas desired/ready, the operator row, the model
conditions) are empty here; tests/integration/test_alerts_prometheus.py checks them.

Needs ``prometheus`` on PATH (Debian's package; ``make binaries`` installs it through
tests/cluster/metrics-deps.sh). Takes ~5 minutes on 2 cores (mostly the engine start).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, ImageDraw, ImageFont
from spyre_engine.testing.process import EngineProcess, engine_command, free_port
from spyre_engine.testing.tiny_model import build_tiny_model

from tests.dashboards import ROOT, dashboards, substitute
from tests.prometheus import Prometheus, Target, available

SHAPE = ["--max-model-len", "512", "--max-num-seqs", "4", "--max-num-batched-tokens", "128"]
LABELS = {"namespace": "demo", "pod": "tiny-0", "serving_spyre_dev_model": "tiny"}
VARIABLES = {"$namespace": LABELS["namespace"], "$model": LABELS["serving_spyre_dev_model"],
             "$__rate_interval": "20s"}
SCRAPE = 2
WORDS = ("the quick brown fox jumps over a lazy dog while spyre accelerators serve large "
         "language models with vllm on kubernetes clusters").split()
COLORS = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9"]


def text(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(i + offset) % len(WORDS)] for i in range(n))


def start_engine(work: Path) -> EngineProcess:
    model = build_tiny_model(work / "tiny", arch="granite")
    art = work / "artifact"
    pre = subprocess.run(
        engine_command("precompile", "--model", str(model), "--artifact-dir", str(art),
                       "--artifact-key", "0f3c9a51d2e4", "--backend", "eager",
                       "--termination-log", str(work / "pre.termlog"), *SHAPE),
        capture_output=True, text=True, timeout=900, check=False)
    if pre.returncode != 0:
        sys.exit(f"precompile failed:\n{pre.stderr[-3000:]}")
    port = free_port()
    engine = EngineProcess(
        ["serve", "--port", str(port), "--host", "127.0.0.1", "--model", str(model),
         "--artifact-dir", str(art), "--artifact-key", "0f3c9a51d2e4", "--backend", "eager",
         "--served-name", "tiny", "--termination-log", str(work / "serve.termlog"), *SHAPE],
        log_path=work / "engine.log", port=port)
    engine.wait_started(900)
    return engine


def load(engine: EngineProcess, seconds: float) -> dict[str, int]:
    """Waves of concurrent streamed completions sharing long prefixes, with pauses."""
    stats = {"ok": 0, "failed": 0}
    lock = threading.Lock()

    def one(i: int) -> None:
        prefix = text(260, offset=(i % 3) * 7)  # three prefixes of ~2+ chunks, shared
        try:
            with httpx.stream("POST", engine.url + "/v1/completions", timeout=300, json={
                "model": "tiny", "prompt": prefix + f" question {i}", "max_tokens": 24,
                "ignore_eos": True, "stream": True,
            }) as r:
                for _ in r.iter_lines():
                    pass
                ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        with lock:
            stats["ok" if ok else "failed"] += 1

    t0 = time.monotonic()
    wave = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        while time.monotonic() - t0 < seconds:
            width = (2, 6, 10, 4)[wave % 4]  # above 4 concurrent, requests queue
            list(pool.map(one, range(wave * 10, wave * 10 + width)))
            wave += 1
            time.sleep(4 if wave % 4 == 0 else 1)
    return stats


def prom(p: Prometheus, path: str, **params: Any) -> Any:
    return p.api(path, **params)["result"]


def legend(fmt: str, metric: dict[str, str]) -> str:
    out = fmt or "{{__name__}}"
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def fmt_value(v: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{v * 100:.0f}%"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s"
    if unit == "reqps":
        return f"{v:.2f}/s"
    return f"{v:.1f}" if abs(v) < 10 and v != int(v) else f"{v:.0f}"


def draw_panel(img: Image.Image, box: tuple[int, int, int, int], panel: dict[str, Any],
               series: list[tuple[str, list[tuple[float, float]]]], t0: float, t1: float,
               fonts: dict[str, Any]) -> None:
    d = ImageDraw.Draw(img)
    x0, y0, x1, y1 = box
    d.rectangle(box, fill="#181b1f", outline="#2c3235")
    d.text((x0 + 10, y0 + 6), panel["title"], fill="#d8d9da", font=fonts["title"])
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    legend_rows = max(1, (len(series) + 2) // 3)
    px0, py0, px1, py1 = x0 + 70, y0 + 32, x1 - 12, y1 - 30 - 16 * legend_rows
    values = [v for _, pts in series for _, v in pts]
    lo = min([0.0, *values])
    hi = max([*values, 1e-9])
    fixed = panel.get("fieldConfig", {}).get("defaults", {})
    if "max" in fixed:
        hi = max(hi, float(fixed["max"])) if unit != "percentunit" else 1.0
    hi = hi * 1.08 if "max" not in fixed else hi
    for i in range(5):
        y = py1 - (py1 - py0) * i / 4
        d.line([(px0, y), (px1, y)], fill="#2c3235")
        d.text((x0 + 6, y - 7), fmt_value(lo + (hi - lo) * i / 4, unit), fill="#8e8e8e",
               font=fonts["small"])
    for i in range(5):
        x = px0 + (px1 - px0) * i / 4
        d.text((x - 14, py1 + 4), f"{(t1 - t0) * i / 4 / 60:.1f}m", fill="#8e8e8e",
               font=fonts["small"])
    for n, (name, pts) in enumerate(series):
        color = COLORS[n % len(COLORS)]
        xy = [(px0 + (px1 - px0) * (t - t0) / max(1e-9, t1 - t0),
               py1 - (py1 - py0) * (v - lo) / max(1e-12, hi - lo)) for t, v in pts]
        if len(xy) > 1:
            d.line(xy, fill=color, width=2)
        lx = x0 + 10 + (n % 3) * ((x1 - x0) // 3)
        ly = y1 - 8 - 16 * (legend_rows - n // 3)
        d.rectangle((lx, ly + 4, lx + 10, ly + 12), fill=color)
        last = fmt_value(pts[-1][1], unit) if pts else "no data"
        d.text((lx + 14, ly), f"{name}: {last}", fill="#d8d9da", font=fonts["small"])
    if not series:
        d.text((px0 + 20, (py0 + py1) // 2), "no data", fill="#8e8e8e", font=fonts["title"])


def draw_table(img: Image.Image, box: tuple[int, int, int, int], panel: dict[str, Any],
               rows: list[dict[str, str]], fonts: dict[str, Any]) -> None:
    d = ImageDraw.Draw(img)
    x0, y0, x1, y1 = box
    d.rectangle(box, fill="#181b1f", outline="#2c3235")
    d.text((x0 + 10, y0 + 6), panel["title"], fill="#d8d9da", font=fonts["title"])
    # the columns are the query's "by (...)" labels, in its order
    by = re.search(r"by \(([^)]*)\)", panel["targets"][0]["expr"])
    cols = [c.strip() for c in by[1].split(",")] if by else sorted({k for r in rows for k in r})
    for i, c in enumerate(cols):
        d.text((x0 + 14 + i * 180, y0 + 40), c, fill="#6e9fff", font=fonts["small"])
    if not rows:
        d.text((x0 + 14, y0 + 64), "no data", fill="#8e8e8e", font=fonts["small"])
    for r, row in enumerate(rows):
        for i, c in enumerate(cols):
            d.text((x0 + 14 + i * 180, y0 + 64 + r * 22), row.get(c, ""), fill="#d8d9da",
                   font=fonts["small"])


def render(url: Prometheus, dash: dict[str, Any], t0: float, t1: float, out: Path,
           note: str) -> None:
    fonts = {"title": ImageFont.load_default(size=16), "small": ImageFont.load_default(size=12)}
    panels = sorted(dash["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    w, row_h, col_w, top = 1600, 300, 800, 44
    rows = max(p["gridPos"]["y"] for p in panels) // 8 + 1
    img = Image.new("RGB", (w, top + rows * row_h + 48), "#111217")
    ImageDraw.Draw(img).text((12, 12), f"{dash['title']}  (namespace={LABELS['namespace']}, "
                             f"model={LABELS['serving_spyre_dev_model']})", fill="#d8d9da",
                             font=fonts["title"])
    step = SCRAPE
    for p in panels:
        if p["type"] == "row":
            continue
        gx, gy = p["gridPos"]["x"] // 12, p["gridPos"]["y"] // 8
        box = (gx * col_w + 4, top + gy * row_h + 4, (gx + 1) * col_w - 4,
               top + (gy + 1) * row_h - 4)
        if p["type"] == "table":
            res = prom(url, "query", query=substitute(p["targets"][0]["expr"], VARIABLES), time=t1)
            draw_table(img, box, p, [r["metric"] for r in res], fonts)
            continue
        series = []
        for t in p["targets"]:
            res = prom(url, "query_range", query=substitute(t["expr"], VARIABLES), start=t0, end=t1,
                       step=step)
            for r in res:
                pts = [(float(ts), float(v)) for ts, v in r["values"] if v not in ("NaN", "+Inf")]
                series.append((legend(t.get("legendFormat", ""), r["metric"]), pts))
        draw_panel(img, box, p, series, t0, t1, fonts)
    for i, line in enumerate(textwrap.wrap(note, 190)[:2]):
        ImageDraw.Draw(img).text((12, img.height - 40 + 18 * i), line, fill="#8e8e8e",
                                 font=fonts["small"])
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, optimize=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "charts" / "spyre-model-operator" / "dashboards" / "spyre-models.png",
    )
    ap.add_argument("--load-seconds", type=float, default=150)
    args = ap.parse_args()
    dash = dashboards()["spyre-models.json"]
    with tempfile.TemporaryDirectory(prefix="dashboard-png-") as tmp:
        work = Path(tmp)
        engine = start_engine(work)
        prometheus = None
        try:
            if not available():
                sys.exit("prometheus is not installed (Debian: apt-get install prometheus)")
            prometheus = Prometheus(work / "prometheus", [Target(f"127.0.0.1:{engine.port}",
                                                                 LABELS)], f"{SCRAPE}s")
            time.sleep(3 * SCRAPE)
            t0 = time.time()
            stats = load(engine, args.load_seconds)
            time.sleep(6 * SCRAPE)  # the last requests' histograms and rates settle
            t1 = time.time()
            note = (f"Real spyre-engine (vLLM + Spyre plugin, CPU eager, tiny model, chunk 128, "
                    f"4 seqs) scraped every {SCRAPE}s by Prometheus; {stats['ok']} streamed "
                    f"completions ({stats['failed']} failed) in {t1 - t0:.0f}s; panels drawn "
                    "by tests/engine/dashboard_png.py from the dashboard's own PromQL "
                    "(no Grafana). No operator ran: its row is checked in "
                    "tests/integration/test_alerts_prometheus.py.")
            render(prometheus, dash, t0, t1, args.out, note)
            print(f"wrote {args.out}: {note}")
        finally:
            if prometheus is not None:
                prometheus.stop()
            engine.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
