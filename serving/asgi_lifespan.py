"""The ASGI lifespan protocol for the native server (``http_server.py``): startup before the
socket accepts, shutdown after it closes; the app's lifespan state is copied into every
request's scope."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["Lifespan"]

log = logging.getLogger("balanceroute.serving.http_server")


class Lifespan:
    """Runs ``app``'s lifespan in a task of its own; :meth:`startup` raises ``RuntimeError``
    when the app reports (or raises) a startup failure."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[dict[str, Any]] | None = None
        self._started: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Send ``lifespan.startup`` and wait for the app's answer."""
        loop = asyncio.get_running_loop()
        self._inbox = asyncio.Queue()
        self._started, self._stopped = loop.create_future(), loop.create_future()
        self._task = loop.create_task(self._main())
        await self._inbox.put({"type": "lifespan.startup"})
        await self._started

    async def shutdown(self) -> None:
        """Send ``lifespan.shutdown`` and wait for the app (errors are logged)."""
        if self._task is None or self._task.done() or self._inbox is None or self._stopped is None:
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        try:
            await self._stopped
        except RuntimeError as exc:
            log.error("%s", exc)

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
        except BaseException as exc:
            for fut in (self._started, self._stopped):
                if fut is not None and not fut.done():
                    fut.set_exception(RuntimeError(f"application lifespan failed: {exc!r}"))
            if not isinstance(exc, Exception):
                raise
        else:
            for fut in (self._started, self._stopped):
                if fut is not None and not fut.done():
                    fut.set_result(None)

    async def _receive(self) -> dict[str, Any]:
        assert self._inbox is not None
        return await self._inbox.get()

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        fut = self._started if kind.startswith("lifespan.startup") else self._stopped
        if fut is None or fut.done():
            return
        if kind.endswith(".failed"):
            fut.set_exception(RuntimeError(f"application {kind}: {message.get('message', '')}"))
        else:
            fut.set_result(None)
