"""LangChain and LangGraph: chat history and agent memory kept in a contextledger.

- ``LedgerChatMessageHistory``: a ``BaseChatMessageHistory`` (sync and async). Each
  history is one ledger session; each LangChain message is one ledger message, an
  OpenAI-chat rendition (so the ledger's views, budgets, recall and summaries work on
  it) carrying the LangChain message itself under ``"lc"`` (``message_to_dict``'s form
  as JSON text), which is what comes back: lossless for every message type,
  ``additional_kwargs``, ``response_metadata``, ids and content blocks.
- ``LedgerAgentMemory``: for LangGraph agents, a ``pre_model_hook`` that records the new
  messages and hands the model the ledger's view fitted to the token budget, and a
  ``post_model_hook`` that records the reply. Run the agent without a checkpointer
  (or with ``InMemorySaver`` for interrupts within a run): the conversation lives in the
  ledger, one row per message, instead of a full copy of the state per step. Why hooks
  rather than a ``BaseCheckpointSaver``: a checkpointer is handed the whole state at
  every step and cannot shape what the model sees; the hooks store only what is new
  and fit the prompt, and the ledger brings its own checkpoints and rollback.

Where the work runs: with ``dsn=``, every call (sync and async) runs on a loop thread of
the adapter's own, where the ledger is opened, so the caller's loop never blocks opening
a pool and any thread or loop may call (``asyncio.run`` after ``asyncio.run``
included). With ``ledger=``, the async methods run on the caller's loop (the ledger's)
and the sync ones on that loop thread with a pool of its own (on the ``dsn`` of the
ledger given; a ``memory://`` ledger is shared). The sync methods work from plain sync
code and from inside a running event loop (which waits for them, as for any sync call:
prefer the ``a*`` methods there), on every store.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from contextledger import (
    Checkpoint,
    InvalidArgument,
    InvalidMessage,
    Ledger,
    OwnedLedger,
    Session,
)
from contextledger.adapters._loops import LoopThread
from contextledger.extras import missing_extra

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        FunctionMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.runnables import RunnableConfig, RunnableLambda
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing_extra("langchain", "langchain-core") from exc

__all__ = [
    "InvalidLangChainMessage",
    "LedgerAgentMemory",
    "LedgerChatMessageHistory",
    "from_ledger_message",
    "to_ledger_message",
]

T = TypeVar("T")

#: ChatMessage roles kept as they are (tool and function need ids a ChatMessage lacks)
_CHAT_ROLES = {"user", "assistant", "system", "developer"}


class InvalidLangChainMessage(InvalidMessage, ValueError):
    """A message the ledger cannot hold (not JSON, unknown type): nothing was written.

    A ``ValueError`` too, as LangChain raises for bad messages."""


# -- messages ------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    out: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, str):
            out.append(block)
        elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
            out.append(block["text"])
    return "\n".join(out)


def _role(message: BaseMessage) -> str:
    kind = message.type
    if kind in ("human", "HumanMessageChunk"):
        return "user"
    if kind in ("ai", "AIMessageChunk"):
        return "assistant"
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, ToolMessage):
        return "tool" if message.tool_call_id else "user"
    if isinstance(message, FunctionMessage):
        return "function"
    if isinstance(message, ChatMessage):
        return message.role if message.role in _CHAT_ROLES else "user"
    return "user"


def to_ledger_message(message: BaseMessage) -> dict[str, Any]:
    """The ledger message for ``message``: a chat rendition plus the message itself."""
    if not isinstance(message, BaseMessage):
        raise InvalidLangChainMessage(
            f"expected a LangChain BaseMessage, not {type(message).__name__}", field="message"
        )
    role = _role(message)
    chat: dict[str, Any] = {"role": role, "content": _text(message.content)}
    if isinstance(message, AIMessage) and message.tool_calls:
        chat["tool_calls"] = [
            {
                "id": call.get("id") or f"call_{n}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call.get("args", {}), default=str),
                },
            }
            for n, call in enumerate(message.tool_calls)
        ]
    if role == "tool":
        chat["tool_call_id"] = message.tool_call_id  # type: ignore[attr-defined]
    if role == "function":
        chat["name"] = message.name
    # as JSON text: a flat message, which the ledger's request path copies shallowly
    chat["lc"] = json.dumps(
        message_to_dict(message), ensure_ascii=False, allow_nan=False, separators=(",", ":")
    )
    return chat


def from_ledger_message(message: Mapping[str, Any]) -> BaseMessage:
    """The LangChain message a ledger message holds (or the one its chat form makes:
    summaries and recalled context the ledger wrote itself carry no ``"lc"``)."""
    original = message.get("lc")
    if isinstance(original, str):
        return messages_from_dict([json.loads(original)])[0]
    chat = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "name")}
    chat.setdefault("content", "")
    if chat.get("role") == "tool":
        chat["tool_call_id"] = message.get("tool_call_id", "")
    return convert_to_messages([chat])[0]


def _checked(messages: Any) -> list[dict[str, Any]]:
    if isinstance(messages, BaseMessage | str | bytes) or not isinstance(messages, Sequence):
        raise InvalidLangChainMessage("add_messages takes a list of messages", field="messages")
    out = []
    for m in messages:
        try:
            out.append(to_ledger_message(m))
        except InvalidLangChainMessage:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidLangChainMessage(str(exc), field="message") from exc
    return out


# -- the sync bridge -------------------------------------------------------------------


class _Ledgers:
    """Where the ledger work runs. With ``dsn=``: everything (sync and async) on a loop
    thread of its own, where the ledger is opened, so the caller's loop never opens a
    pool (blocking file and socket calls) and any loop, thread or plain sync code may
    call. With ``ledger=``: the async methods on the caller's loop (the ledger's), the
    sync ones on that loop thread with a pool of its own on the ledger's PostgreSQL dsn
    (a ``memory://`` ledger is one in-process store, shared). Closes only what it
    opened."""

    def __init__(self, ledger: Ledger | None, dsn: str | None) -> None:
        source = OwnedLedger(ledger, dsn)
        self.given = source.given
        self.dsn = source.dsn
        self.bridge: LoopThread | None = None
        #: the bridge's own ledger: opened on the bridge loop at first use, closed there
        self.bridge_ledger: OwnedLedger | None = None
        self._lock = threading.Lock()

    def _memory(self) -> bool:
        dsn = self.dsn or (self.given.dsn if self.given is not None else None)
        return not dsn or dsn.startswith("memory:")

    def _bridge(self) -> LoopThread:
        with self._lock:
            if self.bridge is None or not self.bridge.alive:
                self.bridge = LoopThread("contextledger-langchain")
                target = self.dsn or (self.given.dsn if self.given is not None else None)
                self.bridge_ledger = OwnedLedger(dsn=target) if target else None
            return self.bridge

    async def for_loop(self) -> Ledger:
        """The ledger for the running loop: the bridge's (opened there on first use), or
        the one given."""
        bridge = self.bridge
        on_bridge = bridge is not None and asyncio.get_running_loop() is bridge.loop
        if not on_bridge or (self.given is not None and self._memory()):
            assert self.given is not None, "with dsn= the ledger is used on the bridge only"
            return self.given
        assert self.bridge_ledger is not None, "a bridge has a ledger of its own"
        return await self.bridge_ledger.get()

    async def call(self, coro_fn: Callable[[], Awaitable[T]]) -> T:
        """Run from async code: on the bridge with ``dsn=`` (the caller's loop keeps
        running meanwhile), else on the caller's loop."""
        if self.given is not None:
            return await coro_fn()
        bridge = self._bridge()
        if asyncio.get_running_loop() is bridge.loop:
            return await coro_fn()

        async def on_bridge() -> T:
            return await coro_fn()

        return await bridge.run_async(on_bridge())

    def run(self, coro_fn: Callable[[], Awaitable[T]]) -> T:
        """Run on the bridge and wait: from plain sync code or from inside a running loop
        (which waits, as any sync call does)."""

        async def on_bridge() -> T:
            return await coro_fn()

        return self._bridge().run_sync(on_bridge())

    async def aclose(self) -> None:
        with self._lock:
            bridge, self.bridge = self.bridge, None
            ledger, self.bridge_ledger = self.bridge_ledger, None
        if bridge is not None:
            if ledger is not None and bridge.alive:
                await bridge.run_async(ledger.close())
            bridge.stop()

    def close_bridge(self) -> None:
        with self._lock:
            bridge, self.bridge = self.bridge, None
            ledger, self.bridge_ledger = self.bridge_ledger, None
        if bridge is not None:
            if ledger is not None and bridge.alive:
                bridge.run_sync(ledger.close())
            bridge.stop()


# -- chat history ------------------------------------------------------------------------


class LedgerChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history in a ledger session named ``session_id``.

    ``LedgerChatMessageHistory("user-42", ledger=ledger)`` or ``(..., dsn="postgresql://…")``;
    ``model`` is recorded on the session (its window sets budgets). ``messages`` is the
    session's branch (everything since the last ``clear``); ``aget_messages(token_budget=…)``
    is the view fitted to a budget instead.
    """

    def __init__(
        self,
        session_id: str,
        *,
        ledger: Ledger | None = None,
        dsn: str | None = None,
        model: str | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidArgument("session_id must be a non-empty string", field="session_id")
        self.session_id = session_id
        self.model = model
        self._ledgers = _Ledgers(ledger, dsn)
        self._owns_ledgers = True
        self._sessions: dict[int, tuple[Ledger, Session]] = {}

    @classmethod
    def _sharing(cls, session_id: str, ledgers: _Ledgers, model: str | None) -> Any:
        """A history on another's ledgers (one pool for all of an agent's threads)."""
        history = cls.__new__(cls)
        history.session_id, history.model = session_id, model
        history._ledgers, history._owns_ledgers = ledgers, False
        history._sessions = {}
        return history

    async def session(self) -> Session:
        """The ledger session behind this history (for checkpoints, rollback, verify…).
        With ``dsn=`` it is the handle on the history's own loop thread, where its ledger
        lives (pass ``ledger=`` to use a ``Session`` from your own loop)."""
        return await self._ledgers.call(self._session)

    async def _session(self) -> Session:
        ledger = await self._ledgers.for_loop()
        hit = self._sessions.get(id(ledger))
        if hit is None or hit[0] is not ledger:
            hit = (ledger, await ledger.session(self.session_id, model=self.model))
            self._sessions[id(ledger)] = hit
        return hit[1]

    # async

    async def aget_messages(self, token_budget: int | None = None) -> list[BaseMessage]:
        return await self._ledgers.call(lambda: self._get(token_budget))

    async def _get(self, token_budget: int | None = None) -> list[BaseMessage]:
        session = await self._session()
        if token_budget is None:
            rows = await session.get_messages()
            return [from_ledger_message(m) for m in rows if "lc" in m]
        view = await session.get_messages_for_request(token_budget=token_budget)
        return [from_ledger_message(m) for m in view]

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        rows = _checked(messages)
        await self._ledgers.call(lambda: self._add_rows(rows))

    async def aclear(self) -> None:
        await self._ledgers.call(self._clear)

    async def _clear(self) -> None:
        await (await self._session()).clear()

    async def aclose(self) -> None:
        """Close what this history opened (its pools); a ``ledger=`` given stays open."""
        self._sessions.clear()
        if self._owns_ledgers:
            await self._ledgers.aclose()

    # sync

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return self._ledgers.run(self._get)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        rows = _checked(messages)
        self._ledgers.run(lambda: self._add_rows(rows))

    async def _add_rows(self, rows: list[dict[str, Any]]) -> None:
        """All or nothing: the ledger checks every message before it writes one."""
        session = await self._session()
        try:
            await session.add_messages(rows)
        except InvalidMessage as exc:
            raise InvalidLangChainMessage(str(exc.args[0]), **exc.details) from exc

    def clear(self) -> None:
        self._ledgers.run(self._clear)

    def close(self) -> None:
        """Sync ``aclose`` for the sync bridge (its thread and pool)."""
        if self._owns_ledgers:
            self._ledgers.close_bridge()


# -- LangGraph ---------------------------------------------------------------------------


class LedgerAgentMemory:
    """Conversation memory for LangGraph agents, one ledger session per ``thread_id``.

    ``create_react_agent(model, tools, pre_model_hook=memory.pre_model_hook,
    post_model_hook=memory.post_model_hook)``, invoked with
    ``{"configurable": {"thread_id": …}}`` and only the new input messages. The model
    sees the ledger's view of the thread fitted to ``token_budget`` (default: the
    model's window, see the session config); the state keeps only this run's messages.
    """

    def __init__(
        self,
        *,
        ledger: Ledger | None = None,
        dsn: str | None = None,
        model: str | None = None,
        token_budget: int | None = None,
        session_prefix: str = "langgraph:",
    ) -> None:
        self.model = model
        self._ledgers = _Ledgers(ledger, dsn)
        self.token_budget = token_budget
        self.session_prefix = session_prefix
        self._histories: dict[str, LedgerChatMessageHistory] = {}
        #: message ids recorded per thread (in this process; idempotency keys cover others)
        self._recorded: dict[str, set[str]] = {}
        #: ledger message text -> LangChain message: a request converts only what is new
        self._converted: dict[str, BaseMessage] = {}
        self.pre_model_hook: RunnableLambda[Any, dict[str, Any]] = RunnableLambda(
            self._pre_sync, afunc=self._pre, name="contextledger_pre_model_hook"
        )
        self.post_model_hook: RunnableLambda[Any, dict[str, Any]] = RunnableLambda(
            self._post_sync, afunc=self._post, name="contextledger_post_model_hook"
        )

    def history(self, thread_id: str) -> LedgerChatMessageHistory:
        """The chat history of one thread (the same ledger session the hooks write)."""
        history = self._histories.get(thread_id)
        if history is None:
            history = LedgerChatMessageHistory._sharing(
                self.session_prefix + thread_id, self._ledgers, self.model
            )
            self._histories[thread_id] = history
        return history

    async def afork(
        self, thread_id: str, new_thread_id: str, at: Checkpoint | str | int | None = None
    ) -> None:
        """Time travel for the memory: ``new_thread_id`` starts with ``thread_id``'s memory
        as it was at ``at`` (a ``Checkpoint``, a label or a seq; default now) and goes on
        on its own, a ledger fork (one pointer event, nothing copied). Invoke the graph
        with ``{"configurable": {"thread_id": new_thread_id}}`` to continue from there;
        ``thread_id`` is unaffected. ``SessionNotFound`` if ``thread_id`` has no memory
        (nothing written), ``SessionExists`` if ``new_thread_id`` has."""
        await self._ledgers.call(lambda: self._fork_here(thread_id, new_thread_id, at))

    def fork(
        self, thread_id: str, new_thread_id: str, at: Checkpoint | str | int | None = None
    ) -> None:
        """``afork`` from sync code."""
        self._ledgers.run(lambda: self._fork_here(thread_id, new_thread_id, at))

    async def _fork_here(
        self, thread_id: str, new_thread_id: str, at: Checkpoint | str | int | None
    ) -> None:
        # the ledger's fork, not the thread's history: opening that would create the
        # source session (a typo'd thread id then forked an empty session it made)
        ledger = await self._ledgers.for_loop()
        await ledger.fork(
            self.session_prefix + thread_id, self.session_prefix + new_thread_id, at=at
        )

    async def aclose(self) -> None:
        """Close what this memory opened (from ``dsn=``; a ``ledger=`` given stays open)."""
        self._histories.clear()
        await self._ledgers.aclose()

    def close(self) -> None:
        """Stop the sync bridge (after sync ``invoke`` runs)."""
        self._ledgers.close_bridge()

    @staticmethod
    def _thread(config: RunnableConfig | None) -> str:
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        if thread is None:
            raise InvalidArgument(
                "LedgerAgentMemory needs a thread_id: invoke with "
                '{"configurable": {"thread_id": ...}}',
                field="thread_id",
            )
        return str(thread)

    async def _record(self, thread: str, messages: Sequence[BaseMessage]) -> Session:
        session = await self.history(thread)._session()
        seen = self._recorded.setdefault(thread, set())
        for message in messages:
            if message.id is None:
                message.id = str(uuid.uuid4())
            if message.id in seen:
                continue
            try:
                await session.add_message(
                    to_ledger_message(message), idempotency_key=f"lc:{message.id}"
                )
            except InvalidMessage as exc:
                raise InvalidLangChainMessage(str(exc.args[0]), **exc.details) from exc
            seen.add(message.id)
        return session

    @staticmethod
    def _messages(state: Any) -> list[BaseMessage]:
        messages = state.get("messages") if isinstance(state, Mapping) else state.messages
        return list(messages or [])

    async def _pre(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return await self._ledgers.call(lambda: self._pre_here(state, config))

    async def _pre_here(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        thread = self._thread(config)
        session = await self._record(thread, self._messages(state))
        view = await session.get_messages_for_request(token_budget=self.token_budget)
        return {"llm_input_messages": [self._convert(m) for m in view]}

    def _convert(self, message: Mapping[str, Any]) -> BaseMessage:
        key = message.get("lc")
        if not isinstance(key, str):
            return from_ledger_message(message)
        hit = self._converted.get(key)
        if hit is None:
            if len(self._converted) > 20_000:  # bounded: a few views' worth
                self._converted.clear()
            hit = self._converted[key] = from_ledger_message(message)
        return hit

    async def _post(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return await self._ledgers.call(lambda: self._post_here(state, config))

    async def _post_here(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        await self._record(self._thread(config), self._messages(state)[-1:])
        return {}

    def _pre_sync(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return self._ledgers.run(lambda: self._pre_here(state, config))

    def _post_sync(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return self._ledgers.run(lambda: self._post_here(state, config))
