#!/usr/bin/env python3
"""Forward TCP connections: ``tcpforward.py LISTEN_HOST:PORT TARGET_HOST:PORT``.

The API server listens on 127.0.0.1 only. The real node lives in its own network namespace
and reaches the host through a veth pair; this forwarder listens on the host end of that
pair (an address that exists only while the node does) and relays to the API server's
loopback port. TLS passes through untouched. Standard library only.
"""

from __future__ import annotations

import asyncio
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


async def main(listen: str, target: str) -> None:
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(thost, int(tport))
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pipe(cr, sw), _pipe(sr, cw))
        for w in (cw, sw):
            w.close()

    server = await asyncio.start_server(handle, lhost, int(lport), reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"forwarding {listen} -> {target}", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
