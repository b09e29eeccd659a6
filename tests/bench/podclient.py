"""HTTP load for the real-node benchmarks, run inside the client pod (standard library only).

There is no cluster DNS and the host has no route to the Service range or the pod network, so
``tests/bench/bench_realpods.py`` runs this script in the namespace's client pod
(``kubectl exec [-i] <client> -- python3 -c <this file> ...``). Times are ``time.time()``: the pod
shares the host's clock, so they compare with the host's.

``until-ok URL BODY``
    POSTs every ``--interval`` s until one answers 200 (refused connections, 503s and timeouts
    are retried); prints ``{"t_ok": <when the 200 arrived>, "attempts", "statuses"}``.
``rate URL BODY``
    Open loop: starts one POST every ``1/--rate`` s, each on its own thread (a slow answer does
    not delay the next request), until stdin is closed (``kubectl exec -i``); then waits for the
    requests in flight. One JSON line per request: ``t0``, ``t1``, ``status`` (0: no HTTP
    answer) and ``error`` (a reset, a refused connection, a timeout) or a short ``body`` of a
    non-200 answer.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit


def post(url: str, body: str, timeout: float) -> dict[str, Any]:
    u = urlsplit(url)
    t0 = time.time()
    try:
        conn = http.client.HTTPConnection(u.hostname or "", u.port or 80, timeout=timeout)
        conn.request("POST", u.path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
        conn.close()
        out: dict[str, Any] = {"t0": t0, "t1": time.time(), "status": resp.status}
        if resp.status != 200:
            out["body"] = text[:300]
        return out
    except (OSError, http.client.HTTPException) as exc:
        return {"t0": t0, "t1": time.time(), "status": 0, "error": repr(exc)[:300]}


def until_ok(url: str, body: str, timeout: float, interval: float, deadline: float) -> None:
    end = time.time() + deadline
    statuses: dict[str, int] = {}
    attempts = 0
    while time.time() < end:
        attempts += 1
        r = post(url, body, timeout)
        if r["status"] == 200:
            print(json.dumps({"t_ok": r["t1"], "t_sent": r["t0"], "attempts": attempts,
                              "statuses": statuses}), flush=True)
            return
        key = str(r["status"]) if r["status"] else (r.get("error") or "?").split("(")[0]
        statuses[key] = statuses.get(key, 0) + 1
        time.sleep(interval)
    print(json.dumps({"t_ok": None, "attempts": attempts, "statuses": statuses}), flush=True)


def rate(url: str, body: str, timeout: float, per_second: float) -> None:
    stop = threading.Event()
    lock = threading.Lock()

    def watch_stdin() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        stop.set()

    def one() -> None:
        r = post(url, body, timeout)
        with lock:
            sys.stdout.write(json.dumps(r) + "\n")
            sys.stdout.flush()

    threading.Thread(target=watch_stdin, daemon=True).start()
    threads: list[threading.Thread] = []
    period = 1.0 / per_second
    nxt = time.monotonic()
    while not stop.is_set():
        t = threading.Thread(target=one, daemon=True)
        t.start()
        threads.append(t)
        threads = [x for x in threads if x.is_alive()]
        nxt += period
        stop.wait(max(0.0, nxt - time.monotonic()))
    for t in threads:
        t.join(timeout + 5)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["until-ok", "rate"])
    p.add_argument("url")
    p.add_argument("body")
    p.add_argument("--timeout", type=float, default=60.0, help="per request")
    p.add_argument("--interval", type=float, default=0.2, help="until-ok: between attempts")
    p.add_argument("--deadline", type=float, default=900.0, help="until-ok: give up after")
    p.add_argument("--rate", type=float, default=3.0, help="rate: requests per second")
    a = p.parse_args()
    if a.mode == "until-ok":
        until_ok(a.url, a.body, a.timeout, a.interval, a.deadline)
    else:
        rate(a.url, a.body, a.timeout, a.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
