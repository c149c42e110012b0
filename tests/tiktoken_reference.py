"""An independent tiktoken encoding: tiktoken's own constructor and loader, pointed at
the files litellm ships, to check contextledger's offline encodings against."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
from tiktoken_ext import openai_public


def litellm_tokenizers() -> Path:
    """litellm's bundled tokenizer files, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


def reference_inputs(name: str) -> dict[str, Any]:
    """What ``openai_public.<name>()`` hands ``tiktoken.Encoding`` (name, pattern, ranks,
    special tokens), with tiktoken's loader reading litellm's copy of each URL; the
    cache is disabled so nothing is written."""
    folder = litellm_tokenizers()

    def local(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        path = folder / hashlib.sha1(url.encode()).hexdigest()
        return tiktoken.load.load_tiktoken_bpe(str(path), expected_hash=expected_hash)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")
        mp.setattr(openai_public, "load_tiktoken_bpe", local)
        inputs: dict[str, Any] = getattr(openai_public, name)()
    return inputs


def reference_encoding(name: str) -> tiktoken.Encoding:
    """``tiktoken.Encoding(**openai_public.<name>())`` on litellm's files."""
    return tiktoken.Encoding(**reference_inputs(name))
