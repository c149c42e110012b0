"""Rolling summaries: the prompt, a model fallback chain over litellm, validation, offline fallback.

The I/O is in :func:`summarize`; everything it decides with is a plain function
(``render_transcript``, ``build_prompt``, ``validate_summary``, ``offline_summary``,
``Backoff.delay``) so it can be tested without a model.

Nothing invalid leaves this module: an empty answer, an error message returned
as text, a truncated answer, or a summary that is not strictly smaller than what
it replaces is that model's failure, and the chain moves on to the next model.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from contextledger import telemetry
from contextledger.core.summary.offline import OFFLINE_MODEL, OFFLINE_VERSION, offline_summary
from contextledger.core.summary.prompt import SummaryRequest, build_prompt, shorten
from contextledger.core.summary.validate import validate_summary
from contextledger.core.tokens import TokenCounter
from contextledger.errors import CompactionError, InvalidArgument

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One link of the fallback chain. ``num_retries`` is retries after the first attempt."""

    model: str
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 30.0
    num_retries: int = 1
    #: Extra keyword arguments for ``litellm.acompletion`` (e.g. ``temperature``).
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise InvalidArgument("ModelSpec.model must be a non-empty model name")
        if not self.timeout > 0:
            raise InvalidArgument(f"ModelSpec.timeout must be > 0, not {self.timeout}")
        if self.num_retries < 0:
            raise InvalidArgument(f"ModelSpec.num_retries must be >= 0, not {self.num_retries}")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One call to one model (or the offline summarizer), for the audit trail."""

    model: str
    ok: bool
    error_type: str | None
    error: str | None
    elapsed_s: float
    #: ``Retry-After`` the provider sent with this failure, in seconds, if any.
    retry_after_s: float | None = None
    #: How long we waited after this attempt before retrying the same model.
    backoff_s: float | None = None


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """A validated summary plus everything a ledger event needs for audit."""

    text: str
    model: str
    attempts: tuple[Attempt, ...]
    tokens_before: int
    tokens_after: int
    prompt_version: str
    custom_instructions: str | None
    usage: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Backoff:
    """Progressive delay between retries of the same model.

    ``delay(n)`` is ``base_s * factor**n`` (capped at ``max_s``) plus up to
    ``jitter`` of itself; a provider's ``Retry-After`` raises it, capped at
    ``retry_after_cap_s`` so a hostile header cannot stall compaction.
    """

    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 8.0
    jitter: float = 0.1
    retry_after_cap_s: float = 30.0

    def delay(self, retry: int, retry_after_s: float | None = None) -> float:
        d = min(self.max_s, self.base_s * self.factor**retry)
        if self.jitter > 0:
            d += d * self.jitter * random.random()
        if retry_after_s is not None and retry_after_s > 0:
            d = max(d, min(retry_after_s, self.retry_after_cap_s))
        return d


FallbackCallback = Callable[[str, str, BaseException], Awaitable[None] | None]
"""``on_fallback(from_model, to_model, error)``; sync or async; failures are logged only."""


# ==================================================================== error handling


def _error_type(exc: BaseException) -> str:
    if isinstance(exc, CompactionError):
        return exc.code
    if isinstance(exc, TimeoutError):
        return "Timeout"
    return type(exc).__name__


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CompactionError):
        return shorten(str(exc), 500)
    return shorten(str(getattr(exc, "message", None) or exc) or type(exc).__name__, 500)


def _retry_same_model(exc: BaseException) -> bool:
    """Transient failures (timeouts, 408/409/429/5xx, connection errors) are worth a retry.

    A context-window or other 4xx error, or an invalid answer, will not improve by
    asking the same model again: the chain moves on instead.
    """
    if isinstance(exc, CompactionError):
        return False
    if isinstance(exc, TimeoutError):
        return True
    name = type(exc).__name__
    if name in ("ContextWindowExceededError", "ContentPolicyViolationError"):
        return False
    if name in ("Timeout", "APIConnectionError", "APITimeoutError"):
        return True
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status in (408, 409, 429) or status >= 500
    return False


def _parse_retry_after(value: Any) -> float | None:
    if value is None:
        return None
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        parsed = email.utils.parsedate_tz(text)
        if parsed is None:
            return None
        seconds = email.utils.mktime_tz(parsed) - time.time()
    return seconds if seconds > 0 else None


def retry_after_seconds(exc: BaseException) -> float | None:
    """``Retry-After`` from a litellm error, in seconds.

    litellm rebuilds ``exc.response`` without the provider's headers; they are on
    ``exc.litellm_response_headers`` (checked first), then ``response``/``headers``.
    """
    sources = (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "headers", None),
    )
    for headers in sources:
        if headers is None:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except Exception:
            continue
        seconds = _parse_retry_after(value)
        if seconds is not None:
            return seconds
    return None


# ==================================================================== the chain


def _usage(response: Any) -> dict[str, int] | None:
    usage = getattr(response, "usage", None)
    if usage is None:
        return None
    out: dict[str, int] = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value
    return out or None


_tamed = False


def _litellm() -> Any:
    """litellm via the shared offline-configured import, its loggers tamed once."""
    global _tamed
    from contextledger._litellm import import_litellm

    module = import_litellm()
    if not _tamed:
        from contextledger.log_setup import tame_litellm_loggers

        tame_litellm_loggers()  # its import attached handlers that would double every line
        _tamed = True
    return module


async def _call_model(
    spec: ModelSpec, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[str | None, str | None, dict[str, int] | None]:
    """One attempt, no hidden retries: ``num_retries=0`` also sets the OpenAI SDK's to 0."""
    litellm = _litellm()
    kwargs: dict[str, Any] = {
        **dict(spec.extra),
        "model": spec.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "timeout": spec.timeout,
        "num_retries": 0,
        "stream": False,
    }
    if spec.api_base is not None:
        kwargs["api_base"] = spec.api_base
    if spec.api_key is not None:
        kwargs["api_key"] = spec.api_key
    with telemetry.span(
        f"chat {spec.model}",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": _provider(litellm, spec.model),
            "gen_ai.request.model": spec.model,
            "gen_ai.request.max_tokens": max_tokens,
        },
        client=True,
    ) as span:
        # Belt and braces: litellm's timeout covers the HTTP call, this covers the rest.
        async with asyncio.timeout(spec.timeout * 1.5 + 1.0):
            response = await litellm.acompletion(**kwargs)
        if span is not None:
            usage = getattr(response, "usage", None)
            for key, name in (
                ("prompt_tokens", "gen_ai.usage.input_tokens"),
                ("completion_tokens", "gen_ai.usage.output_tokens"),
            ):
                value = getattr(usage, key, None)
                if isinstance(value, int):
                    span.set_attribute(name, value)
            if isinstance(getattr(response, "model", None), str):
                span.set_attribute("gen_ai.response.model", response.model)
            reason = getattr(response.choices[0], "finish_reason", None)
            if isinstance(reason, str):
                span.set_attribute("gen_ai.response.finish_reasons", [reason])
    choice = response.choices[0]
    content = getattr(choice.message, "content", None)
    return (
        content if isinstance(content, str) or content is None else str(content),
        getattr(choice, "finish_reason", None),
        _usage(response),
    )


def _provider(litellm: Any, model: str) -> str:
    """The provider litellm routes ``model`` to (``gen_ai.provider.name``)."""
    try:
        return str(litellm.get_llm_provider(model)[1])
    except Exception:  # a model litellm does not know: its prefix, if any
        return model.split("/", 1)[0] if "/" in model else "unknown"


async def _notify(cb: FallbackCallback | None, src: str, dst: str, exc: BaseException) -> None:
    if cb is None:
        return
    try:
        result = cb(src, dst, exc)
        if inspect.isawaitable(result):
            await result
    except Exception as cb_exc:
        log.warning("on_fallback_failed", error=f"{type(cb_exc).__name__}: {cb_exc}")


async def summarize(
    request: SummaryRequest,
    models: Sequence[ModelSpec],
    *,
    counter: TokenCounter,
    tokens_before: int,
    on_fallback: FallbackCallback | None = None,
    backoff: Backoff = Backoff(),  # frozen, so a shared default is safe
    offline_fallback: bool = False,
) -> SummaryResult:
    """Summarize with the first model that gives a valid answer, in order.

    Each model gets ``1 + num_retries`` attempts for transient errors, with
    progressive backoff (raised to the provider's ``Retry-After``). A
    context-window error or an invalid answer moves straight to the next model.
    ``tokens_before`` is what the summary replaces (messages plus prior summary);
    the summary must be strictly smaller. When every model fails: the offline
    summarizer if ``offline_fallback``, else ``CompactionError(ALL_MODELS_FAILED)``
    with ``attempts`` in its details.
    """
    if tokens_before < 1:
        raise InvalidArgument(f"tokens_before must be >= 1, not {tokens_before}")
    if request.max_summary_tokens < 1:
        raise InvalidArgument(f"max_summary_tokens must be >= 1, not {request.max_summary_tokens}")
    if not models and not offline_fallback:
        raise InvalidArgument("no models to summarize with and offline_fallback is off")

    prompt = build_prompt(request) if models else []
    attempts: list[Attempt] = []
    last_error: BaseException | None = None

    for index, spec in enumerate(models):
        tries = 1 + spec.num_retries
        for retry in range(tries):
            started = time.monotonic()
            try:
                text, finish_reason, usage = await _call_model(
                    spec, prompt, request.max_summary_tokens
                )
                if finish_reason == "length":
                    raise CompactionError(
                        f"summary was cut off at max_tokens={request.max_summary_tokens}",
                        code="INVALID_SUMMARY",
                        model=spec.model,
                    )
                cleaned, tokens_after = validate_summary(
                    text, counter=counter, tokens_before=tokens_before, model=spec.model
                )
            except Exception as exc:
                last_error = exc
                elapsed = time.monotonic() - started
                retry_after = retry_after_seconds(exc)
                again = retry + 1 < tries and _retry_same_model(exc)
                wait = backoff.delay(retry, retry_after) if again else None
                attempts.append(
                    Attempt(
                        model=spec.model,
                        ok=False,
                        error_type=_error_type(exc),
                        error=_describe(exc),
                        elapsed_s=elapsed,
                        retry_after_s=retry_after,
                        backoff_s=wait,
                    )
                )
                log.warning(
                    "summary_attempt_failed",
                    model=spec.model,
                    attempt=retry + 1,
                    error_type=_error_type(exc),
                    error=_describe(exc),
                    elapsed_s=round(elapsed, 3),
                    retry_in_s=wait,
                )
                if wait is None:
                    break
                await asyncio.sleep(wait)
                continue
            attempts.append(
                Attempt(
                    model=spec.model,
                    ok=True,
                    error_type=None,
                    error=None,
                    elapsed_s=time.monotonic() - started,
                )
            )
            log.info(
                "summary_ok",
                model=spec.model,
                attempts=len(attempts),
                tokens_before=tokens_before,
                tokens_after=tokens_after,
            )
            return SummaryResult(
                text=cleaned,
                model=spec.model,
                attempts=tuple(attempts),
                tokens_before=tokens_before,
                tokens_after=tokens_after,
                prompt_version=request.prompt_version,
                custom_instructions=request.custom_instructions,
                usage=usage,
            )
        assert last_error is not None
        if index + 1 < len(models):
            await _notify(on_fallback, spec.model, models[index + 1].model, last_error)
        elif offline_fallback:
            await _notify(on_fallback, spec.model, OFFLINE_MODEL, last_error)

    if offline_fallback:
        started = time.monotonic()
        try:
            text = offline_summary(
                request.messages,
                request.prior_summary,
                max_tokens=min(request.max_summary_tokens, tokens_before - 1),
                counter=counter,
            )
            cleaned, tokens_after = validate_summary(
                text, counter=counter, tokens_before=tokens_before, model=OFFLINE_MODEL
            )
        except CompactionError as exc:
            last_error = exc
            attempts.append(
                Attempt(OFFLINE_MODEL, False, exc.code, _describe(exc), time.monotonic() - started)
            )
        else:
            attempts.append(Attempt(OFFLINE_MODEL, True, None, None, time.monotonic() - started))
            log.info(
                "summary_ok",
                model=OFFLINE_MODEL,
                attempts=len(attempts),
                tokens_before=tokens_before,
                tokens_after=tokens_after,
            )
            return SummaryResult(
                text=cleaned,
                model=OFFLINE_MODEL,
                attempts=tuple(attempts),
                tokens_before=tokens_before,
                tokens_after=tokens_after,
                prompt_version=OFFLINE_VERSION,
                custom_instructions=request.custom_instructions,
            )

    tried = ", ".join(dict.fromkeys(a.model for a in attempts))
    last = attempts[-1] if attempts else None
    raise CompactionError(
        f"every summarizer failed ({tried}); last: "
        f"{last.error_type if last else '?'}: {last.error if last else '?'}",
        code="ALL_MODELS_FAILED",
        model=last.model if last else None,
        attempts=tuple(attempts),
        last_error_type=last.error_type if last else None,
    ) from last_error
