"""Fact-recall probe: how many planted facts survive rolling summaries, verbatim.

Run: ``.venv/bin/python bench/recall.py [--facts 40] [--turns 400] [--budget 3000]``.

A long conversation is generated (seeded) in which the user states N facts
("my deploy key id is DK-4411", "our staging port is 18443", ...) among filler
turns that also mention numbers and names. The session runs with
``auto_compact`` and the ``summarize`` strategy, and asks for a request view
within ``--budget`` tokens every turn, so rolling summaries are written as it
grows. Facts are only planted before the preserved tail, so every one of them has
been folded into a summary by the end: a fact counts as recalled when its value
is still in the final working view verbatim (string containment).

Rows: the offline (extractive) summarizer, always; and the model named by
``CONTEXTLEDGER_RECALL_MODEL`` (a litellm model name; ``CONTEXTLEDGER_RECALL_API_BASE``
optional; the provider's usual key variable, e.g. ``OPENAI_API_KEY``), with no
offline fallback so the row measures the model alone. Uses ``memory://``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from contextledger import Ledger
from contextledger.logging import configure_logging

WORDS = ("ledger", "postgres", "index", "migration", "replica", "vacuum", "schema", "query",
         "latency", "rollback", "checkpoint", "cache", "deploy", "release", "config")
FIRST = ("Ines", "Tomas", "Priya", "Kwame", "Mei", "Oskar", "Leila", "Rafael", "Ana", "Jun")
LAST = ("Okafor", "Lindqvist", "Nakamura", "Moreau", "Haddad", "Kowalski", "Silva", "Brandt")


@dataclass(frozen=True)
class Fact:
    statement: str
    value: str
    turn: int


def _fact(rng: random.Random, k: int, turn: int, names: list[str]) -> Fact:
    kind = k % 6
    if kind == 0:
        value = f"DK-{rng.randint(1000, 9999)}{k}"
        text = f"For the record, my deploy key id is {value}."
    elif kind == 1:
        value = str(rng.randint(10000, 60000) + k)
        text = f"Note that our staging port is {value}, please use it."
    elif kind == 2:
        value = names.pop()
        text = f"My manager's name is {value}; copy them on incidents."
    elif kind == 3:
        value = f"v{rng.randint(1, 9)}.{rng.randint(0, 30)}.{k}"
        text = f"The release tag we ship next is {value}."
    elif kind == 4:
        value = f"eu-west-{k}{rng.randint(10, 99)}"
        text = f"Remember: my API region is {value}."
    else:
        value = f"+1-555-{rng.randint(1000, 9999)}-{k}"
        text = f"I prefer to be paged at {value} when the ledger is down."
    return Fact(text, value, turn)


def _filler(rng: random.Random, prefix: str, low: int, high: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
    if rng.random() < 0.3:  # noise that looks fact-ish: numbers and identifiers
        words += f" (ticket OPS-{rng.randint(100, 999)}, build {rng.randint(1000, 9999)})"
    return f"{prefix} {words}."


def conversation(n_facts: int, turns: int, seed: int) -> tuple[list[tuple[str, str]], list[Fact]]:
    """``turns`` (user, assistant) pairs; facts planted in the first 80% of them."""
    rng = random.Random(seed)
    plant_at = sorted(rng.sample(range(int(turns * 0.8)), n_facts))
    names = [f"{a} {b}" for a in FIRST for b in LAST]  # unique, so containment is exact
    rng.shuffle(names)
    facts = {t: _fact(rng, k, t, names) for k, t in enumerate(plant_at)}
    pairs: list[tuple[str, str]] = []
    for t in range(turns):
        question = _filler(rng, rng.choice(("Next,", "Also", "Now", "Then")), 8, 40)
        if t in facts:
            question = f"{facts[t].statement} {question}"
        pairs.append((question, _filler(rng, "Done:", 15, 60)))
    return pairs, list(facts.values())


@dataclass(frozen=True)
class Row:
    name: str
    planted: int
    recalled: int | None
    summaries: int | None
    note: str = ""


async def probe(name: str, models: list[dict[str, Any]], *, offline: bool, n_facts: int,
                turns: int, budget: int, seed: int) -> Row:
    pairs, facts = conversation(n_facts, turns, seed)
    config = {"auto_compact": True, "compaction_strategy": "summarize", "token_counter": "chars",
              "summarizer": {"models": models, "offline_fallback": offline}}
    started = time.monotonic()
    async with Ledger.open("memory://") as ledger:
        session = await ledger.session("recall", config=config)
        await session.add_message({"role": "system", "content": "You are a careful SRE."})
        for question, answer in pairs:
            await session.add_message({"role": "user", "content": question})
            await session.get_messages_for_request(token_budget=budget)
            await session.add_message({"role": "assistant", "content": answer})
        view = "\n".join(str(m.get("content")) for m in await session.view())
        events: list[Any] = [e async for e in session.events()]
    summaries = [e for e in events if e.type == "summary.recorded"]
    truncations = sum(1 for e in events if e.type == "compaction.applied")
    answered = {str(e.payload.audit.get("model")) for e in summaries}
    recalled = sum(1 for f in facts if f.value in view)
    note = f"{time.monotonic() - started:.1f}s; answered by {', '.join(sorted(answered)) or '-'}"
    if truncations:
        note += f"; {truncations} truncate fallbacks"
    return Row(name, len(facts), recalled, len(summaries), note)


def _table(rows: list[Row]) -> str:
    head = ("summarizer", "facts planted", "facts recalled", "%", "summaries written", "notes")
    body = [
        (r.name, str(r.planted), "-" if r.recalled is None else str(r.recalled),
         "-" if r.recalled is None else f"{100 * r.recalled / max(r.planted, 1):.0f}%",
         "-" if r.summaries is None else str(r.summaries), r.note)
        for r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
             for line in (head, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


async def main() -> None:
    configure_logging(level="WARNING", stream=sys.stderr)  # figures on stdout, logs apart
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--facts", type=int, default=40)
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--budget", type=int, default=3000, help="request budget in tokens")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    common: dict[str, Any] = {"n_facts": args.facts, "turns": args.turns,
                              "budget": args.budget, "seed": args.seed}

    rows = [await probe("offline", [], offline=True, **common)]
    model = os.environ.get("CONTEXTLEDGER_RECALL_MODEL")
    if model:
        spec: dict[str, Any] = {"model": model, "timeout": 120.0, "num_retries": 1}
        if os.environ.get("CONTEXTLEDGER_RECALL_API_BASE"):
            spec["api_base"] = os.environ["CONTEXTLEDGER_RECALL_API_BASE"]
        rows.append(await probe(model, [spec], offline=False, **common))
    else:
        rows.append(Row("model", args.facts, None, None, "skipped: set CONTEXTLEDGER_RECALL_MODEL"))
    print(f"{args.turns} turns, {args.facts} facts planted in the first 80%, "
          f"request budget {args.budget} tokens, seed {args.seed}\n")
    print(_table(rows))


if __name__ == "__main__":
    asyncio.run(main())
