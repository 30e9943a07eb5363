"""A loopback TCP proxy that delays every chunk by a fixed time in each direction.

This machine's kernel has no netem, so latency is simulated in user space: each chunk read from one side
is written to the other `delay` seconds after it arrived, order preserved (a per-direction queue).
Run in a thread: `with LatencyProxy(target_port, delay=0.05) as proxy: connect to proxy.port`.

`proxy.traffic` counts what crossed it (bytes each way, connections, and "exchanges": how often a client
spoke again after hearing from the server, a network-level round-trip count that needs no decryption).
Take `traffic.snapshot()` before and after an operation and subtract.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass


@dataclass
class Traffic:
    connections: int = 0
    bytes_up: int = 0      # client -> server
    bytes_down: int = 0    # server -> client
    exchanges: int = 0     # client chunks that follow server data on the same connection (or open it)

    def snapshot(self) -> "Traffic":
        return dataclasses.replace(self)

    def __sub__(self, before: "Traffic") -> "Traffic":
        return Traffic(*(getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(self)))

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


class _Direction:
    """Which side spoke last on one connection, to count exchanges."""

    def __init__(self) -> None:
        self.last: str | None = None


class LatencyProxy:
    def __init__(self, target_port: int, *, delay: float, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = 0
        self.traffic = Traffic()  # only the proxy's thread writes it; readers take snapshots
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
        self._finish_connections()
        self._loop.close()

    def _finish_connections(self) -> None:
        """Cancel the connections still open at exit, so the loop closes with no task pending."""
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(asyncio.sleep(0))  # let the transports' close callbacks run

    async def _handle(self, client_r, client_w) -> None:
        try:
            target_r, target_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self.traffic.connections += 1
        direction = _Direction()
        try:
            await asyncio.gather(self._pipe(client_r, target_w, "up", direction),
                                 self._pipe(target_r, client_w, "down", direction))
        except asyncio.CancelledError:
            pass  # the proxy is shutting down; asyncio's server callback would log a cancelled handler
        finally:
            client_w.close()
            target_w.close()

    def _count(self, side: str, direction: _Direction, size: int) -> None:
        if side == "up":
            self.traffic.bytes_up += size
            if direction.last != "up":
                self.traffic.exchanges += 1
        else:
            self.traffic.bytes_down += size
        direction.last = side

    async def _pipe(self, reader, writer, side: str, direction: _Direction) -> None:
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
                self._count(side, direction, len(chunk))
                queue.put_nowait((time.monotonic() + self.delay, chunk))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((time.monotonic() + self.delay, None))
        await sender
