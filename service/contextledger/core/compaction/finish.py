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

import copy
import operator
from collections.abc import Mapping, Sequence
from typing import Any, cast

from contextledger.core.providers import model_family
from contextledger.core.tokens import TokenCounter
from contextledger.core.view import ViewItem

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
    return model_family(model) == "anthropic"


def _other(role: str) -> str | None:
    return {"user": "assistant", "assistant": "user"}.get(role)


#: One item's finished form: ``(the item, its finished message, flat?, plain?)``; plain:
#: not a summary (no bridge to look for) and flat (a shallow copy is a copy).
Finished = tuple[ViewItem, dict[str, Any] | None, bool, bool]
#: ``target model -> id(item) -> Finished``: keyed by identity (a hit is checked to be the
#: same item, which the entry keeps alive), since the planner hands the same items out
#: request after request; the lookups of a whole view then run at C speed.
FinishCache = dict[str | None, dict[int, Finished]]
#: Target models a cache keeps finished views for (a session alternating between two
#: keeps both warm; a third replaces the oldest).
MODELS_KEPT = 2


def _flat(message: Mapping[str, Any]) -> bool:
    return all(isinstance(v, str | int | float | bool | None) for v in message.values())


def _finish_one(
    item: ViewItem,
    reasoning: bool,
    strip: bool,
    cache: dict[int, Finished] | None,
) -> dict[str, Any] | None:
    """One item's finished message (None: nothing left once thinking is stripped). A cache
    keeps the finished form of items seen before, so a request costs one copy per item."""
    hit = cache.get(id(item)) if cache is not None else None
    if hit is None or hit[0] is not item:
        hit = _finished(item, reasoning, strip)
        if cache is not None:
            cache[id(item)] = hit
    done, flat = hit[1], hit[2]
    if done is None:
        return None
    return dict(done) if flat else copy.deepcopy(done)


def _finished(item: ViewItem, reasoning: bool, strip: bool) -> Finished:
    message = dict(item.message)
    if item.kind == "summary" and reasoning and message.get("role") == "assistant":
        message = add_reasoning_block(message)
    done: dict[str, Any] | None = message
    if strip:
        stripped = strip_signed_thinking([message])
        done = stripped[0] if stripped else None
    flat = done is not None and _flat(done)
    return item, done, flat, flat and item.kind != "summary"


def finish_request_view(
    items: Sequence[ViewItem],
    *,
    target_model: str | None,
    cache: FinishCache | None = None,
    sized_for: int | None = None,
) -> list[dict[str, Any]]:
    """The messages to send for ``items``, finished for ``target_model``."""
    return finish_marked(items, -1, target_model=target_model, cache=cache, sized_for=sized_for)[0]


def finish_marked(
    items: Sequence[ViewItem],
    mark: int,
    *,
    target_model: str | None,
    cache: FinishCache | None = None,
    sized_for: int | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """``finish_request_view`` and where item ``mark`` begins in its output: an item put
    before it (not a summary) finishes alone and goes there, unless ``items[mark - 1]`` is a
    summary (whose bridge looks at its next item). The request path finishes the view this
    way while recall's search is out, then puts the recall block in (``splice_safe``).
    ``sized_for``: the items the cache is kept for when ``items`` is a part of the view the
    next requests carry (a question's request left its oldest part out for recall: pruned
    to it, the cache missed that part on every request after)."""
    reasoning = needs_reasoning_block(target_model or "")
    strip = not is_anthropic(target_model)
    known: dict[int, Finished] | None = None
    if cache is not None:
        known = cache.pop(target_model, None) or {}
        cache[target_model] = known  # the latest used last: the least recent go first
        for other in list(cache)[: len(cache) - MODELS_KEPT]:
            del cache[other]
        size = max(len(items), sized_for or 0)
        if len(known) > size + size // 4 + 8:
            # Bounded by what requests carry, not by history: what this request no longer
            # carries goes (clearing all at 4x made a session's memory swing by 2x; a slack
            # of 64 items let a 35-item view's cache hold 103, 2.2x its memory at 20,000
            # turns of bench/turns.py's max_tokens 6000 path against 1,000).
            keep = set(map(id, items))
            for key in [k for k in known if k not in keep]:
                del known[key]
        # Items seen before are looked up at C speed, the few new ones (the turn's) finished
        # and cached; if all are plain, the copies are made at C speed too.
        hits = list(map(known.get, map(id, items)))
        if None in hits:
            n = hits.index(None)
            while True:
                item = items[n]
                hits[n] = known[id(item)] = _finished(item, reasoning, strip)
                try:
                    n = hits.index(None, n + 1)
                except ValueError:
                    break
        found = cast(list[Finished], hits)  # every miss was filled above
        if all(map(operator.is_, map(_ITEM, found), items)) and all(map(_PLAIN, found)):
            out = list(map(dict, map(_DONE, found)))
            return out, mark if 0 <= mark < len(items) else len(out)
    out = []
    append = out.append
    last = len(items) - 1
    cut = -1
    for n, item in enumerate(items):
        if n == mark:
            cut = len(out)
        if item.kind != "summary":  # the common case: no bridge to look for
            message = _finish_one(item, reasoning, strip, known)
            if message is not None:
                append(message)
            continue
        role = str(item.message.get("role", ""))
        bridge_role = _other(role)
        if bridge_role and out and out[-1].get("role") == role:
            append({"role": bridge_role, "content": BRIDGES[bridge_role]})
        message = _finish_one(item, reasoning, strip, known)
        if message is not None:
            append(message)
        if bridge_role and n < last and items[n + 1].message.get("role") == role:
            append({"role": bridge_role, "content": BRIDGES[bridge_role]})
    return out, len(out) if cut < 0 else cut


_ITEM, _DONE, _PLAIN = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)


def splice_safe(items: Sequence[ViewItem], at: int) -> bool:
    """Whether an item put before ``items[at]`` may be finished apart (``finish_marked``)."""
    return 0 <= at < len(items) and (at == 0 or items[at - 1].kind != "summary")


DEFAULT_REASONING = "Let me analyze the context and continue from this summary."


def needs_reasoning_block(model: str) -> bool:
    """DeepSeek models (r1, reasoner, v3, coder… any name matching ``/deepseek/i``), as Vellum.

    Their APIs expect assistant turns to carry ``reasoning_content``; a synthetic
    summary turn has none, so one is added.
    """
    return model_family(model) == "deepseek"


def add_reasoning_block(
    message: Mapping[str, Any], thinking: str = DEFAULT_REASONING
) -> dict[str, Any]:
    """A deep copy of ``message`` with a synthetic ``reasoning_content`` (kept if present)."""
    out = copy.deepcopy(dict(message))
    if not out.get("reasoning_content"):
        out["reasoning_content"] = thinking
    return out


_THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})


def strip_signed_thinking(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` without Anthropic ``thinking``/``redacted_thinking`` blocks.

    Signed thinking is only valid verbatim, for the model that wrote it, in its
    original position; once turns are summarized or the model changes, the
    provider rejects it. Drops litellm's ``thinking_blocks`` too, and drops a
    message left with no content at all. For the request view only: the inputs
    (and the ledger) are never touched.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        # a message of plain values (most are: role and text) is copied whole by dict();
        # deepcopy's memo and dispatch cost ~10x that, per message of every cold finish
        copied = dict(message) if _flat(message) else copy.deepcopy(dict(message))
        copied.pop("thinking_blocks", None)
        content = copied.get("content")
        if isinstance(content, list):
            kept = [
                b
                for b in content
                if not (isinstance(b, Mapping) and b.get("type") in _THINKING_TYPES)
            ]
            if not kept and len(kept) != len(content) and not copied.get("tool_calls"):
                continue  # the message was only thinking
            copied["content"] = kept
        out.append(copied)
    return out
