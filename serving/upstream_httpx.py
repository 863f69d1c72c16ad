"""The decode-stream contract of :mod:`.upstream` over an injected ``httpx.AsyncClient`` (tests
swap its transport); pull mode only (``read()`` per body part)."""

from __future__ import annotations

import asyncio

import httpx

from .http1 import UpstreamError, local_error

__all__ = ["HttpxUpstream"]


class _HttpxResponse:
    """An ``httpx`` streamed response behind the same contract."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status = response.status_code
        self.headers = response.headers
        encoded = response.headers.get("content-encoding", "identity") not in ("", "identity")
        raw = not encoded and not response.is_stream_consumed  # a mock's body may be read already
        self._chunks = response.aiter_raw() if raw else response.aiter_bytes()
        #: set mid-response, a bound per read of its own (httpx fixes the request's when it is sent)
        self.read_timeout: float | None = None

    async def read(self) -> bytes:
        try:
            async with asyncio.timeout(self.read_timeout):
                while True:
                    part = await self._chunks.__anext__()
                    if part:
                        return part
        except StopAsyncIteration:
            return b""
        except TimeoutError:
            raise UpstreamError(f"no data from upstream for {self.read_timeout:g} s (read timeout)",
                                timed_out=True) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}",
                                timed_out=isinstance(exc, httpx.TimeoutException)) from None

    async def aread(self, limit: int = 1 << 20) -> bytes:
        parts = []
        while part := await self.read():
            parts.append(part)
        return b"".join(parts)[:limit]

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            await self.response.aclose()


class HttpxUpstream:
    """The decode-stream contract over an ``httpx.AsyncClient`` (tests inject mock transports)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post_stream(self, url: str, content: bytes, headers: dict[str, str], *,
                          connect_timeout: float, read_timeout: float) -> _HttpxResponse:
        """POST and return once the headers are in (errors as :class:`UpstreamError`)."""
        request = self.client.build_request(
            "POST", url, content=content, headers={"Content-Type": "application/json", **headers},
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout))
        try:
            return _HttpxResponse(await self.client.send(request, stream=True))
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}",
                                connect=isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)),
                                local=local_error(exc), timed_out=isinstance(exc, httpx.TimeoutException)) from None

    async def aclose(self) -> None:
        """Nothing to close: the client belongs to whoever injected it."""
