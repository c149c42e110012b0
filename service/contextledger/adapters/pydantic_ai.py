"""pydantic-ai message history on the ledger, and a history processor that fits the budget.

``LedgerHistory`` stores pydantic-ai ``ModelMessage`` objects as ledger messages in
OpenAI chat shape (so tokens, compaction and recall work on them): a ``ModelResponse``
is one assistant message (text, ``tool_calls``, thinking as ``reasoning_content``); a
``ModelRequest`` is one chat message per part (system, user, one ``tool`` message per
tool return), so a tool call and its returns form one unit that compaction keeps or
drops whole. The first chat message of each model message carries the message itself
as ``ModelMessagesTypeAdapter`` JSON (under :data:`MESSAGE_KEY`), so ``load`` gives back
exactly what was saved.

The processor (``Agent(capabilities=[history.capability()])``: pydantic-ai 2 took
``history_processors=`` into the ``ProcessHistory`` capability) makes the ledger the
history: it records the messages it has not seen (by content fingerprint, so the
fitted lists pydantic-ai hands back are not recorded twice) and returns the session's
view fitted to ``token_budget``. Messages the view changed (a summary, a recall block, a
pruned tool return) come back as plain parts built from their chat form.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from contextledger import InvalidInput, Ledger, OwnedLedger, Session
from contextledger.adapters._checks import check_token_budget
from contextledger.extras import missing_extra

try:
    from pydantic_ai.capabilities import ProcessHistory
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        ModelResponsePart,
        RetryPromptPart,
        SystemPromptPart,
        TextPart,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
except ImportError as exc:  # tests/unit/test_adapters_optional.py blocks the import
    raise missing_extra("pydantic-ai", "pydantic_ai") from exc

__all__ = ["MESSAGE_KEY", "LedgerHistory"]

#: The key of a ledger message that holds the pydantic-ai message it was made from.
MESSAGE_KEY = "pydantic_ai"


def _dump(message: ModelMessage) -> dict[str, Any]:
    data: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python([message], mode="json")
    return data[0]


def _load(data: Any) -> ModelMessage:
    return ModelMessagesTypeAdapter.validate_python([data])[0]


def _fingerprint(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _request_parts(data: Any) -> list[str]:
    """The fingerprints of a dumped ``ModelRequest``'s parts (none for a response)."""
    if not isinstance(data, Mapping) or data.get("kind") != "request":
        return []
    return [_fingerprint(p) for p in data.get("parts") or []]


def _user_text(content: Any) -> Any:
    if isinstance(content, str):
        return content
    parts = [
        c if isinstance(c, str) else f"[{getattr(c, 'kind', type(c).__name__)}]" for c in content
    ]
    return "\n".join(parts)


def _request_chat(part: ModelRequestPart) -> dict[str, Any]:
    if isinstance(part, SystemPromptPart):
        return {"role": "system", "content": part.content}
    if isinstance(part, ToolReturnPart):
        return {
            "role": "tool",
            "tool_call_id": part.tool_call_id,
            "content": part.model_response_str(),
        }
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:
        return {"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response()}
    if isinstance(part, RetryPromptPart):
        return {"role": "user", "content": part.model_response()}
    if isinstance(part, UserPromptPart):
        return {"role": "user", "content": _user_text(part.content)}
    return {"role": "user", "content": f"[{getattr(part, 'part_kind', type(part).__name__)}]"}


def _response_chat(message: ModelResponse) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            texts.append(part.content)
        elif isinstance(part, ThinkingPart):
            thinking.append(part.content)
        elif isinstance(part, ToolCallPart) and part.part_kind == "tool-call":
            calls.append(
                {
                    "id": part.tool_call_id,
                    "type": "function",
                    "function": {"name": part.tool_name, "arguments": part.args_as_json_str()},
                }
            )
        else:  # provider-side tools, files…: named, so the turn is not empty
            texts.append(f"[{getattr(part, 'part_kind', type(part).__name__)}]")
    chat: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        chat["tool_calls"] = calls
    elif chat["content"] is None:
        chat["content"] = ""
    if thinking:
        chat["reasoning_content"] = "\n".join(thinking)
    return chat


def _to_chat(message: ModelMessage) -> list[dict[str, Any]]:
    """The ledger messages for one pydantic-ai message (see module doc)."""
    data = _dump(message)
    if isinstance(message, ModelResponse):
        chats = [_response_chat(message)]
    else:
        chats = [_request_chat(p) for p in message.parts] or [{"role": "user", "content": ""}]
    names = [getattr(p, "tool_name", None) for p in getattr(message, "parts", ())]
    for n, chat in enumerate(chats):
        tag: dict[str, Any] = {"part": n, "of": len(chats), "check": _fingerprint(chat)}
        if chat["role"] == "tool" and n < len(names) and isinstance(names[n], str):
            tag["tool_name"] = names[n]
        if n == 0:
            tag["message"] = data
            tag["fingerprint"] = _fingerprint(data)
        chat[MESSAGE_KEY] = tag
    return chats


def _rebuilt(chat: Mapping[str, Any]) -> ModelMessage:
    """A pydantic-ai message from a chat message the view changed or made."""
    role, content = chat.get("role"), chat.get("content")
    if content is None:
        text = ""
    else:
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if role == "assistant":
        parts: list[ModelResponsePart] = [TextPart(text)] if text else []
        for call in chat.get("tool_calls") or []:
            function = call.get("function") or {}
            parts.append(
                ToolCallPart(function.get("name", ""), function.get("arguments"), call.get("id"))
            )
        return ModelResponse(parts=parts or [TextPart("")])
    if role == "system":
        return ModelRequest(parts=[SystemPromptPart(text)])
    if role == "tool":
        tag = chat.get(MESSAGE_KEY) or {}
        name = tag.get("tool_name", "") if isinstance(tag, Mapping) else ""
        return ModelRequest(
            parts=[ToolReturnPart(name, text, tool_call_id=str(chat.get("tool_call_id", "")))]
        )
    return ModelRequest(parts=[UserPromptPart(text)])


def _intact(chat: Mapping[str, Any], part: int) -> bool:
    """Whether ``chat`` is part ``part`` of a model message, as it was written (jsonb
    may reorder keys, so the check is a fingerprint of the canonical form)."""
    tag = chat.get(MESSAGE_KEY)
    if not isinstance(tag, Mapping) or tag.get("part") != part:
        return False
    return tag.get("check") == _fingerprint({k: v for k, v in chat.items() if k != MESSAGE_KEY})


def _from_chat(chats: Sequence[Mapping[str, Any]]) -> tuple[list[ModelMessage], list[str]]:
    """The pydantic-ai messages a view stands for (originals where intact), and the
    fingerprints of the ones rebuilt from their chat form."""
    out: list[ModelMessage] = []
    rebuilt: list[str] = []
    n = 0
    while n < len(chats):
        tag = chats[n].get(MESSAGE_KEY)
        if isinstance(tag, Mapping) and tag.get("part") == 0 and "message" in tag:
            count = int(tag.get("of", 1))
            group = chats[n : n + count]
            if len(group) == count and all(_intact(c, k) for k, c in enumerate(group)):
                out.append(_load(tag["message"]))
                n += count
                continue
        message = _rebuilt(chats[n])
        out.append(message)
        rebuilt.append(_fingerprint(_dump(message)))
        n += 1
    return out, rebuilt


class LedgerHistory:
    """A pydantic-ai conversation's history in a contextledger session.

    ``LedgerHistory("chat-7", ledger=ledger)`` or ``(…, dsn="postgresql://…")`` (opened on
    first use; ``close()`` closes it). ``token_budget`` sets what ``processor`` fits to;
    ``model`` and ``config`` go to ``ledger.session``.

    Errors: bad input (a message that cannot be stored, a bad argument) is raised as
    pydantic-ai's ``UserError`` with the typed error as its ``__cause__`` (nothing is
    written); other ``ContextLedgerError``s propagate with their stable ``code``.
    """

    def __init__(
        self,
        session_id: str,
        *,
        ledger: Ledger | None = None,
        dsn: str | None = None,
        token_budget: int | None = None,
        model: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._source = OwnedLedger(ledger, dsn, error=lambda m: UserError(f"LedgerHistory: {m}"))
        check_token_budget(token_budget, UserError)
        self.session_id = session_id
        self.token_budget = token_budget
        self._model = model
        self._config = dict(config) if config is not None else None
        self._session: Session | None = None
        self._known: set[str] | None = None
        #: runs of adjacent stored requests (each request as its parts' fingerprints):
        #: what pydantic-ai merges into one request when it hands the history back
        self._runs: list[list[list[str]]] = []
        self._after_request = False
        self._lock = asyncio.Lock()

    async def session(self) -> Session:
        """The underlying contextledger ``Session`` (checkpoints, verify, usage…)."""
        if self._session is None:
            try:
                ledger = await self._source.get()
                self._session = await ledger.session(
                    self.session_id, model=self._model, config=self._config
                )
            except InvalidInput as exc:
                raise UserError(str(exc)) from exc
        return self._session

    async def load(self) -> list[ModelMessage]:
        """Every stored message (the working view), as pydantic-ai messages."""
        async with self._lock:
            view = await (await self.session()).view()
            messages, _ = _from_chat(view)
            return messages

    async def save(self, messages: Sequence[ModelMessage]) -> int:
        """Record the messages not stored yet (e.g. ``result.all_messages()``), in order,
        in one atomic batch; return how many were recorded."""
        async with self._lock:
            return await self._record(messages)

    async def processor(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history processor: record what is new, return the view fitted to the budget
        (call/return pairs whole; the latest request always kept)."""
        async with self._lock:
            await self._record(messages, merged=True)
            session = await self.session()
            try:
                chats = await session.get_messages_for_request(self.token_budget)
            except InvalidInput as exc:
                raise UserError(str(exc)) from exc
            fitted, rebuilt = _from_chat(chats)
            assert self._known is not None
            self._known.update(rebuilt)  # handed out, so not new when they come back
            return fitted

    def capability(self) -> ProcessHistory[Any]:
        """``processor`` as the capability pydantic-ai's ``Agent(capabilities=…)`` takes."""
        return ProcessHistory(self.processor)

    async def _record(self, messages: Sequence[ModelMessage], *, merged: bool = False) -> int:
        """Record what is not stored yet. ``merged``: the list is one pydantic-ai merged
        adjacent requests in (the processor's), so a request made of stored ones is
        recognised (see ``_unstored_parts``); ``save`` takes the list as given."""
        given: object = messages  # callers are not type-checked
        if isinstance(given, str | bytes) or not isinstance(given, Sequence):
            raise UserError("save takes a list of pydantic-ai messages")
        session = await self.session()
        if self._known is None:
            self._known, self._runs, self._after_request = set(), [], False
            for chat in await session.view():
                tag = chat.get(MESSAGE_KEY)
                if isinstance(tag, Mapping) and isinstance(tag.get("fingerprint"), str):
                    self._known.add(tag["fingerprint"])
                    self._follow(tag.get("message"))
        new: list[dict[str, Any]] = []
        prints: list[str] = []
        for n, message in enumerate(messages):
            if not isinstance(message, ModelRequest | ModelResponse):
                raise UserError(f"messages[{n}] is a {type(message).__name__}, not a ModelMessage")
            data = _dump(message)
            fingerprint = _fingerprint(data)
            if fingerprint in self._known or fingerprint in prints:
                continue
            prints.append(fingerprint)
            if merged and isinstance(message, ModelRequest):
                fresh = self._unstored_parts(message, _request_parts(data))
                if not fresh:
                    continue
                if len(fresh) < len(message.parts):
                    message = dataclasses.replace(message, parts=fresh)
                    data = _dump(message)
            new += _to_chat(message)
            self._follow(data)
        if new:
            try:
                await session.add_messages(new)
            except InvalidInput as exc:
                raise UserError(str(exc)) from exc
        self._known.update(prints)
        return sum(1 for c in new if c[MESSAGE_KEY]["part"] == 0)

    def _follow(self, data: Any) -> None:
        """Track the runs of adjacent stored requests past one more stored message."""
        if isinstance(data, Mapping) and data.get("kind") == "request":
            if not self._after_request:
                self._runs.append([])
            self._runs[-1].append(_request_parts(data))
            self._after_request = True
        else:
            self._after_request = False

    def _unstored_parts(self, message: ModelRequest, own: list[str]) -> list[ModelRequestPart]:
        """The parts of ``message`` not stored yet. pydantic-ai merges adjacent requests
        into one (after a failed model call: the request nobody answered and the next),
        so a request made of whole stored requests of one run, and perhaps new parts,
        is stored already but for those new parts. A request equal to a single stored
        one, with nothing new, is a request of its own (sent again)."""
        best: list[list[str]] = []
        for run in self._runs:
            have = Counter(own)
            matched = []
            for request in run:
                need = Counter(request)
                if request and all(have[f] >= n for f, n in need.items()):
                    have.subtract(need)
                    matched.append(request)
            if len(matched) > len(best):
                best = matched
        covered = sum(len(r) for r in best)
        if not best or (len(best) == 1 and covered == len(own)):
            return list(message.parts)
        stored = Counter(f for r in best for f in r)
        fresh: list[ModelRequestPart] = []
        for part, f in zip(message.parts, own, strict=True):
            if stored[f] > 0:
                stored[f] -= 1
            else:
                fresh.append(part)
        seen = {f for r in best for f in r}
        if any(f in seen for f, n in Counter(own).items() if n > 1):
            return list(message.parts)  # a part twice: not two requests made apart
        return fresh

    async def close(self) -> None:
        """Close the ledger when this history opened it (``dsn=``)."""
        if self._source.owned:
            await self._source.close()
            self._session = None
