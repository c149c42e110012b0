"""The validated configuration: defaults, YAML, errors naming the key, redaction."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from contextledger.core.config import ContextConfig, SummarizerConfig
from contextledger.errors import ConfigError


def test_defaults() -> None:
    config = ContextConfig.from_mapping({})
    assert config == ContextConfig()
    assert (config.compact_threshold, config.compact_target) == (0.92, 0.6)
    assert config.compaction_strategy == "truncate" and config.auto_compact is False
    assert config.protected_tools == ("skill", "memory_search")
    assert config.max_tool_output_chars == 10_000 and config.keep_recent == 10
    assert config.summarizer == SummarizerConfig()
    assert config.summarizer.summary_role == "user"


def test_yaml_text_is_accepted() -> None:
    config = ContextConfig.from_mapping(
        """
        max_tokens: 50000
        compaction_strategy: importance
        protected_tools: [skill]
        summarizer:
          models:
            - model: openai/fake
              api_base: http://127.0.0.1:9/v1
              api_key: sk-secret
              timeout: 5
          min_messages: 2
        """
    )
    assert config.max_tokens == 50_000 and config.compaction_strategy == "importance"
    assert config.protected_tools == ("skill",)
    model = config.summarizer.models[0]
    assert (model.model, model.timeout, model.num_retries) == ("openai/fake", 5.0, 1)
    assert config.summarizer.min_messages == 2


@pytest.mark.parametrize(
    ("mapping", "key"),
    [
        ({"max_tokenz": 1}, "max_tokenz"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"compact_threshold": 1.5}, "compact_threshold"),
        ({"compact_threshold": 0}, "compact_threshold"),
        ({"compact_target": 0.95}, "compact_target"),
        ({"compact_threshold": 0.5}, "compact_target"),  # the default target is now too high
        ({"auto_compact": "yes"}, "auto_compact"),
        ({"compaction_strategy": "smart"}, "compaction_strategy"),
        ({"keep_recent": 0}, "keep_recent"),
        ({"protected_tools": "skill"}, "protected_tools"),
        ({"protected_tools": [1]}, "protected_tools[0]"),
        ({"max_tool_output_chars": 99}, "max_tool_output_chars"),
        ({"protect_recent_tool_results": -1}, "protect_recent_tool_results"),
        ({"min_score": 1.1}, "min_score"),
        ({"token_counter": "words"}, "token_counter"),
        ({"token_counter": "chars:0"}, "token_counter"),
        ({"token_counter": "tiktoken:3"}, "token_counter"),
        ({"profile": "wild"}, "profile"),
        ({"context_window": -5}, "context_window"),
        ({"safety_margin": -1}, "safety_margin"),
        ({"model_overrides": []}, "model_overrides"),
        ({"summarizer": {"models": [{"api_base": "x"}]}}, "summarizer.models[0].model"),
        (
            {"summarizer": {"models": [{"model": "m", "timeout": 0}]}},
            "summarizer.models[0].timeout",
        ),
        ({"summarizer": {"models": [{"model": "m", "extra": 1}]}}, "summarizer.models[0].extra"),
        ({"summarizer": {"min_messages": 0}}, "summarizer.min_messages"),
        ({"summarizer": {"summary_role": "tool"}}, "summarizer.summary_role"),
        ({"summarizer": {"summary_position": "top"}}, "summarizer.summary_position"),
        ({"summarizer": {"nope": 1}}, "summarizer.nope"),
        ({"summarizer": {"models": "gpt-4o"}}, "summarizer.models"),
    ],
)
def test_bad_values_name_the_key(mapping: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ContextConfig.from_mapping(mapping)
    assert caught.value.details["key"] == key
    assert caught.value.code == "INVALID_CONFIG"
    assert key.split(".")[-1].split("[")[0] in str(caught.value)


def test_yaml_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(ConfigError):
        ContextConfig.from_mapping("- a\n- b\n")
    with pytest.raises(ConfigError):
        ContextConfig.from_mapping("a: [unclosed")


def test_token_counter_forms() -> None:
    for value in ("auto", "tiktoken", "litellm", "chars", "chars:3.5"):
        assert ContextConfig.from_mapping({"token_counter": value}).token_counter == value


def test_to_dict_is_json_and_redacts_secrets() -> None:
    config = ContextConfig.from_mapping(
        {
            "model_overrides": {"gpt-x": {"context_window": 8000, "api_key": "sk-over"}},
            "summarizer": {"models": [{"model": "m", "api_key": "sk-secret"}, "other/model"]},
        }
    )
    data = config.to_dict()
    text = json.dumps(data)
    for secret in ("sk-secret", "sk-over"):
        assert secret not in text
    assert "dsn" not in data
    assert data["summarizer"]["models"][0]["api_key"] == "***"
    assert data["summarizer"]["models"][1] == {
        "model": "other/model",
        "api_base": None,
        "api_key": None,
        "timeout": 30.0,
        "num_retries": 1,
    }
    assert data["model_overrides"]["gpt-x"]["context_window"] == 8000
    assert "sk-secret" not in repr(config)


@pytest.mark.parametrize(("key", "arg"), [("dsn", "dsn"), ("storage_path", "home")])
def test_deployment_keys_are_refused_with_where_to_put_them(key: str, arg: str) -> None:
    """Finding 1: a dsn in the session config was silently ignored by Ledger.open."""
    for build in (
        lambda: ContextConfig.from_mapping({key: "postgresql://u:hunter2@db/x"}),
        lambda: ContextConfig().merged({key: "x"}),
    ):
        with pytest.raises(ConfigError) as info:
            build()
        assert info.value.details["key"] == key
        assert f"Ledger.open({arg}=" in str(info.value)
        assert "hunter2" not in str(info.value)


def test_recorded_configs_with_deployment_keys_still_load() -> None:
    recorded = {**ContextConfig().to_dict(), "dsn": "postgresql://u:***@db/x", "storage_path": "/h"}
    assert ContextConfig.from_recorded(recorded) == ContextConfig()


def test_round_trip_without_secrets() -> None:
    config = ContextConfig.from_mapping({"keep_recent": 4, "profile": "balanced", "max_tokens": 9})
    assert ContextConfig.from_mapping(config.to_dict()) == config


def test_merged_applies_overrides_keeps_secrets_and_validates() -> None:
    config = ContextConfig.from_mapping(
        {"summarizer": {"models": [{"model": "m", "api_key": "sk-secret"}], "min_messages": 3}}
    )
    merged = config.merged({"keep_recent": 3, "summarizer": {"min_messages": 6}})
    assert merged.keep_recent == 3 and merged.summarizer.min_messages == 6
    assert merged.summarizer.models[0].api_key == "sk-secret"
    assert config.keep_recent == 10  # the original is unchanged
    with pytest.raises(ConfigError) as caught:
        config.merged({"compact_target": 0.99})
    assert caught.value.details["key"] == "compact_target"
    with pytest.raises(ConfigError):
        config.merged({"unknown": 1})


def test_config_is_frozen_all_the_way_down() -> None:
    config = ContextConfig.from_mapping({"model_overrides": {"m": {"context_window": 1}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.keep_recent = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.model_overrides["m"]["context_window"] = 2


# -- declared once: check and help in field metadata, the docs' table from it ------------


def test_every_field_is_declared_with_its_check_and_help() -> None:
    from dataclasses import fields

    from contextledger.core.config import RecallConfig, SummarizerConfig, SummarizerModel

    for cls in (ContextConfig, SummarizerConfig, RecallConfig, SummarizerModel):
        for f in fields(cls):
            assert callable(f.metadata.get("check")), (cls.__name__, f.name)
            assert f.metadata.get("help"), (cls.__name__, f.name)


def test_describe_fields_lists_every_key_with_type_default_and_help() -> None:
    from contextledger.core.config import describe_fields

    rows = describe_fields()
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys))
    plain = ContextConfig().to_dict()
    expected = {k for k in plain if k not in ("summarizer", "recall")}
    expected |= {f"summarizer.{k}" for k in plain["summarizer"] if k != "models"}
    expected |= {f"recall.{k}" for k in plain["recall"]}
    expected |= {
        f"summarizer.models[].{k}"
        for k in ("model", "api_base", "api_key", "timeout", "num_retries")
    }
    assert set(keys) == expected
    by_key = {r["key"]: r for r in rows}
    assert by_key["compact_threshold"]["default"] == 0.92
    assert by_key["protected_tools"]["default"] == ["skill", "memory_search"]
    assert by_key["compaction_strategy"]["type"] == "truncate | priority | importance | summarize"
    assert by_key["summarizer.models[].timeout"]["default"] == 30.0
    assert by_key["recall.share"]["help"]
    assert all(isinstance(r["help"], str) and r["help"] for r in rows)
    import json

    json.dumps(rows)  # plain rows: the docs helper renders them as a table


def test_to_dict_round_trips_and_redacts_secrets() -> None:
    cfg = ContextConfig.from_mapping(
        {
            "summarizer": {"models": [{"model": "m", "api_key": "sk-1"}]},
            "recall": {"engine": "hybrid", "embedding_model": "e", "embedding_api_key": "ek"},
            "model_overrides": {"x": {"context_window": 1000}},
        }
    )
    shown = cfg.to_dict()
    assert shown["summarizer"]["models"][0]["api_key"] == "***"
    assert shown["recall"]["embedding_api_key"] == "***"
    assert "sk-1" not in repr(cfg) and "ek" not in repr(cfg.recall)
    assert ContextConfig.from_mapping(cfg._raw()) == cfg
