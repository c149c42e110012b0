"""Token counting seam (placeholder: the token-accounting issue replaces the estimator).

Counts are taken once, at append, and stored with the counter's ``name``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TokenCounter(Protocol):
    name: str

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Mapping[str, Any]) -> int: ...

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int: ...


class CharsCounter:
    """Character-ratio estimator: fast, dependency-free, approximate."""

    def __init__(self, chars_per_token: float = 4.0) -> None:
        self.chars_per_token = chars_per_token
        self.name = f"chars:{chars_per_token:g}"

    def count_text(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token) if text else 0

    def count_message(self, message: Mapping[str, Any]) -> int:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        return 4 + self.count_text(text) + (self.count_text(json.dumps(extra)) if extra else 0)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self.count_message(m) for m in messages) + 3
