"""Export / import: a session moves between ledgers with its chain intact, or not at all."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger import InvalidImport, Ledger, SessionExists, SessionNotFound
from contextledger.transfer import export_lines, import_lines

CLI = str(Path(sys.executable).with_name("contextledger"))
_ids = itertools.count()


async def _history(ledger: Ledger, session_id: str) -> None:
    """A session with every kind of event an agent produces."""
    s = await ledger.session(session_id, model="gpt-4o", metadata={"owner": "ada"})
    await s.add_message({"role": "system", "content": "Be terse."})
    await s.add_message({"role": "user", "content": "Weather in Oslo? ✓"}, idempotency_key="k1")
    await s.add_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        }
    )
    await s.add_message({"role": "tool", "tool_call_id": "c1", "content": "4.5 C"})
    mark = await s.checkpoint("mid")
    await s.add_message({"role": "assistant", "content": "4.5 C, rain."})
    await s.rollback(mark)
    await s.add_message({"role": "assistant", "content": "It is 4.5 C."})
    await s.record_summary(2, 4, "asked for Oslo's weather; 4.5 C")
    await s.update_config({"keep_recent": 4})
    await s.add_message({"role": "user", "content": "thanks", "score": 0.5})


async def _export(ledger: Ledger, session_id: str) -> list[str]:
    return [line async for line in export_lines(ledger, session_id)]


async def test_round_trip_between_stores_keeps_every_hash(ledger: Ledger, pg_dsn: str) -> None:
    await _history(ledger, "moving")
    lines = await _export(ledger, "moving")
    source = await ledger.session("moving", create=False)
    rows = [json.loads(line) for line in lines]
    assert [r["seq"] for r in rows] == list(range(1, source.head + 1))
    assert rows[0]["prev_hash"] == "0" * 64
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(rows))
    for target_dsn in ("memory://", pg_dsn):
        if target_dsn == pg_dsn and ledger.store.kind != "memory":
            continue  # same database: covered by the new-id case below
        async with Ledger.open(target_dsn) as other:
            result = await import_lines(other, lines)
            assert (result.session_id, result.events) == ("moving", len(rows))
            assert result.last_hash == rows[-1]["hash"]  # same id: the very same chain
            moved = await other.session("moving", create=False)
            assert (await moved.verify()).ok
            assert await moved.view() == await source.view()
            assert await moved.get_messages() == await source.get_messages()
            # the same events, hashes and all (key order is the store's own)
            assert [json.loads(line) for line in await _export(other, "moving")] == rows
            assert moved.config.keep_recent == 4


async def test_import_under_a_new_id_rehashes_and_verifies(ledger: Ledger) -> None:
    await _history(ledger, "orig")
    lines = await _export(ledger, "orig")
    result = await import_lines(ledger, lines, session_id="copy")
    assert result.session_id == "copy" and result.source_session_id == "orig"
    assert result.last_hash != json.loads(lines[-1])["hash"]  # the id is in every hash
    copy = await ledger.session("copy", create=False)
    assert (await copy.verify()).ok
    assert await copy.view() == await (await ledger.session("orig")).view()
    assert [e.created_at async for e in copy.events()] == [
        e.created_at async for e in (await ledger.session("orig")).events()
    ]


async def test_an_existing_session_id_is_refused(ledger: Ledger) -> None:
    await _history(ledger, "taken")
    lines = await _export(ledger, "taken")
    head = (await ledger.session("taken")).head
    with pytest.raises(SessionExists):
        await import_lines(ledger, lines)
    assert (await ledger.session("taken")).head == head


def _tamper(lines: list[str], index: int, change: Any) -> list[str]:
    out = list(lines)
    record = json.loads(out[index])
    change(record)
    out[index] = json.dumps(record)
    return out


def _set(key: str, value: Any) -> Any:
    return lambda r: r.__setitem__(key, value)


@pytest.mark.parametrize(
    ("make", "line", "says"),
    [
        (
            lambda ls: _tamper(ls, 2, lambda r: r["payload"]["message"].update(content="forged")),
            3,
            "hash mismatch",
        ),
        (lambda ls: _tamper(ls, 4, _set("hash", "ab" * 32)), 5, "hash mismatch"),
        (lambda ls: _tamper(ls, 3, _set("prev_hash", "0" * 64)), 4, "prev_hash"),
        (lambda ls: [*ls[:2], *ls[3:]], 3, "expected seq 3"),
        (lambda ls: [*ls[:1], "{not json", *ls[1:]], 2, "not JSON"),
        (lambda ls: _tamper(ls, 1, lambda r: r.pop("tokens")), 2, "'tokens'"),
        (lambda ls: _tamper(ls, 1, _set("type", "message.teleported")), 2, "unknown event type"),
        (lambda ls: _tamper(ls, 1, _set("session_id", "other")), 2, "session 'other'"),
        (lambda ls: ls[1:], 1, "expected seq 1"),
        (lambda ls: [], 0, "no events"),
    ],
)
async def test_a_bad_file_names_its_line_and_writes_nothing(
    ledger: Ledger, make: Any, line: int, says: str
) -> None:
    await _history(ledger, "src")
    lines = make(await _export(ledger, "src"))
    with pytest.raises(InvalidImport) as info:
        await import_lines(ledger, lines, session_id="dest")
    assert info.value.details["line"] == line
    assert says in str(info.value)
    with pytest.raises(SessionNotFound):
        await ledger.session("dest", create=False)


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
_message = st.builds(
    lambda role, content, extra: {"role": role, "content": content, **extra},
    st.sampled_from(["user", "assistant", "system"]),
    _text,
    st.dictionaries(
        st.sampled_from(["score", "meta"]),
        st.floats(allow_nan=False, allow_infinity=False) | st.integers() | _text,
        max_size=1,
    ),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(messages=st.lists(_message, min_size=1, max_size=8), checkpoint_at=st.integers(0, 8))
async def test_export_import_is_lossless(
    ledger: Ledger, messages: list[dict[str, Any]], checkpoint_at: int
) -> None:
    sid = f"prop-{next(_ids)}"
    s = await ledger.session(sid)
    for n, m in enumerate(messages):
        if n == checkpoint_at:
            await s.checkpoint()
        await s.add_message(m)
    lines = await _export(ledger, sid)
    async with Ledger.open("memory://") as other:
        result = await import_lines(other, lines)
        assert result.last_hash == json.loads(lines[-1])["hash"]
        assert [json.loads(x) for x in await _export(other, sid)] == [json.loads(x) for x in lines]
        assert await (await other.session(sid)).get_messages() == await s.get_messages()


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTEXTLEDGER_DSN": dsn, "COLUMNS": "200"}
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


async def test_cli_export_and_import(pg_ledger: Ledger, pg_dsn: str, tmp_path: Path) -> None:
    await _history(pg_ledger, "cli-src")
    out = tmp_path / "cli-src.jsonl"
    done = _cli(pg_dsn, "export", "cli-src", "-o", str(out))
    assert done.returncode == 0, done.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines == await _export(pg_ledger, "cli-src")
    to_stdout = _cli(pg_dsn, "export", "cli-src")
    assert to_stdout.stdout.splitlines() == lines

    done = _cli(pg_dsn, "import", str(out), "--session", "cli-copy")
    assert done.returncode == 0, done.stderr
    assert "imported" in done.stdout and "chain ok" in done.stdout
    assert (await pg_ledger.verify("cli-copy")).ok

    again = _cli(pg_dsn, "import", str(out))
    assert again.returncode == 2 and "SESSION_EXISTS" in again.stderr

    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join(_tamper(lines, 2, _set("tokens", 999))) + "\n", encoding="utf-8")
    bad = _cli(pg_dsn, "import", str(forged), "--session", "cli-forged")
    assert bad.returncode == 2
    assert "[INVALID_IMPORT] line 3" in bad.stderr
    assert "cli-forged" not in {i.session_id for i in await pg_ledger.sessions()}
    missing = _cli(pg_dsn, "export", "nobody")
    assert missing.returncode == 2 and "SESSION_NOT_FOUND" in missing.stderr
