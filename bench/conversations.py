"""Recall on conversations: two people over many dated sittings, questions that paraphrase.

Run: ``.venv/bin/python bench/conversations.py [--conversations 4] [--stores pg,memory]``.

A generator of our own (no public data set is tuned to): two speakers talk in 24-32
sittings a few days apart, 14-26 turns each, about 350-700 turns in all. Most turns are
chatter drawn from a Zipf vocabulary (bench/language.py); among them each speaker states
facts of eight kinds: a class signed up for, a job offered, a book finished, a trip
(asked *when*: the answer is the sitting's date), an instrument practised, a sibling's
name, a value that changes later (both statements share the question's word; asked for
now, the newer statement is the evidence, and a request with the older alone is counted
"stale only"), and
two-hop facts (a relative's city in one turn, a visit to that relative in another, asked
as "which city did X drive to": both turns are the evidence). The other speaker answers
each statement in a turn that repeats its topic words, as people do. Questions share at
most a word or two (stemmed) with their evidence, never the sentence. Two kinds share
none (``--kinds all``, the default; ``base`` leaves them out): ``paraphrase``, a fact
asked in other words ("what is her dog called?" of "we adopted a beagle, we named him
Biscuit"), and ``aggregate``, three statements in three sittings that one question needs
together ("what has she been doing outdoors lately?"): what only an embedding model can
find.

Each conversation is written with its sittings' dates (the events' times), then every
question is appended as the latest user turn and the request built at a budget of 10%
and 25% of the conversation's tokens. Reported: questions with at least one evidence turn
in the request ("any"), with all of them ("all"), multi-hop all, stale only, and the median ms of a
request; per store, recall on (the default) and off. Prints figures, writes JSON,
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from bench._pg import embedded_server
    from bench.language import FIRST_NAMES, PLACES, Chatter, Prose
    from bench.results import write as write_results
except ImportError:  # run as a script: bench/ itself is sys.path[0]
    from _pg import embedded_server  # type: ignore[no-redef]
    from language import FIRST_NAMES, PLACES, Chatter, Prose  # type: ignore[no-redef]
    from results import write as write_results  # type: ignore[no-redef]

from contextledger import Ledger
from contextledger.core.events import MessageAppended

MODEL = "gpt-4o"
#: ``--text``: the chatter between the facts: ``sentences`` (``Chatter``: small talk an
#: embedding model reads as language) or ``zipf`` (``Prose``: word salad, which makes an
#: embedding model's nearest turns those that share the question's speaker name)
TEXT = "sentences"
CLASSES = ("pottery", "salsa", "woodworking", "calligraphy", "watercolor", "fencing", "judo")
JOBS = ("pharmacist", "paramedic", "librarian", "surveyor", "sommelier", "welder")
BOOKS = ("The Glass Orchard", "Northern Lights Ledger", "A Salt Road", "Copper Sparrows")
INSTRUMENTS = ("cello", "banjo", "clarinet", "harmonica", "ukulele", "oboe")
RELATIVES = ("cousin", "uncle", "aunt", "grandmother", "nephew")
BREEDS = ("beagle", "terrier", "spaniel", "collie", "dachshund")
PETS = ("Biscuit", "Pepper", "Waffles", "Juniper", "Noodle")
COMPANIES = ("Halvorsen Freight", "Brightwater Labs", "Okafor & Daughters", "Teller Mills")
FOODS = ("cheese", "bread", "coffee", "chocolate", "shellfish")
VENUES = ("old boathouse", "glass conservatory", "rooftop garden", "stone barn")
OUTDOORS = ("hiking", "kayaking", "camping", "climbing", "sailing", "cycling")
#: ``--kinds``: ``base`` asks the kinds a shared word can find (the figures before
#: 2026-11-28 were of these alone); ``all`` (default) adds ``paraphrase`` (the question
#: shares no word with its evidence but the speaker's name: "what is her dog called?" of
#: "we adopted a beagle, we named him Biscuit") and ``aggregate`` (three statements in
#: three sittings, all needed, in other words than the question's), which a lexical
#: search cannot find and an embedding model may.
KINDS = "all"


@dataclass
class Question:
    kind: str
    text: str
    evidence: list[str]  # the turns' contents that hold the answer
    #: turns an answer would be stale from (an older value the evidence supersedes)
    stale: list[str] = field(default_factory=list)


@dataclass
class Conversation:
    sittings: list[tuple[dt.datetime, list[dict[str, Any]]]] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def _fact_kinds(
    rng: random.Random, me: str, other: str, date: Callable[[], str]
) -> list[tuple[str, list[str], str]]:
    """(kind, [statement, reply], question) templates for speaker ``me``."""
    cls, job, book = rng.choice(CLASSES), rng.choice(JOBS), rng.choice(BOOKS)
    inst, sib = rng.choice(INSTRUMENTS), rng.choice(FIRST_NAMES)
    place = rng.choice(PLACES)
    return [
        (
            "single",
            [
                f"I signed up for {cls} lessons at the community studio, Fridays after work.",
                f"{cls.capitalize()} on Fridays, that sounds like a lovely way to unwind!",
            ],
            f"What class did {me} sign up for?",
        ),
        (
            "single",
            [
                f"Big news: they offered me the {job} position at the regional hospital!",
                f"A {job}! Congratulations, you worked so hard for that offer.",
            ],
            f"Which role was {me} offered?",
        ),
        (
            "single",
            [
                f"I finally finished {book} last night, what an ending.",
                "I keep hearing about that one, I should borrow it from you.",
            ],
            f"Which novel did {me} just finish?",
        ),
        (
            "single",
            [
                f"I've been practising the {inst} every evening, my neighbours are patient.",
                f"Ha, the {inst} is a hard one to learn, keep going!",
            ],
            f"What instrument is {me} learning to play?",
        ),
        (
            "single",
            [
                f"My sister {sib} is moving in with us for a while.",
                f"That will be cosy! Does {sib} get along with the kids?",
            ],
            f"What is the name of {me}'s sister?",
        ),
        (
            "when",
            [
                f"Just got back from {place}, the food there was incredible.",
                f"{place}! I have always wanted to go, you have to show me photos.",
            ],
            f"When did {me} take the trip to {place}?",
        ),
    ]


def _paraphrases(rng: random.Random, me: str) -> list[tuple[str, list[str], str]]:
    """(kind, [statement, reply], question): the question in other words than the
    statement (nothing but the speaker's name in common)."""
    pet, breed, company = rng.choice(PETS), rng.choice(BREEDS), rng.choice(COMPANIES)
    food, venue = rng.choice(FOODS), rng.choice(VENUES)
    return [
        (
            "paraphrase",
            [
                f"We adopted a little {breed} last month, we named him {pet}.",
                f"{pet}! Send me pictures of the little one.",
            ],
            f"What is {me}'s dog called?",
        ),
        (
            "paraphrase",
            [
                f"I started at {company} on Monday, the commute is brutal but the team is kind.",
                "A new place! The first weeks are always the hardest.",
            ],
            f"Where is {me} employed at the moment?",
        ),
        (
            "paraphrase",
            [
                f"My doctor says {food} is off the menu for good, so no more of that for me.",
                "Oh no, you loved it so much.",
            ],
            f"Which thing to eat did {me} have to give up?",
        ),
        (
            "paraphrase",
            [
                f"We booked the {venue} for the reception after the ceremony.",
                "That place is gorgeous, what a choice.",
            ],
            f"Where will {me}'s wedding party take place?",
        ),
    ]


def _harder(
    rng: random.Random, me: str, other: str, n_sittings: int
) -> list[tuple[int, list[tuple[str, str]], Question | None]]:
    """Plans of the kinds no shared word finds (``KINDS``): two paraphrased facts and one
    question whose three statements lie in three sittings."""
    plans: list[tuple[int, list[tuple[str, str]], Question | None]] = []
    for kind, (stmt, reply), q in rng.sample(_paraphrases(rng, me), 2):
        turns = [(me, stmt), (other, reply)]
        plans.append((rng.randrange(n_sittings), turns, Question(kind, q, [f"{me}: {stmt}"])))
    first, second, third = rng.sample(OUTDOORS, 3)
    said = [
        f"Went {first} with my brother on Saturday, what a view from the top.",
        f"Took the kids {second} at the lake, they came back soaked and happy.",
        f"Booked a {third} weekend for next month, first time for me.",
    ]
    replies = ["Sounds like a perfect day.", "Ha, kids and water!", "You will love it."]
    at = sorted(rng.sample(range(n_sittings), 3))
    question = Question(
        "aggregate", f"What has {me} been doing outdoors lately?", [f"{me}: {t}" for t in said]
    )
    for k in range(3):
        plans.append((at[k], [(me, said[k]), (other, replies[k])], question if k == 2 else None))
    return plans


def conversation(seed: int) -> Conversation:
    """One generated conversation and its questions (deterministic for ``seed``)."""
    rng = random.Random(seed)
    prose: Prose | Chatter = Chatter(seed) if TEXT == "sentences" else Prose(seed)
    a, b = rng.sample(FIRST_NAMES, 2)
    start = dt.datetime(2023, 1, 9, 18, 30, tzinfo=dt.UTC) + dt.timedelta(days=rng.randint(0, 200))
    n_sittings = rng.randint(24, 32)
    days = [start]
    for _ in range(n_sittings - 1):
        days.append(days[-1] + dt.timedelta(days=rng.randint(2, 9), hours=rng.randint(-3, 3)))
    conv = Conversation()
    plans: list[tuple[int, list[tuple[str, str]], Question]] = []  # sitting, turns, question

    def date_of(i: int) -> str:
        return f"{days[i].day} {days[i]:%B %Y}"

    for me, other in ((a, b), (b, a)):
        for kind, (stmt, reply), q in _fact_kinds(rng, me, other, lambda: ""):
            at = rng.randrange(n_sittings)
            if kind == "when":
                q = q  # the answer is the sitting's date
            turns = [(me, stmt), (other, reply)]
            plans.append((at, turns, Question(kind, q, [f"{me}: {stmt}"])))
        # a value that changes later: the newer statement answers "now"; both name the
        # job, as the question does (until 2026-11-28 neither did: it was a paraphrase)
        old, new = rng.sample(JOBS, 2)
        first, later = sorted(rng.sample(range(n_sittings), 2))
        s_old = f"Work is fine, the job pays the bills, being a {old} for now."
        s_new = f"I quit last week, new job: I am a {new} now, a whole new routine."
        plans.append((first, [(me, s_old), (other, "Bills are bills, right?")], None))  # type: ignore[arg-type]
        plans.append(
            (
                later,
                [(me, s_new), (other, f"A {new}, wow, what a change!")],
                Question(
                    "updated",
                    f"What job does {me} have these days?",
                    [f"{me}: {s_new}"],
                    stale=[f"{me}: {s_old}"],
                ),
            )
        )
        # two hops: where a relative lives, then a visit to that relative
        rel, city = rng.choice(RELATIVES), rng.choice(PLACES)
        first, later = sorted(rng.sample(range(n_sittings), 2))
        s1 = f"My {rel} lives in {city} now, in a flat near the harbour."
        s2 = f"I drove out to see my {rel} over the weekend, six hours each way."
        plans.append((first, [(me, s1), (other, "Near the harbour, lucky them.")], None))  # type: ignore[arg-type]
        plans.append(
            (
                later,
                [(me, s2), (other, "Six hours! You must have been exhausted.")],
                Question(
                    "multi-hop",
                    f"Which city did {me} drive to over the weekend?",
                    [f"{me}: {s1}", f"{me}: {s2}"],
                ),
            )
        )
    if KINDS == "all":  # from an RNG of their own: the base kinds' plans stay as they were
        other_rng = random.Random(seed * 7919 + 1)
        for me, other in ((a, b), (b, a)):
            plans.extend(_harder(other_rng, me, other, n_sittings))  # type: ignore[arg-type]
    by_sitting: dict[int, list[tuple[list[tuple[str, str]], Question | None]]] = {}
    for at, turns, q in plans:
        by_sitting.setdefault(at, []).append((turns, q))
    for i, day in enumerate(days):
        speaker = a if i % 2 == 0 else b
        turns: list[tuple[str, str]] = []
        n = rng.randint(14, 26)
        planned = by_sitting.get(i, [])
        slots = sorted(rng.sample(range(n), min(len(planned), n)))
        k = 0
        for t in range(n):
            if k < len(planned) and t == slots[k]:
                turns.extend(planned[k][0])
                q = planned[k][1]
                if q is not None:
                    if q.kind == "when":
                        q = Question(q.kind, q.text, q.evidence, q.stale)
                        q.text += f" (answer: {date_of(i)})"  # what a judge would check
                    conv.questions.append(q)
                k += 1
                speaker = turns[-1][0]
            speaker = b if speaker == a else a
            turns.append((speaker, prose.text(rng.randint(8, 30))))
        messages = [
            {"role": "user" if who == a else "assistant", "content": f"{who}: {text}"}
            for who, text in turns
        ]
        conv.sittings.append((day, messages))
    for q in conv.questions:  # the question text the model sees (no answer in it)
        q.text = q.text.split(" (answer:")[0]
    return conv


async def write_conversation(ledger: Ledger, sid: str, conv: Conversation, config: Any) -> Any:
    """The conversation as events at its sittings' times; the live session on it."""
    session = await ledger.session(sid, model=MODEL, config=config)
    counter = session.counter
    for day, messages in conv.sittings:
        for k, message in enumerate(messages):
            payload = MessageAppended(message, counter.count_message(message), False, counter.name)
            when = day + dt.timedelta(minutes=k)
            await ledger.store.append(sid, [payload], created_at=when)
    session = await ledger.session(sid)
    if EMBEDDINGS:  # embedded before the questions, as a session hybrid all along would be
        await session.get_messages_for_request()  # (a request starts the backlog's
        await session.close()  # embedding, off its path: this waits for it)
    return session


@dataclass
class Tally:
    asked: int = 0
    any: int = 0
    all: int = 0
    multi: int = 0
    multi_all: int = 0
    stale_only: int = 0  # an older value in the request without the newer
    ms: list[float] = field(default_factory=list)
    by_kind: dict[str, list[int]] = field(default_factory=dict)


#: ``--embeddings URL``: hybrid recall through that OpenAI-compatible endpoint
#: (bench/embed_server.py), where the store keeps vectors (PostgreSQL with pgvector).
EMBEDDINGS: str | None = None


def recall_config(recall: bool) -> dict[str, Any] | None:
    if not recall:
        return {"recall": {"enabled": False}}
    if EMBEDDINGS:
        return {
            "recall": {
                "engine": "hybrid",
                "embedding_model": "openai/all-minilm-l6-v2",
                "embedding_api_base": EMBEDDINGS,
                "embedding_api_key": "unused",
            }
        }
    return None


async def measure(ledger: Ledger, sid: str, conv: Conversation, pct: int, recall: bool) -> Tally:
    config = recall_config(recall)
    session = await write_conversation(ledger, sid, conv, config)
    history = sum(session.counter.count_message(m) for _, ms in conv.sittings for m in ms)
    budget = max(1, history * pct // 100)
    tally = Tally()
    for q in conv.questions:
        await session.add_message({"role": "user", "content": q.text})
        t0 = time.perf_counter()
        request = await session.get_messages_for_request(token_budget=budget)
        tally.ms.append((time.perf_counter() - t0) * 1000)
        text = json.dumps(request, ensure_ascii=False)
        hits = [json.dumps(e, ensure_ascii=False)[1:-1] in text for e in q.evidence]
        stale = [json.dumps(e, ensure_ascii=False)[1:-1] in text for e in q.stale]
        tally.stale_only += any(stale) and not any(hits)
        tally.asked += 1
        tally.any += any(hits)
        tally.all += all(hits)
        if q.kind == "multi-hop":
            tally.multi += 1
            tally.multi_all += all(hits)
        k = tally.by_kind.setdefault(q.kind, [0, 0, 0])
        k[0] += 1
        k[1] += any(hits)
        k[2] += all(hits)
        await session.add_message({"role": "assistant", "content": "Let me think back."})
    return tally


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.0f}%" if d else "—"


async def main_async(args: argparse.Namespace) -> None:
    convs = [conversation(seed) for seed in range(1, args.conversations + 1)]
    turns = [sum(len(m) for _, m in c.sittings) for c in convs]
    print(
        f"{len(convs)} conversations, {min(turns)}-{max(turns)} turns, "
        f"{sum(len(c.questions) for c in convs)} questions",
        file=sys.stderr,
    )
    rows: list[dict[str, Any]] = []
    with embedded_server() as dsn:
        for store in args.stores:
            url = "memory://" if store == "memory" else dsn
            async with Ledger.open(url, migrate=None if store == "memory" else True) as ledger:
                for pct in args.budgets:
                    for recall in (True, False):
                        total = Tally()
                        for i, conv in enumerate(convs):
                            t = await measure(ledger, f"c{i}-{pct}-{recall}", conv, pct, recall)
                            total.asked += t.asked
                            total.any += t.any
                            total.all += t.all
                            total.multi += t.multi
                            total.multi_all += t.multi_all
                            total.stale_only += t.stale_only
                            total.ms += t.ms
                            for kind, (n, ok, whole) in t.by_kind.items():
                                k = total.by_kind.setdefault(kind, [0, 0, 0])
                                k[0] += n
                                k[1] += ok
                                k[2] += whole
                        rows.append(
                            {
                                "store": store,
                                "budget_pct": pct,
                                "recall": recall,
                                "asked": total.asked,
                                "any": total.any,
                                "all": total.all,
                                "multi_hop": total.multi,
                                "multi_hop_all": total.multi_all,
                                "stale_only": total.stale_only,
                                "ms_median": statistics.median(total.ms),
                                "by_kind_any": {k: v[1] / v[0] for k, v in total.by_kind.items()},
                                "by_kind_all": {k: v[2] / v[0] for k, v in total.by_kind.items()},
                                "kinds": KINDS,
                            }
                        )
                        print(f"  {store} {pct}% recall={recall} done", file=sys.stderr)
    print(
        "| store | budget | recall | any evidence | all evidence | multi-hop all | stale only "
        "| ms/request |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['store']} | {r['budget_pct']}% | {'on' if r['recall'] else 'off'} | "
            f"{_pct(r['any'], r['asked'])} | {_pct(r['all'], r['asked'])} | "
            f"{_pct(r['multi_hop_all'], r['multi_hop'])} | {r['stale_only']} | "
            f"{r['ms_median']:.2f} |"
        )
    print("\nany / all evidence by kind (recall on):")
    for r in rows:
        if r["recall"]:
            kinds = ", ".join(
                f"{k} {100 * v:.0f}% / {100 * r['by_kind_all'][k]:.0f}%"
                for k, v in sorted(r["by_kind_any"].items())
            )
            print(f"  {r['store']} {r['budget_pct']}%: {kinds}")
    name = "conversations-hybrid" if EMBEDDINGS else "conversations"
    if KINDS != "all":
        name += "-" + KINDS
    path = write_results(name, {"conversations": len(convs), "rows": rows})
    print(f"\nfigures: {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--stores", default="pg,memory")
    parser.add_argument("--embeddings", help="hybrid recall through this embedding endpoint")
    parser.add_argument("--budgets", default="10,25")
    parser.add_argument("--text", choices=("sentences", "zipf"), default="sentences")
    parser.add_argument(
        "--kinds",
        choices=("all", "base"),
        default="all",
        help="base: only the kinds a shared word can find (the figures before 2026-11-28)",
    )
    args = parser.parse_args(argv)
    global EMBEDDINGS, TEXT, KINDS
    EMBEDDINGS, TEXT, KINDS = args.embeddings, args.text, args.kinds
    args.budgets = [int(b) for b in args.budgets.split(",")]
    args.stores = [s.strip() for s in args.stores.split(",")]
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
