"""Splitting a script into paragraphs and sentences, with character spans.

The editor shows these spans and every take belongs to one of them, so the rules
are plain and predictable: a sentence ends at ``.``, ``!``, ``?`` or ``…`` (runs of
them, then closing quotes or brackets) followed by white space, or at the end of its
paragraph; a blank line ends a paragraph. A single line break is a space, so
hard-wrapped text files read as they were written. Common abbreviations and initials
("Dr.", "e.g.", "J. R. R."), decimal numbers and punctuation followed by a lower-case
word ('"Really?" she asked.') do not end a sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf no vol fig approx dept est inc ltd co corp
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun a.m p.m""".split()
)

_END = re.compile(r"""[.!?…]+["'”’)\]]*""")
_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")


@dataclass(frozen=True)
class Span:
    start: int  # offsets into the script, end exclusive, white space trimmed
    end: int
    paragraph: int

    def text(self, script: str) -> str:
        return script[self.start : self.end]


def _is_abbreviation(script: str, dot: int) -> bool:
    """Whether the '.' at ``dot`` closes an abbreviation or an initial."""
    word_start = dot
    while word_start > 0 and (script[word_start - 1].isalpha() or script[word_start - 1] == "."):
        word_start -= 1
    word = script[word_start:dot].lower()
    if not word:
        return False
    return word in ABBREVIATIONS or (len(word) == 1 and word.isalpha() and script[word_start].isupper())


def _sentence_ends(script: str, start: int, end: int) -> list[int]:
    """Offsets just past each sentence end inside [start, end)."""
    ends = []
    for match in _END.finditer(script, start, end):
        stop = match.end()
        if stop < end and not script[stop].isspace():
            continue  # "3.14", "a.m.x", "Hello.World"
        if match.group() == "." and _is_abbreviation(script, match.start()):
            continue
        following = stop
        while following < end and script[following].isspace():
            following += 1
        if following < end and script[following].islower():
            continue  # '"Really?" she asked.', "at 5 p.m. today"
        ends.append(stop)
    return ends


def segment(script: str) -> list[Span]:
    """Sentences of ``script`` in order; empty ones (white space only) are dropped."""
    spans: list[Span] = []
    breaks = list(_PARAGRAPH.finditer(script))
    paragraph_starts = [0] + [m.end() for m in breaks]
    paragraph_ends = [m.start() for m in breaks] + [len(script)]
    for index, (p_start, p_end) in enumerate(zip(paragraph_starts, paragraph_ends, strict=True)):
        begin = p_start
        for cut in [*_sentence_ends(script, p_start, p_end), p_end]:
            _append(spans, script, begin, cut, index)
            begin = cut
    return spans


def _append(spans: list[Span], script: str, start: int, end: int, paragraph: int) -> None:
    while start < end and script[start].isspace():
        start += 1
    while end > start and script[end - 1].isspace():
        end -= 1
    if end > start:
        spans.append(Span(start, end, paragraph))


_MD_RULES = [
    (re.compile(r"^```.*?^```[ \t]*$", re.M | re.S), ""),  # fenced code
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),  # images: their alt text
    (re.compile(r"\[([^\]]*)\]\([^)]*\)"), r"\1"),  # links: their text
    (re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", re.M), r"\1"),  # headings
    (re.compile(r"^[ \t]*>[ \t]?", re.M), ""),  # block quotes
    (re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]+", re.M), ""),  # list markers
    (re.compile(r"^[ \t]*(?:[-*_][ \t]*){3,}$", re.M), ""),  # rules
    (re.compile(r"(\*\*|__|\*|_|`)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # emphasis, inline code
]


def markdown_to_script(text: str) -> str:
    """The words of a Markdown file as a script: markup that would be read aloud removed."""
    for pattern, replacement in _MD_RULES:
        text = pattern.sub(replacement, text)
    return text
