"""What the service refuses before any route runs, and what configs posted over HTTP
may not say (issue 26).

``Guard`` (pure ASGI, outside everything but the access log) refuses:

- a body larger than ``max_body_bytes`` (413), by its ``Content-Length`` before a byte
  is read and by counting when it is chunked, so before any parsing and before the key
  is checked;
- a state-changing request (``POST``, ``PUT``, ``PATCH``, ``DELETE``) that a browser
  sent from another site (``Sec-Fetch-Site: cross-site``/``same-site``, or an
  ``Origin`` that is not the service's own): 403 ``CROSS_SITE``. A page elsewhere could
  otherwise write to a local-mode session (a form or a no-cors fetch) with the
  browser's ambient access to loopback;
- a state-changing request with a body that is not ``application/json`` (or an
  ``application/<x>+json``, which FastAPI also reads) (415): no
  HTML form and no "simple" cross-origin request can send that type without a
  preflight the service never answers. The audit page's sign-in/out forms are the
  exception, and get the same-origin check above with an ``Origin`` required;
- in local mode (bound to loopback), a ``Host`` that is not a loopback name (403
  ``HOST_NOT_ALLOWED``): a DNS-rebinding page reaches 127.0.0.1 under its own name;
- once keys exist, a state-changing API request (``/v1/...``) without a valid key (401),
  after the size check and before the body is parsed: FastAPI parses a route's body before the
  route's key dependency runs, so without this an anonymous client could have the server
  parse up to ``max_body_bytes`` of JSON per request. (The proxy's bearer is the
  client's own upstream key under ``pass_client_key``: its key is then the
  ``X-ContextLedger-Key`` header, as the route reads it.)

It also adds the security headers to every HTML response (CSP with
``frame-ancestors 'none'``, ``X-Content-Type-Options: nosniff``, ``Referrer-Policy``).

``check_posted_config`` refuses a session config that names an endpoint or a key: the
server would call the client's URL (with the provider's key from its environment).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

from contextledger.core.config import ContextConfig
from contextledger.errors import ConfigError, ContextLedgerError
from contextledger.http import problems
from contextledger.http.auth import tenant_for
from contextledger.http.problems import Problem, problem
from contextledger.http.replay import replay
from contextledger.http.settings import Settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The API's paths (keys) and the proxy's (its bearer may be the client's own key).
API_PREFIX, PROXY_PATH = "/v1/", "/v1/chat/completions"
#: The audit page's own HTML forms: urlencoded, same-origin only.
FORM_PATHS = frozenset({"/audit/sign-in", "/audit/sign-out"})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)


class BodyTooLarge(Exception):
    """The body grew past the cap while it was read."""


def host_of(value: str) -> str:
    """``Host`` (or an origin's netloc) without its port, lower case."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8765
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.cap = settings.max_body_bytes
        self.local = settings.local_only
        self.named = frozenset(h.lower() for h in settings.allowed_hosts)
        self.hosts = LOOPBACK_HOSTS | self.named
        self.client_bearer = settings.pass_client_key

    async def unauthorized(self, scope: Scope) -> Callable[..., Awaitable[None]] | None:
        """The 401 (or the key store's failure) for a request without a valid key, as the
        route's dependency answers it; None when the key is good or none is needed. The
        route checks the key again (a cached look-up) and resolves the tenant."""
        request = Request(scope)
        ours = not (self.client_bearer and scope["path"] == PROXY_PATH)
        try:
            await tenant_for(request, bearer_is_ours=ours)
        except (Problem, ContextLedgerError) as exc:
            handler = problems.handler_for(exc)
            if handler is None:
                raise
            response: Callable[..., Awaitable[None]] = await handler(request, exc)
            return response
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
        refused = self.refusal(scope, headers)
        if refused is not None:
            await refused(scope, receive, send)
            return
        cap = self.cap
        if b"content-length" not in headers and b"transfer-encoding" in headers:
            # chunked: read it whole (up to the cap) before any route checks a key
            pending: list[Message] = []
            size = 0
            while True:
                message = await receive()
                pending.append(message)
                if message["type"] != "http.request":
                    break
                size += len(message.get("body", b""))
                if size > cap:
                    await _too_large(cap)(scope, receive, send)
                    return
                if not message.get("more_body", False):
                    break
            receive = replay(pending, receive)
        # the key after the size (413 first, as the issue asks) and before the route parses
        if scope["method"] in STATE_CHANGING and scope["path"].startswith(API_PREFIX):
            unauthorized = await self.unauthorized(scope)
            if unauthorized is not None:
                await unauthorized(scope, receive, send)
                return
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    raise BodyTooLarge
            return message

        started = False

        async def headed(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                raw = list(message.get("headers") or [])
                ctype = next((v for k, v in raw if k.lower() == b"content-type"), b"")
                if ctype.startswith(b"text/html"):
                    names = {k.lower() for k, _ in raw}
                    raw += [(k, v) for k, v in SECURITY_HEADERS if k not in names]
                    message["headers"] = raw
            await send(message)

        try:
            await self.app(scope, capped, headed)
        except BodyTooLarge:
            if started:
                raise
            await _too_large(cap)(scope, receive, send)

    def _same_origin(self, origin: str, host: str) -> bool:
        """The page that sent it is the service's own: its origin names the host the
        request came to, or one the operator named (``allowed_hosts``: a reverse proxy
        that rewrites ``Host``)."""
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed frame, a file: page) and the like
        netloc = parts.netloc.lower()
        return netloc == host.strip().lower() or host_of(netloc) in self.named

    def refusal(self, scope: Scope, headers: Mapping[bytes, bytes]) -> Any:
        host = headers.get(b"host", b"").decode("latin-1")
        if self.local and host_of(host) not in self.hosts:
            return problem(
                403,
                "HOST_NOT_ALLOWED",
                f"this service answers to loopback names only, not {host_of(host)!r} "
                "(allow more with allowed_hosts)",
            )
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.cap
            except ValueError:
                return problem(400, "INVALID_REQUEST", "Content-Length is not a number")
            if too_big:
                return _too_large(self.cap)
        method = scope["method"]
        if method not in STATE_CHANGING:
            return None
        fetch_site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
        origin = headers.get(b"origin")
        form = scope["path"] in FORM_PATHS
        # Sec-Fetch-Site, where a browser sends it, is its own word (no page can set it);
        # else the Origin must be ours
        if fetch_site in ("cross-site", "same-site", "none") or (
            fetch_site != "same-origin"
            and origin is not None
            and not self._same_origin(origin.decode("latin-1"), host)
        ):
            return problem(403, "CROSS_SITE", "a request from another site is refused")
        if form:
            if origin is None and fetch_site != "same-origin":
                return problem(403, "CROSS_SITE", "the audit forms need a same-origin Origin")
            return None
        ctype = headers.get(b"content-type")
        has_body = (length is not None and length.strip() != b"0") or (
            b"transfer-encoding" in headers
        )
        if ctype is None and not has_body:
            return None  # a DELETE or a body-less POST: nothing to parse
        media = (ctype or b"").split(b";", 1)[0].strip().lower()
        if media != b"application/json" and not (
            media.startswith(b"application/") and media.endswith(b"+json")
        ):
            return problem(
                415,
                "UNSUPPORTED_MEDIA_TYPE",
                "send the body as application/json",
            )
        return None


def _too_large(cap: int) -> Any:
    return problem(
        413,
        "BODY_TOO_LARGE",
        f"the body is larger than {cap} bytes (the service's max_body_bytes)",
        limit=cap,
    )


def check_posted_config(raw: Mapping[str, Any] | None, settings: Settings) -> None:
    """Refuse (``ConfigError``: 422) a config from HTTP that names a key, or an endpoint
    the operator did not allow (``config_api_bases``). Checked on the config as posted,
    before anything is written."""
    if raw is None:
        return
    parsed = ContextConfig.from_mapping(raw)  # a malformed config: its own ConfigError
    allowed = {b.rstrip("/") for b in settings.config_api_bases}
    named: list[tuple[str, str | None, bool]] = []
    for i, m in enumerate(parsed.summarizer.models):
        named.append((f"summarizer.models[{i}].api_base", m.api_base, False))
        named.append((f"summarizer.models[{i}].api_key", m.api_key, True))
    rc = parsed.recall
    named.append(("recall.embedding_api_base", rc.embedding_api_base, False))
    named.append(("recall.embedding_api_key", rc.embedding_api_key, True))
    for key, value, secret in named:
        if value is None:
            continue
        if secret:
            raise ConfigError(
                f"{key}: a config sent over HTTP cannot carry a key; the operator configures "
                "keys in the service's environment",
                key=key,
            )
        if value.rstrip("/") not in allowed:
            raise ConfigError(
                f"{key}: a config sent over HTTP cannot name an endpoint the operator did "
                "not allow (config_api_bases)",
                key=key,
            )
