"""Text shaped like language, for benchmarks: a Zipf vocabulary with a long tail.

Real prose has a few very common words (most of them stop words), a middle band that
recurs across a conversation, and a long tail of words seen once or twice; plus names,
numbers and dates. A bench whose text is a small uniform vocabulary makes every word
common, so a search that drops common words does no work at all and measures nothing.

``Prose`` draws words by rank with weight ``1 / rank ** s`` (s = 1.07, what English
corpora show) from a vocabulary of real English words followed by a tail of made-up
pronounceable words (a session's own jargon: project names, identifiers), with names,
numbers and dates mixed in. Deterministic for a seed.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Sequence

#: The head of the vocabulary, roughly by frequency: function words first (English stop
#: words: a search drops them), then common content words.
COMMON = (
    "the of and to a in is it you that he was for on are with as I his they be at one have"
    " this from or had by not word but what some we can out other were all there when up use"
    " your how said an each she which do their time if will way about many then them write"
    " would like so these her long make thing see him two has look more day could go come did"
    " number sound no most people my over know water than call first who may down side been now"
    " find any new work part take get place made live where after back little only round man"
    " year came show every good me give our under name very through just form sentence great"
    " think say help low line differ turn cause much mean before move right boy old too same tell"
    " does set three want air well also play small end put home read hand port large spell add"
    " even land here must big high such follow act why ask men change went light kind off need"
    " house picture try us again animal point mother world near build self earth father head"
    " stand own page should country found answer school grow study still learn plant cover food"
    " sun four between state keep eye never last let thought city tree cross farm hard start"
    " might story saw far sea draw left late run while press close night real life few north"
    " open seem together next white children begin got walk example ease paper group always"
    " music those both mark often letter until mile river car feet care second book carry took"
    " science eat room friend began idea fish mountain stop once base hear horse cut sure watch"
    " color face wood main enough plain girl usual young ready above ever red list though feel"
    " talk bird soon body dog family direct pose leave song measure door product black short"
    " numeral class wind question happen complete ship area half rock order fire south problem"
    " piece told knew pass since top whole king space heard best hour better true during hundred"
    " five remember step early hold west ground interest reach fast verb sing listen six table"
    " travel less morning ten simple several vowel toward war lay against pattern slow center"
    " love person money serve appear road map rain rule govern pull cold notice voice unit power"
    " town fine certain fly fall lead cry dark machine note wait plan figure star box noun field"
    " rest correct able pound done beauty drive stood contain front teach week final gave green"
    " quick develop ocean warm free minute strong special mind behind clear tail produce fact"
    " street inch multiply nothing course stay wheel full force blue object decide surface deep"
    " moon island foot system busy test record boat common gold possible plane stead dry wonder"
    " laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes"
    " distant fill east paint language among grand ball yet wave drop heart present heavy dance"
    " engine position arm wide sail material size vary settle speak weight general ice matter"
    " circle pair include divide syllable felt perhaps pick sudden count square reason length"
    " represent art subject region energy hunt probable bed brother egg ride cell believe"
    " fraction forest sit race window store summer train sleep prove lone exercise wall catch"
    " mount wish sky board joy winter sat written wild instrument kept glass grass cow job edge"
    " sign visit past soft fun bright gas weather month million bear finish happy hope flower"
    " clothe strange gone jump baby eight village meet root buy raise solve metal whether push"
    " seven paragraph third shall held hair describe cook floor either result burn hill safe cat"
    " century consider type law bit coast copy phrase silent tall sand soil roll temperature"
    " finger industry value fight lie beat excite natural view sense ear else quite broke case"
    " middle kill son lake moment scale loud spring observe child straight consonant nation"
    " dictionary milk speed method organ pay age section dress cloud surprise quiet stone tiny"
    " climb cool design poor lot experiment bottom key iron single stick flat twenty skin smile"
    " crease hole trade melody trip office receive row mouth exact symbol die least trouble"
    " shout except wrote seed tone join suggest clean break lady yard rise bad blow oil blood"
    " touch grew cent mix team wire cost lost brown wear garden equal sent choose fell fit flow"
    " fair bank collect save control decimal gentle woman captain practice separate difficult"
    " doctor please protect noon whose locate ring character insect caught period indicate"
    " radio spoke atom human history effect electric expect crop modern element hit student"
    " corner party supply bone rail imagine provide agree thus capital chair danger fruit rich"
    " thick soldier process operate guess necessary sharp wing create neighbor wash bat rather"
    " crowd corn compare poem string bell depend meat rub tube famous dollar stream fear sight"
    " thin triangle planet hurry chief colony clock mine tie enter major fresh search send"
    " yellow gun allow print dead spot desert suit current lift rose continue block chart hat"
    " sell success company subtract event particular deal swim term opposite wife shoe shoulder"
    " spread arrange camp invent cotton born determine quart nine truck noise level chance"
    " gather shop stretch throw shine property column molecule select wrong gray repeat require"
    " broad prepare salt nose plural anger claim continent oxygen sugar death pretty skill women"
    " season solution magnet silver thank branch match suffix especially fig afraid huge sister"
    " steel discuss forward similar guide experience score apple bought led pitch coat mass card"
    " band rope slip win dream evening condition feed tool total basic smell valley nor double"
    " seat arrive master track parent shore division sheet substance favor connect post spend"
    " chord fat glad original share station dad bread charge proper bar offer segment slave duck"
    " instant market degree populate chick dear enemy reply drink occur support speech nature"
    " range steam motion path liquid log meant quotient teeth shell neck"
).split()
FIRST_NAMES = (
    "Caroline Melanie Jon Gina John Maria Joanna Nate Tim Audrey Andrew Evan Sam Calvin Dave"
    " Jolene Deborah James Priya Tomasz Aiko Kwame Ingrid Rafael Noor Lena Mateo Siobhan Arjun"
    " Yusuf Elena Hiroshi Fatima Oskar Zainab"
).split()
PLACES = (
    "Lisbon Boston Kyoto Nairobi Oslo Lima Toronto Sevilla Krakow Hanoi Denver Porto Tucson"
    " Galway Bergen Mumbai Austin Leipzig Quito Perth"
).split()
MONTHS = (
    "January February March April May June July August September October November December"
).split()
_ONSETS = "b br c ch d dr f fl g gr h j k l m n p pl qu r s sh st t tr v w z".split()
_VOWELS = "a e i o u ai ea io ou".split()
_CODAS = ["", "", "n", "r", "l", "s", "t", "m", "x", "nd", "rk", "st"]


def _made_up(rng: random.Random) -> str:
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
        for _ in range(rng.randint(2, 3))
    )


def vocabulary(size: int, seed: int = 11) -> list[str]:
    """``size`` words by rank: the real ones first, then a made-up tail, all distinct."""
    rng = random.Random(seed)
    words = list(dict.fromkeys(COMMON))
    seen = set(words)
    while len(words) < size:
        word = _made_up(rng)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words[:size]


class Prose:
    """Sentences drawn from a Zipf vocabulary, with names, numbers and dates mixed in."""

    def __init__(self, seed: int = 5, size: int = 6000, s: float = 1.07) -> None:
        self.rng = random.Random(seed)
        self.words = vocabulary(size, seed)
        weights = [1.0 / (rank**s) for rank in range(1, size + 1)]
        self._cum = list(itertools.accumulate(weights))

    def word(self) -> str:
        u = self.rng.random() * self._cum[-1]
        return self.words[min(bisect.bisect_left(self._cum, u), len(self.words) - 1)]

    def date(self) -> str:
        r = self.rng
        return f"{r.randint(1, 28)} {r.choice(MONTHS)} {r.choice((2022, 2023, 2024))}"

    def token(self) -> str:
        r = self.rng.random()
        if r < 0.025:
            return self.rng.choice(FIRST_NAMES)
        if r < 0.035:
            return self.rng.choice(PLACES)
        if r < 0.055:
            return str(self.rng.choice((self.rng.randint(2, 99), self.rng.randint(100, 9999))))
        if r < 0.06:
            return self.date()
        return self.word()

    def sentence(self, words: int) -> str:
        toks = [self.token() for _ in range(words)]
        toks[0] = toks[0][:1].upper() + toks[0][1:]
        return " ".join(toks) + self.rng.choice((".", ".", ".", "?", "!"))

    def text(self, words: int) -> str:
        """About ``words`` words in sentences of 6-18."""
        out: list[str] = []
        left = words
        while left > 0:
            n = min(left, self.rng.randint(6, 18))
            out.append(self.sentence(n))
            left -= n
        return " ".join(out)


def distinct_share(texts: Sequence[str]) -> float:
    """Distinct words / words: a check that text is not a small uniform vocabulary."""
    words = [w for t in texts for w in t.split()]
    return len(set(words)) / max(1, len(words))
