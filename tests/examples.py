"""How many examples a property test runs.

As written, in the suite and in CI. ``ops/test`` on one unit file (the local loop, where
a file should take ~2 s) sets ``CONTEXTLEDGER_EXAMPLES=quick``: a tenth of each count (at
least 10), and 10 for tests that name none (hypothesis's default, 100, as written).
``.ci/run`` sets ``full``; so can anyone who wants one file's full run locally.
"""

from __future__ import annotations

import os

QUICK = os.environ.get("CONTEXTLEDGER_EXAMPLES", "full") == "quick"


def examples(count: int) -> int:
    """``count``, or its quick share."""
    return max(10, count // 10) if QUICK else count
