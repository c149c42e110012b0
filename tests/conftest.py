"""Test-wide settings: offline by default, no tokenizer or cost-map downloads."""

from __future__ import annotations

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("CONTEXTLEDGER_LOG_FORMAT", "console")
