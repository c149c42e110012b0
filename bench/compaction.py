"""Compaction benchmark: planning time by view size, and passes per 1,000 steady turns.

Run: ``.venv/bin/python bench/compaction.py``. Deterministic (seeded); prints
figures, asserts nothing about time. The ratio column is the time growth per
10x more messages: ~10 is linear, ~13 is n log n, ~100 would be quadratic.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

from contextledger.core.compaction import RequestPlanner, plan
from contextledger.core.config import ContextConfig
from contextledger.core.tokens import CharsCounter
from contextledger.core.view import ORD_STRIDE, ViewItem

COUNTER = CharsCounter()
WORDS = (
    "the", "build", "fails", "in", "config.py", "parse_args", "line", "42",
    "retry", "userId", "ok", "check", "value", "fix",
)  # fmt: skip


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def conversation(n: int, seed: int = 7) -> tuple[ViewItem, ...]:
    """~n messages: chat, acks, and tool batches (OpenAI shape) with occasional big outputs."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are careful. " * 20}]
    call = 0
    while len(messages) < n:
        roll = rng.random()
        if roll < 0.35:
            messages.append({"role": "user", "content": _text(rng, 3, 30)})
        elif roll < 0.6:
            messages.append({"role": "assistant", "content": _text(rng, 1, 80)})
        else:
            ids = [f"call_{call + k}" for k in range(rng.randint(1, 4))]
            call += len(ids)
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {"name": "grep", "arguments": "{}"},
                        }
                        for i in ids
                    ],
                }
            )
            for i in ids:
                body = _text(rng, 5, 60)
                if rng.random() < 0.02:
                    body = "log line\n" * 2000
                messages.append({"role": "tool", "tool_call_id": i, "content": body})
    return tuple(
        ViewItem(ref=(s, 0), ord=s * ORD_STRIDE, message=m, tokens=COUNTER.count_message(m))
        for s, m in enumerate(messages, start=1)
    )


def time_plan(view: tuple[ViewItem, ...], strategy: str, config: ContextConfig) -> float:
    target = sum(i.tokens for i in view) // 3
    best = float("inf")
    for _ in range(2 if len(view) > 50_000 else 3):
        start = time.perf_counter()
        plan(view, target_tokens=target, config=config, counter=COUNTER, strategy=strategy)
        best = min(best, time.perf_counter() - start)
    return best


def storm(turns: int, strategy: str, budget: int = 4000) -> int:
    config = ContextConfig.from_mapping({"compaction_strategy": strategy})
    rng = random.Random(11)
    planner = RequestPlanner(budget, config, COUNTER)
    seq = 0

    def push(m: dict[str, Any]) -> None:
        nonlocal seq
        seq += 1
        planner.push(ViewItem((seq, 0), seq * ORD_STRIDE, m, COUNTER.count_message(m)))

    push({"role": "system", "content": "You are careful."})
    for k in range(turns):
        push({"role": "user", "content": f"q{k} " + _text(rng, 8, 16)})
        push({"role": "assistant", "content": f"a{k} " + _text(rng, 8, 16)})
        planner.view()
    return planner.passes


def main() -> None:
    config = ContextConfig()
    sizes = (1_000, 10_000, 100_000)
    views = {n: conversation(n) for n in sizes}
    print("planning time (best of runs), target = 1/3 of the view")
    print(f"{'strategy':<11}" + "".join(f"{n:>12,}" for n in sizes) + "   ratio per 10x")
    for strategy in ("truncate", "priority", "importance", "summarize"):
        times = [time_plan(views[n], strategy, config) for n in sizes]
        ratios = " ".join(f"{b / a:5.1f}" for a, b in itertools.pairwise(times))
        print(f"{strategy:<11}" + "".join(f"{t * 1000:10.1f}ms" for t in times) + f"   {ratios}")
    print()
    print("compaction passes per 1,000 steady turns (request planner, budget 4,000 tokens)")
    for strategy in ("truncate", "priority", "importance", "summarize"):
        start = time.perf_counter()
        passes = storm(1000, strategy)
        print(f"{strategy:<11}{passes:>6} passes   ({time.perf_counter() - start:.1f}s)")


if __name__ == "__main__":
    main()
