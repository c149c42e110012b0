"""Image token maths per provider, from the image's pixel size. Pure: no I/O.

Providers bill images by their (resized) pixel size, not by their bytes, so the
size is read from the block's ``width``/``height`` keys or from the header of
inline base64 data (PNG, JPEG, GIF, WebP). A URL is never fetched: an image whose
size cannot be read counts as :data:`DEFAULT_IMAGE_SIZE`.

Formulas (the providers' published rules):

* Anthropic: scale down, preserving aspect, so the long edge is <= 1568 px, then
  so the area is <= 1.2 MP (Anthropic's ~1600-token ceiling; their 1092x1092 "not
  resized" example is 1.19 MP), then ``ceil(w * h / 750)``.
* OpenAI (GPT-4o family tiles): ``detail="low"`` is 85; ``high``/``auto``: fit in
  2048x2048, then shrink so the shortest side is 768 (never enlarged), then
  ``85 + 170 * ceil(w/512) * ceil(h/512)``.
* Gemini: 258 per image.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping
from typing import Any, Literal

from contextledger.core.providers import model_family

__all__ = [
    "ANTHROPIC_MAX_LONG_EDGE",
    "ANTHROPIC_MAX_PIXELS",
    "DEFAULT_IMAGE_SIZE",
    "GEMINI_IMAGE_TOKENS",
    "OPENAI_LOW_DETAIL_TOKENS",
    "Provider",
    "anthropic_image_tokens",
    "block_dimensions",
    "dimensions_from_base64",
    "gemini_image_tokens",
    "image_dimensions",
    "image_tokens",
    "openai_image_tokens",
    "provider_for_model",
]

Provider = Literal["anthropic", "openai", "gemini"]

DEFAULT_IMAGE_SIZE: tuple[int, int] = (1024, 1024)
"""Assumed size when it cannot be read (URL images, unknown formats): a typical
screenshot/photo size; 1399 Anthropic tokens, 765 OpenAI high-detail tokens."""

ANTHROPIC_MAX_LONG_EDGE = 1568
ANTHROPIC_MAX_PIXELS = 1_200_000
ANTHROPIC_PIXELS_PER_TOKEN = 750
OPENAI_LOW_DETAIL_TOKENS = 85
OPENAI_TILE_TOKENS = 170
OPENAI_TILE = 512
OPENAI_FIT = 2048
OPENAI_SHORT_SIDE = 768
GEMINI_IMAGE_TOKENS = 258

# Enough base64 for any header we parse, including a JPEG with a large EXIF block.
_HEADER_B64_CHARS = 1 << 18


def provider_for_model(model: str | None) -> Provider:
    """Whose image rule applies: Anthropic's, Gemini's, else OpenAI's (``core/providers``)."""
    family = model_family(model)
    if family == "anthropic" or family == "gemini":
        return family
    return "openai"


def _fit_long_edge(w: int, h: int, limit: int) -> tuple[int, int]:
    """Shrink so the long edge is ``limit`` (integer maths: no float rounding at edges)."""
    if max(w, h) <= limit:
        return w, h
    if w >= h:
        return limit, max(1, h * limit // w)
    return max(1, w * limit // h), limit


def _fit_short_edge(w: int, h: int, limit: int) -> tuple[int, int]:
    """Shrink (never enlarge) so the short edge is ``limit``."""
    if min(w, h) <= limit:
        return w, h
    if w <= h:
        return limit, max(1, h * limit // w)
    return max(1, w * limit // h), limit


def anthropic_image_tokens(width: int, height: int) -> int:
    """``ceil(w*h/750)`` after Anthropic's downscale: long edge to 1568, then area to 1.2 MP."""
    w, h = _fit_long_edge(*_positive(width, height), ANTHROPIC_MAX_LONG_EDGE)
    if w * h > ANTHROPIC_MAX_PIXELS:
        scale = math.sqrt(ANTHROPIC_MAX_PIXELS / (w * h))
        w, h = max(1, math.floor(w * scale)), max(1, math.floor(h * scale))
    return math.ceil(w * h / ANTHROPIC_PIXELS_PER_TOKEN)


def openai_image_tokens(width: int, height: int, detail: str = "high") -> int:
    """OpenAI tile count: fit 2048x2048, shortest side to 768, 170 per 512-px tile + 85."""
    if detail == "low":
        return OPENAI_LOW_DETAIL_TOKENS
    w, h = _fit_long_edge(*_positive(width, height), OPENAI_FIT)
    w, h = _fit_short_edge(w, h, OPENAI_SHORT_SIDE)
    tiles = math.ceil(w / OPENAI_TILE) * math.ceil(h / OPENAI_TILE)
    return OPENAI_LOW_DETAIL_TOKENS + OPENAI_TILE_TOKENS * tiles


def gemini_image_tokens(width: int, height: int) -> int:
    """Gemini bills a flat 258 tokens per image."""
    _positive(width, height)
    return GEMINI_IMAGE_TOKENS


def _positive(width: int, height: int) -> tuple[int, int]:
    # A zero/negative size is a broken header, not a free image: count the default.
    if width <= 0 or height <= 0:
        return DEFAULT_IMAGE_SIZE
    return int(width), int(height)


# --- dimension parsing -------------------------------------------------------------


def image_dimensions(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the header of PNG, JPEG, GIF or WebP bytes, else None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return _checked(w, h)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return _checked(w, h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_dimensions(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_dimensions(data)
    return None


def _checked(w: int, h: int) -> tuple[int, int] | None:
    return (w, h) if w > 0 and h > 0 else None


def _webp_dimensions(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return _checked(w & 0x3FFF, h & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return _checked((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return _checked(w, h)
    return None


# SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG), CC (DAC) share the range but don't.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})


def _jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_STANDALONE:
            i += 2
            continue
        length = struct.unpack(">H", data[i + 2 : i + 4])[0]
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return _checked(w, h)
        if marker == 0xDA or length < 2:  # start of scan before any SOF: give up
            return None
        i += 2 + length
    return None


def dimensions_from_base64(data: str) -> tuple[int, int] | None:
    """Image size from base64 text or a ``data:`` URL; only the header is decoded."""
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        if ";base64" not in head:
            return None
    if len(data) > _HEADER_B64_CHARS:
        size = _decode_dimensions(data[:_HEADER_B64_CHARS])
        if size is not None:
            return size
    return _decode_dimensions(data)


def _decode_dimensions(b64: str) -> tuple[int, int] | None:
    cleaned = "".join(b64.split()).replace("-", "+").replace("_", "/")
    cleaned = cleaned[: len(cleaned) - len(cleaned) % 4]
    try:
        raw = base64.b64decode(cleaned)
    except (binascii.Error, ValueError):
        return None
    return image_dimensions(raw)


def _size_keys(obj: Mapping[str, Any]) -> tuple[int, int] | None:
    w, h = obj.get("width"), obj.get("height")
    if isinstance(w, int) and isinstance(h, int) and not isinstance(w, bool) and w > 0 and h > 0:
        return w, h
    return None


def block_dimensions(block: Mapping[str, Any]) -> tuple[int, int] | None:
    """Size of an ``image_url`` / ``image`` / ``input_image`` block, if knowable offline.

    Explicit ``width``/``height`` keys (on the block, its ``image_url`` or ``source``)
    win; then inline base64 (``data:`` URL or Anthropic ``source.data``). URLs: None.
    """
    inner: list[Mapping[str, Any]] = [block]
    for key in ("image_url", "source", "image"):
        value = block.get(key)
        if isinstance(value, Mapping):
            inner.append(value)
    for obj in inner:
        size = _size_keys(obj)
        if size is not None:
            return size
    for obj in inner:
        for key in ("url", "data", "image_url"):
            value = obj.get(key)
            if isinstance(value, str) and value:
                if value.startswith(("http://", "https://", "file:", "gs://", "s3://")):
                    return None
                if obj is not block or key != "image_url" or value.startswith("data:"):
                    return dimensions_from_base64(value)
    return None


def _detail(block: Mapping[str, Any]) -> str:
    inner = block.get("image_url")
    if isinstance(inner, Mapping) and isinstance(inner.get("detail"), str):
        return str(inner["detail"])
    detail = block.get("detail")
    return detail if isinstance(detail, str) else "auto"


def image_tokens(block: Mapping[str, Any], provider: Provider = "openai") -> int:
    """Tokens an image block costs under ``provider``'s rule (default size if unknown)."""
    if provider == "gemini":
        return GEMINI_IMAGE_TOKENS
    if provider == "openai" and _detail(block) == "low":
        return OPENAI_LOW_DETAIL_TOKENS
    width, height = block_dimensions(block) or DEFAULT_IMAGE_SIZE
    if provider == "anthropic":
        return anthropic_image_tokens(width, height)
    return openai_image_tokens(width, height, "high")
