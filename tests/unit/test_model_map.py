"""The model map litellm ships, read without litellm: which names it answers and how.

Every answer is checked against litellm itself in tests/integration/test_model_map.py;
these tests pin the rules on small maps, and that deciding never imports litellm.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger import _model_map
from contextledger._model_map import MISS, ModelMap

RAW: dict[str, Any] = {
    "gpt-4o": {"litellm_provider": "openai", "max_input_tokens": 128_000, "mode": "chat"},
    "azure/gpt-4o": {"litellm_provider": "azure", "max_input_tokens": 128_000},
    "azure/gpt-3.5-turbo-instruct": {"litellm_provider": "azure_text", "max_input_tokens": 4097},
    "azure/mistral-large": {"litellm_provider": "azure", "max_input_tokens": 32_000},
    "mistral/mistral-large": {"litellm_provider": "mistral", "max_input_tokens": 32_000},
    "j2-light": {"litellm_provider": "ai21", "max_input_tokens": 8192},
    "ollama/llama3.1": {"litellm_provider": "ollama", "max_input_tokens": 8192},
    "claude-opus-4-6": {"litellm_provider": "anthropic", "max_input_tokens": 200_000},
    "vertex_ai/gemini-x": {"litellm_provider": "vertex_ai-language-models"},
    "big-model": {
        "litellm_provider": "openai",
        "max_input_tokens": 1_000,
        "aliases": ["big-alias", "gpt-4o"],
    },
    "fallback_generalizations": {
        "rules": [
            {"pattern": "^claude-", "model_info": {"litellm_provider": "anthropic"}},
            {
                "name": "family",
                "pattern": "claude-[a-z]+-\\d+",
                "model_info": {"mode": "chat", "max_input_tokens": 200_000},
            },
            {
                "pattern": "claude-opus-",
                "fill_missing_for_providers": ["anthropic"],
                "model_info": {"max_output_tokens": 64_000, "max_input_tokens": 1},
            },
            {"pattern": "claude-[a-z]+-9", "extends": "family", "model_info": {"x": 1}},
            {"pattern": "^zeta-", "model_info": {"max_input_tokens": 7}},
            {"pattern": "(", "model_info": {"max_input_tokens": 5}},  # skipped: bad regex
            {"pattern": "x", "model_info": "not a mapping"},  # skipped
        ]
    },
}


@pytest.fixture(scope="module")
def small() -> ModelMap:
    return ModelMap.parse(RAW)


def test_parse_takes_the_rules_out_and_the_aliases_in(small: ModelMap) -> None:
    assert "fallback_generalizations" not in small.rows
    assert small.rows["big-alias"] == {"litellm_provider": "openai", "max_input_tokens": 1_000}
    assert "aliases" not in small.rows["big-model"]
    assert small.rows["gpt-4o"]["max_input_tokens"] == 128_000  # an alias never overwrites
    assert [p for _, p in small.routing] == ["anthropic"]
    windows = [info.get("max_input_tokens") for _, info in small.capability]
    assert windows == [200_000, 1, 200_000, 7]
    assert small.capability[2][1] == {"mode": "chat", "max_input_tokens": 200_000, "x": 1}
    assert [rule.providers for rule in small.fill] == [frozenset({"anthropic"})]


def test_a_row_as_written_answers_itself(small: ModelMap) -> None:
    assert small.lookup("gpt-4o") == (small.rows["gpt-4o"], "gpt-4o")
    assert small.lookup("azure/gpt-4o") == (small.rows["azure/gpt-4o"], "azure/gpt-4o")
    # a live provider's row is read as is, and nothing else is
    assert small.lookup("ollama/llama3.1") == (small.rows["ollama/llama3.1"], "ollama/llama3.1")
    assert small.lookup("Ollama/qwen") == MISS


def test_rows_litellm_infers_another_provider_for_are_left_to_litellm(small: ModelMap) -> None:
    assert small.lookup("azure/gpt-3.5-turbo-instruct") is None  # azure_text under azure/
    assert small.lookup("azure/mistral-large") is None  # inferred as openai
    assert small.lookup("j2-light") is None  # inferred as ai21_chat
    assert small.lookup("GPT-4o") is None  # matched case-insensitively
    assert small.lookup("gpt-35-turbo") is None  # litellm.azure_llms swaps it first


def test_a_provider_prefix_on_its_own_row(small: ModelMap) -> None:
    assert small.lookup("openai/gpt-4o") == (small.rows["gpt-4o"], "gpt-4o")
    assert small.lookup("anthropic/gpt-4o") is None  # a row of another provider


def test_missing_limits_are_filled_by_flagged_rules(small: ModelMap) -> None:
    row, key = small.lookup("claude-opus-4-6")  # type: ignore[misc]
    assert key == "claude-opus-4-6"
    assert (row["max_input_tokens"], row["max_output_tokens"]) == (200_000, 64_000)


def test_names_no_row_holds_get_the_fallback_rules_or_miss(small: ModelMap) -> None:
    assert small.lookup("claude-opus-5") == (
        {"mode": "chat", "max_input_tokens": 1, "max_output_tokens": 64_000},
        "claude-opus-5",
    )  # every matching rule, later ones winning
    assert small.lookup("openai/zeta-1") == ({"max_input_tokens": 7}, "zeta-1")
    assert small.lookup("claude-newfamily-9")[1] == "claude-newfamily-9"  # type: ignore[index]
    assert small.lookup("anthropic/claude-newfamily-5")[1] == "anthropic/claude-newfamily-5"  # type: ignore[index]
    assert small.lookup("totally-unknown") == MISS
    assert small.lookup("openai/totally-unknown") == MISS
    assert small.lookup("vertex_ai/totally-unknown-001") == MISS


def test_what_depends_on_litellm_alone_is_left_to_it(small: ModelMap) -> None:
    assert small.lookup("gpt-4o-2024-08-06") is None  # its undated name is a row
    assert small.lookup("openrouter/gpt-4o") is None  # the part after the prefix is a row
    # only the part after an unknown prefix matches a rule: it counts only if litellm
    # takes the prefix for a provider
    assert small.lookup("somewhere/zeta-1") is None
    assert small.lookup("somewhere/x-claude-ab-1")[1] == "somewhere/x-claude-ab-1"  # type: ignore[index]
    assert small.lookup("ft:gpt-4o:org::id") is None
    assert small.lookup("bedrock/anything") is None  # litellm rewrites these names


_spelling = st.text(alphabet="abcgptlude-/0123456789.:", max_size=24)


@given(st.one_of(_spelling, st.sampled_from(sorted(RAW)).map(lambda k: f"openai/{k}")))
def test_an_answer_is_a_row_or_a_spelling_litellm_derives(name: str) -> None:
    small = ModelMap.parse(RAW)
    found = small.lookup(name)
    assert found is None or found == MISS or isinstance(found, tuple)
    if isinstance(found, tuple):
        row, key = found
        rest = name.split("/", 1)[-1]
        stripped = {_model_map._DATED.sub("", name), _model_map._VERSION.sub("", name)}
        assert key in small.rows or key in {name, rest} | stripped
        assert isinstance(row, dict)


def test_the_bundled_map_answers_without_importing_litellm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "litellm", raising=False)
    row, key = _model_map.answer("openai/gpt-4o")  # type: ignore[misc]
    assert (row["max_input_tokens"], key) == (128_000, "gpt-4o")
    assert "litellm" not in sys.modules


def test_litellm_imported_or_its_remote_map_means_asking_litellm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "litellm", raising=False)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "False")
    assert _model_map.answer("gpt-4o") is None
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    assert _model_map.answer("gpt-4o") is not None
    # an application that imported litellm may have registered its own models with it
    monkeypatch.setitem(sys.modules, "litellm", sys.modules[__name__])
    assert _model_map.answer("gpt-4o") is None
