"""A script's sentence spoken as the studio and `render` speak it: its "say as" tags and the
lexicon applied (app.core.lexicon.engine_input), what the voice's front end drops recorded
(``unspoken``) and, where they can be told, where its words are in the take (``words``)."""

from __future__ import annotations

from app.core import lexicon, words
from app.core.script import read_as
from app.engine.engine import Engine, Take


def speak(engine: Engine, text: str, entries: dict[str, str], **params) -> Take:
    """The engine's take of one sentence read with the lexicon ``entries``; ``params`` are
    Engine.synthesize's (on_stage, on_chunk, cancelled, length_scale, seed, ...)."""
    read = lexicon.engine_input(engine, text, entries)
    take = engine.synthesize(**read, **params)
    spoken = read_as(text)[0]
    take.timings["unspoken"] = engine.unspoken(spoken)  # never dropped silently
    if spoken == text and (timed := word_times(engine, text, read, take, entries)) is not None:  # no "say as" tags
        take.timings["words"] = timed
    return take


def word_times(engine: Engine, text: str, read: dict, take: Take, entries: dict[str, str]) -> list | None:
    """Where each word of the sentence is in its take (app.core.words), from its tokens'
    durations (a take of one chunk has them, batched or not); None where they cannot be told
    (several chunks, skipped symbols, a voice without durations, words the front end joined)."""
    if not engine.takes_phonemes or take.durations is None or take.timings.get("skipped_symbols"):
        return None
    lines = lexicon.phoneme_lines(engine, read)
    durations = take.durations
    frames = float(durations.sum())
    if len(lines) != 1 or frames <= 0 or len(take.audio) % round(frames) != 0:
        return None

    def words_of(word: str) -> int:
        return len(" ".join(lexicon.phoneme_lines(engine, lexicon.engine_input(engine, word, entries))).split())

    per_frame = len(take.audio) / frames / take.sample_rate
    return words.word_times(text, lines[0], durations, engine.family, per_frame, words_of)
