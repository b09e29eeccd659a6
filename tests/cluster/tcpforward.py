#!/usr/bin/env python3
"""Forward TCP connections and UDP datagrams:
``tcpforward.py LISTEN_HOST:PORT TARGET_HOST:PORT [[udp:]LISTEN TARGET ...]``.

The API server and CoreDNS listen on 127.0.0.1 only. The real node lives in its own network
namespace and reaches the host through a veth pair; this forwarder listens on the host end of
that pair (an address that exists only while the node does) and relays to their loopback
ports: TCP for the API server (TLS passes through untouched), TCP and UDP (a ``udp:`` LISTEN)
for cluster DNS. Standard library only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass


#: A client's upstream socket is closed after this long unused. A resolver asks from a new port
#: per lookup and gets its answer within milliseconds: every lookup of the last this-many
#: seconds holds a socket (at 30 s, thousands under a test's steady traffic).
UDP_IDLE_SECONDS = float(os.environ.get("SPYRE_UDP_IDLE_SECONDS", "5"))


class _UdpUpstream(asyncio.DatagramProtocol):
    """One client's socket towards the target: replies go back to that client."""

    def __init__(self, listener: asyncio.DatagramTransport, client: tuple[str, int]) -> None:
        self.listener, self.client = listener, client
        self.transport: asyncio.DatagramTransport | None = None
        self.used = asyncio.get_running_loop().time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.used = asyncio.get_running_loop().time()
        self.listener.sendto(data, self.client)


class _UdpListener(asyncio.DatagramProtocol):
    """Relays each client's datagrams through its own upstream socket (so replies find it)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.transport: asyncio.DatagramTransport | None = None
        self.upstreams: dict[tuple[str, int], _UdpUpstream] = {}
        #: a client's upstream socket being opened: the datagrams that come meanwhile (a
        #: resolver's A and AAAA, back to back) wait for it instead of each opening one (the
        #: one a second replaced in the table was never closed: thousands of sockets)
        self.opening: dict[tuple[str, int], asyncio.Future[_UdpUpstream]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        asyncio.ensure_future(self._relay(data, addr))

    async def _open(self, client: tuple[str, int]) -> _UdpUpstream:
        assert self.transport is not None
        listener = self.transport
        try:
            _, up = await asyncio.get_running_loop().create_datagram_endpoint(
                lambda: _UdpUpstream(listener, client), remote_addr=self.target)
        finally:
            del self.opening[client]
        self.upstreams[client] = up
        return up

    async def _relay(self, data: bytes, client: tuple[str, int]) -> None:
        up = self.upstreams.get(client)
        if up is None or up.transport is None or up.transport.is_closing():
            if client not in self.opening:
                self.opening[client] = asyncio.ensure_future(self._open(client))
            up = await self.opening[client]
        up.used = asyncio.get_running_loop().time()
        assert up.transport is not None
        up.transport.sendto(data)

    async def expire(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(UDP_IDLE_SECONDS / 3)
            for client, up in list(self.upstreams.items()):
                if loop.time() - up.used > UDP_IDLE_SECONDS and up.transport is not None:
                    up.transport.close()
                    del self.upstreams[client]


def _hostport(spec: str) -> tuple[str, int]:
    host, port = spec.rsplit(":", 1)
    return host, int(port)


async def main(pairs: list[tuple[str, str]]) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    tasks = []
    for listen, target in pairs:
        thost, tport = _hostport(target)
        if listen.startswith("udp:"):
            proto = _UdpListener((thost, tport))
            await loop.create_datagram_endpoint(lambda p=proto: p,  # type: ignore[misc]
                                                local_addr=_hostport(listen[4:]))
            tasks.append(asyncio.ensure_future(proto.expire()))
        else:
            lhost, lport = _hostport(listen)

            async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter,
                             thost: str = thost, tport: int = tport) -> None:
                try:
                    sr, sw = await asyncio.open_connection(thost, tport)
                except OSError:
                    cw.close()
                    return
                await asyncio.gather(_pipe(cr, sw), _pipe(sr, cw))
                for w in (cw, sw):
                    w.close()

            servers.append(await asyncio.start_server(handle, lhost, lport,
                                                      reuse_address=True))
        print(f"forwarding {listen} -> {target}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for t in tasks:
        t.cancel()
    for s in servers:
        s.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    asyncio.run(main(list(zip(args[::2], args[1::2], strict=True))))
