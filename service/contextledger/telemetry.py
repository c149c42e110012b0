"""OpenTelemetry spans for what the ledger does on a turn, after the GenAI conventions.

``create_memory`` for an append, ``search_memory`` for recall, ``compact_events
{strategy}`` for a compaction (trigger, strategy, tokens before and after), ``chat
{model}`` for the summarizer's model call with the usage litellm reports, and
``fork_memory`` for a fork; every span carries ``gen_ai.conversation.id`` (the session)
and the seq. A turn (an append, a request with its recall, an append) is at most three
spans.

Only ``opentelemetry-api`` is used, imported on first use and only if installed (the
``[otel]`` extra). With no tracer provider configured no span object is created at
all: ``span()`` answers ``None`` after one global lookup. Message content is off unless
the application opts in with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``;
an error is recorded by its type and code (``error.type``), never by its text, which
may quote content.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["CAPTURE_CONTENT_ENV", "active", "capture_content", "span", "tracer"]

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_NAME = "contextledger"
#: the API module once imported (False: not installed), the tracer once a real provider is set
_api: Any = None
_tracer: Any = None


def tracer() -> Any | None:
    """The ``contextledger`` tracer, or ``None`` while no tracer provider is configured
    (the API's proxy or no-op provider) or ``opentelemetry-api`` is not installed.

    A provider, once set, cannot be replaced (the API allows one), so the tracer is kept.
    """
    global _api, _tracer
    if _tracer is not None:
        return _tracer
    if _api is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _api = False
            return None
        _api = trace
    if _api is False:
        return None
    provider = _api.get_tracer_provider()
    if isinstance(provider, _NOOP or _noop()):
        return None
    try:
        from importlib.metadata import version

        release = version(_NAME)
    except Exception:  # an uninstalled checkout
        release = None
    _tracer = provider.get_tracer(_NAME, release)
    return _tracer


_NOOP: tuple[type, ...] = ()


def _noop() -> tuple[type, ...]:
    """The API's stand-in providers (no SDK configured), looked up once."""
    global _NOOP
    _NOOP = (_api.ProxyTracerProvider, _api.NoOpTracerProvider)
    return _NOOP


def active() -> bool:
    """Whether spans are being made (a tracer provider is configured)."""
    return tracer() is not None


def capture_content() -> bool:
    """The application's opt-in to message content on spans (off by default)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("true", "1")


def content(value: Any) -> str:
    """Content as a span attribute: JSON text (only ever called after the opt-in)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@contextmanager
def span(name: str, attributes: Mapping[str, Any], *, client: bool = False) -> Iterator[Any | None]:
    """A span named ``name`` (kind INTERNAL, CLIENT for a call out), or ``None`` when no
    provider is configured. An exception leaving it sets ``error.type`` (the typed
    error's ``code``, else the class name) and the ERROR status, with no message."""
    t = tracer()
    if t is None:
        yield None
        return
    kind = _api.SpanKind.CLIENT if client else _api.SpanKind.INTERNAL
    with t.start_as_current_span(
        name,
        kind=kind,
        attributes={k: v for k, v in attributes.items() if v is not None},
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            kind_of = getattr(exc, "code", None)
            error = kind_of if isinstance(kind_of, str) else type(exc).__qualname__
            current.set_attribute("error.type", error)
            current.set_status(_api.Status(_api.StatusCode.ERROR, error))
            raise
