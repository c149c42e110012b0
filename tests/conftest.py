"""Test-wide settings: offline by default, no tokenizer or cost-map downloads."""

from __future__ import annotations

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("CONTEXTLEDGER_LOG_FORMAT", "console")

from hypothesis import settings

from tests.examples import examples

# No per-example deadline: it is a timing assertion, and a loaded machine (CI, a
# benchmark alongside) made a property test fail at 251 ms against hypothesis's 200.
# Tests that name no example count run hypothesis's 100, or its quick share
# (tests/examples.py: one unit file run by ops/test).
settings.register_profile("contextledger", deadline=None, max_examples=examples(100))
settings.load_profile("contextledger")
