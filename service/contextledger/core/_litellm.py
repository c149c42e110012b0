"""The one place contextledger imports litellm.

Importing litellm costs ~2 s and, left to its defaults, fetches the model cost
map over the network and may download Hugging Face tokenizers. Every caller goes
through :func:`import_litellm` so those switches are set before and after the
import, and litellm is only imported by code that actually needs it.
"""

from __future__ import annotations

import gc
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
