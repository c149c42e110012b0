"""The adapters' tests use the shared fixtures; this only exposes ``fake_llm`` here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakellm import FakeLLM, running_fake_llm


@pytest.fixture(name="fake_llm")
def _fake_llm() -> Iterator[FakeLLM]:
    with running_fake_llm() as fake:
        yield fake
