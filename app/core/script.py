"""Splitting a script into paragraphs and sentences, with character spans.

The editor shows these spans and every take belongs to one of them, so the rules
are plain and predictable: a sentence ends at ``.``, ``!``, ``?`` or ``…`` (runs of
them, then closing quotes or brackets) followed by white space, or at the end of its
paragraph; a blank line ends a paragraph. A single line break is a space, so
hard-wrapped text files read as they were written. Common abbreviations and initials
("Dr.", "e.g.", "J. R. R."), decimal numbers and punctuation followed by a lower-case
word ('"Really?" she asked.') do not end a sentence.

A line that starts with ``#`` (one to six, then a space: Markdown's heading) is a chapter
heading: a sentence of its own, read aloud without its marks, that starts a chapter
(``chapters``; audiobooks and their chapter marks follow them).

Pauses are tags in the script: ``[pause 1.5s]`` or ``[pause 500ms]``, and SSML's
``<break time="1.5s"/>`` as other tools write them (``canonical_tags`` rewrites those in
the first form). A tag ends the sentence before it and is never read aloud; the silence
between two sentences is then exactly the sum of the tags between them (instead of the
usual gap), to the sample. A malformed tag (no length, a length over MAX_PAUSE_S) still
ends the sentence and is not read; ``tags`` reports what is wrong with it.

Two more tags set how what follows them is read, up to the next tag of their kind (they
too end the sentence before them): ``[voice kokoro:af_heart]`` (any voice id; a dialogue
names a voice per speaker; ``[voice default]`` returns to the project's) and ``[speed 1.2]``
(from 0.25 to 4; ``[speed default]``). ``direction`` says what holds at a place.

"Say as" tags stand inside a sentence, in place of a word: ``[spell NASA]`` reads its letters
one by one, ``[say GIF as jif]`` reads a respelling and ``[say Nguyen as /ŋwˈɪn/]`` IPA
(phonemes, for Piper and Kokoro) for this one occurrence; ``shown`` is the text as a reader
sees it, ``read_as`` what the front end is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf no vol fig approx dept est inc ltd co corp
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun a.m p.m""".split()
)

_END = re.compile(r"""[.!?…]+["'”’)\]]*""")
# Anything that starts like a tag, up to its closing bracket (or the line's end).
_TAG = re.compile(r"\[\s*(?:pause|voice|speed)\b[^\]\n]*\]?|<\s*break\b[^>\n]*>?", re.I)
_VOICE = re.compile(r"\[\s*voice\s+([\w.:/+-]+)\s*\]", re.I)
_SPEED = re.compile(r"\[\s*speed\s+(default|\d+(?:\.\d+)?|\.\d+)\s*\]", re.I)
SPEEDS = (0.25, 4.0)
_INLINE = re.compile(r"\[\s*(spell|say)\b([^\]\n]*)\]?", re.I)
_SAY_AS = re.compile(r"\s*(\S(?:.*?\S)?)\s+as\s+(\S(?:.*\S)?)\s*", re.I)
_PAUSE = re.compile(r"\[\s*pause\s+(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\s*\]", re.I)
_BREAK = re.compile(r"""<\s*break\s+time\s*=\s*(["'])(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\1\s*/?\s*>""", re.I)
MAX_PAUSE_S = 60.0
_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
_HEADING = re.compile(r"^[ \t]*(#{1,6})[ \t]+(\S[^\n]*?)[ \t#]*$", re.M)


@dataclass(frozen=True)
class Span:
    start: int  # offsets into the script, end exclusive, white space trimmed
    end: int
    paragraph: int

    def text(self, script: str) -> str:
        return script[self.start : self.end]


@dataclass(frozen=True)
class Tag:
    start: int  # offsets into the script, end exclusive
    end: int
    kind: str  # "pause", "voice" or "speed"
    value: float | str | None  # seconds, a voice id, a speed; None for "default" or a malformed tag
    problem: str = ""  # what is wrong with it, for the editor ("" where nothing is)

    @property
    def seconds(self) -> float | None:
        """A well-formed pause's length, else None."""
        return self.value if self.kind == "pause" and not self.problem else None

    def text(self, script: str) -> str:
        return script[self.start : self.end]


def _tag(start: int, end: int, text: str) -> Tag:
    kind = "pause" if text.lstrip().startswith("<") else re.match(r"\[\s*(\w+)", text).group(1).lower()
    if kind == "voice":
        full = _VOICE.fullmatch(text)
        if full is None:
            return Tag(start, end, kind, None, "a voice is written [voice kokoro:af_heart] or [voice default]")
        return Tag(start, end, kind, None if full.group(1).lower() == "default" else full.group(1))
    if kind == "speed":
        full = _SPEED.fullmatch(text)
        if full is None:
            return Tag(start, end, kind, None, "a speed is written [speed 1.2] or [speed default]")
        if full.group(1).lower() == "default":
            return Tag(start, end, kind, None)
        speed = float(full.group(1))
        if not SPEEDS[0] <= speed <= SPEEDS[1]:
            return Tag(start, end, kind, None, f"a speed lies from {SPEEDS[0]:g} to {SPEEDS[1]:g}")
        return Tag(start, end, kind, speed)
    full = _PAUSE.fullmatch(text) or _BREAK.fullmatch(text)
    if full is None:
        example = "[pause 1.5s]" if text.lstrip("[ ").lower().startswith("pause") else '<break time="1.5s"/>'
        return Tag(start, end, kind, None, f"a pause is written {example} or with ms")
    value, unit = full.group(full.lastindex - 1), full.group(full.lastindex)
    seconds = float(value) / (1000.0 if unit.lower() == "ms" else 1.0)
    if seconds > MAX_PAUSE_S:
        return Tag(start, end, kind, None, f"a pause is at most {MAX_PAUSE_S:g} s")
    return Tag(start, end, kind, seconds)


def tags(script: str) -> list[Tag]:
    """Every tag of the script, in order, each with its value or what is wrong with it."""
    return [_tag(m.start(), m.end(), m.group()) for m in _TAG.finditer(script)]


@dataclass(frozen=True)
class SayAs:
    start: int  # offsets into the text, end exclusive
    end: int
    word: str  # what a reader sees
    reading: str  # what is read: letters spaced out, a respelling or /IPA/ ("" where malformed)
    problem: str = ""


def say_as_tags(text: str) -> list[SayAs]:
    """The "say as" tags of a text, each with what it reads or what is wrong with it."""
    found = []
    for m in _INLINE.finditer(text):
        kind, body = m.group(1).lower(), m.group(2)
        if not m.group().endswith("]"):
            found.append(SayAs(m.start(), m.end(), body.strip(), "", f"a [{kind} ...] tag ends with ]"))
        elif kind == "spell":
            word = body.strip()
            letters = " ".join(c.upper() for c in word if c.isalnum())
            problem = "" if letters else "[spell ...] needs a word: [spell NASA]"
            found.append(SayAs(m.start(), m.end(), word, letters, problem))
        elif (full := _SAY_AS.fullmatch(body)) is None:
            found.append(
                SayAs(
                    m.start(),
                    m.end(),
                    body.strip(),
                    "",
                    "a say tag is written [say GIF as jif] or [say Nguyen as /ŋwˈɪn/]",
                )
            )
        else:
            found.append(SayAs(m.start(), m.end(), full.group(1), full.group(2)))
    return found


def shown(text: str) -> str:
    """The text as a reader sees it: each "say as" tag as its word."""
    out, at = [], 0
    for tag in say_as_tags(text):
        out += [text[at : tag.start], tag.word]
        at = tag.end
    return "".join(out) + text[at:]


def read_as(text: str, *, phonemes: bool = True) -> tuple[str, dict[str, str]]:
    """What the front end is given for a text: each "say as" tag as its reading (an IPA one as
    a word of its own, with the lexicon entry that reads it: app.core.lexicon; as its word
    where the voice reads no phonemes), malformed ones as their word."""
    out, entries, at = [], {}, 0
    for n, tag in enumerate(say_as_tags(text)):
        reading = tag.reading if not tag.problem else tag.word
        if len(reading) > 2 and reading.startswith("/") and reading.endswith("/"):  # IPA
            if phonemes:
                entries[f"sayastag{n}"] = reading
                reading = f"sayastag{n}"
            else:
                reading = tag.word
        out += [text[at : tag.start], reading]
        at = tag.end
    return "".join(out) + text[at:], entries


def direction(script: str, offset: int, found: list[Tag] | None = None) -> dict:
    """What the voice and speed tags before ``offset`` set for the text there: {"voice": id,
    "speed": x}, each only where a well-formed tag of its kind sets it (not "default")."""
    out: dict = {}
    for tag in tags(script) if found is None else found:
        if tag.start >= offset:
            break
        if tag.kind in ("voice", "speed") and not tag.problem:
            if tag.value is None:
                out.pop(tag.kind, None)
            else:
                out[tag.kind] = tag.value
    return out


def canonical_tags(script: str) -> str:
    """The script with each well-formed SSML break written as [pause ...] (malformed tags kept as they are)."""
    out, at = [], 0
    for tag in tags(script):
        if tag.seconds is not None and tag.text(script).lstrip().startswith("<"):
            out += [script[at : tag.start], f"[pause {_format_seconds(tag.seconds)}]"]
            at = tag.end
    return "".join(out) + script[at:]


def _format_seconds(seconds: float) -> str:
    if seconds < 1.0 and round(seconds * 1000.0, 6).is_integer():
        return f"{round(seconds * 1000.0):d}ms"
    return f"{seconds:g}s"


def pause_between(script: str, end: int, start: int) -> float | None:
    """The pause the tags in script[end:start] ask for (their sum), or None where there are
    none; malformed tags count as none."""
    lengths = [t.seconds for t in tags(script[end:start]) if t.kind == "pause"]
    return sum(s for s in lengths if s is not None) if any(s is not None for s in lengths) else None


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


@dataclass(frozen=True)
class Chapter:
    start: int  # offset of its heading's text
    title: str


def chapters(script: str) -> list[Chapter]:
    """The script's chapter headings, in order."""
    return [Chapter(m.start(2), m.group(2).strip()) for m in _HEADING.finditer(script)]


def _paragraphs(script: str) -> list[tuple[int, int]]:
    """Paragraph ranges: between blank lines, and each heading line one of its own (its marks left out)."""
    breaks = list(_PARAGRAPH.finditer(script))
    ranges = []
    for start, end in zip([0] + [m.end() for m in breaks], [m.start() for m in breaks] + [len(script)], strict=True):
        at = start
        for m in _HEADING.finditer(script, start, end):
            ranges += [(at, m.start()), (m.start(2), m.end(2))]
            at = m.end()
        ranges.append((at, end))
    return [(a, b) for a, b in ranges if script[a:b].strip()]


def segment(script: str) -> list[Span]:
    """Sentences of ``script`` in order; empty ones (white space only) are dropped."""
    spans: list[Span] = []
    all_tags = tags(script)
    for index, (p_start, p_end) in enumerate(_paragraphs(script)):
        # A tag ends the sentence before it; the text between tags splits as any other.
        pieces, begin = [], p_start
        for tag in all_tags:
            if p_start <= tag.start < p_end:
                pieces.append((begin, tag.start))
                begin = min(tag.end, p_end)
        pieces.append((begin, p_end))
        for piece_start, piece_end in pieces:
            begin = piece_start
            for cut in [*_sentence_ends(script, piece_start, piece_end), piece_end]:
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
    (re.compile(r"^[ \t]{0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$", re.M), r"\1 \2"),  # headings: chapters
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
