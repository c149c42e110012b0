"""The OpenAPI document, kept in the repository beside the code that serves it.

``python -m contextledger.http.openapi`` rewrites ``openapi.json``; a test fails
when the committed document and the app's differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contextledger.http.app import create_app
from contextledger.http.settings import Settings

DOCUMENT = Path(__file__).with_name("openapi.json")


def current() -> dict[str, Any]:
    """The app's document (building the app opens nothing)."""
    doc: dict[str, Any] = create_app(Settings(dsn="memory://")).openapi()
    return doc


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def main() -> None:
    DOCUMENT.write_text(render(current()))
    print(f"wrote {DOCUMENT}")


if __name__ == "__main__":
    main()
