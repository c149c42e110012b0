"""The model map read without litellm gives what litellm gives.

``contextledger._model_map`` answers a context window from the JSON file litellm ships,
by rules copied from litellm's lookup. Here each answer it gives is checked against
litellm itself (model_limits' litellm path): every row of the map, every bare row behind
its provider's prefix, and names no row holds. A litellm upgrade that changes a rule
fails here. It imports litellm (~1.5 s), which is why it is not a unit test.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from contextledger import _model_map
from contextledger.core import catalogue
from contextledger.core import model_limits as ml
from contextledger.core.model_limits import ModelLimits

pytestmark = pytest.mark.slow  # every row of the map through litellm: ~10 s

# names the unit tests resolve: each must be decided by the file, or those tests
# import litellm again
UNIT_TEST_NAMES = {
    "gpt-4o": ModelLimits(128_000, 16_384, "litellm:gpt-4o"),
    "openai/gpt-4o": ModelLimits(128_000, 16_384, "litellm:gpt-4o"),
    "azure/gpt-4o": ModelLimits(128_000, 16_384, "litellm:azure/gpt-4o"),
    "gpt-4o-2024-08-06": ModelLimits(128_000, 16_384, "litellm:gpt-4o-2024-08-06"),
    "claude-sonnet-4-20250514": ModelLimits(200_000, 64_000, "litellm:claude-sonnet-4-20250514"),
    "anthropic/claude-sonnet-4-20250514": ModelLimits(
        200_000, 64_000, "litellm:anthropic/claude-sonnet-4-20250514"
    ),
    "ollama/llama3.1": ModelLimits(8192, 8192, "litellm:ollama/llama3.1"),
    "gemini/gemini-2.5-pro": ModelLimits(1_048_576, 65_536, "litellm:gemini/gemini-2.5-pro"),
    "deepseek-chat": ModelLimits(131_072, 8192, "litellm:deepseek-chat"),
}
UNKNOWN = [
    "claude-3-5-sonnet-20241022",
    "claude-3-5-sonnet",
    "claude-3-7-sonnet-latest",
    "claude-3-7-sonnet",
    "claude-3-opus-20240229",
    "claude-3-opus",
    "llama3.1",
    "llama3.2",
    "llama-3.3-70b-instruct",
    "meta-llama/llama-3.3-70b-instruct",
    "ollama/llama3.2",
    "ollama/qwen2.5",
    "ollama_chat/mistral-nemo",
    "mistral-nemo",
    "lemonade/x",
    "hosted_vllm/x",
    "x",
    "totally-unknown-model",
    "another-unknown",
    "some-unknown-model-xyz",
    "unknown-x",
    "my-local-model",
    "test-model",
]
# names litellm's fallback rules (not its rows) answer, or may
RULED = [
    "claude-newfamily-5",
    "claude-newfamily-5-1-20990101",
    "claude-sonnet-4-20250514",
    "anthropic/claude-opus-9",
    "openai/claude-opus-9",
    "vertex_ai/claude-opus-9@001",
    "openrouter/anthropic/claude-opus-9",
    "foo/claude-opus-9",
    "us.anthropic.claude-opus-9-v1:0",
    "anthropic.claude-opus-9",
    "gemini-3-pro-zz",
    "gemini/gemini-3-pro-zz",
    "vertex_ai/gemini-3-flash-001",
    "gpt-5-zz",
    "openai/gpt-5-zz",
    "azure/gpt-5-zz",
    "o3-zz",
    "ft:gpt-4o:org::id",
    "wandb/zz",
    "Claude-Opus-9",
]


@pytest.fixture(scope="module")
def bundled() -> _model_map.ModelMap:
    found = _model_map.bundled()
    assert found is not None
    return found


@pytest.fixture(scope="module")
def litellm() -> Any:
    return catalogue.litellm()


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"network call to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture
def ask_litellm(litellm: Any) -> Iterator[Callable[[str], ModelLimits | None]]:
    """model_limits' own lookup of one spelling, which with litellm imported never
    takes the file's answer (``_model_map.answer`` leaves it to litellm)."""
    assert catalogue.map_row("gpt-4o") is None
    ml.clear_cache()
    yield ml._litellm_lookup
    ml.clear_cache()


def _disagreements(
    names: list[str], bundled: _model_map.ModelMap, ask: Callable[[str], ModelLimits | None]
) -> tuple[int, list[tuple[str, Any, Any]]]:
    decided, wrong = 0, []
    for name in names:
        found = bundled.lookup(name)
        if found is None:
            continue
        decided += 1
        ours = None if found == _model_map.MISS else ml._limits(*found)
        theirs = ask(name)
        if ours != theirs:
            wrong.append((name, ours, theirs))
    return decided, wrong


def test_the_file_is_the_map_litellm_loaded(bundled: _model_map.ModelMap, litellm: Any) -> None:
    assert set(bundled.rows) == set(litellm.model_cost)
    assert all(bundled.rows[k] == v for k, v in litellm.model_cost.items())


def test_every_row_answers_what_litellm_answers(
    bundled: _model_map.ModelMap, ask_litellm: Callable[[str], ModelLimits | None]
) -> None:
    names = sorted(bundled.rows)
    decided, wrong = _disagreements(names, bundled, ask_litellm)
    assert wrong == []
    assert decided >= 0.97 * len(names)  # the file answers nearly all of them itself


def test_each_bare_row_behind_its_provider_prefix(
    bundled: _model_map.ModelMap, ask_litellm: Callable[[str], ModelLimits | None]
) -> None:
    names = sorted(
        f"{row['litellm_provider']}/{key}"
        for key, row in bundled.rows.items()
        if "/" not in key and isinstance(row.get("litellm_provider"), str)
    )
    decided, wrong = _disagreements(names, bundled, ask_litellm)
    assert wrong == []
    ours = [n for n in names if n.split("/", 1)[0] in _model_map.PREFIXES]
    assert sum(bundled.lookup(n) is not None for n in ours) >= 0.95 * len(ours)
    assert decided >= len(ours)


def test_names_no_row_holds(
    bundled: _model_map.ModelMap, ask_litellm: Callable[[str], ModelLimits | None]
) -> None:
    keys = sorted(bundled.rows)
    names = UNKNOWN + RULED
    for key in keys[::3]:
        tail = key.rsplit("/", 1)[-1]
        names += [f"{key}-zq9", f"zq9-{tail}", f"{key}-2099-01-01", key.upper(), tail]
        names += [f"openrouter/{tail}", f"together_ai/{tail}-zq9"]
    decided, wrong = _disagreements(sorted(set(names)), bundled, ask_litellm)
    assert wrong == []
    assert decided >= 0.3 * len(set(names))


def test_the_names_the_unit_tests_use_are_decided_by_the_file(
    bundled: _model_map.ModelMap, ask_litellm: Callable[[str], ModelLimits | None]
) -> None:
    for name, limits in UNIT_TEST_NAMES.items():
        found = bundled.lookup(name)
        assert found not in (None, _model_map.MISS), name
        assert ml._limits(*found) == limits == ask_litellm(name)
    for name in UNKNOWN:
        for spelling in ml.name_candidates(name):
            assert bundled.lookup(spelling) == _model_map.MISS, spelling
            assert ask_litellm(spelling) is None


def test_the_copied_constants_are_litellm_s(litellm: Any) -> None:
    from litellm import constants, utils

    assert set(litellm.azure_llms) | set(litellm.azure_embedding_models) <= (
        _model_map._AZURE_ALIASES
    )
    assert _model_map._BACKFILL_MODES == utils._BACKFILL_MODES
    assert frozenset(constants.PROVIDERS_THAT_AUTHENTICATE_ON_PROVIDER_INFO) == (ml._AUTHENTICATING)
    providers = set(litellm.provider_list)
    assert providers >= _model_map.PREFIXES | _model_map._VERTEX_STRIP
    assert litellm.AnthropicTextConfig._is_anthropic_text_model("claude-2")
    assert not litellm.AnthropicTextConfig._is_anthropic_text_model("claude-2.1")


def test_authenticating_providers_are_resolved_without_the_network(
    ask_litellm: Callable[[str], ModelLimits | None],
) -> None:
    # get_llm_provider runs the OAuth device flow for these (the refused socket above
    # would fail the test); model_limits takes the provider from the prefix instead
    assert ask_litellm("github_copilot/no-such-model") is None
    assert ask_litellm("chatgpt/no-such-model") is None


def test_the_import_helper_configures_litellm() -> None:
    # moved from tests/unit/core/test_model_limits.py: model_limits no longer imports
    # litellm for a mapped name, so the helper is asked directly
    import os

    litellm = catalogue.litellm()
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert litellm.disable_hf_tokenizer_download is True
    assert litellm.suppress_debug_info is True
