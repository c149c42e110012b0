"""A scripted OpenAI-compatible chat-completions server for tests.

Tests talk to it over real HTTP through litellm (``model="openai/<name>"``,
``api_base=fake.base_url``, ``api_key="test"``), so the whole client stack
(litellm's exception mapping, timeouts, retries) is exercised instead of mocked.

Each model name gets a script: a queue of :class:`Reply` values (or callables
building one from the request). When a script runs out, the model's ``then``
reply is used, else the default handler, which answers with a deterministic
summary of the request's messages. Every request is recorded.

Streaming requests (``"stream": true``) get the same reply as server-sent
``chat.completion.chunk`` events (see :func:`stream_chunks`); :func:`tool_call`
answers with a tool call.

Usage::

    fake_llm.script("primary", [server_error(), ok("the summary")])
    await litellm.acompletion(model="openai/primary", api_base=fake_llm.base_url,
                              api_key="test", messages=[...], num_retries=0)
    assert fake_llm.models_called() == ["primary", "primary"]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the server saw it."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None
    headers: dict[str, str]
    body: dict[str, Any]
    path: str

    @property
    def text(self) -> str:
        """All message text joined: handy for asserting on the prompt."""
        return "\n".join(_content_text(m.get("content")) for m in self.messages)


@dataclass(frozen=True, slots=True)
class Reply:
    """What the server answers: a status, a JSON (or raw text) body, headers, a delay."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    content_type: str = "application/json"
    #: A streaming request gets these chunks instead of ``stream_chunks(body)``.
    chunks: Sequence[Mapping[str, Any]] | None = None
    #: A streaming request gets this many chunks, then the connection drops mid-body.
    cut_after: int | None = None


Responder = Reply | Callable[[RecordedRequest], Reply]


# ---------------------------------------------------------------- reply builders


def completion_body(model: str, text: str | None, *, finish_reason: str = "stop") -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object with rough (4 chars/token) usage."""
    completion_tokens = len(text or "") // 4
    return {
        "id": "chatcmpl-" + hashlib.sha1((text or "").encode()).hexdigest()[:12],
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": completion_tokens,
            "total_tokens": 10 + completion_tokens,
        },
    }


def _answer(text: str | None, *, delay_s: float = 0.0, finish_reason: str = "stop") -> Responder:
    def build(req: RecordedRequest) -> Reply:
        return Reply(
            body=completion_body(req.model, text, finish_reason=finish_reason), delay_s=delay_s
        )

    return build


def ok(text: str, *, finish_reason: str = "stop") -> Responder:
    """A good answer with ``text`` as the assistant content."""
    return _answer(text, finish_reason=finish_reason)


def tool_call(name: str, arguments: Mapping[str, Any], *, call_id: str = "call_1") -> Responder:
    """An assistant turn that calls one tool (``finish_reason="tool_calls"``)."""

    def build(req: RecordedRequest) -> Reply:
        body = completion_body(req.model, None, finish_reason="tool_calls")
        body["choices"][0]["message"]["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(dict(arguments))},
            }
        ]
        return Reply(body=body)

    return build


def stream_chunks(body: Mapping[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """A ``chat.completion`` as the ``chat.completion.chunk`` objects a stream sends:
    the role, the content in three pieces, the tool calls, the finish, then usage."""
    choice = body["choices"][0]
    message = choice["message"]
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    step = max(1, len(text) // 3 + 1)
    chunks += [chunk({"content": text[i : i + step]}) for i in range(0, len(text), step)]
    for i, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": i, **call}]}))
    chunks.append(chunk({}, choice.get("finish_reason") or "stop"))
    if include_usage:
        chunks.append(base | {"choices": [], "usage": body.get("usage")})
    return chunks


def streamed(chunks: Sequence[Mapping[str, Any]]) -> Reply:
    """A streaming request's answer as these ``chat.completion.chunk`` objects."""
    return Reply(body={}, chunks=chunks)


def cut_stream(text: str, *, after: int = 2) -> Responder:
    """A stream of ``text`` whose connection drops after ``after`` chunks, mid-body (the
    chunked framing is left unfinished, so the client sees a broken stream)."""

    def build(req: RecordedRequest) -> Reply:
        return Reply(body=completion_body(req.model, text), cut_after=after)

    return build


def slow(seconds: float, text: str = "## Task overview\n- slow but fine") -> Responder:
    """Sleep ``seconds`` (interruptible at server shutdown), then answer ``text``."""
    return _answer(text, delay_s=seconds)


def empty(text: str | None = "") -> Responder:
    """An answer whose content is empty (or whitespace, or ``None``)."""
    return _answer(text)


def openai_error(
    status: int,
    message: str,
    *,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """An error in OpenAI's JSON shape: ``{"error": {message, type, param, code}}``."""
    return Reply(
        status=status,
        body={"error": {"message": message, "type": type_, "param": param, "code": code}},
        headers=dict(headers or {}),
    )


def server_error(message: str = "The server had an error while processing your request.") -> Reply:
    return openai_error(500, message, type_="server_error")


def rate_limited(retry_after: float | str = 1) -> Reply:
    """HTTP 429 with a ``Retry-After`` header (seconds)."""
    ra = str(retry_after) if not isinstance(retry_after, float) else f"{retry_after:g}"
    return openai_error(
        429,
        "Rate limit reached for requests",
        type_="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": ra},
    )


def context_exceeded(limit: int = 8192, used: int = 9000) -> Reply:
    """HTTP 400 ``context_length_exceeded`` exactly as OpenAI phrases it."""
    return openai_error(
        400,
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {used} tokens. Please reduce the length of the messages.",
        type_="invalid_request_error",
        code="context_length_exceeded",
        param="messages",
    )


def html_page(status: int = 502) -> Reply:
    """A proxy's HTML error page instead of JSON."""
    return Reply(
        status=status,
        body="<html><body><h1>502 Bad Gateway</h1></body></html>",
        content_type="text/html",
    )


def long_answer(factor: float = 2.0) -> Responder:
    """An answer ``factor`` times longer than all the request's message text."""

    def build(req: RecordedRequest) -> Reply:
        src = req.text or "x"
        reps = int(len(src) * factor) // len(src) + 1
        return Reply(body=completion_body(req.model, (src + "\n") * reps))

    return build


def summary_answer(req: RecordedRequest) -> Reply:
    """Deterministic stand-in for a real summary: short, sectioned, derived from the request."""
    return Reply(body=completion_body(req.model, deterministic_summary(req.messages)))


def deterministic_summary(messages: Sequence[Mapping[str, Any]]) -> str:
    text = "\n".join(_content_text(m.get("content")) for m in messages)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return (
        f"## Task overview\n- summary {digest} of {len(messages)} messages\n"
        f"## Current state\n- {len(text)} characters of input"
    )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in content)
    return "" if content is None else str(content)


EMBEDDING_DIM = 64


def hashed_embedding(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A unit vector from hashed lower-case words: texts sharing words are close."""
    vec = [0.0] * dim
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        digest = hashlib.sha1(word.encode()).digest()
        vec[digest[0] % dim] += 1.0 if digest[1] % 2 else -1.0
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


# ---------------------------------------------------------------- server


class FakeLLM:
    """The server plus its scripts and request log. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, deque[Responder]] = {}
        self._then: dict[str, Responder] = {}
        self._default: Responder = summary_answer
        self._stopping = threading.Event()
        self.requests: list[RecordedRequest] = []
        #: every text sent to ``/v1/embeddings``, in order
        self.embedded: list[str] = []
        #: called with the texts (on the server's thread) before an embedding is answered:
        #: what a test needs to happen while a request waits for its embedder
        self.on_embed: Callable[[list[str]], None] | None = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fakellm",
            daemon=True,
        )

    # -- lifecycle
    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes slow replies so their threads end now
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self._then.clear()
            self._default = summary_answer
            self.requests.clear()
            self.embedded.clear()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting
    def script(
        self, model: str, replies: Iterable[Responder], *, then: Responder | None = None
    ) -> None:
        """Queue ``replies`` for ``model`` (the name after ``openai/``); ``then`` once spent."""
        with self._lock:
            self._scripts[model] = deque(replies)
            if then is not None:
                self._then[model] = then

    def handler(self, model: str, responder: Responder) -> None:
        """Answer every request for ``model`` with ``responder``."""
        self.script(model, [], then=responder)

    def set_default(self, responder: Responder) -> None:
        with self._lock:
            self._default = responder

    # -- inspection
    def calls(self, model: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if model is None or r.model == model]

    def models_called(self) -> list[str]:
        with self._lock:
            return [r.model for r in self.requests]

    # -- internals
    def _next(self, req: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(req)
            queue = self._scripts.get(req.model)
            responder = queue.popleft() if queue else self._then.get(req.model, self._default)
        return responder(req) if callable(responder) else responder

    def _embed(self, body: dict[str, Any], headers: dict[str, str], path: str) -> Reply:
        """``/v1/embeddings``: deterministic hashed bag-of-words vectors (recorded)."""
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else list(raw or [])
        req = RecordedRequest(
            model=str(body.get("model", "")),
            messages=[],
            max_tokens=None,
            headers={k.lower(): v for k, v in headers.items()},
            body=body,
            path=path,
        )
        with self._lock:
            self.requests.append(req)
            self.embedded.extend(str(t) for t in texts)
        if self.on_embed is not None:
            self.on_embed([str(t) for t in texts])
        data = [
            {"object": "embedding", "index": i, "embedding": hashed_embedding(str(t))}
            for i, t in enumerate(texts)
        ]
        return Reply(
            body={
                "object": "list",
                "data": data,
                "model": req.model,
                "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
            }
        )

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # One segment per reply: headers and body written separately met the client's
            # delayed ACK (Nagle), adding ~40 ms to every call.
            disable_nagle_algorithm = True
            wbufsize = 1 << 16

            def log_message(self, format: str, *args: Any) -> None:  # silence stderr
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(Reply(status=400, body={"error": {"message": "bad json"}}))
                    return
                if self.path.rstrip("/").endswith("/embeddings"):
                    self._send(fake._embed(body, dict(self.headers.items()), self.path))
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(Reply(status=404, body={"error": {"message": "not found"}}))
                    return
                req = RecordedRequest(
                    model=str(body.get("model", "")),
                    messages=list(body.get("messages") or []),
                    max_tokens=body.get("max_tokens", body.get("max_completion_tokens")),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                    path=self.path,
                )
                reply = fake._next(req)
                if reply.delay_s and fake._stopping.wait(reply.delay_s):
                    return  # server stopping: drop the connection
                if body.get("stream") and reply.status == 200 and isinstance(reply.body, dict):
                    usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    chunks = reply.chunks
                    if chunks is None:
                        chunks = stream_chunks(reply.body, include_usage=usage)
                    if reply.cut_after is not None:
                        self._cut_stream(list(chunks)[: reply.cut_after])
                    else:
                        self._stream(list(chunks))
                    return
                self._send(reply)

            def _stream(self, chunks: list[Mapping[str, Any]]) -> None:
                """Server-sent events, one chunk per event, then ``[DONE]``."""
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for c in chunks:
                        self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                self.close_connection = True

            def _cut_stream(self, chunks: list[Mapping[str, Any]]) -> None:
                """Chunked events, then the connection closed without the last chunk."""
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for c in chunks:
                        event = f"data: {json.dumps(c)}\n\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                self.close_connection = True

            def _send(self, reply: Reply) -> None:
                payload = (
                    reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                ).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                    self.wfile.flush()

        return Handler


@contextlib.contextmanager
def running_fake_llm() -> Iterator[FakeLLM]:
    fake = FakeLLM().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    """A fresh fake server per test (starting one takes about a millisecond)."""
    with running_fake_llm() as fake:
        yield fake
