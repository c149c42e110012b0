"""How many TCP segments carrying data a socket has received and sent (Linux's
``TCP_INFO``: ``tcpi_data_segs_in``/``tcpi_data_segs_out``, since 4.6): what the tests of
one-segment writes count, as the peer sees them."""

from __future__ import annotations

import socket
import struct
from typing import Any

#: ``struct tcp_info`` up to and including the two counters, and where they are.
_INFO_LEN = 160
_DATA_SEGS = 152


def data_segments(sock: Any) -> tuple[int, int]:
    """(segments in, segments out) with data, on ``sock`` (a socket, or the one a
    transport's ``get_extra_info("socket")`` gives)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_LEN)
    segs_in, segs_out = struct.unpack_from("II", raw, _DATA_SEGS)
    return int(segs_in), int(segs_out)
