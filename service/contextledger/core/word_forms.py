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
life: "lives"; half).
"""

from __future__ import annotations

import re

#: Each word's forms: a verb's base, past and past participle (where it differs), commonest
#: first; then nouns, singular and plural.
_TABLE = """
go went gone; come came; get got gotten; make made; take took taken; see saw seen;
know knew known; think thought; give gave given; find found; tell told; say said;
leave left; feel felt; bring brought; begin began begun; keep kept; hold held;
write wrote written; stand stood; hear heard; mean meant; meet met; run ran; pay paid;
sit sat; speak spoke spoken; lose lost; buy bought; send sent; build built; fall fell fallen;
understand understood; lead led; grow grew grown; win won; teach taught; eat ate eaten;
drive drove driven; catch caught; choose chose chosen; sell sold; spend spent;
fly flew flown; throw threw thrown; wear wore worn; swim swam swum; sing sang sung;
drink drank drunk; ride rode ridden; forget forgot forgotten; break broke broken;
wake woke woken; sleep slept; feed fed; fight fought; hide hid hidden; lend lent;
draw drew drawn; blow blew blown; freeze froze frozen; steal stole stolen;
shake shook shaken; forgive forgave forgiven; become became; dig dug; deal dealt;
dream dreamt; learn learnt; burn burnt; seek sought; sweep swept;
weep wept; shoot shot; show shown; light lit; bend bent; bleed bled; flee fled;
kneel knelt; spin spun; swing swung; cling clung; creep crept; breed bred; shine shone;
swear swore sworn; tear tore torn; shrink shrank shrunk; forbid forbade forbidden;
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

#: PostgreSQL's English stop words (its ``english.stop``, Snowball's list): what the
#: ``english`` configuration drops, so what never counts among a query's lexemes.
_STOP = """i me my myself we our ours ourselves you your yours yourself yourselves he him his
himself she her hers herself it its itself they them their theirs themselves what which who
whom this that these those am is are was were be been being have has had having do does did
doing a an the and but if or because as until while of at by for with about against between
into through during before after above below to from up down in out on off over under again
further then once here there when where why how all any both each few more most other some
such no nor not only own same so than too very s t can will just don should now"""
STOP_WORDS = frozenset(_STOP.split())

#: What counts as one of a query's words (PostgreSQL's parser makes lexemes of letters and
#: digits; a word with ``-``, ``.``, ``@`` or ``/`` inside is several, counted as 3).
_WORD = re.compile(r"[^\W_]+(?:[-.@/][^\W_]+)*")
#: The lexemes a search looks up at most (``store.lexical.MAX_QUERY_LEXEMES``: the
#: longest are kept): forms are added only while the query's own words all stay in.
_ROOM = 12
#: Longer texts are searched as they are: a question is short, a long turn (a pasted
#: document, a tool call's arguments) has words enough of its own, and reading one of
#: 4,000 characters for its words took ~0.25 ms a request.
_LONGEST = 400


def with_forms(text: str) -> str:
    """``text`` and, after it, the other forms of the irregular words it uses, when it is
    at most ``_LONGEST`` characters and its own words and those forms together are at most
    ``_ROOM`` (the search keeps a query's longest lexemes: a long turn keeps its own
    words, not forms that would push out a short name). The same text gives the same
    result."""
    if len(text) > _LONGEST:
        return text
    words = _WORD.findall(text.lower())
    distinct = set(words)
    if FORMS.keys().isdisjoint(distinct):  # (at C speed: most turns use none)
        return text
    own = distinct - STOP_WORDS
    if len(own) >= _ROOM:  # no room for one form: a long turn is searched as it is
        return text
    added: list[str] = []
    for word in words:
        for form in FORMS.get(word, ()):
            if form not in own and form not in added:
                added.append(form)
    # a word joined by "-", ".", "@" or "/" is several lexemes: counted as 3
    counted = len(own) + 2 * sum(1 for w in own if not w.isalnum())
    if not added or counted + len(added) > _ROOM:
        return text
    return f"{text} ({' '.join(added)})"
