"""The one place contextledger imports litellm.

Importing litellm costs ~2 s and, left to its defaults, fetches the model cost
map over the network and may download Hugging Face tokenizers. Every caller goes
through :func:`import_litellm` so those switches are set before and after the
import, and litellm is only imported by code that actually needs it.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

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
            import litellm

            litellm.disable_hf_tokenizer_download = True
            litellm.suppress_debug_info = True
            _module = litellm
    return _module
