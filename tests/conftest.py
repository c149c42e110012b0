"""Test-wide settings: offline by default, no tokenizer or cost-map downloads."""

from __future__ import annotations

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("CONTEXTLEDGER_LOG_FORMAT", "console")

from hypothesis import settings

# No per-example deadline: it is a timing assertion, and a loaded machine (CI, a
# benchmark alongside) made a property test fail at 251 ms against hypothesis's 200.
settings.register_profile("contextledger", deadline=None)
settings.load_profile("contextledger")
