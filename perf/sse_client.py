"""A cheap streaming client for the routing-quality benchmark: raw HTTP/1.1 over asyncio streams, one
keep-alive connection per session, measuring each streamed chat completion's time to first token.

``Connection.stream`` sends one POST and reads the answer as it comes (``Transfer-Encoding: chunked``,
``Content-Length`` or read to close), splits it into server-sent events and decodes only the ``data:``
lines: the first chunk with non-empty ``delta.content`` stops the TTFT clock, the contents are joined
into the answer (sent back as the next turn's assistant message, exactly as received) and the chunk with
``usage`` gives prompt and cached tokens. An answer that is not 200 is read whole and reported by status.
It costs a few µs per chunk where httpx costs tens: the client shares two cores with the engines and the
router it measures. I/O: loopback TCP only.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Answer", "Connection"]


@dataclass(slots=True)
class Answer:
    status: int = 0  # 0: no answer (connection error, timeout)
    ttft: float | None = None  # seconds from sending to the first content
    seconds: float = 0.0  # to the end of the answer
    content: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""
    parts: list[str] = field(default_factory=list)


class Connection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1:``port``, opened on first use and again after the
    server closed it or a request failed."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.port = port
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{extra}"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def stream(self, path: str, body: bytes, timeout: float = 300.0) -> Answer:
        answer = Answer()
        start = time.perf_counter()
        try:
            await asyncio.wait_for(self._exchange(path, body, answer, start), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            answer.error = f"{type(exc).__name__}: {exc}"
            await self.close()
        except TimeoutError:
            answer.error = f"no complete answer in {timeout:.0f}s"
            await self.close()
        answer.seconds = time.perf_counter() - start
        answer.content = "".join(answer.parts)
        return answer

    async def _exchange(self, path: str, body: bytes, answer: Answer, start: float) -> None:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        request = f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n".encode()
        writer.write(request + body)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        answer.status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        events = _Events(answer, start)
        if headers.get("transfer-encoding") == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    break
                events.feed(data[:-2])
        elif "content-length" in headers:
            events.feed(await reader.readexactly(int(headers["content-length"])))
        else:
            while data := await reader.read(65536):
                events.feed(data)
            headers["connection"] = "close"
        if answer.status != 200:
            answer.error = events.raw[:300].decode(errors="replace")
        if headers.get("connection") == "close":
            await self.close()


class _Events:
    """Server-sent events from body pieces: each complete event's ``data:`` decoded into ``answer``."""

    def __init__(self, answer: Answer, start: float) -> None:
        self.answer = answer
        self.start = start
        self.buffer = b""
        self.raw = b""

    def feed(self, data: bytes) -> None:
        if self.answer.status != 200:
            self.raw += data
            return
        self.buffer += data
        *events, self.buffer = self.buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload and payload != b"[DONE]":
                        self._chunk(json.loads(payload))

    def _chunk(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or ():
            text = (choice.get("delta") or {}).get("content")
            if text:
                if self.answer.ttft is None:
                    self.answer.ttft = time.perf_counter() - self.start
                self.answer.parts.append(text)
        usage = chunk.get("usage")
        if usage:
            self.answer.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.answer.cached_tokens = int(details.get("cached_tokens") or 0)
