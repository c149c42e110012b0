"""SQL placeholders by name: ``$query`` markers resolved to asyncpg's ``$n`` once per text.

A statement assembled from shared parts (the search's CTEs, the branch predicates) used
to be renumbered with ``str.replace`` when a part was left out, which silently breaks when
a number is reused. Here a part says ``$upto`` or ``$branch``; ``named`` numbers the names
by first appearance after the positional ``$1..$k`` the text keeps (the session id is
``$1`` in every statement of this store), and the same name is the same parameter
wherever it appears. The resolution is cached per text, so a statement shape always
gets the same ``$n`` text and asyncpg's prepared-statement cache still hits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["Named", "bind", "named"]

#: ``$name`` (a letter or underscore first) or ``$n``; ``$$`` and ``::casts`` are neither.
_MARKER = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|([0-9]+))(\$?)")


@dataclass(frozen=True, slots=True)
class Named:
    """A statement's ``$n`` text and the names its ``$k+1..`` stand for, in order."""

    text: str
    names: tuple[str, ...]
    positional: int  # the highest ``$n`` the source text used itself

    def args(self, values: Mapping[str, Any], *positional: Any) -> list[Any]:
        """The argument list: ``positional`` (``$1..$k``), then each name's value."""
        if len(positional) != self.positional:
            raise ValueError(
                f"the statement takes {self.positional} positional arguments, "
                f"{len(positional)} given"
            )
        missing = [n for n in self.names if n not in values]
        extra = sorted(set(values) - set(self.names))
        if missing or extra:
            raise ValueError(f"named arguments: missing {missing}, not in the statement {extra}")
        return [*positional, *(values[n] for n in self.names)]


@lru_cache(maxsize=256)
def named(sql: str) -> Named:
    """Resolve ``sql``'s ``$name`` markers to ``$n`` numbers after its positional ones.

    Raises ``ValueError`` for a dollar-quote tag (``$tag$``), which is not a parameter.
    """
    found = list(_MARKER.finditer(sql))
    for m in found:
        if m.group(3):
            raise ValueError(f"dollar quoting ({m.group(0)!r}) is not supported here")
    positional = max((int(m.group(2)) for m in found if m.group(2)), default=0)
    numbers: dict[str, int] = {}

    def number(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            return m.group(0)
        if name not in numbers:
            numbers[name] = positional + len(numbers) + 1
        return f"${numbers[name]}"

    text = _MARKER.sub(number, sql)
    return Named(text, tuple(numbers), positional)


def bind(sql: str, values: Mapping[str, Any], *positional: Any) -> tuple[str, list[Any]]:
    """``sql`` with ``$n`` placeholders and its argument list, from ``values`` by name."""
    statement = named(sql)
    return statement.text, statement.args(values, *positional)
