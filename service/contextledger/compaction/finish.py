"""Last touches on a request view, for the provider it is going to (pure, request-only).

Nothing here reaches the ledger: the stored messages stay as given, and the same
view is finished the same way every time (so the prompt prefix stays stable).

* A summary sits where the turns it replaced sat. When that puts it next to a
  message of its own role (user summary, then the user's next turn), a short
  bridge message of the other role goes between them: strict providers (Gemini,
  older Anthropic) reject two same-role turns in a row; the others lose nothing.
* Signed thinking blocks are only valid for the provider (and model) that signed
  them: they are stripped unless the target is Anthropic.
* Reasoning models that require reasoning content on assistant messages
  (DeepSeek R1 style) get a synthetic reasoning block on an assistant summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contextledger.tokens import TokenCounter
from contextledger.view import ViewItem

BRIDGES: Mapping[str, str] = {
    "assistant": "Understood. I will continue from that summary.",
    "user": "Continue.",
}


def bridge_cost(counter: TokenCounter) -> int:
    """Tokens of the bridges finish may put around one summary (one on each side)."""
    return 2 * max(counter.count_message({"role": r, "content": t}) for r, t in BRIDGES.items())


def bridge_reserve(items: Sequence[ViewItem], counter: TokenCounter) -> int:
    """Tokens to hold back for bridges: at most two per summary in the view."""
    summaries = sum(1 for i in items if i.kind == "summary")
    return summaries * bridge_cost(counter) if summaries else 0


def is_anthropic(model: str | None) -> bool:
    name = (model or "").lower()
    return "claude" in name or "anthropic" in name


def _other(role: str) -> str | None:
    return {"user": "assistant", "assistant": "user"}.get(role)


def finish_request_view(
    items: Sequence[ViewItem], *, target_model: str | None
) -> list[dict[str, Any]]:
    from contextledger.summarizer import (
        add_reasoning_block,
        needs_reasoning_block,
        strip_signed_thinking,
    )

    reasoning = needs_reasoning_block(target_model or "")
    out: list[dict[str, Any]] = []
    for n, item in enumerate(items):
        message = dict(item.message)
        is_summary = item.kind == "summary"
        if is_summary and reasoning and message.get("role") == "assistant":
            message = add_reasoning_block(message)
        role = str(message.get("role", ""))
        bridge_role = _other(role) if is_summary else None
        if bridge_role and out and out[-1].get("role") == role:
            out.append({"role": bridge_role, "content": BRIDGES[bridge_role]})
        out.append(message)
        nxt = items[n + 1] if n + 1 < len(items) else None
        if bridge_role and nxt is not None and nxt.message.get("role") == role:
            out.append({"role": bridge_role, "content": BRIDGES[bridge_role]})
    if not is_anthropic(target_model):
        out = strip_signed_thinking(out)
    return out
