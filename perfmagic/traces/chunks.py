"""The text of a JSON trace a chunk at a time, decompressed as it is read, cut after whole events.

The streamed trace reader decodes these chunks; what they cannot give (an unreadable,
truncated or misnamed file) raises :class:`Unstreamable`, which sends the trace to the
whole-document reader for its own error message.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
_SEPARATOR = re.compile(rb"\}\s*,\s*\Z")  # what comes before an event that follows another
_SEPARATOR_SPAN = 64  # bytes before an event searched for it (Kineto writes ",\n  " between events)
# bytes of JSON decoded at a time: small enough that the chunk and its decoded events stay in a core's
# cache (4 MiB chunks read the A100 test trace about 20% slower)
CHUNK = 1 << 19


class Unstreamable(Exception):
    """The streamed reader met something it leaves to the whole-document reader."""


def last_boundary(buf: bytearray) -> int:
    """Offset just past the ``}`` that ends the last event followed by another; -1 if none.

    Searched back from the end, ``{`` by ``{``: a scan of the whole chunk cost a tenth of the read.
    """
    end = len(buf)
    while (brace := buf.rfind(b"{", 0, end)) > 0:
        separator = _SEPARATOR.search(buf, max(0, brace - _SEPARATOR_SPAN), brace)
        if separator is not None:
            return separator.start() + 1
        end = brace
    return -1


def json_chunks(p: Path) -> Iterator[bytes]:
    """The file's text in chunks of at most ``CHUNK`` bytes, decompressed when gzipped."""
    try:
        f = p.open("rb")
    except OSError:
        raise Unstreamable from None
    with f:
        gzipped = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if not gzipped:
            if p.suffix == ".gz":
                raise Unstreamable
            while chunk := f.read(CHUNK):
                yield chunk
            return
        inflate = zlib.decompressobj(wbits=31)
        pending = b""
        while True:
            if not pending and not (pending := f.read(CHUNK // 8)):
                break
            if inflate.eof:  # a multi-member gzip file: the next member starts here
                inflate = zlib.decompressobj(wbits=31)
            try:
                out = inflate.decompress(pending, CHUNK)
            except zlib.error:
                raise Unstreamable from None
            pending = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
            yield out
        if not inflate.eof:  # truncated
            raise Unstreamable
