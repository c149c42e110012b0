"""Image token maths: hand-built image headers, hand-computed token values."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from contextledger.core.images import (
    DEFAULT_IMAGE_SIZE,
    anthropic_image_tokens,
    block_dimensions,
    dimensions_from_base64,
    gemini_image_tokens,
    image_dimensions,
    image_tokens,
    openai_image_tokens,
    provider_for_model,
)

# --- minimal image headers, written by hand ----------------------------------------------


def png(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + b"\x00\x00\x00\x00IEND\xaeB`\x82"
    )


def gif(w: int, h: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", w, h) + b"\x00\x00\x00" + b";"


def _riff(chunk: bytes) -> bytes:
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def webp_vp8(w: int, h: int) -> bytes:
    frame = b"\x9d\x01\x2a" + struct.pack("<HH", w, h) + b"\x00" * 10
    payload = b"\x50\x02\x00" + frame  # 3-byte frame tag, then the key-frame start code
    return _riff(b"VP8 " + struct.pack("<I", len(payload)) + payload)


def webp_vp8l(w: int, h: int) -> bytes:
    bits = (w - 1) | ((h - 1) << 14)  # 14 bits each, alpha/version bits 0
    payload = b"\x2f" + struct.pack("<I", bits) + b"\x00" * 4
    return _riff(b"VP8L" + struct.pack("<I", len(payload)) + payload)


def webp_vp8x(w: int, h: int) -> bytes:
    payload = b"\x00\x00\x00\x00" + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    return _riff(b"VP8X" + struct.pack("<I", len(payload)) + payload)


def jpeg(w: int, h: int, sof: int = 0xC0, app_segments: int = 0) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    body = b"Exif\x00\x00" + b"\x00" * 60_000  # a segment holds at most 65533 bytes
    app1 = (b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body) * app_segments
    dht = b"\xff\xc4" + struct.pack(">H", 5) + b"\x00\x00\x00"  # C4 is not a SOF
    sof_seg = (
        bytes([0xFF, sof])
        + struct.pack(">HBHHB", 17, 8, h, w, 3)
        + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    )
    return b"\xff\xd8" + app0 + app1 + b"\xff\xff" + dht + sof_seg + b"\xff\xd9"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


# --- header parsing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("maker", "w", "h"),
    [
        (png, 1, 1),
        (png, 1920, 1080),
        (gif, 640, 480),
        (gif, 65535, 3),
        (webp_vp8, 800, 600),
        (webp_vp8l, 16383, 2),
        (webp_vp8x, 4000, 3000),
        (jpeg, 1024, 768),
    ],
)
def test_image_dimensions_from_headers(maker, w, h) -> None:  # type: ignore[no-untyped-def]
    assert image_dimensions(maker(w, h)) == (w, h)
    assert dimensions_from_base64(b64(maker(w, h))) == (w, h)


def test_jpeg_progressive_and_large_exif() -> None:
    # SOF2 (progressive) after 5 x 60 KB APP1 blocks: beyond the first 192 KB decoded.
    data = jpeg(3000, 2000, sof=0xC2, app_segments=5)
    assert image_dimensions(data) == (3000, 2000)
    assert dimensions_from_base64(b64(data)) == (3000, 2000)


def test_unparseable_data_has_no_dimensions() -> None:
    assert image_dimensions(b"not an image at all") is None
    assert image_dimensions(b"\xff\xd8\xff\xda\x00\x02") is None  # scan before SOF
    assert dimensions_from_base64("%%%not-base64%%%") is None
    assert dimensions_from_base64("data:image/png,rawbytes") is None  # not base64


def test_block_dimensions_sources() -> None:
    assert block_dimensions({"type": "image", "width": 10, "height": 20}) == (10, 20)
    url_block = {"type": "image_url", "image_url": {"url": data_url(gif(33, 44), "image/gif")}}
    assert block_dimensions(url_block) == (33, 44)
    assert block_dimensions({"type": "image_url", "image_url": data_url(png(5, 6))}) == (5, 6)
    anthropic = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/webp", "data": b64(webp_vp8x(7, 9))},
    }
    assert block_dimensions(anthropic) == (7, 9)
    # Explicit keys beat the embedded data.
    both = {
        "type": "image_url",
        "image_url": {"url": data_url(png(5, 6)), "width": 99, "height": 98},
    }
    assert block_dimensions(both) == (99, 98)
    # A URL is never fetched.
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    assert block_dimensions(remote) is None


# --- formulas ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "h", "expected"),
    [
        # 200*100 = 20000; 20000/750 = 26.67 -> 27
        (200, 100, 27),
        # 1000*1000 = 1_000_000 <= 1.2 MP; /750 = 1333.33 -> 1334
        (1000, 1000, 1334),
        # Anthropic's "not resized" 1:1 example: 1092*1092 = 1_192_464; /750 = 1589.95 -> 1590
        (1092, 1092, 1590),
        # long edge: 4000 -> 1568, 600*1568//4000 = 235 (235.2); 1568*235 = 368_480
        # 368_480/750 = 491.31 -> 492
        (4000, 600, 492),
        # long edge: 2000x1000 -> 1568x784 = 1_229_312 > 1.2 MP
        # s = sqrt(1_200_000/1_229_312) = 0.988006; 1568*s = 1549.19 -> 1549, 784*s = 774.60 -> 774
        # 1549*774 = 1_198_926; /750 = 1598.57 -> 1599
        (2000, 1000, 1599),
        # portrait: same maths transposed
        (1000, 2000, 1599),
        # 3000x3000 -> 1568x1568 = 2_458_624; s = sqrt(1.2e6/2_458_624) = 0.698625
        # 1568*s = 1095.44 -> 1095; 1095*1095 = 1_199_025; /750 = 1598.7 -> 1599
        (3000, 3000, 1599),
    ],
)
def test_anthropic_tokens(w: int, h: int, expected: int) -> None:
    assert anthropic_image_tokens(w, h) == expected


@pytest.mark.parametrize(
    ("w", "h", "detail", "expected"),
    [
        # OpenAI's documented examples:
        # 1024x1024: shortest side 1024 > 768 -> 768x768; 2x2 tiles; 85 + 170*4 = 765
        (1024, 1024, "high", 765),
        # 2048x4096: fit 2048 -> 1024x2048; short side -> 768x1536; 2x3 tiles; 85 + 170*6 = 1105
        (2048, 4096, "high", 1105),
        # 4096x8192 at low detail: flat 85
        (4096, 8192, "low", 85),
        # 200x100: no scaling; 1x1 tile; 85 + 170 = 255
        (200, 100, "high", 255),
        # 1000x600: short side 600 <= 768 (never enlarged); ceil(1000/512)=2 * ceil(600/512)=2
        # 85 + 170*4 = 765
        (1000, 600, "high", 765),
        # 1536x1000: short side -> 768, long = 1536*768//1000 = 1179; 3x2 tiles; 85 + 1020 = 1105
        (1536, 1000, "high", 1105),
        # 512x512: exactly one tile: 85 + 170 = 255
        (512, 512, "high", 255),
    ],
)
def test_openai_tokens(w: int, h: int, detail: str, expected: int) -> None:
    assert openai_image_tokens(w, h, detail) == expected


def test_gemini_tokens_flat() -> None:
    assert gemini_image_tokens(10, 10) == 258
    assert gemini_image_tokens(4000, 3000) == 258


def test_provider_for_model() -> None:
    assert provider_for_model("claude-sonnet-4-20250514") == "anthropic"
    assert provider_for_model("bedrock/anthropic.claude-3-5-sonnet") == "anthropic"
    assert provider_for_model("gemini/gemini-2.5-pro") == "gemini"
    assert provider_for_model("gpt-4o") == "openai"
    assert provider_for_model(None) == "openai"


def test_image_tokens_per_block_and_provider() -> None:
    block = {"type": "image_url", "image_url": {"url": data_url(png(2000, 1000))}}
    assert image_tokens(block, "anthropic") == 1599  # see test_anthropic_tokens
    # 2000x1000: fits 2048; short side 1000 -> 768, long 2000*768//1000 = 1536; 3x2 tiles
    # 85 + 170*6 = 1105
    assert image_tokens(block, "openai") == 1105
    assert image_tokens(block, "gemini") == 258
    low = {"type": "image_url", "image_url": {"url": data_url(png(2000, 1000)), "detail": "low"}}
    assert image_tokens(low, "openai") == 85
    auto = {"type": "image_url", "image_url": {"url": data_url(png(2000, 1000)), "detail": "auto"}}
    assert image_tokens(auto, "openai") == 1105


def test_unknown_size_uses_default() -> None:
    assert DEFAULT_IMAGE_SIZE == (1024, 1024)
    remote = {"type": "image", "source": {"type": "url", "url": "https://example.com/x.jpg"}}
    # 1024*1024 = 1_048_576 <= 1.2 MP; /750 = 1398.10 -> 1399
    assert image_tokens(remote, "anthropic") == 1399
    # 1024x1024 -> 768x768 -> 4 tiles -> 765
    assert image_tokens(remote, "openai") == 765
