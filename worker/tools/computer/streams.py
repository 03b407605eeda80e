"""Reading and rewriting a file by chunks, in memory bounded by the chunk size, not the file size.

A 300 MB file made of one line once cost ``read_file(limit=1)`` and
``edit_file`` about 570 MB each (the whole line, then its decoded copy). Here
every function reads the descriptor with ``pread`` in ``CHUNK`` bytes and
keeps at most:

- ``iter_lines``: the first ``keep`` bytes of the current line;
- ``count_occurrences`` / ``copy_replacing``: one chunk plus
  ``len(needle) - 1`` bytes carried over a chunk boundary (a match may straddle it).

Matching is done on bytes. For valid UTF-8 (``count_occurrences`` checks it)
this counts exactly what ``str.count`` counts on the decoded text: UTF-8 is
self-synchronising, so the encoding of a string never matches in the middle
of a character.
"""

from __future__ import annotations

import codecs
import os
import re
from typing import BinaryIO, Iterator

CHUNK = 1 << 20  # bytes per pread

# A line ends at "\r\n", "\r" or "\n" (Python's universal newlines, as text-mode iteration had).
_EOL = re.compile(rb"\r\n?|\n")


def iter_lines(fd: int, keep: int, chunk: int = CHUNK) -> Iterator[tuple[bytes, bool]]:
    """Yield ``(head, cut)`` for each line of the file open on ``fd``, from offset 0.

    ``head`` is at most the first ``keep`` bytes of the line, without its line
    ending; ``cut`` is True when the line was longer. A last line without a
    line ending is yielded too; an empty file yields nothing.
    """
    head = bytearray()
    cut = False
    in_line = False  # bytes seen since the last line ending
    after_cr = False  # the previous chunk ended with "\r": a "\n" first in this one belongs to it
    offset = 0
    while True:
        data = os.pread(fd, chunk, offset)
        if not data:
            break
        offset += len(data)
        pos, end = 0, len(data)
        if after_cr:
            after_cr = False
            if data[:1] == b"\n":
                pos = 1
        while pos < end:
            m = _EOL.search(data, pos)
            stop = end if m is None else m.start()
            if stop > pos:
                in_line = True
                room = keep - len(head)
                if room > 0:
                    head += data[pos : min(stop, pos + room)]
                if stop - pos > room:
                    cut = True
            if m is None:
                break
            after_cr = m.group() == b"\r" and m.end() == end
            yield bytes(head), cut
            head.clear()
            cut = in_line = False
            pos = m.end()
    if in_line:
        yield bytes(head), cut


def count_occurrences(fd: int, needle: bytes, chunk: int = CHUNK) -> int:
    """Non-overlapping occurrences of ``needle`` in the file open on ``fd`` (as ``bytes.count``).

    Raises ``UnicodeDecodeError`` when the file is not valid UTF-8 (checked on the way, by chunks).
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    count = 0
    carry = b""
    offset = 0
    while True:
        data = os.pread(fd, chunk, offset)
        if not data:
            break
        offset += len(data)
        decoder.decode(data)
        buf = carry + data
        pos = 0
        while (i := buf.find(needle, pos)) >= 0:
            count += 1
            pos = i + len(needle)
        carry = buf[max(pos, len(buf) - len(needle) + 1) :]
    decoder.decode(b"", final=True)
    return count


def copy_replacing(fd: int, out: BinaryIO, old: bytes, new: bytes, chunk: int = CHUNK) -> int:
    """Write the file open on ``fd`` to ``out`` with every occurrence of ``old`` replaced by ``new``.

    Returns the bytes written. Same matching as ``count_occurrences``.
    """
    written = 0
    carry = b""
    offset = 0
    while True:
        data = os.pread(fd, chunk, offset)
        offset += len(data)
        buf = carry + data
        pos = 0
        while (i := buf.find(old, pos)) >= 0:
            written += out.write(buf[pos:i]) + out.write(new)
            pos = i + len(old)
        safe = len(buf) if not data else max(pos, len(buf) - len(old) + 1)
        written += out.write(buf[pos:safe])
        carry = buf[safe:]
        if not data:
            return written
