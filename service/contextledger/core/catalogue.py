"""What core needs from outside itself: litellm's model map and tokenizers, and the
files litellm ships (its tokenizers, its model map).

Core is pure (no I/O, nothing from the shell): it never imports litellm or reads a file
itself. The shell installs these here when the package is imported
(``contextledger._litellm``), so model windows and tokenizers still come from litellm,
offline-configured, while core only calls what it was handed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Literal

from contextledger.errors import ConfigError

#: Returns litellm, imported offline-configured (~2 s the first time).
LitellmLoader = Callable[[], ModuleType]
#: ``(url, expected sha256)`` -> the BPE ranks of a tiktoken encoding, from a local copy.
BpeLoader = Callable[[str, "str | None"], dict[bytes, int]]
#: One spelling against the model map file litellm ships, read without litellm:
#: ``(row, key)``, ``"miss"``, or ``None`` when only litellm itself can tell.
MapRow = tuple[Mapping[str, Any], str] | Literal["miss"] | None
MapReader = Callable[[str], MapRow]

_litellm: LitellmLoader | None = None
_bpe: BpeLoader | None = None
_map: MapReader | None = None


def install(litellm: LitellmLoader, bpe: BpeLoader, model_map: MapReader | None = None) -> None:
    """Hand core its catalogue (the shell does this at import)."""
    global _litellm, _bpe, _map
    _litellm, _bpe, _map = litellm, bpe, model_map


def litellm() -> ModuleType:
    if _litellm is None:
        raise ConfigError("no litellm catalogue installed (import contextledger first)")
    return _litellm()


def bpe(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
    if _bpe is None:
        raise ConfigError("no tokenizer files installed (import contextledger first)")
    return _bpe(url, expected_hash)


def map_row(name: str) -> MapRow:
    """``name`` in the bundled model map without importing litellm (``None``: ask it)."""
    return _map(name) if _map is not None else None
