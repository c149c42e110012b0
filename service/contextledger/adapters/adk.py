"""Google ADK: ``LedgerSessionService``, a ``BaseSessionService`` kept in a contextledger.

ADK's own stores read every event of a session on each turn (``DatabaseSessionService``)
and, before ADK added revision markers, let two writers interleave into one history
(ADK #4751). Here each ADK session is one ledger session, so it is hash-chained,
replayable and checkpointable, and every append is pinned to the head it was read at:
a write from a stale ``Session`` object is refused with ADK's ``StaleSessionError``.

Layout (ledger session ids; each part percent-encoded, so ``:`` and ``/`` are safe):

- ``adk:{app}:{user}:{session}``: the session. A ``created`` marker message opens it
  (initial session-scope state), then one message per ADK event, then perhaps a
  ``deleted`` tombstone (deleting appends it: the ledger is append-only; a later
  ``create_session`` with the same id appends a new ``created`` marker). Each event
  message is an OpenAI-chat rendition (role, text; function calls and responses as text,
  so the ledger's view, recall and budgets work on it) with the ADK event under
  ``"adk"`` as ``Event.model_dump(mode="json", exclude_none=True)`` writes it (what
  ADK's own ``DatabaseSessionService`` stores; defaults left out too), plus the
  session-scope state: in full when the event changed it, else ``state_at`` (the seq
  of the message that holds it). So reading a session never folds the history: the
  tail gives the state, and ``GetSessionConfig`` reads only the events asked for.
- ``adk-app:{app}`` and ``adk-user:{app}:{user}``: ``app:`` and ``user:`` state, one
  snapshot message per change (read-modify-write pinned to the head, retried on a race).

``temp:`` keys reach the in-memory ``Session`` but are never stored, as in ADK.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from contextledger import (
    ConcurrencyError,
    InvalidArgument,
    Ledger,
    OwnedLedger,
    Session,
    SessionExists,
    SessionNotFound,
)
from contextledger.extras import missing_extra

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions import BaseSessionService, State
    from google.adk.sessions import Session as AdkSession
    from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing_extra("adk", "google-adk") from exc

__all__ = ["InvalidAdkArgument", "LedgerSessionService", "copy_session", "ledger_session_id"]

_STALE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
#: events read per round trip when walking back from the tail
_PAGE = 128
#: attempts at a read-modify-write of app/user state before giving up
_STATE_RETRIES = 8


#: the ledger's limit on a session id
_MAX_ID = 200


class InvalidAdkArgument(InvalidArgument, ValueError):
    """An app, user or session id the ledger cannot hold; nothing was written.

    A ``ValueError`` too, as ADK's services raise for bad arguments."""


def _part(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidAdkArgument(f"ids must be non-empty strings, not {value!r}", field="id")
    return quote(value, safe="")


def ledger_session_id(app_name: str, user_id: str, session_id: str) -> str:
    """The ledger session that holds ADK session ``(app_name, user_id, session_id)``."""
    lid = f"adk:{_part(app_name)}:{_part(user_id)}:{_part(session_id)}"
    if len(lid) > _MAX_ID:
        raise InvalidAdkArgument(
            f"app, user and session ids take {len(lid)} characters encoded as {lid[:40]!r}…; "
            f"the ledger holds at most {_MAX_ID}",
            field="session_id",
        )
    return lid


def _app_state_id(app_name: str) -> str:
    return f"adk-app:{_part(app_name)}"


def _user_state_id(app_name: str, user_id: str) -> str:
    return f"adk-user:{_part(app_name)}:{_part(user_id)}"


def _split_state(state: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """ADK's prefix rules: ``app:``/``user:`` are shared, ``temp:`` is never stored."""
    out: dict[str, dict[str, Any]] = {"app": {}, "user": {}, "session": {}}
    for key, value in (state or {}).items():
        if key.startswith(State.APP_PREFIX):
            out["app"][key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            out["user"][key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            out["session"][key] = value
    return out


def _jsonable(value: dict[str, Any]) -> dict[str, Any]:
    """State as JSON data, as ADK's database services keep it: datetimes, models... as
    pydantic writes them, and only when that fails, each value JSON cannot hold (a
    callable) as its string form (ADK's ``make_json_safe_state``)."""
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    out: dict[str, Any]
    try:
        out = to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError):
        out = to_jsonable_python(value, serialize_unknown=True)
    return out


def _merge(
    session_state: Mapping[str, Any], app: Mapping[str, Any], user: Mapping[str, Any]
) -> dict[str, Any]:
    merged = dict(session_state)
    merged.update({State.APP_PREFIX + k: v for k, v in app.items()})
    merged.update({State.USER_PREFIX + k: v for k, v in user.items()})
    return merged


def _chat_text(event: Event) -> str:
    """What the event said, as text: parts' text, function calls and their results."""
    pieces: list[str] = []
    for part in (event.content.parts or []) if event.content else []:
        if part.text is not None and not part.thought:
            pieces.append(part.text)
        elif part.function_call is not None:
            args = json.dumps(part.function_call.args or {}, default=str, sort_keys=True)
            pieces.append(f"[call {part.function_call.name}({args})]")
        elif part.function_response is not None:
            result = json.dumps(part.function_response.response or {}, default=str)
            pieces.append(f"[{part.function_response.name} returned {result}]")
    return "\n".join(pieces)


def event_message(event: Event) -> dict[str, Any]:
    """The ledger message for ``event``: a chat rendition plus the event itself."""
    role = "user" if event.content is not None and event.content.role == "user" else "assistant"
    message: dict[str, Any] = {"role": role, "content": _chat_text(event)}
    message["adk"] = {
        "event": event.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    }
    return message


class _Tail:
    """What the last marker or event of a ledger session says."""

    def __init__(self, head: int) -> None:
        self.head = head
        self.deleted = False
        self.exists = False
        self.state: dict[str, Any] | None = None
        self.state_at: int | None = None
        self.updated = 0.0
        self.last_event_id: str | None = None


def _adk_part(event: Any) -> dict[str, Any] | None:
    if event.type != "message.appended":
        return None
    message = event.payload.message
    adk = message.get("adk") if isinstance(message, Mapping) else None
    return adk if isinstance(adk, dict) else None


class LedgerSessionService(BaseSessionService):
    """ADK sessions in a contextledger ledger.

    ``LedgerSessionService(ledger=ledger)`` uses an open ``Ledger`` (its owner closes
    it); ``LedgerSessionService(dsn="postgresql://...")`` opens one on first use and
    ``close()`` closes it. ``model`` is recorded on the ledger sessions (token budgets).
    """

    def __init__(
        self,
        *,
        ledger: Ledger | None = None,
        dsn: str | None = None,
        model: str | None = None,
    ) -> None:
        self._source = OwnedLedger(
            ledger, dsn, error=lambda m: InvalidAdkArgument(m, field="ledger")
        )
        self._model = model
        self._handles: dict[str, Session] = {}
        #: ledger id -> (head, seq holding the session state, that state)
        self._states: dict[str, tuple[int, int, dict[str, Any]]] = {}

    async def _get_ledger(self) -> Ledger:
        return await self._source.get()

    async def close(self) -> None:
        """Close the ledger if this service opened it (from ``dsn=``)."""
        await self._source.close()

    async def __aenter__(self) -> LedgerSessionService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- ledger plumbing -----------------------------------------------------------------

    async def _handle(self, lid: str) -> tuple[Session, int] | None:
        """The ledger session ``lid`` and its head now (None if absent).

        A cached handle is not refreshed (that would make its next append re-read the
        view's tail): the head comes from ``ledger.anchor``, and appends are pinned to
        the head they were decided at with ``expected_seq`` whatever the handle saw.
        """
        ledger = await self._get_ledger()
        handle = self._handles.get(lid)
        try:
            if handle is None:
                handle = await ledger.session(lid, create=False)
                self._handles[lid] = handle
                return handle, handle.head
            return handle, (await ledger.anchor(lid)).seq
        except SessionNotFound:
            self._handles.pop(lid, None)
            return None

    async def _create_handle(self, lid: str, metadata: dict[str, Any]) -> Session:
        ledger = await self._get_ledger()
        handle = await ledger.session(lid, model=self._model, metadata=metadata)
        self._handles[lid] = handle
        return handle

    async def _tail(self, handle: Session, head: int) -> _Tail:
        """The state and status at ``head``, reading back only as far as needed."""
        tail = _Tail(head)
        to = head
        while to >= 1 and not tail.exists:
            start = max(1, to - 7)
            for ev in reversed([e async for e in handle.events(start, to)]):
                adk = _adk_part(ev)
                if adk is None:
                    continue
                self._read_marker(tail, adk, ev.seq)
                break
            to = start - 1
        if tail.exists and tail.state is None and tail.state_at is not None:
            tail.state = await self._state_at(handle, tail.state_at)
        return tail

    @staticmethod
    def _read_marker(tail: _Tail, adk: Mapping[str, Any], seq: int) -> None:
        tail.exists = True
        if "deleted" in adk:
            tail.deleted = True
            tail.updated = float(adk["deleted"])
            return
        if "state" in adk:
            tail.state, tail.state_at = dict(adk["state"]), seq
        else:
            tail.state_at = int(adk["state_at"])
        if "event" in adk:
            tail.updated = float(adk["event"].get("timestamp", 0.0))
            tail.last_event_id = adk["event"].get("id")
        else:
            tail.updated = float(adk.get("created", 0.0))

    @staticmethod
    async def _state_at(handle: Session, seq: int) -> dict[str, Any]:
        async for ev in handle.events(seq, seq):
            adk = _adk_part(ev)
            if adk is not None and "state" in adk:
                return dict(adk["state"])
        return {}  # pragma: no cover - a state_at always names a snapshot

    async def _scoped_state(self, lid: str) -> dict[str, Any]:
        ref = await self._handle(lid)
        if ref is None or ref[1] < 2:
            return {}
        handle, head = ref
        async for ev in handle.events(head, head):
            adk = _adk_part(ev)
            if adk is not None:
                return dict(adk.get("state", {}))
        return {}

    async def _update_scoped(self, lid: str, delta: dict[str, Any], what: str) -> dict[str, Any]:
        """Merge ``delta`` into app or user state: read, merge, append pinned to the head."""
        if await self._handle(lid) is None:
            await self._create_handle(lid, {"adk": what})
        for _ in range(_STATE_RETRIES):
            ref = await self._handle(lid)
            assert ref is not None
            handle, head = ref
            current: dict[str, Any] = {}
            async for ev in handle.events(head, head):
                adk = _adk_part(ev)
                current = dict(adk.get("state", {})) if adk is not None else {}
            state = {**current, **delta}
            message = {"role": "system", "content": f"ADK {what} state", "adk": {"state": state}}
            try:
                await handle.add_message(message, expected_seq=head)
            except ConcurrencyError:
                continue
            return state
        raise StaleSessionError(f"{what} state kept changing under this write; retry it")

    async def _apply_shared(
        self, app_name: str, user_id: str, deltas: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if deltas["app"]:
            app = await self._update_scoped(_app_state_id(app_name), deltas["app"], "app")
        else:
            app = await self._scoped_state(_app_state_id(app_name))
        if deltas["user"]:
            user = await self._update_scoped(
                _user_state_id(app_name, user_id), deltas["user"], "user"
            )
        else:
            user = await self._scoped_state(_user_state_id(app_name, user_id))
        return app, user

    # -- BaseSessionService --------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AdkSession:
        sid = session_id if session_id is not None else str(uuid.uuid4())
        lid = ledger_session_id(app_name, user_id, sid)
        ref = await self._handle(lid)
        if ref is not None:
            handle, head = ref
            tail = await self._tail(handle, head)
            if tail.exists and not tail.deleted:
                raise AlreadyExistsError(f"Session with id {sid} already exists.")
        else:
            meta = {"adk": {"app_name": app_name, "user_id": user_id, "session_id": sid}}
            handle = await self._create_handle(lid, meta)
            head = handle.head
        deltas = _split_state(_jsonable(dict(state or {})))
        now = time.time()
        marker = {
            "role": "system",
            "content": f"ADK session {sid} of user {user_id} in app {app_name}",
            "adk": {"created": now, "state": deltas["session"]},
        }
        try:
            seq = await handle.add_message(marker, expected_seq=head)
        except ConcurrencyError as exc:  # created (or written) concurrently
            raise AlreadyExistsError(f"Session with id {sid} already exists.") from exc
        assert seq is not None
        self._states[lid] = (seq, seq, deltas["session"])
        app, user = await self._apply_shared(app_name, user_id, deltas)
        session = AdkSession(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=_merge(deltas["session"], app, user),
            last_update_time=now,
        )
        session._storage_update_marker = str(seq)
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> AdkSession | None:
        lid = ledger_session_id(app_name, user_id, session_id)
        ref = await self._handle(lid)
        if ref is None:
            return None
        handle, head = ref
        limit = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        tail: _Tail | None = None
        events: list[Event] = []
        collecting = limit != 0
        page = _PAGE if limit is None else min(_PAGE, limit + 2)
        to, done = head, False
        while to >= 1 and not done:
            start = max(1, to - page + 1)
            for ev in reversed([e async for e in handle.events(start, to)]):
                adk = _adk_part(ev)
                if adk is None:
                    continue
                if tail is None:
                    tail = _Tail(head)
                    self._read_marker(tail, adk, ev.seq)
                    if tail.deleted:
                        return None
                if "event" not in adk:  # the created marker: the session starts here
                    done = True
                    break
                if collecting:
                    event = Event.model_validate(adk["event"])
                    if after is not None and event.timestamp < after:
                        collecting = False
                    else:
                        events.append(event)
                        collecting = limit is None or len(events) < limit
                if not collecting:
                    done = True
                    break
            to = start - 1
        if tail is None:
            return None
        assert tail.state_at is not None
        if tail.state is None:
            held = self._states.get(lid)
            if held is not None and held[0] == head:
                tail.state = held[2]
            else:
                tail.state = await self._state_at(handle, tail.state_at)
        self._states[lid] = (head, tail.state_at, tail.state)
        app = await self._scoped_state(_app_state_id(app_name))
        user = await self._scoped_state(_user_state_id(app_name, user_id))
        events.reverse()
        session = AdkSession(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merge(tail.state, app, user),
            events=events,
            last_update_time=tail.updated,
        )
        session._storage_update_marker = str(head)
        return session

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        prefix = f"adk:{_part(app_name)}:" + (f"{_part(user_id)}:" if user_id is not None else "")
        app = await self._scoped_state(_app_state_id(app_name))
        users: dict[str, dict[str, Any]] = {}
        sessions: list[AdkSession] = []
        for info in await (await self._get_ledger()).sessions():
            if not info.session_id.startswith(prefix):
                continue
            meta = info.metadata.get("adk") if isinstance(info.metadata, Mapping) else None
            if not isinstance(meta, Mapping):
                continue
            ref = await self._handle(info.session_id)
            if ref is None:
                continue
            tail = await self._tail(*ref)
            if not tail.exists or tail.deleted:
                continue
            uid = str(meta["user_id"])
            if uid not in users:
                users[uid] = await self._scoped_state(_user_state_id(app_name, uid))
            sessions.append(
                AdkSession(
                    id=str(meta["session_id"]),
                    app_name=app_name,
                    user_id=uid,
                    state=_merge(tail.state or {}, app, users[uid]),
                    last_update_time=tail.updated,
                )
            )
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Append a tombstone: the session is gone for ADK, its history stays audited
        (``contextledger purge`` removes it from the ledger for good)."""
        lid = ledger_session_id(app_name, user_id, session_id)
        ref = await self._handle(lid)
        if ref is None:
            return
        handle, _ = ref
        tail = await self._tail(*ref)
        if not tail.exists or tail.deleted:
            return
        tombstone = {
            "role": "system",
            "content": f"ADK session {session_id} deleted",
            "adk": {"deleted": time.time()},
        }
        await handle.add_message(tombstone)
        self._states.pop(lid, None)

    async def fork_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        new_session_id: str | None = None,
    ) -> AdkSession:
        """A new ADK session with this one's events and state so far, which then goes on
        on its own (what google/adk-python #4010 asks for): a ledger fork, copy-on-write,
        so nothing is copied however long the session is, and its history verifies
        through the source's. ``SessionNotFoundError`` if the source is absent or
        deleted, ``AlreadyExistsError`` if ``new_session_id`` is taken."""
        lid = ledger_session_id(app_name, user_id, session_id)
        await self._raise_if_gone(lid, session_id)
        sid = new_session_id if new_session_id is not None else str(uuid.uuid4())
        new_lid = ledger_session_id(app_name, user_id, sid)
        meta = {"adk": {"app_name": app_name, "user_id": user_id, "session_id": sid}}
        try:
            handle = await (await self._get_ledger()).fork(lid, new_lid, metadata=meta)
        except SessionExists as exc:
            raise AlreadyExistsError(f"Session with id {sid} already exists.") from exc
        self._handles[new_lid] = handle
        forked = await self.get_session(app_name=app_name, user_id=user_id, session_id=sid)
        assert forked is not None
        return forked

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await self._scoped_state(_user_state_id(app_name, user_id))

    async def _raise_if_gone(self, lid: str, session_id: str) -> None:
        """ADK's contract: appending to a session deleted (or never created) since it was
        read is ``SessionNotFoundError``, not a stale write."""
        ref = await self._handle(lid)
        tail = await self._tail(*ref) if ref is not None else None
        if tail is None or not tail.exists or tail.deleted:
            self._states.pop(lid, None)
            raise SessionNotFoundError(f"Session {session_id} not found.")

    async def append_event(self, session: AdkSession, event: Event) -> Event:
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        lid = ledger_session_id(session.app_name, session.user_id, session.id)
        marker = session._storage_update_marker
        cached = self._handles.get(lid) if marker is not None else None
        ref = (cached, int(marker)) if cached is not None and marker else await self._handle(lid)
        if ref is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        handle, head = ref
        if marker is None:
            # A Session this service did not hand out: accept it only if it has seen
            # everything stored (ADK's fallback for marker-less sessions).
            tail = await self._tail(handle, head)
            if not tail.exists or tail.deleted:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            seen = session.events[-1].id if session.events else None
            if seen != tail.last_event_id:
                raise StaleSessionError(_STALE)
            expected = head
        else:
            expected = int(marker)
        deltas = _split_state(_jsonable(dict(event.actions.state_delta or {})))
        held = self._states.get(lid)
        if held is not None and held[0] == expected:
            state_seq, state = held[1], held[2]
        else:
            at = await self._tail(handle, expected) if expected <= head else None
            if at is None or not at.exists or at.deleted or at.state_at is None:
                await self._raise_if_gone(lid, session.id)
                raise StaleSessionError(_STALE)
            state_seq, state = at.state_at, at.state or {}
        message = event_message(event)
        if deltas["session"]:
            state = {**state, **deltas["session"]}
            message["adk"]["state"] = state
        else:
            message["adk"]["state_at"] = state_seq
        try:
            seq = await handle.add_message(message, expected_seq=expected)
        except ConcurrencyError as exc:
            await self._raise_if_gone(lid, session.id)
            raise StaleSessionError(_STALE) from exc
        assert seq is not None
        if deltas["session"]:
            state_seq = seq
        self._states[lid] = (seq, state_seq, state)
        if deltas["app"] or deltas["user"]:
            await self._apply_shared(session.app_name, session.user_id, deltas)
        session._storage_update_marker = str(seq)
        session.last_update_time = event.timestamp
        committed: Event = self._commit_event_to_session(session, event)
        return committed


async def copy_session(
    source: BaseSessionService,
    target: BaseSessionService,
    *,
    app_name: str,
    user_id: str,
    session_id: str,
) -> AdkSession:
    """Copy one ADK session between any two session services, either way: out of
    ADK's ``DatabaseSessionService`` into the ledger, or back. The target is created
    with the source's current state, then every event is appended in order (their
    state deltas end where the source's state is). ``AlreadyExistsError`` if the
    target has the id; ``SessionNotFoundError`` if the source has not."""
    found = await source.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
    if found is None:
        raise SessionNotFoundError(f"Session {session_id} not found.")
    copied = await target.create_session(
        app_name=app_name, user_id=user_id, state=dict(found.state), session_id=session_id
    )
    for event in found.events:
        await target.append_event(copied, event.model_copy(deep=True))
    return copied
