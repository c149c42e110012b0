"""The docs' generated tables (``docs/hooks.py``): complete against the code, and the
README's copy of the per-turn table is what the last recorded run says."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_performance_table_is_the_last_recorded_run() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- generated: turns -->\n(.*?)\n<!-- end generated -->", readme, re.S)
    assert found, "the README lost its generated per-turn table"
    assert found.group(1) == _hooks().turns_table(), (
        "bench/results/turns.json changed: paste docs/hooks.py's turns_table() into the README"
    )


def test_the_config_table_lists_every_key() -> None:
    from contextledger.core.config import ContextConfig, RecallConfig, SummarizerConfig

    table = _hooks().config_table()
    keys = set(re.findall(r"^\| `([a-z_.]+)` \|", table, re.M))
    expected = {f.name for f in dataclasses.fields(ContextConfig)} - {"summarizer", "recall"}
    expected |= {f"summarizer.{f.name}" for f in dataclasses.fields(SummarizerConfig)}
    expected |= {f"recall.{f.name}" for f in dataclasses.fields(RecallConfig)}
    assert keys == expected
    for line in table.splitlines()[2:]:
        assert line.rstrip("| ").split("|")[-1].strip(), f"no help for {line}"


def test_the_settings_table_lists_every_setting_with_its_help() -> None:
    from contextledger.http.settings import ENV_PREFIX, Settings

    table = _hooks().settings_table()
    for f in dataclasses.fields(Settings):
        [row] = [
            ln for ln in table.splitlines() if ln.startswith(f"| `{ENV_PREFIX}{f.name.upper()}`")
        ]
        if f.metadata.get("help"):
            assert f.metadata["help"].split(" (")[0].replace("|", "\\|") in row


def test_an_unknown_marker_fails_the_build() -> None:
    with pytest.raises(ValueError, match="no generated table named 'nope'"):
        _hooks().render("text\n<!-- generated: nope -->\n")
