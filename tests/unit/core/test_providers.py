"""One classification of model names, used by every rule that depends on the provider."""

from __future__ import annotations

import pytest

from contextledger.core.budget import GEMINI_THRESHOLDS, PROFILES, thresholds_for
from contextledger.core.compaction.finish import is_anthropic, needs_reasoning_block
from contextledger.core.images import provider_for_model
from contextledger.core.providers import model_family
from contextledger.core.tokens import get_counter

# model, family, image rule, default thresholds profile name, token counter name prefix
TABLE = [
    ("gpt-4o", "openai", "openai", "balanced", "tiktoken:o200k_base"),
    ("openai/gpt-4o-2024-08-06", "openai", "openai", "balanced", "tiktoken:o200k_base"),
    ("o3-mini", "openai", "openai", "balanced", "tiktoken:o200k_base"),
    ("claude-sonnet-4-5", "anthropic", "anthropic", "balanced", "litellm:anthropic"),
    ("claude-opus-4", "anthropic", "anthropic", "conservative", "litellm:anthropic"),
    # Bedrock and Vertex spellings: Anthropic in every rule (the counter used to differ)
    (
        "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0",
        "anthropic",
        "anthropic",
        "balanced",
        "litellm:anthropic",
    ),
    (
        "vertex_ai/claude-3-7-sonnet@20250219",
        "anthropic",
        "anthropic",
        "balanced",
        "litellm:anthropic",
    ),
    ("gemini/gemini-2.5-pro", "gemini", "gemini", "gemini", "tiktoken:cl100k_base"),
    ("vertex_ai/gemini-1.5-flash", "gemini", "gemini", "gemini", "tiktoken:cl100k_base"),
    # DeepSeek anywhere in the name (the threshold rule used to need a prefix)
    ("deepseek/deepseek-reasoner", "deepseek", "openai", "aggressive", "tiktoken:cl100k_base"),
    ("ollama/deepseek-r1:8b", "deepseek", "openai", "aggressive", "tiktoken:cl100k_base"),
    ("ollama/llama3.1", "other", "openai", "balanced", "tiktoken:cl100k_base"),
    (None, "other", "openai", "balanced", "tiktoken:cl100k_base"),
]


@pytest.mark.parametrize(("model", "family", "image", "profile", "counter"), TABLE)
def test_every_rule_classifies_a_name_alike(
    model: str | None, family: str, image: str, profile: str, counter: str
) -> None:
    assert model_family(model) == family
    assert provider_for_model(model) == image
    expected = GEMINI_THRESHOLDS if profile == "gemini" else PROFILES[profile]
    assert thresholds_for(model) == expected
    assert is_anthropic(model) is (family == "anthropic")
    assert needs_reasoning_block(model or "") is (family == "deepseek")
    assert get_counter("auto", model).name == counter
