"""Sealing (store/sealing.py): the KEK from the operator, data keys, sealed event data."""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.chain import GENESIS_HASH, make_event, verify_chain
from contextledger.core.events import MessageAppended, MessagesReplaced, SummaryRecorded
from contextledger.errors import ConfigError, KeyUnavailable
from contextledger.store.sealing import (
    KEK_ENV,
    KEK_FILE_ENV,
    KEK_OLD_ENV,
    KeyRing,
    Sealer,
    kek_id,
    keyring_from,
)

KEK = bytes(range(32))
B64 = base64.b64encode(KEK).decode()
T0 = datetime(2026, 11, 27, tzinfo=UTC)

json_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": json_text},
    optional={"name": json_text, "n": st.integers(-(2**40), 2**40), "ok": st.booleans()},
)


def test_kek_from_environment_value_file_and_old_keys(tmp_path: Path) -> None:
    assert keyring_from({}) is None
    ring = keyring_from({KEK_ENV: f"  {B64}\n"})
    assert ring is not None and ring.primary == KEK and ring.old == ()
    key_file = tmp_path / "kek"
    key_file.write_text(B64)
    key_file.chmod(0o600)
    other = base64.b64encode(bytes(32)).decode()
    ring = keyring_from({KEK_FILE_ENV: str(key_file), KEK_OLD_ENV: f"{other}, "})
    assert ring is not None and ring.primary == KEK and ring.old == (bytes(32),)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({KEK_ENV: "not base64!"}, "not standard base64"),
        ({KEK_ENV: base64.b64encode(b"short").decode()}, "32 random bytes"),
        ({KEK_ENV: B64, KEK_FILE_ENV: "/x"}, "not both"),
        ({KEK_OLD_ENV: B64}, "no \\$CONTEXTLEDGER_KEK"),
        ({KEK_ENV: B64, KEK_OLD_ENV: "zz"}, "KEK_OLD"),
        ({KEK_ENV: "generate"}, "embedded server only"),
        ({KEK_FILE_ENV: "/nonexistent/kek"}, "cannot read"),
    ],
)
def test_bad_kek_settings_are_typed_and_never_echo_the_value(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        keyring_from(env)
    assert B64 not in str(caught.value)


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "kek"
    key_file.write_text(B64)
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        keyring_from({KEK_FILE_ENV: str(key_file)})


def test_generate_makes_one_private_key_under_home_and_keeps_it(tmp_path: Path) -> None:
    first = keyring_from({KEK_ENV: "generate"}, home=lambda: tmp_path / "home")
    again = keyring_from({KEK_ENV: "generate"}, home=lambda: tmp_path / "home")
    assert first is not None and again is not None and first.primary == again.primary
    assert (tmp_path / "home" / "kek").stat().st_mode & 0o077 == 0


def test_wrapped_key_is_bound_to_tenant_session_and_kek() -> None:
    ring = KeyRing(KEK)
    dek = os.urandom(32)
    kid, wrapped = ring.wrap(dek, tenant="t", session_id="s")
    assert kid == kek_id(KEK) and dek not in wrapped
    assert ring.unwrap(kid, wrapped, tenant="t", session_id="s") == dek
    for tenant, session in (("u", "s"), ("t", "s2")):
        with pytest.raises(KeyUnavailable, match="does not unwrap"):
            ring.unwrap(kid, wrapped, tenant=tenant, session_id=session)
    with pytest.raises(KeyUnavailable, match="neither"):
        KeyRing(bytes(32)).unwrap(kid, wrapped, tenant="t", session_id="s")
    rotated = KeyRing(bytes(32), (KEK,))  # the old KEK still listed: unwraps, re-wraps
    assert rotated.unwrap(kid, wrapped, tenant="t", session_id="s") == dek


@given(st.lists(messages, min_size=1, max_size=4), st.integers(1, 10**6))
def test_seal_then_open_is_identity_and_hides_the_content(
    batch: list[dict[str, Any]], seq: int
) -> None:
    sealer = Sealer(KEK, "local", "s")
    cases: list[tuple[str, dict[str, Any]]] = [
        ("message.appended", {"message": batch[0], "tokens": 3, "critical": True}),
        ("messages.replaced", {"messages": batch, "tokens": [1] * len(batch)}),
        ("summary.recorded", {"from_seq": 1, "to_seq": 2, "message": batch[0], "tokens": 1}),
        ("checkpoint.created", {"label": "kept in clear"}),
    ]
    for type_, data in cases:
        stored = sealer.seal(seq, type_, data)
        assert sealer.open(seq, type_, stored) == data
        if type_ == "message.appended":
            assert stored["message"]["role"] == batch[0]["role"]  # SQL filters on it
            assert stored["critical"] is True and stored["tokens"] == 3
            assert "content" not in stored["message"]
        if type_ == "checkpoint.created":
            assert stored == data


def test_sealed_value_is_bound_to_its_place() -> None:
    sealer = Sealer(KEK, "local", "s")
    data = {"message": {"role": "user", "content": "secret"}}
    stored = sealer.seal(2, "message.appended", data)
    for seq, type_, other in (
        (3, "message.appended", sealer),
        (2, "summary.recorded", sealer),
        (2, "message.appended", Sealer(KEK, "local", "s2")),
        (2, "message.appended", Sealer(KEK, "tenant-b", "s")),
    ):
        with pytest.raises(KeyUnavailable, match="does not open"):
            other.open(seq, type_, stored)


def test_the_chain_hashes_the_sealed_form() -> None:
    """``verify`` needs no key: it hashes what is stored; the payload stays readable."""
    sealer = Sealer(KEK, "local", "s")
    prev, events = GENESIS_HASH, []
    payloads = [
        MessageAppended({"role": "user", "content": "secret one"}, 2),
        MessagesReplaced(({"role": "user", "content": "secret two"},), (2,)),
        SummaryRecorded(1, 2, {"role": "user", "content": "secret three"}, 2),
    ]
    for seq, payload in enumerate(payloads, start=1):
        event = make_event("s", seq, payload, prev, created_at=T0, seal=sealer.seal)
        assert event.payload == payload
        assert event.data is not None and "secret" not in str(event.data)
        events.append(event)
        prev = event.hash
    assert verify_chain("s", events, 3, prev).ok
    plain = make_event("s", 1, payloads[0], GENESIS_HASH, created_at=T0)
    assert plain.hash != events[0].hash and plain.data is None  # unsealed: unchanged path


@given(json_text, json_text, st.integers(0, 2**62), json_text, json_text)
def test_associated_data_is_the_canonical_json_of_the_place(
    tenant: str, session: str, seq: int, type_: str, where: str
) -> None:
    from contextledger.core.encoding import canonical_json

    aad = Sealer(KEK, tenant, session)._aad(seq, type_, where)
    assert aad == canonical_json(["contextledger-event", tenant, session, seq, type_, where])
