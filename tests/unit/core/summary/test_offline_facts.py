"""The offline summarizer keeps facts: newest values, new over carried, any speaker."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from contextledger.core.summary.offline import offline_summary, parse_sections
from tests.examples import examples
from tests.unit.strategies import COUNTER, assistant, openai_call, openai_result, user


def test_a_changed_fact_keeps_its_newest_value() -> None:
    msgs = [
        user("Heads up: orchard-api binds to 18443 on staging."),
        assistant("Noted."),
        user("Heads up: orchard-api binds to 20001 on staging."),
    ]
    facts = "\n".join(parse_sections(offline_summary(msgs, counter=COUNTER))["Durable facts"])
    assert "20001" in facts and "18443" not in facts


def test_a_carried_value_restated_in_new_turns_is_replaced() -> None:
    prior = "## Durable facts\n- The lantern-cache budget is $12,400."
    out = offline_summary([user("The lantern-cache budget is $15,000.")], prior, counter=COUNTER)
    assert "$15,000" in out and "$12,400" not in out


@settings(max_examples=examples(40), deadline=None)
@given(carried=st.lists(st.integers(1000, 9999), min_size=20, max_size=40, unique=True))
def test_carried_lines_never_crowd_out_new_facts(carried: list[int]) -> None:
    prior = "## Durable facts\n" + "\n".join(f"- item {n} of batch {n} was fine" for n in carried)
    new = [user("The staging port is 18443."), user("Ticket OPS-4471 tracks the flaky login.")]
    out = offline_summary(new, prior, max_tokens=120, counter=COUNTER)
    assert "18443" in out and "OPS-4471" in out
    assert COUNTER.count_text(out) <= 120


def test_facts_the_assistant_and_tools_state_are_kept() -> None:
    msgs = [
        user("please set it up"),
        assistant("Done. I moved the rate limiter into src/net/bucket_311.py."),
        openai_call([("c1", "set_config")]),
        openai_result("c1", json.dumps({"owner": "mei@fernhill.io", "region": "eu-west-12"})),
        assistant("ok"),
    ]
    msgs[2]["tool_calls"][0]["function"]["arguments"] = '{"max_workers": 1465}'
    out = offline_summary(msgs, counter=COUNTER)
    assert "src/net/bucket_311.py" in out
    assert '"max_workers": 1465' in out
    assert "mei@fernhill.io" in out and "eu-west-12" in out
    assert out == offline_summary(msgs, counter=COUNTER)  # deterministic


def test_small_step_numbers_are_chatter_not_facts() -> None:
    msgs = [user(f"Can you look at the cache again (step {n})?") for n in range(40)]
    msgs.insert(3, user("Finance approved $12,430 for the lantern-cache migration."))
    out = offline_summary(msgs, max_tokens=80, counter=COUNTER)
    facts = parse_sections(out).get("Durable facts", [])
    assert any("$12,430" in line for line in facts)
    assert not any("(step" in line for line in facts)
