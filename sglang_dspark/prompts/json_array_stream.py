"""Stream the elements of a JSON array file that may be cut off mid-element.

The file is read in byte chunks (never loaded whole into one `json.load`), decoded incrementally,
and each element is decoded with `json.JSONDecoder.raw_decode` as soon as the buffer holds it.
When an element does not decode, more of the file is read and it is tried again; at the end of
the file the rest is the truncation: iteration stops there, cleanly, and says so. (A malformed
element in the middle of a file therefore also ends the iteration, at that element.)
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterator

from tqdm import tqdm

_SEPARATOR = re.compile(r"[\s,]*")  # whitespace and the comma between two elements


class JsonArrayStream:
    """Iterate once over the complete elements; afterwards `complete` says whether the array was
    closed, and `unparsed_chars` how many characters of a cut-off element were left over."""

    def __init__(self, path: str | os.PathLike, *, chunk_bytes: int = 1 << 20, progress: str | None = None):
        self.path, self.chunk_bytes, self.progress = path, chunk_bytes, progress
        self.complete = False
        self.unparsed_chars = 0

    def __iter__(self) -> Iterator[object]:
        decoder = json.JSONDecoder()
        # errors="replace": a cut can fall inside a multi-byte character at the very end
        text_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=self.progress,
                                              disable=self.progress is None) as bar:
            buf, pos, eof = "", 0, False

            def fill() -> None:
                nonlocal buf, pos, eof
                # read at least as much as is buffered, so an element longer than a chunk costs
                # a few retries, not one per chunk
                chunk = f.read(max(self.chunk_bytes, len(buf) - pos))
                bar.update(len(chunk))
                eof = not chunk
                buf, pos = buf[pos:] + text_decoder.decode(chunk, final=eof), 0

            def skip_separators() -> str:
                """The next character after whitespace and commas, reading on as needed ('' at EOF)."""
                nonlocal pos
                while True:
                    pos = _SEPARATOR.match(buf, pos).end()
                    if pos < len(buf) or eof:
                        return buf[pos:pos + 1]
                    fill()

            fill()
            if skip_separators() != "[":
                raise ValueError(f"{self.path}: not a JSON array")
            pos += 1
            while (char := skip_separators()) not in ("", "]"):
                try:
                    element, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    end = None
                if end is None or (end == len(buf) and not eof):  # incomplete, or a number that may go on
                    if eof:
                        self.unparsed_chars = len(buf) - pos
                        return
                    fill()
                    continue
                pos = end
                yield element
            self.complete = char == "]"
