"""Generated text as it arrives (pure): stop sequences and UTF-8 split across tokens.

`StopScanner.push(piece)` returns the text that can be sent now. A stop sequence may begin in one
piece and end in a later one, so only the shortest tail that could still begin one is held back
(not the length of the longest stop sequence), and only that tail and the new piece are searched:
the cost of a push does not grow with the length of the answer.
"""

from __future__ import annotations

import codecs
from typing import Sequence


def first_mark(text: str, marks: Sequence[str]) -> int:
    """Where the first of `marks` begins in `text` (-1: none does)."""
    return min((i for i in (text.find(m) for m in marks) if i >= 0), default=-1)


def held_tail(text: str, marks: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `marks`: what may
    still become one once more text comes."""
    best = 0
    for s in marks:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class StopScanner:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self.pending + piece
        cut = first_mark(text, self.stops)
        if cut >= 0:
            self.stopped = True
            self.pending = ""
            return text[:cut]
        hold = held_tail(text, self.stops)
        self.pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]

    def flush(self) -> str:
        """What is held back, once the answer ended without a stop sequence."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out


class Utf8Pieces:
    """Bytes of tokens -> text, a character split across tokens kept until it is whole; bytes
    that are not UTF-8 become U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
