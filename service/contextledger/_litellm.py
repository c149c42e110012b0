"""The one place contextledger imports litellm (and reads the tokenizer files it ships).

Importing litellm costs ~2 s and, left to its defaults, fetches the model cost
map over the network and may download Hugging Face tokenizers. Every caller goes
through :func:`import_litellm` so those switches are set before and after the
import, and litellm is only imported by code that actually needs it.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import os
import threading
from pathlib import Path
from types import ModuleType

from contextledger import _model_map
from contextledger.core import catalogue
from contextledger.errors import ConfigError

_lock = threading.Lock()
_module: ModuleType | None = None


def import_litellm() -> ModuleType:
    """Import litellm offline-configured (bundled cost map, no HF downloads, no banner).

    ``LITELLM_LOCAL_MODEL_COST_MAP`` is set with ``setdefault`` so an operator who
    explicitly opts into the remote map keeps that choice.
    """
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            # The import allocates millions of long-lived objects: left on, the cyclic
            # GC runs full collections over them meanwhile, pausing every thread (the
            # event loop included) for up to a second or more on a busy machine. Off
            # during the import, then those objects are frozen out of later collections.
            was_enabled = gc.isenabled()
            gc.disable()
            try:
                import litellm
            finally:
                gc.freeze()
                if was_enabled:
                    gc.enable()

            litellm.disable_hf_tokenizer_download = True
            litellm.suppress_debug_info = True
            _quiet_loggers()
            _module = litellm
    return _module


def _quiet_loggers() -> None:
    """litellm attaches its own stdout handlers at import: a library must not print.

    They are removed and records propagate, so they go wherever the application's
    logging sends them (nowhere, if it configured none).
    """
    import logging

    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        lg = logging.getLogger(name)
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
        lg.propagate = True


def tokenizer_dir() -> Path:
    """litellm's bundled tokenizer directory, found without importing litellm (~2 s)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "litellm is not installed; it ships the tokenizer files", key="token_counter"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


def load_bpe_offline(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
    """``tiktoken.load.load_tiktoken_bpe`` for litellm's local copy of ``url``.

    The file is named ``sha1(url)`` (tiktoken's own cache key). Parsed here rather
    than by ``load_tiktoken_bpe(path)`` because that copies even a local file into
    ``TIKTOKEN_CACHE_DIR`` (litellm points it at site-packages) and raises when that
    directory is read-only. The sha256 tiktoken expects is still verified.

    Each line is ``<base64 token> <rank>``; split and decoded in C (``map`` over the
    file's fields) rather than line by line: half the time of tiktoken's loop (o200k:
    ~0.5 s -> ~0.25 s here), the same ranks.
    """
    import binascii

    path = tokenizer_dir() / hashlib.sha1(url.encode()).hexdigest()
    if not path.is_file():
        raise ConfigError(f"no bundled tiktoken file for {url} at {path}", key="token_counter")
    data = path.read_bytes()
    if expected_hash and hashlib.sha256(data).hexdigest() != expected_hash:
        raise ConfigError(f"tiktoken file {path} does not match its hash", key="token_counter")
    fields = data.split()
    if len(fields) % 2:
        raise ConfigError(f"tiktoken file {path} is not token/rank pairs", key="token_counter")
    # a2b_base64 is what base64.b64decode (tiktoken's) calls, without its argument checks
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]), strict=True))


# Core's catalogue (core never imports litellm or reads a file): installed at import.
catalogue.install(import_litellm, load_bpe_offline, _model_map.answer)
