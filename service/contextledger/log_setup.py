"""Logging: a library emits, an application decides where it goes.

``library_defaults`` (run when ``contextledger`` is imported) follows the stdlib
conventions: a ``NullHandler`` on the ``contextledger`` logger and, unless the
application configured structlog itself, structlog routed into stdlib logging —
so nothing reaches stdout or stderr unless the application configures logging.

``configure_logging`` is for programs (the CLI, the demo): structlog over the
stdlib, so litellm, SQLAlchemy and alembic records render like ours. One stream handler with a
``ProcessorFormatter``: JSON lines in production,
colour only when the stream is a terminal. Tracebacks never include local
variables (prompts and API keys live in locals), in either format.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Literal, TextIO

import orjson
import structlog
from structlog.types import EventDict, Processor, WrappedLogger

LogFormat = Literal["console", "json"]

#: Env var read when ``configure_logging(fmt=None)``.
LOG_FORMAT_ENV = "CONTEXTLEDGER_LOG_FORMAT"
#: Loggers litellm creates (and attaches its own stdout handlers to) at import.
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marker class: lets ``configure_logging`` find and replace its own handler."""


class LineLogger:
    """structlog's logger under ``configure_logging``: writes each line structlog
    rendered to the stream of our stdlib handler, under that handler's lock (so a line
    from the stdlib, in another thread, never interleaves with it), as the handler writes
    its own: the line, a newline, a flush. ``name`` is what ``add_logger_name`` reads."""

    __slots__ = ("_handler", "name")

    def __init__(self, name: str, handler: logging.StreamHandler) -> None:  # type: ignore[type-arg]
        self.name, self._handler = name, handler

    def msg(self, line: str) -> None:
        handler = self._handler
        with handler.lock or _NO_LOCK:
            handler.stream.write(line + handler.terminator)
            handler.stream.flush()

    debug = info = warning = warn = error = critical = fatal = exception = log = msg


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


class LineLoggerFactory:
    """``structlog.get_logger(name)`` → a ``LineLogger`` named ``name`` (without one, the
    caller's module, as structlog's stdlib ``LoggerFactory`` names it)."""

    def __init__(self, handler: logging.StreamHandler) -> None:  # type: ignore[type-arg]
        self.handler = handler

    def __call__(self, *args: Any) -> LineLogger:
        if args:
            name = str(args[0])
        else:
            from structlog._frames import _find_first_app_frame_and_name

            _, name = _find_first_app_frame_and_name([__name__])
        return LineLogger(name, self.handler)


def drop_litellm_redacted(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """litellm records carry a ``litellm_redacted`` attribute that ``ExtraAdder`` copies in."""
    event_dict.pop("litellm_redacted", None)
    return event_dict


_litellm_level: int | str = logging.WARNING


def tame_litellm_loggers(level: int | str | None = None) -> None:
    """Remove litellm's own handlers (output would be doubled) and let records propagate.

    Called again after litellm is imported, because its import attaches the handlers;
    ``level=None`` reuses the level the last ``configure_logging`` chose (WARNING).
    """
    global _litellm_level
    if level is None:
        level = _litellm_level
    _litellm_level = level
    for name in LITELLM_LOGGERS:
        lg = logging.getLogger(name)
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
        lg.setLevel(level)
        lg.propagate = True


#: Event-dict keys the record carries already (its level; logging's own arguments).
_NOT_CONTEXT = frozenset({"level", "exception", "exc_info", "stack_info", "stacklevel"})


def render_context_into_message(
    logger: WrappedLogger, name: str, event_dict: EventDict
) -> EventDict:
    """structlog → stdlib for an application that configured only stdlib logging.

    ``render_to_log_kwargs`` alone hands the context to ``extra``, which a plain
    ``logging.basicConfig`` formatter never prints: a warning read
    ``WARNING:contextledger.session_budget:session_without_model`` with neither the
    window assumed nor the hint. Here the message is the event followed by its
    ``key=value`` pairs (``session_without_model context_window=8192 hint='...'``);
    the pairs stay in ``extra`` too, for handlers that read record attributes.
    """
    kwargs = structlog.stdlib.render_to_log_kwargs(logger, name, event_dict)
    extra = kwargs.get("extra") or {}
    shown = " ".join(f"{key}={value!r}" for key, value in extra.items() if key not in _NOT_CONTEXT)
    message = f"{kwargs['msg']} {shown}" if shown else str(kwargs["msg"])
    if extra.get("exception"):  # format_exc_info's text: on lines of its own
        message = f"{message}\n{extra['exception']}"
    kwargs["msg"] = message
    return kwargs


def library_defaults() -> None:
    """Stdlib conventions for a library; idempotent, and never overrides the application."""
    logging.getLogger("contextledger").addHandler(logging.NullHandler())
    if not structlog.is_configured():
        structlog.configure(
            processors=[
                structlog.stdlib.filter_by_level,
                structlog.stdlib.add_log_level,
                structlog.stdlib.PositionalArgumentsFormatter(),
                structlog.processors.StackInfoRenderer(),
                structlog.processors.format_exc_info,
                render_context_into_message,
            ],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=False,
        )


def json_line(obj: Any, **kw: Any) -> str:
    """``JSONRenderer``'s serializer: orjson, ~4x faster than ``json.dumps`` on the
    service's access line (one per request). ``json.dumps`` (what the renderer used)
    where orjson would differ or refuses: non-ASCII text (``json`` escapes it, and the
    stream may not be UTF-8), an int past 64 bits. Only the spacing differs."""
    try:
        line = orjson.dumps(obj, default=kw.get("default"), option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(obj, **kw)
    return line.decode() if line.isascii() else json.dumps(obj, **kw)


def _resolve_format(fmt: LogFormat | None) -> LogFormat:
    if fmt is None:
        env = os.environ.get(LOG_FORMAT_ENV, "").strip().lower()
        if env in ("console", "json"):
            return env  # type: ignore[return-value]
        return "console" if sys.stderr.isatty() else "json"
    if fmt not in ("console", "json"):
        raise ValueError(f"log format must be 'console' or 'json', not {fmt!r}")
    return fmt


def _console_renderer(colors: bool) -> Processor:
    """A ConsoleRenderer whose tracebacks omit locals (rich's default formatter shows them).

    Rich tracebacks only on a terminal: piped, they would be full of ANSI codes.
    """
    formatter: Any = structlog.dev.plain_traceback
    if colors:
        try:
            import rich  # noqa: F401  (RichTracebackFormatter needs it at render time)

            formatter = structlog.dev.RichTracebackFormatter(show_locals=False)
        except ImportError:  # pragma: no cover - rich is a dependency
            pass
    return structlog.dev.ConsoleRenderer(colors=colors, exception_formatter=formatter)


def configure_logging(
    fmt: LogFormat | None = None,
    level: int | str = "INFO",
    *,
    stream: TextIO | None = None,
    litellm_level: int | str = logging.WARNING,
    cache_loggers: bool = True,
) -> None:
    """Configure structlog and the root logger. Idempotent: calling again replaces our handler.

    ``fmt=None`` reads ``CONTEXTLEDGER_LOG_FORMAT``, else picks console on a tty and
    JSON otherwise. ``cache_loggers=False`` suits test suites that reconfigure
    structlog (e.g. ``structlog.testing.capture_logs``) after this ran.
    """
    resolved = _resolve_format(fmt)
    out = stream if stream is not None else sys.stderr
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.stdlib.ExtraAdder(),
        drop_litellm_redacted,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    final: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if resolved == "json":
        final += [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.JSONRenderer(serializer=json_line),
        ]
    else:
        isatty = getattr(out, "isatty", None)
        final.append(_console_renderer(colors=bool(isatty and isatty())))

    handler = _OurHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=final)
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)

    # structlog's own lines are rendered by structlog and written straight to the
    # handler's stream (``LineLogger``): the same processors, in the same order, as the
    # stdlib records' (``shared`` then ``final``), without a stdlib record made and copied
    # per line (~49 -> ~20 us for the service's access line, one per request); a line
    # under ``level`` costs a no-op method call, not the processor chain.
    numeric = level if isinstance(level, int) else logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    structlog.configure(
        processors=[
            *[p for p in shared if not isinstance(p, structlog.stdlib.ExtraAdder)],
            *final[1:],  # not remove_processors_meta: no stdlib record here
        ],
        logger_factory=LineLoggerFactory(handler),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=cache_loggers,
    )
    tame_litellm_loggers(litellm_level)
