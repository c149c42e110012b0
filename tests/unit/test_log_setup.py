"""configure_logging: JSON without locals, stdlib records rendered, litellm tamed, idempotent."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from contextledger.log_setup import LITELLM_LOGGERS, configure_logging, json_line


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put it all back."""
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    saved_lite = {
        name: (list(lg.handlers), lg.level, lg.propagate)
        for name in LITELLM_LOGGERS
        for lg in [logging.getLogger(name)]
    }
    # structlog's own configuration too (the library's stdlib defaults from its import):
    # reset to structlog's defaults instead, later tests in this process (another file
    # under pytest-xdist) printed to stdout where their caplog saw nothing
    saved_structlog = structlog.get_config() if structlog.is_configured() else None
    yield
    root.handlers[:] = saved_root[0]
    root.setLevel(saved_root[1])
    for name, (handlers, level, propagate) in saved_lite.items():
        lg = logging.getLogger(name)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
    structlog.reset_defaults()
    if saved_structlog is not None:
        structlog.configure(**saved_structlog)
    structlog.contextvars.clear_contextvars()


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


#: Built at run time so the secret never appears in source lines a traceback may quote.
SECRET = "-".join(["sk", "TOPSECRET", "123"])


def _leaky(api_key: str) -> None:
    prompt = f"summarize this for key {api_key}"  # noqa: F841 - a local: must never be logged
    raise ValueError("provider rejected the request")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_exception_has_no_locals() -> None:
    out = io.StringIO()
    configure_logging("json", stream=out, cache_loggers=False)
    try:
        _leaky(SECRET)
    except ValueError:
        structlog.get_logger("t").exception("summarize_failed", session_id="s-1")
    text = out.getvalue()
    assert SECRET not in text and "TOPSECRET" not in text
    (line,) = _lines(out)
    assert line["event"] == "summarize_failed" and line["level"] == "error"
    assert line["logger"] == "t" and line["session_id"] == "s-1"
    assert line["timestamp"].endswith("Z")
    frames = line["exception"][0]["frames"]
    assert frames and all("locals" not in f for f in frames)
    assert line["exception"][0]["exc_value"] == "provider rejected the request"


@pytest.mark.parametrize("tty", [False, True])
def test_console_exception_has_no_locals(tty: bool) -> None:
    out = FakeTTY() if tty else io.StringIO()
    configure_logging("console", stream=out, cache_loggers=False)
    try:
        _leaky(SECRET)
    except ValueError:
        structlog.get_logger("t").exception("summarize_failed")
    text = out.getvalue()
    assert "summarize_failed" in text and "provider rejected the request" in text
    assert "TOPSECRET" not in text
    assert ("\x1b[" in text) is tty  # colour only on a terminal


def test_stdlib_and_litellm_records_render_once() -> None:
    lite = logging.getLogger("LiteLLM")
    lite.addHandler(logging.StreamHandler(io.StringIO()))  # what litellm does at import
    out = io.StringIO()
    configure_logging("json", stream=out, cache_loggers=False)
    assert lite.handlers == [] and lite.level == logging.WARNING and lite.propagate
    lite.info("noise that should be filtered")
    lite.warning("rate limited %s", "openai/x", extra={"litellm_redacted": True, "attempt": 2})
    logging.getLogger("sqlalchemy.engine").warning("pool exhausted")
    lines = _lines(out)
    assert [(ln["logger"], ln["event"]) for ln in lines] == [
        ("LiteLLM", "rate limited openai/x"),
        ("sqlalchemy.engine", "pool exhausted"),
    ]
    assert "litellm_redacted" not in lines[0] and lines[0]["attempt"] == 2


def test_idempotent_and_contextvars() -> None:
    out = io.StringIO()
    configure_logging("json", stream=out, cache_loggers=False)
    configure_logging("json", stream=out, cache_loggers=False)
    ours = [h for h in logging.getLogger().handlers if h.__class__.__name__ == "_OurHandler"]
    assert len(ours) == 1
    structlog.contextvars.bind_contextvars(session_id="s-9")
    structlog.get_logger("t").info("event_appended", seq=3)
    assert _lines(out) == [pytest.approx(_lines(out)[0])]  # exactly one line
    line = _lines(out)[0]
    assert (line["session_id"], line["seq"], line["level"]) == ("s-9", 3, "info")


def test_level_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    configure_logging("json", level="WARNING", stream=out, cache_loggers=False)
    structlog.get_logger("t").info("hidden")
    structlog.get_logger("t").warning("shown")
    assert [ln["event"] for ln in _lines(out)] == ["shown"]


def test_format_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setenv("CONTEXTLEDGER_LOG_FORMAT", "json")
    configure_logging(None, stream=out, cache_loggers=False)
    structlog.get_logger("t").info("from_env")
    assert _lines(out)[0]["event"] == "from_env"
    with pytest.raises(ValueError, match="log format"):
        configure_logging("xml", stream=out)  # type: ignore[arg-type]


LIBRARY_ONLY = """
import logging, sys
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
import contextledger, structlog
log = structlog.get_logger("contextledger.test")
log.warning("session_without_model", assumed_context_window=8192, hint="pass model=")
try:
    raise ValueError("boom")
except ValueError:
    log.exception("failed_once", attempt=2)
"""


def test_plain_stdlib_logging_shows_the_context_of_a_library_record() -> None:
    """An application with only ``logging.basicConfig`` sees each record's key-values in
    the message (structlog routed into stdlib put them in ``extra``, which no default
    formatter prints), and an exception's traceback under its line."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LIBRARY_ONLY], capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "WARNING session_without_model assumed_context_window=8192 hint='pass model='"
    )
    assert lines[1] == "ERROR failed_once attempt=2"
    assert "ValueError: boom" in done.stdout


@pytest.mark.parametrize(
    "event",
    [
        {"event": "request", "status": 201, "ms": 1.25, "tenant": None, "ok": True},
        {"event": "naïve café"},  # json escapes it: so does the line
        {"event": "big", "n": 2**70},  # past orjson's 64 bits
        {"event": "keys", "by_id": {1: "one"}},
        {"event": "odd", "value": object()},  # the renderer's default: its repr
    ],
)
def test_a_json_line_reads_back_as_json_dumps_wrote_it(event: dict[str, Any]) -> None:
    line = json_line(event, default=repr)
    assert json.loads(line) == json.loads(json.dumps(event, default=repr))
    assert line.isascii()


class Rendered:
    """A value that counts how often a renderer asked for it."""

    def __init__(self) -> None:
        self.times = 0

    def __repr__(self) -> str:
        self.times += 1
        return "rendered"


def test_structlog_and_stdlib_lines_render_alike_and_a_hidden_line_is_not_rendered() -> None:
    out = io.StringIO()
    configure_logging("json", level="INFO", stream=out, cache_loggers=False)
    hidden = Rendered()
    structlog.get_logger("contextledger.access").debug("hidden", value=hidden)
    structlog.get_logger("contextledger.access").info("request", status=201, value=Rendered())
    logging.getLogger("uvicorn.error").info("started %s", "server")
    structlog.get_logger().warning("unnamed")  # named after the calling module
    lines = _lines(out)
    assert hidden.times == 0  # below the level: never rendered, not even to be dropped
    assert list(lines[0]) == ["status", "value", "event", "logger", "level", "timestamp"]
    assert list(lines[2]) == ["event", "logger", "level", "timestamp"]
    assert lines[0]["value"] == "rendered" and lines[0]["level"] == "info"
    # the stdlib's line (pytest's own capture may add its "message"): the same fields
    assert lines[1] == {**lines[1], "event": "started server", "logger": "uvicorn.error"}
    assert {"level", "timestamp"} <= lines[1].keys()
    assert lines[2]["logger"] == __name__ and lines[2]["level"] == "warning"
