"""Pronunciation lexicons: words and how to say them, applied before the voice's own G2P.

An entry is a word and its pronunciation: IPA between slashes (``/ŋwˈɪn/``), given to the
voice as phonemes (Piper and Kokoro; Chatterbox reads text and cannot take them), or a
respelling (``win``), put in the word's place in the text for every voice. An entry written
in lower case matches the word in any case; one with a capital matches that case alone.
Words match whole (not inside longer words).

An entry may be for one part of speech, written after its word: ``record (noun)``,
``record (verb)``, for words read one way as a noun and another as a verb. Which one a word in
a sentence is comes from the word before it, as espeak-ng tells its own homographs apart: a
noun after an article, a possessive, a demonstrative, a quantifier or a preposition ("the",
"my", "this", "every", "of", ...); a verb after "to", a modal or "do" ("will", "can", "don't",
...), a subject pronoun ("I", "we", "they", ...) or "please", and at the start of a clause
when an article or a possessive follows ("Record the song."). Where that does not tell, an
entry for the word without a part of speech applies, and where there is none, the voice reads
the word its own way.

A studio has a user lexicon (in its settings folder) and each project one of its own, which
wins where both have a word. A take records the entries its sentence used, so that changing
an entry makes exactly the sentences that use it stale.

The file format is plain UTF-8 text, one entry a line: the word, a tab, the pronunciation;
``#`` starts a comment. W3C PLS files (what ElevenLabs exports) import too: each lexeme's
graphemes with its phoneme (IPA) or alias (a respelling).
"""

from __future__ import annotations

import functools
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from app.core.atomic import write_bytes_atomic
from app.core.script import read_as

MAX_ENTRIES = 10_000
PARTS_OF_SPEECH = ("noun", "verb")
_KEY = re.compile(r"(.+?)\s*\((noun|verb)\)", re.IGNORECASE)
_ARTICLES = {"a", "an", "the", "my", "your", "his", "her", "its", "our", "their"}
_NOUN_AFTER = _ARTICLES | {
    "this", "that", "these", "those", "every", "each", "some", "any", "no", "another", "of", "for", "with",
    "in", "on", "at", "by", "from", "about", "into", "under", "over",
}  # fmt: skip
_VERB_AFTER = {
    "to", "will", "would", "shall", "should", "can", "could", "may", "might", "must", "cannot", "do", "does",
    "did", "don't", "doesn't", "didn't", "won't", "wouldn't", "can't", "couldn't", "shouldn't", "mustn't",
    "i", "you", "we", "they", "please", "let's", "not", "never",
}  # fmt: skip
MAX_FILE_BYTES = 4 << 20
_WORD = re.compile(r"[\w][\w'’.-]*\w|\w", re.UNICODE)


class LexiconError(ValueError):
    pass


def is_ipa(pronunciation: str) -> bool:
    return len(pronunciation) > 2 and pronunciation.startswith("/") and pronunciation.endswith("/")


def split_key(key: str) -> tuple[str, str | None]:
    """An entry's word and its part of speech (None: any)."""
    m = _KEY.fullmatch(key)
    return (m.group(1), m.group(2).lower()) if m else (key, None)


def check_entry(word: str, pronunciation: str) -> tuple[str, str]:
    """An entry as stored (stripped; a part of speech as "word (noun)"), or LexiconError saying
    what is wrong with it."""
    word, pronunciation = word.strip(), pronunciation.strip()
    bare, pos = split_key(word)
    if not _WORD.fullmatch(bare):
        raise LexiconError(
            f"{word!r}: an entry is one word (letters, digits, inner ' . -), with a part of speech after it"
            " where it has one: word (noun), word (verb)"
        )
    word = f"{bare} ({pos})" if pos else bare
    if not pronunciation or pronunciation == "//":
        raise LexiconError(f"{word!r}: no pronunciation")
    if "\n" in pronunciation or "\t" in pronunciation or len(pronunciation) > 200:
        raise LexiconError(f"{word!r}: a pronunciation is one line of at most 200 characters")
    return word, pronunciation


def merged(user: dict[str, str], project: dict[str, str]) -> dict[str, str]:
    """The entries a project's sentences are read with: the user's, the project's winning."""
    return {**user, **project}


def _pattern(entries: dict[str, str]) -> re.Pattern | None:
    """What matches the entries' words in a text (built once for a set of entries: a project's
    staleness asks it for every sentence)."""
    return _compiled(frozenset(entries)) if entries else None


@functools.lru_cache(maxsize=64)
def _compiled(keys: frozenset[str]) -> re.Pattern:
    # Longest first, so that "St. Louis"-like words win over their prefixes; a lower-case entry
    # matches any case, so its alternative is case-insensitive.
    alternatives = []
    for word in sorted({split_key(k)[0] for k in keys}, key=len, reverse=True):
        body = re.escape(word)
        alternatives.append(f"(?i:{body})" if word == word.lower() else body)
    return re.compile(r"(?<![\w'’])(?:" + "|".join(alternatives) + r")(?![\w'’])")


def part_of_speech(text: str, start: int, end: int) -> str | None:
    """Whether the word at text[start:end] is a noun or a verb, where the word before it (or, at
    the start of a clause, the one after it) tells; None where they do not."""
    before = re.search(r"([\w'’]+)[^\w.!?;:]*$", text[:start])
    if before is None:
        after = re.match(r"[^\w.!?;:]*([\w'’]+)", text[end:])
        return "verb" if after and after.group(1).lower() in _ARTICLES else None
    word = before.group(1).lower().replace("’", "'")
    return "noun" if word in _NOUN_AFTER else "verb" if word in _VERB_AFTER else None


def _entry_for(entries: dict[str, str], text: str, m: re.Match) -> str | None:
    """The entry a matched word is read with: its exact form's, else its lower-case one's; of
    those, the one for the part of speech the word has there, else the one for any; None where
    only entries for other parts of speech have the word."""
    found = m.group()
    pos = None
    for form in dict.fromkeys((found, found.lower())):
        if any(f"{form} ({p})" in entries for p in PARTS_OF_SPEECH):
            pos = pos or part_of_speech(text, m.start(), m.end()) or "?"
            if f"{form} ({pos})" in entries:
                return f"{form} ({pos})"
        if form in entries:
            return form
    return None


def used(text: str, entries: dict[str, str]) -> dict[str, str]:
    """The entries ``text`` uses (what a take records)."""
    pattern = _pattern(entries)
    if pattern is None:
        return {}
    out = {}
    for m in pattern.finditer(text):
        if (key := _entry_for(entries, text, m)) is not None:
            out[key] = entries[key]
    return dict(sorted(out.items()))


def respelled(text: str, entries: dict[str, str]) -> str:
    """The text with each respelling entry's words replaced (IPA entries left as they are)."""
    spelled = {w: p for w, p in entries.items() if not is_ipa(p)}
    pattern = _pattern(spelled)
    if pattern is None:
        return text

    def replace(m: re.Match) -> str:
        key = _entry_for(spelled, text, m)
        return m.group() if key is None else spelled[key]

    return pattern.sub(replace, text)


def phonemes(text: str, entries: dict[str, str], phonemize) -> str | None:
    """The phonemes of ``text`` with each IPA entry's words said as written, the rest through
    ``phonemize`` (an engine's, text -> lines of IPA) after the respellings; None where the text
    uses no IPA entry (then the text, respelled, is what to synthesize)."""
    text = respelled(text, entries)
    ipa = {w: p for w, p in entries.items() if is_ipa(p)}
    pattern = _pattern(ipa)
    said = [] if pattern is None else [(m, key) for m in pattern.finditer(text) if (key := _entry_for(ipa, text, m))]
    if not said:
        return None
    pieces, at = [], 0
    for m, key in said:
        pieces.append(" ".join(phonemize(text[at : m.start()])) if text[at : m.start()].strip() else "")
        pieces.append(ipa[key][1:-1])
        at = m.end()
    tail = text[at:]
    pieces.append(" ".join(phonemize(tail)) if tail.strip(" ") and any(c.isalnum() for c in tail) else tail.strip())
    return " ".join(p for p in pieces if p).replace(" .", ".").replace(" ,", ",").replace(" ?", "?").replace(" !", "!")


def sentence_entries(text: str, entries: dict[str, str]) -> dict[str, str]:
    """The entries a sentence is read with (what its take records): those its text uses once
    its "say as" tags are read (a tag's word reads as the tag says)."""
    return used(read_as(text)[0], entries)


def engine_input(engine, text: str, entries: dict[str, str]) -> dict:
    """What an engine (app.engine.Engine) reads for a sentence: its text with its "say as" tags
    read (app.core.script) and the entries' respellings, or its phonemes where it uses an IPA
    entry and the voice takes phonemes; the keyword arguments of Engine.synthesize."""
    text, extra = read_as(text, phonemes=engine.takes_phonemes)
    entries = entries | extra
    if not used(text, entries):
        return {"text": text}
    if engine.takes_phonemes:
        ipa = phonemes(text, entries, engine.phonemize)
        if ipa is not None:
            return {"phonemes": ipa}
    return {"text": respelled(text, entries)}


def phoneme_lines(engine, read: dict) -> list[str]:
    """The phonemes an engine that takes them reads for engine_input's answer, a sentence a line."""
    return [read["phonemes"]] if "phonemes" in read else engine.phonemize(read["text"])


# -- files --------------------------------------------------------------------------------


def parse(text: str, *, name: str = "lexicon") -> dict[str, str]:
    """A lexicon file's entries (the plain format, or PLS XML); LexiconError names a bad line."""
    if text.lstrip().startswith("<"):
        return _parse_pls(text, name)
    entries: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, sep, pron = line.partition("\t")
        if not sep:
            raise LexiconError(f"{name}, line {number}: the word, a tab, then its pronunciation")
        _add(entries, word, pron, f"{name}, line {number}")
    return entries


def _add(entries: dict[str, str], word: str, pron: str, where: str) -> None:
    """Checks an entry a file holds and adds it; LexiconError says where a bad one is."""
    try:
        word, pron = check_entry(word, pron)
    except LexiconError as exc:
        raise LexiconError(f"{where}: {exc}") from None
    entries[word] = pron
    if len(entries) > MAX_ENTRIES:
        raise LexiconError(f"{where.split(',')[0]}: more than {MAX_ENTRIES} entries")


def _parse_pls(text: str, name: str) -> dict[str, str]:
    if "<!ENTITY" in text or "<!DOCTYPE" in text:
        raise LexiconError(f"{name}: a PLS file with a document type or entities is not read")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise LexiconError(f"{name}: not a PLS lexicon ({exc})") from None
    entries: dict[str, str] = {}
    for lexeme in root.iter():
        if not lexeme.tag.endswith("lexeme"):
            continue
        graphemes = [g.text or "" for g in lexeme if g.tag.endswith("grapheme")]
        phoneme = next((p.text for p in lexeme if p.tag.endswith("phoneme") and p.text), None)
        alias = next((a.text for a in lexeme if a.tag.endswith("alias") and a.text), None)
        if phoneme is None and alias is None:
            continue
        for grapheme in graphemes:
            _add(entries, grapheme, f"/{phoneme.strip()}/" if phoneme else alias, name)
    return entries


def read(path: Path | str) -> dict[str, str]:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise LexiconError(f"{path.name}: larger than {MAX_FILE_BYTES >> 20} MiB")
        return parse(path.read_text(encoding="utf-8"), name=path.name)
    except (OSError, UnicodeDecodeError) as exc:
        raise LexiconError(f"{path.name}: cannot read it as UTF-8 text ({exc})") from None


def user_path() -> Path:
    """The user's lexicon, which every project of the studio and `render` read with theirs."""
    from app.core import paths

    return paths.config_dir() / "lexicon.txt"


def read_user() -> tuple[dict[str, str], str | None]:
    """The user's lexicon, and why it cannot be used where it cannot (the file stays as it is,
    and sentences are read without it)."""
    path = user_path()
    if not path.exists():
        return {}, None
    try:
        return read(path), None
    except LexiconError as exc:
        return {}, str(exc)


def dumps(entries: dict[str, str]) -> str:
    lines = ["# Voice Studio pronunciation lexicon: word<TAB>pronunciation (/IPA/ or a respelling)"]
    lines += [f"{word}\t{pron}" for word, pron in sorted(entries.items(), key=lambda e: e[0].lower())]
    return "\n".join(lines) + "\n"


def write(path: Path | str, entries: dict[str, str]) -> Path:
    return write_bytes_atomic(path, dumps(entries).encode("utf-8"))
