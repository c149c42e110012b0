"""The proxy's pass-through to an OpenAI-compatible upstream.

When the proxy's target is an OpenAI-compatible endpoint (``upstream_api_base`` set
and a ``hosted_vllm/`` or ``openai/`` model, the ``<api_base>/chat/completions`` that
litellm would call), the request is already in the upstream's shape, and litellm's
work on it is pure cost: request transforms, a worker-thread hop, its logging object
and success log took ~7 ms of CPU a call, where the same request over aiohttp takes
~1 ms (bench/service.py, py-spy). So the proxy relays such requests itself, as
pass-through proxies do: the client's body as sent, with ``messages`` replaced by
the session's budgeted view and ``model`` by the upstream's name, POSTed over one
pooled keep-alive client; the upstream's JSON (or its SSE events, as they arrive)
goes back to the client untouched. litellm stays the path for every other provider
and for fallbacks (``proxy.chat_completions``).

aiohttp rather than httpx: 0.45 against 1.97 ms of client CPU a request here (1,000
sequential POSTs of a 50-message body to tests/fakellm.py in another process).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from contextledger.http.settings import Fallback, Settings

#: litellm providers whose requests go to ``<api_base>/chat/completions`` as they are.
RELAYED_PROVIDERS = frozenset({"hosted_vllm", "openai"})
#: Statuses worth another try (OpenAI's SDK retries the same), besides connect errors
#: and timeouts.
RETRY_STATUSES = frozenset({408, 409, 429})
BACKOFF_S = 0.25  # first wait between tries, doubled each time, with jitter
BACKOFF_MAX_S = 8.0
#: A ``Retry-After`` up to this is waited for; a longer one falls back to the backoff.
RETRY_AFTER_MAX_S = 10.0
#: Idle pooled connections are dropped before the upstream's own keep-alive closes them
#: (uvicorn, which vLLM runs on, closes after 5 s: a POST on a connection it has just
#: closed fails).
KEEPALIVE_S = 4.0
USER_AGENT = "contextledger-proxy"


#: The OpenAI chat-completion parameters the proxy forwards (besides ``model`` and
#: ``messages``, which it sets itself). Anything else is refused, not forwarded: litellm
#: reads its own control arguments (``api_base``, ``base_url``, ``api_key``,
#: ``mock_response``, ``custom_llm_provider``, ...) from the same keyword arguments, and
#: one of them in a client's body chose where the operator's key went.
PARAMETERS = frozenset(
    {
        "model",
        "messages",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "seed",
        "stream_options",
        "reasoning_effort",
        "functions",
        "function_call",
    }
)
#: Names an operator may not add to the allow-list (``proxy_parameters``): litellm's
#: arguments that choose an endpoint, a key, a provider, a canned answer or headers.
CONTROL = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "organization",
        "custom_llm_provider",
        "mock_response",
        "mock_tool_calls",
        "mock_timeout",
        "mock_testing_fallbacks",
        "extra_headers",
        "headers",
        "extra_body",
        "extra_query",
        "timeout",
        "num_retries",
        "max_retries",
        "fallbacks",
        "context_window_fallbacks",
        "model_list",
        "metadata",
        "litellm_params",
        "litellm_metadata",
        "proxy_server_request",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_region_name",
        "vertex_credentials",
        "vertex_project",
        "vertex_location",
        "azure_ad_token",
        "input_cost_per_token",
        "output_cost_per_token",
        "cache",
        "caching",
        "no-log",
    }
)


class ModelNotAllowed(LookupError):
    """The client named a model the operator did not configure."""


def check_parameters(settings: Settings, body: Mapping[str, Any]) -> list[str]:
    """The body's fields the proxy does not forward, sorted (empty: all allowed)."""
    extra = settings.proxy_parameters
    return sorted(k for k in body if k not in PARAMETERS and (k not in extra or k in CONTROL))


def target_model(settings: Settings, model: str) -> str:
    """The litellm model the client's ``model`` maps to, or ``ModelNotAllowed``.

    Only what the operator configured: a ``model_map`` key; with an
    ``upstream_api_base``, a plain name (``<upstream_provider>/<model>``) or a name
    with the upstream's own provider prefix (both go to that base); a fallback's model
    by its full name. Any other name with a ``/`` would pick a provider, and its
    endpoint and key, that nobody configured."""
    target = settings.model_map.get(model)
    if target is not None:
        return target
    if settings.upstream_api_base:
        if "/" not in model:
            return f"{settings.upstream_provider}/{model}"
        if model.partition("/")[0] == settings.upstream_provider:
            return model
    for f in settings.fallbacks:
        if model == (f if isinstance(f, str) else f.model):
            return model
    raise ModelNotAllowed(model)


def label_names(settings: Settings, model: str) -> frozenset[str]:
    """The model names the proxy's usage metric may carry for a request to ``model``:
    it and the fallbacks, with and without their provider prefix (a bounded set)."""
    names = {model, *(f if isinstance(f, str) else f.model for f in settings.fallbacks)}
    return frozenset(names | {n.partition("/")[2] for n in names if "/" in n})


def upstream_key(settings: Settings, client_key: str | None) -> str | None:
    """The key for the primary upstream: the client's (``pass_client_key``), else ours;
    None when there is neither (litellm then reads the provider's own variable)."""
    key = client_key if settings.pass_client_key and client_key else settings.upstream_api_key
    return key or None


#: The variable litellm reads a relayed provider's key from when it is given none.
PROVIDER_KEY_ENV = {"hosted_vllm": "HOSTED_VLLM_API_KEY", "openai": "OPENAI_API_KEY"}


@dataclass(frozen=True, slots=True)
class Route:
    """One model the proxy may call, with its endpoint and key (None: litellm's default
    for the provider, its environment variable)."""

    model: str
    api_base: str | None
    api_key: str | None

    def litellm_kwargs(self) -> dict[str, Any]:
        """litellm's ``model``/``api_base``/``api_key``, every key present: a fallback's
        dict overrides the first model's arguments in litellm, so a None here keeps a
        fallback from inheriting the first model's endpoint."""
        key = self.api_key
        provider = self.model.partition("/")[0]
        if key is None and provider == "openai" and self.api_base:
            # litellm's OpenAI client refuses to call without a key: a keyless local
            # OpenAI-compatible server gets a placeholder unless the variable is set
            key = None if os.environ.get("OPENAI_API_KEY") else "none"
        return {"model": self.model, "api_base": self.api_base, "api_key": key}


def routes(settings: Settings, model: str, key: str | None) -> list[Route]:
    """``model`` at the upstream, then the fallbacks: a name with the upstream's base
    and key, a ``Fallback`` at its own."""
    primary = Route(model, settings.upstream_api_base, key)
    for f in settings.fallbacks:  # a fallback named by the client: at its own endpoint
        if isinstance(f, Fallback) and f.model == model and model not in settings.model_map:
            primary = Route(f.model, f.api_base, f.api_key)
            break
    out = [primary]
    for f in settings.fallbacks:
        if isinstance(f, str):
            out.append(Route(f, primary.api_base, key))
        else:
            out.append(Route(f.model, f.api_base, f.api_key))
    return out


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how a relayed request goes."""

    url: str
    model: str  # the upstream's own name, without the provider prefix
    headers: Mapping[str, str]


def relay_target(settings: Settings, litellm_model: str, key: str | None) -> Target | None:
    """The relay's target for ``litellm_model``, or None when litellm must carry it (no
    ``upstream_api_base``, another provider, or the relay switched off). Without a key,
    the provider's variable as litellm reads it, else ``none`` (a keyless local server
    ignores it)."""
    base = settings.upstream_api_base
    provider, _, name = litellm_model.partition("/")
    if not settings.upstream_relay or not base or not name or provider not in RELAYED_PROVIDERS:
        return None
    if routes(settings, litellm_model, key)[0].api_base != base:
        return None  # a fallback at its own endpoint, named by the client: litellm's
    if key is None:
        key = os.environ.get(PROVIDER_KEY_ENV[provider]) or "none"
    url = base.rstrip("/")
    if "chat/completions" not in url:  # litellm's rule: a base naming the endpoint is kept
        url += "/chat/completions"
    return Target(
        url=url,
        model=name,
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        },
    )


class UpstreamError(Exception):
    """The upstream failed (after the retries): ``status_code`` as litellm's exceptions
    carry it, so the proxy renders both alike (``proxy._upstream_problem``)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code, self.message = status_code, message


def _error_message(status: int, raw: bytes) -> str:
    """The upstream's own message (OpenAI's ``{"error": {"message": ...}}``) if it gave
    one, else the start of its body."""
    text = raw.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message:
            return message
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return f"the upstream answered {status}: {text[:500]}".rstrip(": ")


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        value = float(headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if 0 <= value <= RETRY_AFTER_MAX_S else None


class Relay:
    """The pooled HTTP client the app holds (created on first use, closed at shutdown)."""

    def __init__(self, settings: Settings) -> None:
        self.retries = max(0, settings.upstream_retries)
        # httpx's semantics, which litellm's ``timeout`` has: connecting and each read
        # wait at most this long; a long stream that keeps sending is not cut.
        self.timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.upstream_timeout, sock_read=settings.upstream_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[str, str | None] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No cap on connections: a queue here would add to the model's time; the
            # upstream limits its own concurrency.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    def _proxy(self, url: str) -> str | None:
        """The HTTP(S)_PROXY for ``url`` (None under NO_PROXY), as litellm's httpx client
        honours them; read once per URL: aiohttp's ``trust_env`` reads them, and the
        netrc file, in a worker thread on every request."""
        if url not in self._proxies:
            parts = urlsplit(url)
            bypass = urllib.request.proxy_bypass(parts.hostname or "")
            proxy = None if bypass else urllib.request.getproxies().get(parts.scheme)
            self._proxies[url] = proxy
        return self._proxies[url]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def complete(self, target: Target, body: bytes) -> bytes:
        """POST ``body`` and read the answer: its bytes once a 2xx came, else
        ``UpstreamError`` (after the retries)."""
        _, raw = await self._tries(target, body, read=True)
        return raw

    async def open_stream(self, target: Target, body: bytes) -> aiohttp.ClientResponse:
        """POST ``body`` for a stream: the response once a 2xx came (its body unread:
        the caller releases it), else ``UpstreamError`` (after the retries)."""
        response, _ = await self._tries(target, body, read=False)
        return response

    async def _tries(
        self, target: Target, body: bytes, *, read: bool
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        """Retried on connect errors, timeouts, 408/409/429 and 5xx, with a short
        exponential backoff (or the upstream's ``Retry-After`` when it is short)."""
        attempt = 0
        while True:
            wait: float | None = None
            try:
                response = await self._client().post(
                    target.url, data=body, headers=target.headers, proxy=self._proxy(target.url)
                )
                if response.status < 300 and not read:
                    return response, b""
                try:
                    raw = await response.read()
                finally:
                    response.release()
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = _transport_error(exc)
            else:
                if response.status < 300:
                    return response, raw
                error = UpstreamError(response.status, _error_message(response.status, raw))
                if response.status not in RETRY_STATUSES and response.status < 500:
                    raise error
                wait = _retry_after(response.headers)
            if attempt >= self.retries:
                raise error
            if wait is None:
                wait = min(BACKOFF_MAX_S, BACKOFF_S * 2**attempt) * random.uniform(0.75, 1.25)
            attempt += 1
            await asyncio.sleep(wait)


def _transport_error(exc: BaseException) -> UpstreamError:
    """A connect failure or a timeout, with the status litellm gives them (its
    ``APIConnectionError``: 500; its ``Timeout``: 408)."""
    if isinstance(exc, TimeoutError):
        return UpstreamError(408, f"the upstream did not answer in time ({exc!r})")
    return UpstreamError(500, f"cannot reach the upstream: {exc}")


def stream_failure(exc: BaseException) -> UpstreamError:
    """What a stream cut by ``exc`` tells the client."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, TimeoutError | aiohttp.ClientError):
        return _transport_error(exc)
    return UpstreamError(502, f"the upstream's stream failed: {exc!r}")


@dataclass(slots=True)
class _Call:
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Assembler:
    """Builds the reply's message and usage from a stream's chunks, as litellm's
    ``stream_chunk_builder`` does for what the proxy records: content deltas joined,
    tool-call deltas merged by index (id, type and name as given, arguments joined)."""

    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    usage: Any = None
    model: Any = None  # the model the chunks name
    choices: bool = False

    def add(self, chunk: Mapping[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if self.model is None:
            self.model = chunk.get("model")
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            self.choices = True
            delta = choice.get("delta") or {}
            if delta.get("role"):
                self.role = delta["role"]
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for piece in delta.get("tool_calls") or ():
                call = self.calls.setdefault(piece.get("index", len(self.calls)), _Call())
                call.id = piece.get("id") or call.id
                call.type = piece.get("type") or call.type
                function = piece.get("function") or {}
                call.name = function.get("name") or call.name
                if function.get("arguments"):
                    call.arguments.append(function["arguments"])

    def message(self) -> dict[str, Any] | None:
        """The assembled message (None: the stream carried no choice)."""
        if not self.choices:
            return None
        text = "".join(self.content)
        message: dict[str, Any] = {"role": self.role, "content": text or None}
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type or "function",
                    "function": {"name": c.name, "arguments": "".join(c.arguments)},
                }
                for _, c in sorted(self.calls.items())
            ]
        return message


async def events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[bytes, bytes | None]]:
    """The response's server-sent events as they arrive: each event's bytes as sent
    (ending in a blank line) and its ``data`` (None: an event without one)."""
    pending = b""
    lines: list[bytes] = []
    data: list[bytes] = []
    async for piece in response.content.iter_any():
        pending += piece
        *complete, pending = pending.split(b"\n")
        for line in complete:
            line = line.rstrip(b"\r")
            if line:
                lines.append(line)
                if line.startswith(b"data:"):
                    data.append(line[5:].lstrip(b" "))
                continue
            if lines:
                yield b"\n".join(lines) + b"\n\n", b"\n".join(data) if data else None
                lines, data = [], []
    if pending.strip():
        lines.append(pending.rstrip(b"\r"))
        if pending.startswith(b"data:"):
            data.append(pending[5:].strip())
    if lines:
        yield b"\n".join(lines) + b"\n\n", b"\n".join(data) if data else None
