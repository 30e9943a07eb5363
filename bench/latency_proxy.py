"""A loopback TCP proxy that delays every chunk by a fixed time in each direction.

This machine's kernel has no netem, so latency is simulated in user space: each chunk read from one side
is written to the other `delay` seconds after it arrived, order preserved (a per-direction queue).
Run in a thread: `with LatencyProxy(target_port, delay=0.05) as proxy: connect to proxy.port`.
"""
from __future__ import annotations

import asyncio
import threading
import time


class LatencyProxy:
    def __init__(self, target_port: int, *, delay: float, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "LatencyProxy":
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _handle(self, client_r, client_w) -> None:
        try:
            target_r, target_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self._pipe(client_r, target_w), self._pipe(target_r, client_w))

    async def _pipe(self, reader, writer) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if chunk is None:
                    writer.close()
                    return
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while chunk := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.delay, chunk))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((time.monotonic() + self.delay, None))
        await sender
