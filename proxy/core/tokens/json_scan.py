"""Where a JSON object ends, read as it streams (core/tokens/parsers.py streams a tool
call's arguments with it): a tiny scanner that skips strings and their escapes and counts
brackets, so the arguments' text can go out delta by delta and stop exactly where the object
closes. It does not check the JSON: the whole call is parsed when it ends."""

from __future__ import annotations

import re

_IN_STRING = re.compile(r'[\\"]')
_OUTSIDE = re.compile(r'["{}\[\]]')


class ObjectEnd:
    """Where a JSON object ends, fed its text in fragments: strings (and their escapes) are
    skipped, brackets counted. Keeps the object's text so far (`text`)."""

    __slots__ = ("depth", "done", "escape", "in_string", "text")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.done = False
        self.text: list[str] = []

    def feed(self, text: str) -> int:
        """How many characters of `text` belong to the object (all, until it ends)."""
        i, n = 0, len(text)
        while i < n and not self.done:
            if self.escape:
                self.escape = False
                i += 1
                continue
            if self.in_string:
                m = _IN_STRING.search(text, i)
                if m is None:
                    i = n
                    break
                i = m.start()
                if text[i] == "\\":
                    self.escape = True
                else:
                    self.in_string = False
                i += 1
                continue
            m = _OUTSIDE.search(text, i)
            if m is None:
                i = n
                break
            i = m.start()
            c = text[i]
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                self.done = self.depth == 0
            i += 1
        if i:
            self.text.append(text[:i])
        return i


__all__ = ["ObjectEnd"]
