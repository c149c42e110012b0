"""``LedgerSession``: contextledger as the OpenAI Agents SDK's session store.

The SDK hands a session Responses-API input items (messages, function calls and their
outputs, reasoning, and item types this code has never heard of). Each ``add_items``
batch becomes ledger messages in OpenAI chat shape, so token counting, compaction and
recall work on them. A message item whose content the ledger reads as it is (a string,
or ``input_text`` / ``output_text`` / ``input_image`` parts) is stored verbatim; any
other message carries the items it came from (under :data:`ITEMS_KEY`). Either way
``get_items`` gives back exactly what was added.

Grouping, so a budget cut never breaks what the Responses API insists on: a run of
calls (parallel ``function_call`` items, with the reasoning items before them) is one
assistant message with several ``tool_calls``, each output one ``tool`` message right
after it; compaction keeps or drops such a unit whole. Reasoning rides with the item it
precedes. Any ``*_call`` / ``*_call_output`` pair with a ``call_id`` (computer, shell,
custom tools…) is mapped the same way; other unknown items become an assistant message
whose text is the item's JSON (counted, searchable) and come back unchanged.

``pop_item`` is honest about the ledger being append-only: it records a rollback to
just before the last message (history stays, the view loses the item), re-appending the
rest of that message's group when it held several items.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar, cast

from contextledger import (
    Checkpoint,
    ConcurrencyError,
    InvalidArgument,
    InvalidInput,
    InvalidMessage,
    Ledger,
    OwnedLedger,
    Session,
)
from contextledger.adapters._checks import check_token_budget
from contextledger.adapters._loops import LoopThread
from contextledger.extras import missing_extra

try:
    from agents.exceptions import UserError
    from agents.items import TResponseInputItem
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import SessionSettings, coerce_session_settings
except ImportError as exc:  # tests/unit/test_adapters_optional.py blocks the import
    raise missing_extra("openai-agents", "agents") from exc

__all__ = ["ITEMS_KEY", "LedgerSession"]

#: The key of a ledger message that holds the Responses items it was made from.
ITEMS_KEY = "responses_items"
_CHAT_ROLES = frozenset({"user", "assistant", "system", "developer"})
#: the caller's input (``errors.InvalidInput``: a message, an argument, a config…)
_BAD_INPUT = InvalidInput
#: attempts at a pop before a ConcurrencyError is raised (each lost race is a pop won by
#: another writer, so the next attempt reads a shorter view)
_POP_RETRIES = 16
T = TypeVar("T")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _type(item: Mapping[str, Any]) -> str:
    t = item.get("type")
    if isinstance(t, str):
        return t
    return "message" if "role" in item else ""


def _is_call(item: Mapping[str, Any]) -> bool:
    t = _type(item)
    return t.endswith("_call") and isinstance(item.get("call_id"), str)


def _is_output(item: Mapping[str, Any]) -> bool:
    t = _type(item)
    return t.endswith("_call_output") and isinstance(item.get("call_id"), str)


def _text(value: Any) -> str:
    """The readable text of a content value (string, parts, or anything JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping) and isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
            else:
                parts.append(_json(part))
        return "\n".join(parts)
    return "" if value is None else _json(value)


def _content(value: Any) -> Any:
    """Chat content for a message item's content: text stays text, images are counted
    as images, any other part as its type."""
    if not isinstance(value, list):
        return _text(value)
    blocks: list[dict[str, Any]] = []
    for part in value:
        if isinstance(part, Mapping) and part.get("type") == "input_image":
            url = part.get("image_url")
            if isinstance(url, str):
                blocks.append({"type": "image_url", "image_url": {"url": url}})
                continue
        blocks.append({"type": "text", "text": _text([part])})
    return blocks


def _reasoning_text(items: Sequence[Mapping[str, Any]]) -> str:
    out = []
    for item in items:
        for key in ("summary", "content"):
            text = _text(item.get(key))
            if text:
                out.append(text)
    return "\n".join(out)


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    if _type(item) == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
    else:  # computer_call, shell_call, custom_tool_call…: the item's own fields
        name = _type(item)
        arguments = _json({k: v for k, v in item.items() if k not in ("type", "call_id", "id")})
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {
            "name": name if isinstance(name, str) else _type(item),
            "arguments": arguments if isinstance(arguments, str) else _json(arguments),
        },
    }


def _as_is(item: Mapping[str, Any]) -> bool:
    """A message item the ledger can store verbatim: chat role, and content the token
    counter reads (a string, or typed parts such as ``input_text`` / ``output_text``)."""
    content = item.get("content")
    return (
        _type(item) == "message"
        and item.get("role") in _CHAT_ROLES
        and not any(k in item for k in (ITEMS_KEY, "tool_calls", "tool_call_id"))
        and (
            isinstance(content, str)
            or (
                isinstance(content, list)
                and all(isinstance(p, Mapping) and isinstance(p.get("type"), str) for p in content)
            )
        )
    )


def _to_message(group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One ledger message (OpenAI chat shape) for a group of items (see module doc)."""
    if len(group) == 1 and _as_is(group[0]):
        return dict(group[0])  # no copy of the text beside it: the item is the message
    reasoning = [i for i in group if _type(i) == "reasoning"]
    main = [i for i in group if _type(i) != "reasoning"]
    message: dict[str, Any]
    if main and _is_call(main[0]):
        message = {"role": "assistant", "content": None, "tool_calls": [_call(i) for i in main]}
    elif main and _is_output(main[0]):
        message = {
            "role": "tool",
            "tool_call_id": main[0]["call_id"],
            "content": _text(main[0].get("output")),
        }
    elif main and _type(main[0]) == "message" and main[0].get("role") in _CHAT_ROLES:
        message = {"role": main[0]["role"], "content": _content(main[0].get("content"))}
    elif main:  # an item type with no chat counterpart: its JSON, counted and searchable
        message = {"role": "assistant", "content": _json(main[0])}
    else:  # reasoning with nothing after it
        message = {"role": "assistant", "content": ""}
    if reasoning:
        message["reasoning_content"] = _reasoning_text(reasoning)
    message[ITEMS_KEY] = [dict(i) for i in group]
    return message


def _groups(items: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Split a batch into message groups. Calls in a row (reasoning between them
    included) are one group, as is reasoning right after them, so a call's unit is never
    broken by an assistant message of its own; other reasoning joins the item after it;
    everything else is a group of its own."""
    groups: list[list[Mapping[str, Any]]] = []
    pending: list[Mapping[str, Any]] = []

    def after_calls() -> bool:
        return bool(groups) and any(_is_call(i) for i in groups[-1])

    for item in items:
        if _type(item) == "reasoning":
            pending.append(item)
        elif _is_call(item) and after_calls():
            groups[-1] += [*pending, item]
            pending = []
        elif _is_output(item):
            if pending and after_calls():
                groups[-1] += pending
            elif pending:
                groups.append(pending)
            pending = []
            groups.append([item])
        else:
            groups.append([*pending, item])
            pending = []
    if pending:
        if after_calls():
            groups[-1] += pending
        else:
            groups.append(pending)
    return groups


def _check_items(items: Any) -> list[Mapping[str, Any]]:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise InvalidArgument("add_items takes a list of items", field="items")
    for n, item in enumerate(items):
        if not isinstance(item, Mapping) or not _type(item):
            raise InvalidMessage(
                f"items[{n}] is not a Responses input item (a dict with 'type' or 'role')",
                field=f"items[{n}]",
            )
        if _type(item) == "message" and item.get("role") not in _CHAT_ROLES:
            raise InvalidMessage(
                f"items[{n}] has role {item.get('role')!r}; expected one of {sorted(_CHAT_ROLES)}",
                field=f"items[{n}].role",
            )
    return list(items)


def _from_message(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The items a view message stands for: the originals when the message is as it was
    stored, else (a summary, a recall block, a pruned tool output) its chat form."""
    stored = message.get(ITEMS_KEY)
    if isinstance(stored, list) and stored and _to_message(stored) == dict(message):
        return [dict(i) for i in stored]
    if stored is None and _as_is(message):
        return [dict(message)]  # stored verbatim, or a summary / recall block / bridge
    role = message.get("role")
    if role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": str(message.get("tool_call_id", "")),
                "output": _text(message.get("content")),
            }
        ]
    out: list[dict[str, Any]] = []
    text = _text(message.get("content"))
    if text or not message.get("tool_calls"):
        out.append({"role": role if role in _CHAT_ROLES else "user", "content": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        out.append(
            {
                "type": "function_call",
                "call_id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
            }
        )
    return out


#: How often a call handed to a memory:// ledger's home loop checks that loop still runs.
HOME_CHECK_SECONDS = 0.05


class _Closed:
    """What ``close()`` returns: it has already closed, and awaiting it is a no-op, so
    both ``session.close()`` (as the SDK's stores are closed) and ``await
    session.close()`` work."""

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()


class _Place:
    """Where a ledger lives: its loop (or the loop thread that runs it), the ledger, the
    session handle on it, and a lock for opening them (used on that loop only)."""

    def __init__(self, thread: LoopThread | None, ledger: Ledger | None) -> None:
        self.thread = thread
        self.ledger = ledger
        self.session: Session | None = None
        self.lock = asyncio.Lock()  # binds to the loop it is first contended on: this one


class LedgerSession(SessionABC):
    """An Agents SDK session whose items live in a contextledger ledger.

    ``LedgerSession("user-42", ledger=ledger)`` (an open ``Ledger``) or
    ``LedgerSession("user-42", dsn="postgresql://…")`` (opened on first use; ``close()``
    closes it, called plainly or awaited). ``token_budget``: ``get_items()`` returns the
    view fitted to that many tokens (compacted per the session's config, call/output pairs
    kept whole) instead of the whole history. ``model`` and ``config`` go to
    ``ledger.session``. ``session_settings``: a ``SessionSettings`` or a dict, coerced and
    checked as the SDK's own stores do (an unknown field is a ``TypeError``).

    Any thread, any event loop, sync or async (``Runner.run_sync`` in a fresh thread
    included): with ``dsn=`` the ledger lives on a loop thread of this session's own and
    every call runs there; with ``ledger=`` calls run on the loop that first used this
    session (the ledger's), and calls from other loops run on a loop thread of this
    session's own, with a pool of its own on the ledger's PostgreSQL dsn (a ``memory://``
    ledger has no dsn: they run on its loop, which must not be blocked waiting on them).

    Errors: bad input (``InvalidMessage``, ``InvalidArgument``, ``ConfigError``) is raised
    as the SDK's ``UserError`` (the typed error is its ``__cause__``; nothing is written);
    every other ``ContextLedgerError`` (``LedgerUnavailable``, ``ConcurrencyError``…)
    propagates as is, with its stable ``code``.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        *,
        ledger: Ledger | None = None,
        dsn: str | None = None,
        token_budget: int | None = None,
        model: str | None = None,
        config: Mapping[str, Any] | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        source = OwnedLedger(ledger, dsn, error=lambda m: UserError(f"LedgerSession: {m}"))
        check_token_budget(token_budget, UserError)
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.token_budget = token_budget
        #: ``ledger=`` is used where it lives; ``dsn=`` (and a foreign loop's own pool)
        #: is opened per loop thread, in ``_open`` under that place's lock
        self._ledger, self._dsn = source.given, source.dsn
        self._model = model
        self._config = dict(config) if config is not None else None
        #: the ledger's own loop (``ledger=``) and the place there
        self._home_loop: asyncio.AbstractEventLoop | None = None
        self._home: _Place | None = None
        #: the loop thread of this session's own (``dsn=``, or foreign loops on ``ledger=``)
        self._own: _Place | None = None
        self._guard = threading.Lock()

    # -- where the work runs ------------------------------------------------------------

    def _own_place(self) -> _Place:
        with self._guard:
            if self._own is None or self._own.thread is None or not self._own.thread.alive:
                self._own = _Place(LoopThread(f"contextledger-agents-{self.session_id}"), None)
            return self._own

    def _foreign_dsn(self) -> str | None:
        """The dsn a pool of our own opens for calls from a loop that is not the ledger's."""
        if self._dsn is not None:
            return self._dsn
        dsn = self._ledger.dsn if self._ledger is not None else None
        return dsn if dsn and not dsn.startswith("memory:") else None

    async def _open(self, place: _Place) -> Session:
        """The session handle at ``place`` (opening its ledger first when it has none)."""
        if place.session is None:
            async with place.lock:
                if place.session is None:
                    try:
                        if place.ledger is None:
                            place.ledger = await Ledger.open(self._foreign_dsn())
                        place.session = await place.ledger.session(
                            self.session_id, model=self._model, config=self._config
                        )
                    except _BAD_INPUT as exc:
                        raise UserError(str(exc)) from exc
        return place.session

    async def _run(self, op: Callable[[Session], Awaitable[T]]) -> T:
        """Run ``op`` on the session handle where the ledger lives (see the class doc)."""

        async def at(place: _Place) -> T:
            return await op(await self._open(place))

        if self._dsn is not None:
            own = self._own_place()
            assert own.thread is not None
            return await own.thread.run_async(at(own))
        loop = asyncio.get_running_loop()
        with self._guard:
            home = self._home_loop
            if home is None or (home.is_closed() and self._foreign_dsn() is None):
                # first use, or a memory:// ledger whose loop is gone (it is bound to none)
                self._home_loop, home = loop, loop
                self._home = _Place(None, self._ledger)
            place = self._home
        assert place is not None
        if loop is home:
            return await at(place)
        if self._foreign_dsn() is None:  # memory://: one store, on its own loop
            if not home.is_running():
                raise UserError(
                    "this LedgerSession's memory:// ledger lives in an event loop that is "
                    "not running; use it from that loop, or pass dsn='memory://'"
                )
            sent = asyncio.run_coroutine_threadsafe(at(place), home)
            waiting = asyncio.wrap_future(sent)
            while not (await asyncio.wait({waiting}, timeout=HOME_CHECK_SECONDS))[0]:
                # The home loop may end before it runs what was handed to it (a thread's
                # short asyncio.run): taken back unstarted, it runs again from here, where
                # this loop becomes home (a memory:// ledger is bound to no loop).
                if not home.is_running() and sent.cancel():
                    with self._guard:
                        if self._home_loop is home:
                            self._home_loop, self._home = loop, _Place(None, self._ledger)
                    return await self._run(op)
            if waiting.cancelled():  # not by us: we take back only what never began
                # begun there, then cancelled as that loop shut down: it may have written
                raise UserError(
                    "the event loop this LedgerSession's memory:// ledger lived in ended "
                    "during the call (it may or may not have taken effect); pass "
                    "dsn='memory://' to use a memory ledger from threads with loops of "
                    "their own"
                )
            return waiting.result()
        own = self._own_place()
        assert own.thread is not None
        return await own.thread.run_async(at(own))

    async def session(self) -> Session:
        """The underlying contextledger ``Session`` (checkpoints, verify, usage…) of the
        ledger this session was given, for use on that ledger's loop. With ``dsn=`` it is
        the handle on this session's own loop thread (pass ``ledger=`` to use a
        ``Session`` from your own loop)."""
        return await self._run(_same)

    # -- the SDK's Session -----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history as items (oldest first); the latest ``limit`` items if given (else
        ``session_settings.limit``). With ``token_budget``, the budget-fitted view."""
        if limit is None and self.session_settings is not None:
            limit = coerce_session_settings(self.session_settings).limit

        async def read(session: Session) -> list[dict[str, Any]]:
            try:
                if self.token_budget is not None:
                    return await session.get_messages_for_request(self.token_budget)
                return await session.view()
            except _BAD_INPUT as exc:
                raise UserError(str(exc)) from exc

        messages = await self._run(read)
        items = [item for m in messages for item in _from_message(m)]
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items: all of them in one atomic batch, or (bad input) none."""
        try:
            checked = _check_items(items)
        except _BAD_INPUT as exc:
            raise UserError(str(exc)) from exc
        if not checked:
            return
        messages = [_to_message(g) for g in _groups(checked)]

        async def add(session: Session) -> None:
            try:
                await session.add_messages(messages)
            except _BAD_INPUT as exc:
                raise UserError(str(exc)) from exc

        await self._run(add)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the last item from the view and return it (``None`` when empty).

        Recorded as a rollback to just before the message that holds it, pinned to the
        head the view was read at: a concurrent pop (or add) makes it read again, so two
        pops never return the same item. The ledger keeps the item, and
        ``session.rollback`` to a later seq brings it back."""
        return cast(TResponseInputItem | None, await self._run(_pop))

    async def clear_session(self) -> None:
        """Empty the view (a ``session.cleared`` event; the history stays in the ledger)."""

        async def clear(session: Session) -> None:
            await session.clear()

        await self._run(clear)

    # -- branching -------------------------------------------------------------------------

    async def fork(
        self, new_session_id: str, at: Checkpoint | str | int | None = None
    ) -> LedgerSession:
        """A new ``LedgerSession`` standing on this one at ``at`` (a ``Checkpoint``, a
        label or a seq; default the head): the SDK's branching
        (``AdvancedSQLiteSession.create_branch_from_turn``) as a ledger fork, one pointer
        event, nothing copied. This session goes on unaffected; the new one has the same
        ledger (or dsn), budget, model, config and settings."""

        async def fork(session: Session) -> None:
            try:
                await session.fork(new_session_id, at)
            except _BAD_INPUT as exc:
                raise UserError(str(exc)) from exc

        await self._run(fork)
        return LedgerSession(
            new_session_id,
            ledger=self._ledger,
            dsn=self._dsn,
            token_budget=self.token_budget,
            model=self._model,
            config=self._config,
            session_settings=self.session_settings,
        )

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> _Closed:
        """Close what this session opened (its loop thread and pool, the ledger from
        ``dsn=``); a ``ledger=`` given stays open. Call it plainly, as the SDK's stores
        are closed, or await it. The session opens them again if used afterwards."""
        with self._guard:
            own, self._own = self._own, None
        if own is not None and own.thread is not None:
            if own.ledger is not None and own.thread.alive:
                own.thread.run_sync(own.ledger.close())
            own.thread.stop()
        return _Closed()

    async def aclose(self) -> None:
        """``close()`` without blocking the calling loop while the pool closes."""
        with self._guard:
            own, self._own = self._own, None
        if own is not None and own.thread is not None:
            if own.ledger is not None and own.thread.alive:
                await own.thread.run_async(own.ledger.close())
            own.thread.stop()


async def _same(session: Session) -> Session:
    return session


#: events that leave the view as a rollback to before the last item expects
_PLAIN = frozenset({"message.appended", "checkpoint.created", "session.rolled_back"})


async def _rolls_back(session: Session, view: Sequence[Any], head: int) -> bool:
    """Whether the view is the view right after its last item's own append, so a
    rollback to just before that append is the view without it: the item was appended
    alone (``message.appended``), nothing in the view is newer, and nothing after it
    rewrote the view (a summary, compaction, replacement, clear or settings change)."""
    last = view[-1]
    if last.kind != "message" or last.ref[1] != 0 or last.seq <= 1:
        return False
    if any(i.seq > last.seq for i in view):
        return False
    events = [e async for e in session.events(last.seq, head)]
    return (
        bool(events)
        and events[0].type == "message.appended"
        and all(e.type in _PLAIN for e in events)
    )


async def _pop(session: Session) -> dict[str, Any] | None:
    """``pop_item`` on the handle where the ledger lives (see ``LedgerSession.pop_item``)."""
    for _ in range(_POP_RETRIES):
        head = (await session.refresh()).head
        view = await session.view_items()
        if not view:
            return None
        last = view[-1]
        items = _from_message(last.message)
        try:
            if len(items) == 1 and await _rolls_back(session, view, head):
                await session.rollback(last.seq - 1, expected_seq=head)
            else:
                # a summary, a replaced view, or a call group that keeps its other items:
                # the view without the item, in one event
                rest = [dict(i.message) for i in view[:-1]]
                rest += [_to_message(g) for g in _groups(items[:-1])]
                await session.set_messages(rest, expected_seq=head)
        except ConcurrencyError:
            continue
        return items[-1] if items else None
    raise ConcurrencyError(
        f"pop_item lost {_POP_RETRIES} races in a row to other writers of "
        f"{session.session_id!r}; retry it",
        session_id=session.session_id,
    )
