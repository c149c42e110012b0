"""The offline extractive summarizer: facts kept verbatim, carried, within any budget."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextledger.core.summary.offline import offline_summary
from contextledger.core.tokens import CharsCounter
from tests.examples import examples
from tests.samples import MESSAGES

COUNTER = CharsCounter()


WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "kernel",
    "route",
    "table",
    "shard",
    "queue",
    "retry",
    "budget",
    "merge",
    "draft",
    "review",
    "ticket",
    "widget",
]


filler = st.lists(st.sampled_from(WORDS), min_size=3, max_size=12).map(
    lambda ws: " ".join(ws).capitalize() + "."
)


names = st.text(string.ascii_lowercase, min_size=2, max_size=10).map(str.capitalize)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=st.lists(filler, max_size=30),
    after=st.lists(filler, max_size=30),
    name=names,
    port=st.integers(1024, 65535),
    budget=st.sampled_from([60, 200, 1024]),
)
def test_offline_summary_keeps_planted_facts_verbatim(
    before: list[str], after: list[str], name: str, port: int, budget: int
) -> None:
    msgs: list[dict[str, Any]] = []
    for i, sentence in enumerate(before):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": sentence})
    msgs.append({"role": "user", "content": f"My name is {name}. The port is {port}."})
    for i, sentence in enumerate(after):
        msgs.append({"role": "assistant" if i % 2 == 0 else "user", "content": sentence})
    out = offline_summary(msgs, max_tokens=budget, counter=COUNTER)
    assert f"My name is {name}." in out
    assert f"The port is {port}." in out
    assert COUNTER.count_text(out) <= budget
    assert out == offline_summary(msgs, max_tokens=budget, counter=COUNTER)  # deterministic


@settings(max_examples=examples(40), deadline=None)
@given(
    facts=st.lists(
        st.text(string.ascii_letters + string.digits + " -:_./", min_size=3, max_size=40)
        .map(str.strip)
        .filter(bool),
        min_size=1,
        max_size=6,
        unique=True,
    ),
    chatter=st.lists(filler, max_size=40),
)
def test_offline_summary_carries_prior_durable_facts(facts: list[str], chatter: list[str]) -> None:
    prior = "## Task overview\n- Old task\n## Durable facts\n" + "\n".join(f"- {f}" for f in facts)
    msgs = [{"role": "user", "content": c} for c in chatter]
    out = offline_summary(msgs, prior, max_tokens=300, counter=COUNTER)
    for f in facts:
        assert f"- {f}" in out.splitlines()
    assert COUNTER.count_text(out) <= 300


@given(budget=st.integers(0, 400))
def test_offline_summary_respects_any_budget(budget: int) -> None:
    out = offline_summary(
        MESSAGES * 10, "## Durable facts\n- a fact", max_tokens=budget, counter=COUNTER
    )
    assert COUNTER.count_text(out) <= budget


def test_offline_summary_sections() -> None:
    out = offline_summary(MESSAGES, counter=COUNTER)
    assert "## Task overview\n- First request: My name is Ada." in out
    assert "`service/config.yaml`" in out
    assert "We decided to keep port 8443." in out  # a decision
    assert "It failed with ImportError, fix it please." in out  # an error
    assert "secret chain of thought" not in out
