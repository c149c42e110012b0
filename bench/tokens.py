"""Token counting benchmark: throughput per counter and accuracy of the chars estimator.

Run: ``python bench/tokens.py`` (offline, < 60 s). Corpora are generated
deterministically (seeded) and cut into message-sized samples; throughput counts
every sample with ``count_text`` (how counts are taken at append), accuracy compares
``chars:4`` (and a naive ``len/4``) with tiktoken o200k per sample.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from contextledger.core.tokens import (
    CharsCounter,
    LitellmCounter,
    TiktokenCounter,
    TokenCounter,
)

SEED = 20240601
CORPUS_CHARS = 400_000
SAMPLES = 200

_WORDS_TEXT = (  # vocabulary for the JSON messages
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were their one all we can her has there been if more when "
    "will would who so no ledger context session memory agent token budget window summary "
    "compaction provider request response model event append checkpoint replay history "
    "message conversation tool result assistant user system careful quickly because however "
    "although therefore meanwhile approximately significant important interesting "
)
WORDS = _WORDS_TEXT.split()
_IDENTS_TEXT = "items result value index config session ledger tokens count total key name"
IDENTS = _IDENTS_TEXT.split()
CJK_CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说"
    "产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使"
    "点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明"
    "看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料"
)
KANA = (
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
)
HANGUL = "가나다라마바사아자차카타파하거너더러머버서어저처커터퍼허고노도로모보소오조초코토포호"


PROSE = (
    "The committee postponed its decision until the auditors had reviewed every invoice.",
    "Nobody expected the bridge to open on schedule, least of all the engineers who built it.",
    "She kept a notebook of overheard conversations, which later became her first novel.",
    "Rainfall in the northern valleys was twice the seasonal average this spring.",
    "If the migration fails halfway, the service must resume from the last checkpoint.",
    "Historians still argue about why the treaty collapsed within a single winter.",
    "The recipe calls for two cups of flour, a pinch of salt, and patience.",
    "Our quarterly report shows steady growth, although expenses rose faster than revenue.",
    "He replied that the deadline was unrealistic and asked for another week.",
    "Researchers measured the temperature of the lake at dawn for three consecutive years.",
    "Please summarise the discussion so far and list the open questions at the end.",
    "The library extended its opening hours during the examination period.",
    "A small misunderstanding about the contract turned into a lengthy legal dispute.",
    "Volunteers planted four hundred trees along the river before the first frost.",
    "Customers reported that the new interface was faster but harder to navigate.",
    "The orchestra rehearsed the final movement until the conductor was satisfied.",
)


def prose(rng: random.Random) -> str:
    out: list[str] = []
    size = 0
    while size < CORPUS_CHARS:
        sentence = rng.choice(PROSE)
        if rng.random() < 0.15:
            sentence += "\n\n"
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def code(rng: random.Random) -> str:
    out: list[str] = []
    size = 0
    while size < CORPUS_CHARS:
        name = "_".join(rng.sample(IDENTS, 2))
        args = ", ".join(rng.sample(IDENTS, rng.randint(1, 3)))
        body = [f"def {name}({args}):", f'    """Compute {name} for the {rng.choice(IDENTS)}."""']
        for _ in range(rng.randint(2, 8)):
            a, b = rng.sample(IDENTS, 2)
            body.append(f"    {a} = {b}.get({rng.randint(0, 999)!r}, {{}}) or [{a}, {b}]")
        body.append(f"    return {rng.choice(IDENTS)}\n\n")
        block = "\n".join(body)
        out.append(block)
        size += len(block)
    return "".join(out)


def tool_json(rng: random.Random) -> str:
    out: list[str] = []
    size = 0
    while size < CORPUS_CHARS:
        record = {
            "id": f"{rng.getrandbits(64):016x}",
            "path": "/".join(rng.sample(IDENTS, 3)) + ".py",
            "line": rng.randint(1, 5000),
            "score": round(rng.random(), 4),
            "tags": rng.sample(IDENTS, 2),
            "ok": rng.random() < 0.8,
            "message": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))),
        }
        text = json.dumps(record, indent=2 if rng.random() < 0.5 else None)
        out.append(text)
        size += len(text) + 2
    return "[" + ",\n".join(out) + "]"


def cjk(rng: random.Random) -> str:
    out: list[str] = []
    size = 0
    while size < CORPUS_CHARS:
        script = rng.random()
        if script < 0.6:
            body = "".join(rng.choice(CJK_CHARS) for _ in range(rng.randint(8, 30)))
            sentence = body + rng.choice("\u3002\uff0c\uff01\uff1f")  # CJK full stop, comma, !, ?
        elif script < 0.8:
            sentence = "".join(rng.choice(KANA + CJK_CHARS) for _ in range(rng.randint(8, 30)))
            sentence += "。"
        else:
            words = [
                "".join(rng.choice(HANGUL) for _ in range(rng.randint(1, 4))) for _ in range(6)
            ]
            sentence = " ".join(words) + "."
        out.append(sentence)
        size += len(sentence)
    return "".join(out)


def samples(text: str, rng: random.Random) -> list[str]:
    """Cut ``text`` into consecutive message-sized pieces (50..4000 chars, log-uniform)."""
    pieces: list[str] = []
    pos = 0
    while pos < len(text):
        size = int(math.exp(rng.uniform(math.log(50), math.log(4000))))
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


def throughput(counter: TokenCounter, pieces: list[str]) -> float:
    """MB/s (UTF-8 bytes) over all pieces, best of 3 runs."""
    nbytes = sum(len(p.encode()) for p in pieces)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        for piece in pieces:
            counter.count_text(piece)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e6


def mape(estimate: Callable[[str], int], truth: Callable[[str], int], pieces: list[str]) -> float:
    errors = [abs(estimate(p) - truth(p)) / truth(p) for p in pieces if truth(p) > 0]
    return 100 * statistics.fmean(errors)


def bias(estimate: Callable[[str], int], truth: Callable[[str], int], pieces: list[str]) -> float:
    return 100 * statistics.fmean((estimate(p) - truth(p)) / truth(p) for p in pieces if truth(p))


def main() -> None:
    started = time.perf_counter()
    rng = random.Random(SEED)
    corpora = {
        "English prose": prose(rng),
        "Python code": code(rng),
        "JSON tool output": tool_json(rng),
        "CJK text": cjk(rng),
    }
    pieces = {name: samples(text, rng) for name, text in corpora.items()}

    o200k = TiktokenCounter(encoding="o200k_base")
    counters: dict[str, TokenCounter] = {
        "tiktoken o200k": o200k,
        "tiktoken cl100k": TiktokenCounter(encoding="cl100k_base"),
        "litellm gpt-4o": LitellmCounter("gpt-4o"),
        "chars:4": CharsCounter(4.0),
    }
    for counter in counters.values():  # warm up: load encodings / import litellm
        counter.count_text("warm up")

    print(f"# Token counting benchmark (seed {SEED}, Python {sys.version.split()[0]})\n")
    print("## Throughput (MB/s, UTF-8 bytes, count_text per message-sized sample)\n")
    header = "| corpus | samples | MB | " + " | ".join(counters) + " |"
    print(header)
    print("|" + "---|" * (3 + len(counters)))
    for name, ps in pieces.items():
        mb = sum(len(p.encode()) for p in ps) / 1e6
        rates = [f"{throughput(c, ps):.1f}" for c in counters.values()]
        print(f"| {name} | {len(ps)} | {mb:.2f} | " + " | ".join(rates) + " |")

    print("\n## chars estimator vs tiktoken o200k (per-sample mean absolute % error)\n")
    print("| corpus | samples | chars:4 MAPE | chars:4 bias | naive len/4 MAPE | naive bias |")
    print("|---|---|---|---|---|---|")
    chars = counters["chars:4"]

    def naive(text: str) -> int:
        return math.ceil(len(text) / 4)

    for name, ps in pieces.items():
        subset = ps[:SAMPLES]
        print(
            f"| {name} | {len(subset)} "
            f"| {mape(chars.count_text, o200k.count_text, subset):.1f}% "
            f"| {bias(chars.count_text, o200k.count_text, subset):+.1f}% "
            f"| {mape(naive, o200k.count_text, subset):.1f}% "
            f"| {bias(naive, o200k.count_text, subset):+.1f}% |"
        )
    print("\n## usage() latency vs history length (O(1): the view total is kept at append)\n")
    print("| messages in the session | usage() median µs | p95 µs | ratio to 100 |")
    print("|---|---|---|---|")
    rows = asyncio.run(usage_latency((100, 10_000, 100_000)))
    for n, med, p95 in rows:
        print(f"| {n:,} | {med:.1f} | {p95:.1f} | {med / rows[0][1]:.2f}x |")
    print(f"\n_total run time {time.perf_counter() - started:.1f} s_")


async def usage_latency(
    sizes: tuple[int, ...], reads: int = 2000
) -> list[tuple[int, float, float]]:
    """``Session.usage()`` on sessions of growing length (memory store: usage never reads
    the store, it combines the cached view total with the model's budget)."""
    from contextledger import Ledger

    out = []
    async with Ledger.open("memory://") as ledger:
        for n in sizes:
            session = await ledger.session(f"usage-{n}", model="gpt-4o")
            for i in range(n):
                await session.add_message(
                    {
                        "role": "user" if i % 2 else "assistant",
                        "content": f"message {i} " + "lorem ipsum " * 20,
                    }
                )
            samples = []
            for _ in range(reads):
                t0 = time.perf_counter()
                await session.usage()
                samples.append((time.perf_counter() - t0) * 1e6)
            samples.sort()
            out.append((n, statistics.median(samples), samples[int(len(samples) * 0.95)]))
    return out


if __name__ == "__main__":
    main()
