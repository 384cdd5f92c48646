"""Word timings of a take from the engine's durations: where each word of a sentence's text
starts and ends in its audio.

The engine gives each phoneme token's frames (``Engine.output("durations")`` after a one-chunk
synthesis). Piper's tokens are BOS, pad, then each phoneme followed by a pad, then EOS;
Kokoro's are a pad, the phonemes, a pad. A phoneme word is a run of phonemes between spaces.
The text's words are matched to the phoneme words by phonemizing each word alone (a number
is several words: "1990" is "nineteen ninety"); where the counts disagree (the front end
joined words), the take has no word timings rather than wrong ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

_TEXT_WORD = re.compile(r"\w(?:[\w'’.-]*\w)?")


def phoneme_word_frames(ipa: str, durations: np.ndarray, layout: str) -> list[tuple[float, float]] | None:
    """Each phoneme word's first frame and the frame after its last; None where the durations
    are not those of these phonemes in this layout ("piper" or "kokoro")."""
    chars = [c for c in ipa if c not in "\r\n"]
    d = np.asarray(durations, dtype=np.float64).reshape(-1)
    if layout == "piper" and len(d) == 2 * len(chars) + 3:
        per, start = d[2 : 2 + 2 * len(chars) : 2] + d[3 : 3 + 2 * len(chars) : 2], d[0] + d[1]
    elif layout == "kokoro" and len(d) == len(chars) + 2:
        per, start = d[1 : 1 + len(chars)], d[0]
    else:
        return None
    words, at, first = [], start, None
    for c, n in zip(chars, per, strict=True):
        if c == " ":
            if first is not None:
                words.append((first, at))
                first = None
        elif first is None:
            first = at
        at += n
    if first is not None:
        words.append((first, at))
    return words


def text_words(text: str) -> list[tuple[int, int]]:
    """The character spans of the text's words."""
    return [(m.start(), m.end()) for m in _TEXT_WORD.finditer(text)]


def word_times(
    text: str,
    ipa: str,
    durations: np.ndarray,
    layout: str,
    seconds_per_frame: float,
    words_of: Callable[[str], int],
) -> list[list[float]] | None:
    """[[char_start, char_end, start_s, end_s], ...] for each word of ``text`` that is spoken;
    ``words_of(word)`` counts the phoneme words the front end makes of one word alone."""
    frames = phoneme_word_frames(ipa, durations, layout)
    spans = text_words(text)
    if frames is None or not spans:
        return None
    counts = [words_of(text[a:b]) for a, b in spans]
    if sum(counts) != len(frames):
        return None
    out, k = [], 0
    for (a, b), n in zip(spans, counts, strict=True):
        if n:
            out.append([a, b, frames[k][0] * seconds_per_frame, frames[k + n - 1][1] * seconds_per_frame])
        k += n
    return out


def take_words(timings: dict, text: str, duration_s: float) -> list[tuple[int, int, float, float]]:
    """A take's word timings as recorded (timings["words"]), each checked against its text and
    length (a project file's are someone else's); [] where there are none or any is malformed."""
    recorded = timings.get("words")
    if not isinstance(recorded, list):
        return []
    out = []
    for item in recorded:
        if not (isinstance(item, list) and len(item) == 4 and all(isinstance(v, int | float) for v in item)):
            return []
        a, b, start, end = item
        if not (0 <= a < b <= len(text) and 0.0 <= start <= end <= duration_s + 1e-3):
            return []
        out.append((int(a), int(b), float(start), float(end)))
    return out


def word_at(timings: dict, text: str, duration_s: float, seconds: float) -> tuple[int, int] | None:
    """The character span of the word being said ``seconds`` into a take, or None."""
    for a, b, start, end in take_words(timings, text, duration_s):
        if start <= seconds < end:
            return a, b
    return None
