"""What makes a summary acceptable: not empty, not an error text, smaller than what it replaces."""

from __future__ import annotations

import re

from contextledger.core.tokens import TokenCounter
from contextledger.errors import CompactionError

_ERROR_TEXT_RE = re.compile(
    r"""^\s*(?:
        error\b\s*[:\-]? | an?\s+error\s+(?:has\s+)?occurred | internal\s+server\s+error
      | bad\s+gateway | service\s+unavailable | gateway\s+time-?out | rate\s+limit
      | i['\u2019]m\s+sorry,?\s+but | i\s+am\s+sorry,?\s+but | sorry,\s+i\s+can(?:no|['\u2019])t
      | i\s+can(?:no|['\u2019])t\s+(?:help|assist|comply|do\s+that|provide)
      | i\s+(?:am\s+)?unable\s+to | as\s+an\s+ai\b | as\s+a\s+language\s+model
      | <!doctype\s+html | <html\b | <head\b | <body\b | \{\s*"error"\s*:
    )""",
    re.IGNORECASE | re.VERBOSE,
)
_THINK_RE = re.compile(r"^\s*<think(?:ing)?>.*?</think(?:ing)?>\s*", re.DOTALL | re.IGNORECASE)


# ==================================================================== validation


def clean_summary_text(text: str | None) -> str:
    """Strip whitespace and a leading ``<think>…</think>`` some reasoning models emit."""
    if not text:
        return ""
    return _THINK_RE.sub("", text, count=1).strip()


def looks_like_error(text: str) -> bool:
    """An error message or refusal returned as if it were the answer (checked at the start)."""
    return bool(_ERROR_TEXT_RE.match(text[:300]))


def validate_summary(
    text: str | None,
    *,
    counter: TokenCounter,
    tokens_before: int,
    model: str | None = None,
) -> tuple[str, int]:
    """Return ``(clean_text, tokens_after)`` or raise ``INVALID_SUMMARY`` / ``CONTEXT_GROWTH``.

    Also usable on a hook's ``custom_summary``, so nothing invalid reaches the ledger.
    """
    cleaned = clean_summary_text(text)
    if not cleaned:
        raise CompactionError("summary is empty", code="INVALID_SUMMARY", model=model)
    if looks_like_error(cleaned):
        raise CompactionError(
            f"summary looks like an error message, not a summary: {cleaned[:120]!r}",
            code="INVALID_SUMMARY",
            model=model,
        )
    tokens_after = counter.count_text(cleaned)
    if tokens_after >= tokens_before:
        pct = round((tokens_after - tokens_before) * 100 / max(tokens_before, 1))
        raise CompactionError(
            f"summary is {pct}% larger than what it replaces "
            f"({tokens_after} tokens vs {tokens_before}); it must be strictly smaller",
            code="CONTEXT_GROWTH",
            model=model,
            original_tokens=tokens_before,
            resulting_tokens=tokens_after,
        )
    return cleaned, tokens_after
