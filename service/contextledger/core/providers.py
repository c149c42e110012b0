"""Model families in one table: which provider's rules apply to a model name.

Tokens (which tokenizer), images (whose image formula), budget (default pressure
thresholds) and request shaping (signed thinking, reasoning blocks) all ask
``model_family``, so a name is classified the same way everywhere. Names are matched
on the bare model name (provider prefixes dropped), in table order; the first row
that matches wins.

Decisions pinned by ``tests/unit/test_providers.py``:

* ``claude`` anywhere in the bare name is Anthropic, so Bedrock's
  ``anthropic.claude-…-v1:0`` and Vertex's ``claude-…@date`` count as Anthropic in
  every rule (the token counter used to treat Bedrock names as unknown).
* ``gemini`` anywhere is Gemini; ``deepseek`` anywhere is DeepSeek (the threshold
  rule used to need a ``deepseek-`` prefix, the reasoning rule did not).
* OpenAI: ``gpt-``, ``chatgpt-``, ``o1``/``o3``/``o4``…, fine-tunes (``ft:``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from contextledger.core.model_limits import bare_model_name

Family = Literal["anthropic", "gemini", "deepseek", "openai", "other"]

_OPENAI = re.compile(r"^(?:ft:)?(?:gpt-|chatgpt-|o\d(?:$|[-.:@_])|text-embedding-|davinci|babbage)")

#: (family, predicate on the bare lower-cased name), first match wins.
FAMILIES: tuple[tuple[Family, Callable[[str], bool]], ...] = (
    ("anthropic", lambda bare: "claude" in bare),
    ("gemini", lambda bare: "gemini" in bare),
    ("deepseek", lambda bare: "deepseek" in bare),
    ("openai", lambda bare: bool(_OPENAI.match(bare))),
)


def model_family(model: str | None) -> Family:
    """The family whose rules apply to ``model`` (``other`` when none matches)."""
    bare = bare_model_name(model)
    for family, matches in FAMILIES:
        if bare and matches(bare):
            return family
    return "other"
