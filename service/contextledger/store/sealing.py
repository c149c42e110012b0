"""Envelope encryption of message content, so a session can be erased by destroying a key.

A key-encryption key (KEK, 32 bytes, from the operator only: ``$CONTEXTLEDGER_KEK``,
``$CONTEXTLEDGER_KEK_FILE`` or, for the embedded server, ``<home>/kek``) wraps one data
key (DEK) per session. The DEK seals the content fields of each event with AES-256-GCM;
the associated data binds tenant, session, seq, event type and field, so a sealed value
cannot be moved to another event or session. The hash chain hashes what is stored (the
sealed form), so ``verify`` passes after the DEK is destroyed.

What stays in clear, because projections and SQL need it: the event type, seq, token
counts, ``critical``, a message's ``role``, checkpoint labels, session model, config and
metadata. Everything a message *says* is sealed (``SEALED_FIELDS``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

from contextledger.core.encoding import canonical_json, dumps
from contextledger.errors import ConfigError, KeyUnavailable

KEK_ENV = "CONTEXTLEDGER_KEK"
KEK_FILE_ENV = "CONTEXTLEDGER_KEK_FILE"
#: Old KEKs still accepted to unwrap (comma-separated base64) while a rotation runs.
KEK_OLD_ENV = "CONTEXTLEDGER_KEK_OLD"
#: ``CONTEXTLEDGER_KEK=generate``: the embedded server's home keeps a generated KEK here.
KEK_FILENAME = "kek"
GENERATE = "generate"
#: The prefix of a sealed value (its format version).
SEAL_PREFIX = "v1."
NONCE = 12

#: The content fields sealed per event type; everything else stays in clear.
SEALED_FIELDS: dict[str, tuple[str, ...]] = {
    "message.appended": ("message", "original"),
    "messages.replaced": ("messages",),
    "summary.recorded": ("message",),
    "compaction.applied": ("prune",),
}


def _aead(key: bytes) -> Any:
    """``cryptography``'s AES-GCM (imported on first use: ~30 ms, not at package import)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def parse_kek(text: str, *, where: str) -> bytes:
    """32 bytes in standard base64, or a ``ConfigError`` naming ``where`` (never the value)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where} is not standard base64", key=where) from None
    if len(raw) != 32:
        raise ConfigError(
            f"{where} must hold 32 random bytes (standard base64, 44 characters); "
            f"it holds {len(raw)}",
            key=where,
        )
    return raw


def kek_id(kek: bytes) -> str:
    """A fingerprint naming a KEK in the key table (a hash prefix: reveals nothing)."""
    return hashlib.sha256(b"contextledger-kek-id\x00" + kek).hexdigest()[:16]


def _dek_aad(tenant: str, session_id: str) -> bytes:
    return canonical_json(["contextledger-dek", tenant, session_id])


@dataclass(frozen=True)
class KeyRing:
    """The KEK new data keys are wrapped under, and old ones still accepted to unwrap."""

    primary: bytes
    old: tuple[bytes, ...] = ()

    @property
    def primary_id(self) -> str:
        """The fingerprint of the KEK new data keys are wrapped under (stored beside
        each wrapped key, so ``unwrap`` knows which KEK to use)."""
        return kek_id(self.primary)

    def _by_id(self, wanted: str) -> bytes:
        for kek in (self.primary, *self.old):
            if kek_id(kek) == wanted:
                return kek
        raise KeyUnavailable(
            f"the data key was wrapped under KEK {wanted}, which is neither "
            f"${KEK_ENV} nor listed in ${KEK_OLD_ENV}",
            kek_id=wanted,
        )

    def wrap(self, dek: bytes, *, tenant: str, session_id: str) -> tuple[str, bytes]:
        """``(kek id, nonce ‖ ciphertext)`` of ``dek`` under the primary KEK."""
        nonce = os.urandom(NONCE)
        sealed = _aead(self.primary).encrypt(nonce, dek, _dek_aad(tenant, session_id))
        return self.primary_id, nonce + sealed

    def unwrap(self, kid: str, wrapped: bytes, *, tenant: str, session_id: str) -> bytes:
        """The data key ``wrap`` sealed, under the KEK ``kid`` names (the primary or an
        old one still listed); ``KeyUnavailable`` when that KEK is not configured or the
        key was wrapped for another tenant or session."""
        kek = self._by_id(kid)
        try:
            dek: bytes = _aead(kek).decrypt(
                wrapped[:NONCE], wrapped[NONCE:], _dek_aad(tenant, session_id)
            )
        except _invalid_tag():
            raise KeyUnavailable(
                f"the data key of session {session_id!r} does not unwrap under KEK {kid} "
                "(altered, or wrapped for another tenant or session)",
                session_id=session_id,
            ) from None
        return dek

    def new_key(self, *, tenant: str, session_id: str) -> tuple[Sealer, str, bytes]:
        """A fresh DEK: its sealer, and the (kek id, wrapped DEK) to store."""
        dek = os.urandom(32)  # what AESGCM.generate_key(bit_length=256) does
        kid, wrapped = self.wrap(dek, tenant=tenant, session_id=session_id)
        return Sealer(dek, tenant, session_id), kid, wrapped


def keyring_from(
    environ: Mapping[str, str], *, home: Callable[[], Path] | None = None
) -> KeyRing | None:
    """The operator's KEK: ``$CONTEXTLEDGER_KEK`` (base64, or ``generate`` with the
    embedded server: a KEK kept in ``<home>/kek``, mode 0600, made on first use), else
    the file ``$CONTEXTLEDGER_KEK_FILE``; None when neither is set (no encryption).
    Old KEKs for unwrapping come from ``$CONTEXTLEDGER_KEK_OLD``."""
    value = environ.get(KEK_ENV, "").strip()
    path = environ.get(KEK_FILE_ENV, "").strip()
    if value and path:
        raise ConfigError(f"set ${KEK_ENV} or ${KEK_FILE_ENV}, not both", key=KEK_ENV)
    if value == GENERATE:
        if home is None:
            raise ConfigError(
                f"${KEK_ENV}=generate works with the embedded server only; give a server "
                "its KEK from the operator's secret store",
                key=KEK_ENV,
            )
        primary = generated_kek(home() / KEK_FILENAME)
    elif value:
        primary = parse_kek(value, where=f"${KEK_ENV}")
    elif path:
        primary = read_kek_file(Path(path), where=f"${KEK_FILE_ENV}")
    else:
        if environ.get(KEK_OLD_ENV, "").strip():
            raise ConfigError(f"${KEK_OLD_ENV} is set but no ${KEK_ENV}", key=KEK_OLD_ENV)
        return None
    old = tuple(
        parse_kek(part, where=f"${KEK_OLD_ENV}[{n}]")
        for n, part in enumerate(environ.get(KEK_OLD_ENV, "").split(","))
        if part.strip()
    )
    return KeyRing(primary, old)


def read_kek_file(path: Path, *, where: str) -> bytes:
    """A KEK file: base64 text, readable by its owner only (a group- or world-readable
    key file is refused, as ssh refuses such a private key)."""
    try:
        st = path.stat()
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read the key file ({exc.__class__.__name__})") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{where}: the key file is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
            "chmod 600 it",
            key=where,
        )
    return parse_kek(text, where=where)


def generated_kek(path: Path) -> bytes:
    """The KEK at ``path``, made (32 random bytes, mode 0600) if there is none yet."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = base64.b64encode(os.urandom(32)).decode() + "\n"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(text)
    return read_kek_file(path, where=str(path))


class Sealer:
    """One session's data key: seals and opens the content fields of its events."""

    __slots__ = ("_aead", "_prefix", "session_id", "tenant")

    def __init__(self, dek: bytes, tenant: str, session_id: str) -> None:
        self._aead = _aead(dek)
        self.tenant = tenant
        self.session_id = session_id
        # the associated data is canonical JSON of [tag, tenant, session, seq, type,
        # field]: its fixed head encoded once (an append pays for the rest only)
        self._prefix = canonical_json(["contextledger-event", tenant, session_id])[:-1]

    def _aad(self, seq: int, type_: str, where: str) -> bytes:
        return b"%s,%d,%s,%s]" % (
            self._prefix,
            seq,
            encode_basestring(type_).encode(),
            encode_basestring(where).encode(),
        )

    def _seal_value(self, value: Any, aad: bytes) -> str:
        nonce = os.urandom(NONCE)
        ct = self._aead.encrypt(nonce, dumps(value).encode(), aad)
        return SEAL_PREFIX + base64.b64encode(nonce + ct).decode()

    def _open_value(self, token: str, aad: bytes) -> Any:
        if not token.startswith(SEAL_PREFIX):
            raise KeyUnavailable(f"session {self.session_id!r}: not a sealed value")
        raw = base64.b64decode(token[len(SEAL_PREFIX) :])
        try:
            return json.loads(self._aead.decrypt(raw[:NONCE], raw[NONCE:], aad))
        except _invalid_tag():
            raise KeyUnavailable(
                f"session {self.session_id!r}: a sealed value does not open (altered, or "
                "moved from another event)",
                session_id=self.session_id,
            ) from None

    def _seal_message(self, message: Any, aad: bytes) -> Any:
        """A message keeps its role in clear (the SQL projection filters on it)."""
        if isinstance(message, Mapping):
            out: dict[str, Any] = {"sealed": self._seal_value(message, aad)}
            if isinstance(message.get("role"), str):
                out["role"] = message["role"]
            return out
        return {"sealed": self._seal_value(message, aad)}

    def _open_message(self, sealed: Any, aad: bytes) -> Any:
        if isinstance(sealed, Mapping) and isinstance(sealed.get("sealed"), str):
            return self._open_value(sealed["sealed"], aad)
        return sealed  # written in clear (not a content field of this type)

    def seal(self, seq: int, type_: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` with its content fields sealed (the form stored and hashed)."""
        return self._fields(seq, type_, data, self._seal_message)

    def open(self, seq: int, type_: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of ``seal``: ``data`` as the caller wrote it."""
        return self._fields(seq, type_, data, self._open_message)

    def _fields(
        self,
        seq: int,
        type_: str,
        data: Mapping[str, Any],
        each: Callable[[Any, bytes], Any],
    ) -> dict[str, Any]:
        """``data`` with ``each`` applied to its content fields (each element of a list
        field on its own), each bound to its place by the associated data."""
        out = dict(data)
        for name in SEALED_FIELDS.get(type_, ()):
            value = out.get(name)
            if value is None:
                continue
            if isinstance(value, Sequence) and not isinstance(value, str | Mapping):
                out[name] = [
                    each(v, self._aad(seq, type_, f"{name}[{n}]")) for n, v in enumerate(value)
                ]
            else:
                out[name] = each(value, self._aad(seq, type_, name))
        return out

    def open_message(self, seq: int, message: Any, *, part: int | None = None) -> Any:
        """One message read by SQL (``data -> 'message'`` or ``-> 'messages' -> part``)."""
        if part is None:
            return self._open_message(message, self._aad(seq, "message.appended", "message"))
        return self._open_message(message, self._aad(seq, "messages.replaced", f"messages[{part}]"))


def is_sealed_message(message: Any) -> bool:
    """Whether a message read back is still in its sealed form."""
    return isinstance(message, Mapping) and isinstance(message.get("sealed"), str)
