"""Irregular English word forms, so a question finds the statement it asks about.

A question asks with a verb's base form ("where did she *go*?", "what did he *buy*?") and
the statement that answers it tells the past ("I *went* to Lisbon", "I *bought* a
kayak"); it asks about "the children" of someone who talked about "my child". Stemming
joins regular forms (painted, painting -> paint; kids -> kid), never irregular ones: the
words share no lexeme, and lexical recall missed the turn the question is about. A
recall query is searched with the other forms of each irregular word it uses
(``with_forms``), as words, so every search path (PostgreSQL's parser, ``memory://``'s
tokenizer, the search Citus runs on a worker) stems them its own way and the query's
lexemes stay one function of its text. Not listed: verbs whose forms are one word (put,
read, cut), stop words (be, do, have), and words whose forms are mostly other words
(bite: "a bit"; lie and lay; rise: "a rose"; ring, sink, stick, bear; leaf: "leaves";
life: "lives"; half), nor those a coding session uses as other words (mean, lead: "LED",
show: "git show", light, deal, forbid: "403 Forbidden").
"""

from __future__ import annotations

import re
import string

#: Each word's forms: a verb's base, past and past participle (where it differs), commonest
#: first; then nouns, singular and plural.
_TABLE = """
go went gone; come came; get got gotten; make made; take took taken; see saw seen;
know knew known; think thought; give gave given; find found; tell told; say said;
leave left; feel felt; bring brought; begin began begun; keep kept; hold held;
write wrote written; stand stood; hear heard; meet met; run ran; pay paid;
sit sat; speak spoke spoken; lose lost; buy bought; send sent; build built; fall fell fallen;
understand understood; grow grew grown; win won; teach taught; eat ate eaten;
drive drove driven; catch caught; choose chose chosen; sell sold; spend spent;
fly flew flown; throw threw thrown; wear wore worn; swim swam swum; sing sang sung;
drink drank drunk; ride rode ridden; forget forgot forgotten; break broke broken;
wake woke woken; sleep slept; feed fed; fight fought; hide hid hidden; lend lent;
draw drew drawn; blow blew blown; freeze froze frozen; steal stole stolen;
shake shook shaken; forgive forgave forgiven; become became; dig dug;
dream dreamt; learn learnt; burn burnt; seek sought; sweep swept;
weep wept; shoot shot; bend bent; bleed bled; flee fled;
kneel knelt; spin spun; swing swung; cling clung; creep crept; breed bred; shine shone;
swear swore sworn; tear tore torn; shrink shrank shrunk;
arise arose arisen; awake awoke awoken;
child children; person people; man men; woman women; wife wives; knife knives;
tooth teeth; foot feet; mouse mice; goose geese; wolf wolves; shelf shelves;
thief thieves; loaf loaves; calf calves
"""

#: word -> its other forms, in the table's order
FORMS: dict[str, tuple[str, ...]] = {}
for _entry in _TABLE.replace("\n", " ").split(";"):
    _forms = tuple(dict.fromkeys(_entry.split()))
    for _word in _forms:
        FORMS.setdefault(_word, tuple(f for f in _forms if f != _word))

#: Words both search paths drop (bm25s's English stop words, which ``memory://`` drops;
#: PostgreSQL's ``english.stop`` holds them and more): a text's word that is one of them
#: is not counted.
_DROPPED = """a an and are as at be but by for if in into is it no not of on or such that the
their then there these they this to was will with"""
DROPPED = frozenset(_DROPPED.split())

#: A text's words, to find the irregular ones (and the forms it already has): what is
#: between spaces and ASCII punctuation (a translation and a split: a quarter of a regex).
_SPACED = str.maketrans(dict.fromkeys(string.punctuation, " "))
#: What a parser may make a lexeme of, at most one each: a run of ASCII letters, a run of
#: digits, any other character but an apostrophe. PostgreSQL's makes fewer of a
#: whitespace-separated word (``three-year-old``: its parts and the whole, 4 against 5;
#: ``-8px``: ``-8`` and ``px``, 2 against 3; ``x²y``: 2 against 3), bm25s fewer still (its
#: tokens are runs of letters and digits).
_PIECE = re.compile(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9'\u2019]")
#: What both parsers drop at a word's ends (a sign, a slash or a tilde they keep).
_EDGES = ".,;:!?\"'()[]{}<>*\u00ab\u00bb\u201c\u201d\u2018\u2019\u2026"
#: The lexemes a recall search looks up at most, the query's longest (``store.lexical``
#: reads this one, and says why 12): forms are added only while the query's own words all
#: stay in.
MAX_QUERY_LEXEMES = 12
#: Longer texts are searched as they are: a question is short, a long query (a pasted
#: document, a tool loop's calls) has words enough of its own, and reading one of
#: 4,000 characters for its words took ~0.25 ms a request.
_LONGEST = 400


def most_lexemes(text: str) -> int:
    """At least as many lexemes as either search path makes of ``text`` (the distinct
    whitespace-separated words, each counted by ``_PIECE``, a dropped word not at all)."""
    count = 0
    for word in {w.strip(_EDGES).lower() for w in text.split()}:
        if word and word not in DROPPED:
            count += len(_PIECE.findall(word))
    return count


def with_forms(text: str) -> str:
    """``text`` and, after it in parentheses, the other forms of the irregular words it
    uses, when it is at most ``_LONGEST`` characters and its lexemes (``most_lexemes``)
    and those forms together are at most ``MAX_QUERY_LEXEMES`` (the search keeps a query's longest
    lexemes: forms must not push out a short name). The same text gives the same result."""
    if len(text) > _LONGEST:
        return text
    words = text.lower().translate(_SPACED).split()
    distinct = set(words)
    if FORMS.keys().isdisjoint(distinct):  # (at C speed: most texts use none)
        return text
    added: list[str] = []
    for word in words:
        for form in FORMS.get(word, ()):
            if form not in distinct and form not in added:
                added.append(form)
    # refused first by its words (each holds a lexeme counted, or is one no parser makes:
    # refusing too often is safe), without counting (~20 µs a text)
    if not added or len(distinct - DROPPED) + len(added) > MAX_QUERY_LEXEMES:
        return text
    if most_lexemes(text) + len(added) > MAX_QUERY_LEXEMES:
        return text
    return f"{text} ({' '.join(added)})"


def without_forms(text: str) -> str:
    """What ``with_forms`` was given to make ``text`` (``text`` itself when it added
    nothing): a store's appends guess the next query from the one before it. A text that
    already ended with its own forms in parentheses reads as one they were added to (it
    is the same text): the guess built on it is wrong, and costs that request its skipped
    catch-up, nothing more."""
    head, sep, _ = text.rpartition(" (")
    if sep and text.endswith(")") and with_forms(head) == text:
        return head
    return text
