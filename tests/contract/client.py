"""An HTTP client for the real-pod tests, run inside the real node's network namespace.

The host has no route to the Service range, so the tests run this script in a client pod on
the real node (``kubectl exec ... python3 -c <this file>``,
:class:`tests.contract.realpods.Client`). Standard library only, no proxy: every request
goes to the model's ``status.endpoint`` (its Service's name, resolved by cluster DNS),
through kube-proxy.

Modes (every result is one JSON line on stdout, or in ``--out``):

``once URL BODY``
    One POST; prints ``{"status", "body"}``, and ``headers`` unless the status is 200.
``steady URL BODY``
    POSTs one after another until stdin is closed (``kubectl exec -i``); one line per request
    with its start and end (``time.time()``), when its name was resolved and its connection
    made (``resolved``, ``connected``), the address it connected to (``addr``), status, and
    error (a reset, a refused connection, a timeout); ``connect_retry``/``connect_error`` when
    its first connect found no host (EHOSTUNREACH) and it connected again.
``many URL BODY --count N``
    N POSTs at once (threads); prints ``{"results": [...]}``, each as ``once`` prints it.
``stream URL BODY``
    One streaming POST; prints ``started`` at its first event, then
    ``{"status", "events", "done", "error_event", "error", ...}``: how the stream ended,
    ``error`` being a transport failure (a reset connection).
"""

from __future__ import annotations

import argparse
import errno
import http.client
import json
import socket
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit


def _post(
    url: str, body: str, timeout: float, phases: dict[str, float] | None = None
) -> tuple[http.client.HTTPConnection, Any]:
    """POST ``body``; ``phases`` gets when the name was resolved and the connection made
    (``time.time()``): a slow request says whether DNS, the connection or the answer took
    the time."""
    u = urlsplit(url)
    host, port = u.hostname or "", u.port or 80
    phases = {} if phases is None else phases
    # resolved here, once, and each address tried in turn (what create_connection does), to
    # time the two apart
    addrs = [str(a[4][0]) for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    phases["resolved"] = time.time()
    for i, addr in enumerate(addrs):
        phases["addr"] = addr  # the Service address a failure reached (the report's timeline)
        conn = http.client.HTTPConnection(addr, port, timeout=timeout)
        try:
            try:
                conn.connect()
            except OSError as exc:
                # No host answered for the backend chosen for this connection: nothing was
                # sent, so connect once more, as HTTP clients and gateways do (recorded: the
                # tests report these). Full runs saw this twice right after a roll, with every
                # endpoint the node's NAT rules named alive (tests/contract/README.md); a
                # refused connection (a backend that is there but not listening) is not retried.
                if exc.errno != errno.EHOSTUNREACH or "connect_retry" in phases:
                    raise
                phases["connect_retry"] = time.time()
                phases["connect_error"] = repr(exc)  # type: ignore[assignment]
                conn = http.client.HTTPConnection(addr, port, timeout=timeout)
                conn.connect()
            break
        except OSError:
            if i == len(addrs) - 1:
                raise
    phases["connected"] = time.time()
    # the Host header the name gives (the interceptor routes on it), not the address
    conn.request("POST", u.path, body=body, headers={
        "Content-Type": "application/json", "Host": host if port == 80 else f"{host}:{port}"})
    return conn, conn.getresponse()


def once(url: str, body: str, timeout: float) -> dict[str, Any]:
    t0 = time.time()
    phases: dict[str, float] = {}
    try:
        conn, resp = _post(url, body, timeout, phases)
        text = resp.read().decode(errors="replace")
        conn.close()
        out = {"t0": t0, "t1": time.time(), "status": resp.status, "body": text, **phases}
        if resp.status != 200:  # a 503's Retry-After
            out["headers"] = {k.lower(): v for k, v in resp.getheaders()}
        return out
    except (OSError, http.client.HTTPException) as exc:
        return {"t0": t0, "t1": time.time(), "status": 0, "error": repr(exc), **phases}


def many(url: str, body: str, timeout: float, count: int) -> dict[str, Any]:
    results: list[dict[str, Any]] = [{} for _ in range(count)]

    def one(i: int) -> None:
        results[i] = once(url, body, timeout)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"results": results}


def steady(url: str, body: str, timeout: float, pause: float) -> None:
    stop = threading.Event()

    def watch_stdin() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.is_set():
        r = once(url, body, timeout)
        if r.get("status") == 200:
            r.pop("body", None)  # keep the output small
        sys.stdout.write(json.dumps(r) + "\n")
        sys.stdout.flush()
        time.sleep(pause)


def stream(url: str, body: str, timeout: float) -> dict[str, Any]:
    t0 = time.time()
    out: dict[str, Any] = {"t0": t0, "events": 0, "done": False, "error_event": None,
                           "error": None, "status": 0, "first_event_at": None}
    try:
        conn, resp = _post(url, body, timeout)
        out["status"] = resp.status
        if resp.status != 200:
            out["body"] = resp.read().decode(errors="replace")
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            text = line.decode(errors="replace").strip()
            if not text.startswith("data:"):
                continue
            data = text[5:].strip()
            if data == "[DONE]":
                out["done"] = True
                continue
            event = json.loads(data)
            if "error" in event:
                out["error_event"] = event["error"]
                continue
            out["events"] += 1
            if out["first_event_at"] is None:
                out["first_event_at"] = time.time()
                sys.stdout.write("started\n")
                sys.stdout.flush()
            fr = (event.get("choices") or [{}])[0].get("finish_reason")
            if fr:
                out["finish_reason"] = fr
        conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        out["error"] = repr(exc)
    out["t1"] = time.time()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["once", "many", "steady", "stream"])
    p.add_argument("url")
    p.add_argument("body")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--pause", type=float, default=0.2)
    p.add_argument("--count", type=int, default=1)
    a = p.parse_args()
    if a.mode == "many":
        sys.stdout.write(json.dumps(many(a.url, a.body, a.timeout, a.count)) + "\n")
        return 0
    if a.mode == "steady":
        steady(a.url, a.body, a.timeout, a.pause)
        return 0
    result = once(a.url, a.body, a.timeout) if a.mode == "once" else stream(
        a.url, a.body, a.timeout)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
