"""A request beside an open watch on one HTTP/2 connection waits past its read timeout; the
operator's clients (handlers.api_clients) keep their watches off the reconcile's connection.

A local API-server stand-in speaks TLS with ALPN (HTTP/2 and HTTP/1.1, as the API server
does): a watch gets one event and stays open; a PATCH is never answered. With one HTTP/2
client for both (the control case), the PATCH's 2 s read timeout never fires: the watch
holds the connection's read side with no timeout of its own (httpcore 2.16). With the
operator's two clients the PATCH times out after 2 s, as it must, so the worker can report
and retry. Found on the real node: a status PATCH hung one model's reconcile for good.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx2
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod
from spyre_operator.handlers import api_clients

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                                                       "resourceVersion": "1"}}
EVENT = json.dumps({"type": "ADDED", "object": POD}).encode() + b"\n"
READ_TIMEOUT = 2.0
#: Long past the read timeout: "hung" if the PATCH has neither an answer nor a timeout by then.
PATIENCE = 10.0


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    yield cert, key


async def _serve_h2(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False,
                                                                header_encoding="utf-8"))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    while data := await reader.read(65535):
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived) and "watch=" in dict(ev.headers)[":path"]:
                conn.send_headers(ev.stream_id, [(":status", "200"),
                                                 ("content-type", "application/json")])
                conn.send_data(ev.stream_id, EVENT)  # and the stream stays open
            # any other request: never answered
        writer.write(conn.data_to_send())
        await writer.drain()


async def _serve_http1(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode()
        length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                       if h.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        if "watch=" in line:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         + f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n")
            await writer.drain()
            await asyncio.Event().wait()  # the watch stays open
        # any other request: never answered (the connection waits for the next one)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        proto = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        await (_serve_h2 if proto == "h2" else _serve_http1)(reader, writer)
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def kubeconfig(port: int, cert: Path) -> KubeConfig:
    ca = base64.b64encode(cert.read_bytes()).decode()
    return KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"https://127.0.0.1:{port}",
                                               "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    })


async def _patch_beside_a_watch(make: Any, tls: tuple[Path, Path]) -> str:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*tls)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    server = await asyncio.start_server(_serve, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    client, watch_client = make(kubeconfig(port, tls[0]))
    watching = asyncio.Event()

    async def watch() -> None:
        async for _ in watch_client.watch(Pod, namespace="ns"):
            watching.set()

    task = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(watching.wait(), 10)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(
                client.patch(Pod, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="ns"),
                PATIENCE)
        except httpx2.ReadTimeout:
            return f"timed out after {time.monotonic() - t0:.1f}s"
        except TimeoutError:
            return "hung"
        return "answered"
    finally:
        task.cancel()
        server.close()
        await asyncio.gather(task, return_exceptions=True)
        for c in {client, watch_client}:
            await c.close()


def test_a_watch_on_the_shared_http2_connection_holds_a_patch_past_its_timeout(
    tls: tuple[Path, Path],
) -> None:
    """The control case: one HTTP/2 client for the watch and the PATCH."""

    def shared(config: KubeConfig) -> tuple[AsyncClient, AsyncClient]:
        c = AsyncClient(config=config, timeout=READ_TIMEOUT, http2=True)
        return c, c

    assert asyncio.run(_patch_beside_a_watch(shared, tls)) == "hung"


def test_the_operators_clients_let_the_patch_time_out(tls: tuple[Path, Path]) -> None:
    got = asyncio.run(_patch_beside_a_watch(
        lambda config: api_clients(Counter(), config=config, timeout=READ_TIMEOUT), tls))
    # its own read timeout ended it (an exception, not PATIENCE's "hung"), no sooner than set;
    # how much later depends on the machine's load, so no upper bound but PATIENCE
    assert got.startswith("timed out after "), got
    assert float(got.removeprefix("timed out after ").removesuffix("s")) >= READ_TIMEOUT - 0.05, got
