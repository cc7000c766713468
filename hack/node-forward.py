"""Forwards TCP from the real node's bridge gateway to servers that listen on loopback only.

    python3 hack/node-forward.py --listen 10.245.0.1 --to 127.0.0.1 PORT [PORT...]

Pods on the real node (hack/node-up.sh) reach the host only through the CNI bridge's gateway
address; the local environment's kube-apiserver and SeaweedFS bind 127.0.0.1. For each PORT this
listens on ``--listen``:PORT and copies bytes both ways to ``--to``:PORT, so a pod reaches the API
server through the ``kubernetes`` Service (its endpoint is the gateway, the API server's
``--advertise-address``) and S3 at ``http://<gateway>:<port>``. Nothing listens outside the bridge
the project made; the Host header and TLS pass through untouched (SigV4 signatures hold).
Standard library only: it runs with the system's python3. hack/node-down.sh stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

CHUNK = 1 << 16
CONNECT_TIMEOUT_S = 10


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies ``reader`` to ``writer`` until EOF, then half-closes ``writer``."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def handle(
    target: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(target, port), CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError):
        writer.close()
        return
    try:
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()


async def serve(listen: str, target: str, ports: list[int]) -> None:
    servers = []
    for port in ports:

        async def on_connect(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, port: int = port
        ) -> None:
            await handle(target, port, r, w)

        servers.append(await asyncio.start_server(on_connect, listen, port, reuse_address=True))
        print(f"forwarding {listen}:{port} -> {target}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, help="the bridge gateway address")
    parser.add_argument("--to", default="127.0.0.1", help="where the servers listen")
    parser.add_argument("ports", nargs="+", type=int)
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.to, args.ports))


if __name__ == "__main__":
    main()
