"""Chatterbox Multilingual's text front end, as the reference (mtl_tts.py, MTLTokenizer) prepares
text for its grapheme tokenizer: its punctuation normalisation, then lower case and Unicode's
NFKD decomposition (which writes Korean syllables as their jamo), Chinese characters as Cangjie
codes, the language's tag in front, spaces as [SPACE].

The reference also passes Japanese through pykakasi (kanji to hiragana), Hebrew through Dicta's
diacritizer, Russian through a stress marker and Chinese through pkuseg's word segmentation where
those packages are installed, and leaves the text as it is where they are not; none of them is a
dependency here, so the text goes on as the reference's does without them.
"""

from __future__ import annotations

import json
import unicodedata

from app.engine.errors import InvalidArgumentError

# ChatterboxMultilingualTTS.SUPPORTED_LANGUAGES.
LANGUAGES = {
    "ar": "Arabic",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "es": "Spanish",
    "fi": "Finnish",
    "fr": "French",
    "he": "Hebrew",
    "hi": "Hindi",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "ms": "Malay",
    "nl": "Dutch",
    "no": "Norwegian",
    "pl": "Polish",
    "pt": "Portuguese",
    "ru": "Russian",
    "sv": "Swedish",
    "sw": "Swahili",
    "tr": "Turkish",
    "zh": "Chinese",
}
SPACE = "[SPACE]"

# mtl_tts.punc_norm: Turbo's replacements and more, and CJK sentence ends.
PUNCTUATION = [
    ("...", ", "),
    ("…", ", "),
    (":", ","),
    (" - ", ", "),
    (";", ", "),
    ("—", "-"),
    ("–", "-"),
    (" ,", ","),
    ("“", '"'),
    ("”", '"'),
    ("‘", "'"),
    ("’", "'"),
]
ENDERS = (".", "!", "?", "-", ",", "、", "，", "。", "？", "！")


def check_language(language: str | None) -> str | None:
    """The language code as the model takes it (None or "": none, the text without a language
    tag, as the reference allows), or a clear error naming the ones it speaks."""
    code = (language or "").strip().lower()
    if not code:
        return None
    if code not in LANGUAGES:
        raise InvalidArgumentError(
            f"Chatterbox Multilingual does not speak {language!r}; it speaks: {', '.join(sorted(LANGUAGES))}"
        )
    return code


class Cangjie:
    """Chinese characters as their Cangjie codes ([cj_x] a letter, [cj_.] after each), from
    Cangjie5_TC.json's "character<TAB>code" entries; a character sharing its code with earlier
    ones gets its place among them after the code. Characters it lacks stay as they are."""

    def __init__(self, entries: list[str]):
        self.code: dict[str, str] = {}  # a character listed twice: its last code
        self.words: dict[str, list[str]] = {}
        for entry in entries:
            parts = entry.split("\t")
            if len(parts) < 2:
                raise ValueError(f"a Cangjie entry is not 'character<TAB>code': {entry!r}")
            word, code = parts[0], parts[1]
            self.code[word] = code
            self.words.setdefault(code, []).append(word)

    @classmethod
    def from_json(cls, text: str) -> Cangjie:
        entries = json.loads(text)
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ValueError("the Cangjie table is not a list of 'character<TAB>code' strings")
        return cls(entries)

    def __call__(self, text: str) -> str:
        out = []
        for ch in text:
            code = self.code.get(ch) if unicodedata.category(ch) == "Lo" else None
            if code is None:
                out.append(ch)
                continue
            index = self.words[code].index(ch)
            code += str(index) if index > 0 else ""
            out.append("".join(f"[cj_{c}]" for c in code) + "[cj_.]")
        return "".join(out)


def normalize_punctuation(text: str, table: list[tuple[str, str]] = PUNCTUATION, enders: tuple = ENDERS) -> str:
    """The reference's punc_norm (mtl_tts.py's; Turbo's with its own table and enders): a capital
    first letter, single spaces, uncommon punctuation replaced, a full stop where the text ends
    without one of ``enders``. (Empty text is refused before.)"""
    if text and text[0].islower():
        text = text[0].upper() + text[1:]
    text = " ".join(text.split())
    for old, new in table:
        text = text.replace(old, new)
    text = text.rstrip(" ")
    if not text.endswith(enders):
        text += "."
    return text


def prepare(text: str, language: str | None, cangjie: Cangjie | None = None) -> str:
    """What MTLTokenizer.encode hands its tokenizer for normalized ``text`` in ``language`` (None:
    no language tag)."""
    text = unicodedata.normalize("NFKD", text.lower())
    if language == "zh" and cangjie is not None:
        text = cangjie(text)
    elif language == "ko":
        text = text.strip()  # NFKD has already written its syllables as jamo, as the reference's step does
    return (f"[{language}]{text}" if language else text).replace(" ", SPACE)
