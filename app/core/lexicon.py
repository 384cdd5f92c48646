"""Pronunciation lexicons: words and how to say them, applied before the voice's own G2P.

An entry is a word and its pronunciation: IPA between slashes (``/ŋwˈɪn/``), given to the
voice as phonemes (Piper and Kokoro; Chatterbox reads text and cannot take them), or a
respelling (``win``), put in the word's place in the text for every voice. An entry written
in lower case matches the word in any case; one with a capital matches that case alone.
Words match whole (not inside longer words).

A studio has a user lexicon (in its settings folder) and each project one of its own, which
wins where both have a word. A take records the entries its sentence used, so that changing
an entry makes exactly the sentences that use it stale.

The file format is plain UTF-8 text, one entry a line: the word, a tab, the pronunciation;
``#`` starts a comment. W3C PLS files (what ElevenLabs exports) import too: each lexeme's
graphemes with its phoneme (IPA) or alias (a respelling).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from app.core.atomic import write_bytes_atomic
from app.core.script import read_as

MAX_ENTRIES = 10_000
MAX_FILE_BYTES = 4 << 20
_WORD = re.compile(r"[\w][\w'’.-]*\w|\w", re.UNICODE)


class LexiconError(ValueError):
    pass


def is_ipa(pronunciation: str) -> bool:
    return len(pronunciation) > 2 and pronunciation.startswith("/") and pronunciation.endswith("/")


def check_entry(word: str, pronunciation: str) -> tuple[str, str]:
    """An entry as stored (stripped), or LexiconError saying what is wrong with it."""
    word, pronunciation = word.strip(), pronunciation.strip()
    if not _WORD.fullmatch(word):
        raise LexiconError(f"{word!r}: an entry is one word (letters, digits, inner ' . -)")
    if not pronunciation or pronunciation == "//":
        raise LexiconError(f"{word!r}: no pronunciation")
    if "\n" in pronunciation or "\t" in pronunciation or len(pronunciation) > 200:
        raise LexiconError(f"{word!r}: a pronunciation is one line of at most 200 characters")
    return word, pronunciation


def merged(user: dict[str, str], project: dict[str, str]) -> dict[str, str]:
    """The entries a project's sentences are read with: the user's, the project's winning."""
    return {**user, **project}


def _pattern(entries: dict[str, str]) -> re.Pattern | None:
    if not entries:
        return None
    # Longest first, so that "St. Louis"-like words win over their prefixes; a lower-case entry
    # matches any case, so its alternative is case-insensitive.
    alternatives = []
    for word in sorted(entries, key=len, reverse=True):
        body = re.escape(word)
        alternatives.append(f"(?i:{body})" if word == word.lower() else body)
    return re.compile(r"(?<![\w'’])(?:" + "|".join(alternatives) + r")(?![\w'’])")


def _entry_for(entries: dict[str, str], found: str) -> str:
    """The entry a matched word came from: its exact form, else its lower-case one."""
    return found if found in entries else found.lower()


def used(text: str, entries: dict[str, str]) -> dict[str, str]:
    """The entries ``text`` uses (what a take records)."""
    pattern = _pattern(entries)
    if pattern is None:
        return {}
    out = {}
    for m in pattern.finditer(text):
        key = _entry_for(entries, m.group())
        out[key] = entries[key]
    return dict(sorted(out.items()))


def respelled(text: str, entries: dict[str, str]) -> str:
    """The text with each respelling entry's words replaced (IPA entries left as they are)."""
    pattern = _pattern({w: p for w, p in entries.items() if not is_ipa(p)})
    if pattern is None:
        return text
    return pattern.sub(lambda m: entries[_entry_for(entries, m.group())], text)


def phonemes(text: str, entries: dict[str, str], phonemize) -> str | None:
    """The phonemes of ``text`` with each IPA entry's words said as written, the rest through
    ``phonemize`` (an engine's, text -> lines of IPA) after the respellings; None where the text
    uses no IPA entry (then the text, respelled, is what to synthesize)."""
    text = respelled(text, entries)
    pattern = _pattern({w: p for w, p in entries.items() if is_ipa(p)})
    if pattern is None or not pattern.search(text):
        return None
    pieces, at = [], 0
    for m in pattern.finditer(text):
        pieces.append(" ".join(phonemize(text[at : m.start()])) if text[at : m.start()].strip() else "")
        pieces.append(entries[_entry_for(entries, m.group())][1:-1])
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


def dumps(entries: dict[str, str]) -> str:
    lines = ["# Voice Studio pronunciation lexicon: word<TAB>pronunciation (/IPA/ or a respelling)"]
    lines += [f"{word}\t{pron}" for word, pron in sorted(entries.items(), key=lambda e: e[0].lower())]
    return "\n".join(lines) + "\n"


def write(path: Path | str, entries: dict[str, str]) -> Path:
    return write_bytes_atomic(path, dumps(entries).encode("utf-8"))
