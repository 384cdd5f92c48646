"""Chatterbox in the engine: a voice's conditionals from a recording, and speech tokens for text
tokens in that voice.

    with ChatterboxModel.open("chatterbox-turbo.gguf", device="cpu", threads=2) as cb:
        voice = Conditionals(cb.speaker_embedding(audio_16k), prompt_tokens)
        tokens = cb.generate(text_tokens, voice, seed=1)

Qt-free; the native call releases the GIL. One ChatterboxModel must be used by one thread at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path
from app.engine.binding import native_engine
from app.engine.bpe import ByteLevelBPE
from app.engine.errors import InvalidArgumentError, ModelFileError, NothingToSpeakError

MAX_SPEECH_TOKENS = 4096
# The longest chunk of text spoken in one run of the token model: the reference drifts on
# runs past about 30 s, and a sentence of 300 characters takes about 20 s.
MAX_CHUNK_CHARS = 300

# Chatterbox's punc_norm (tts_turbo.py): what its text was trained with.
_PUNCTUATION = [
    ("…", ", "),
    (":", ","),
    ("—", "-"),
    ("–", "-"),
    (" ,", ","),
    ("“", '"'),
    ("”", '"'),
    ("‘", "'"),
    ("’", "'"),
]
_ENDERS = (".", "!", "?", "-", ",")


def normalize_punctuation(text: str) -> str:
    """The reference's punc_norm: a capital first letter, single spaces, uncommon punctuation
    replaced, a full stop where the text ends without one. (Empty text is refused before.)"""
    if text and text[0].islower():
        text = text[0].upper() + text[1:]
    text = " ".join(text.split())
    for old, new in _PUNCTUATION:
        text = text.replace(old, new)
    text = text.rstrip(" ")
    if not text.endswith(_ENDERS):
        text += "."
    return text


def split_text(text: str, max_chars: int = MAX_CHUNK_CHARS) -> list[str]:
    """Sentences of ``text``, each at most ``max_chars`` characters: a longer sentence is cut
    after its last clause mark (, ; :) before the limit that keeps a quarter of it, else after
    its last space, else at the limit. Blank pieces are dropped."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n\s*\n", text):
        sentence = " ".join(sentence.split())
        while len(sentence) > max_chars:
            head = sentence[:max_chars]
            cut = max(head.rfind(", "), head.rfind("; "), head.rfind(": "))
            cut = cut + 1 if cut >= max_chars // 4 else head.rfind(" ")
            cut = cut if cut > 0 else max_chars
            out.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            out.append(sentence)
    return [s for s in out if s.strip(" .,;:!?-")]


@dataclass(frozen=True)
class Conditionals:
    """A voice as Chatterbox takes it, computed from a recording of the speaker: the voice
    encoder's speaker embedding (L2-normalized) and the recording's speech tokens (the S3
    tokenizer's codes)."""

    speaker_embedding: np.ndarray
    prompt_tokens: np.ndarray

    def __post_init__(self):
        spk = np.ascontiguousarray(self.speaker_embedding, dtype=np.float32).reshape(-1)
        tokens = np.ascontiguousarray(self.prompt_tokens, dtype=np.int32).reshape(-1)
        if not np.all(np.isfinite(spk)):
            raise InvalidArgumentError("the speaker embedding holds a NaN or infinite value")
        object.__setattr__(self, "speaker_embedding", spk)
        object.__setattr__(self, "prompt_tokens", tokens)

    def save(self, path: Path) -> None:
        """Write to ``path`` (.npz), atomically."""
        with atomic_path(Path(path)) as tmp, open(tmp, "wb") as f:
            np.savez(f, speaker_embedding=self.speaker_embedding, prompt_tokens=self.prompt_tokens)

    @classmethod
    def load(cls, path: Path) -> Conditionals:
        try:
            with np.load(Path(path), allow_pickle=False) as z:
                return cls(z["speaker_embedding"], z["prompt_tokens"])
        except (OSError, KeyError, ValueError) as e:
            raise ModelFileError(f"'{path}' holds no Chatterbox conditionals ({e})") from None


class ChatterboxModel:
    """A Chatterbox model opened on a device: its voice encoder and its token model (T3)."""

    def __init__(self, model, context):
        self._model = model
        self._context = context

    @classmethod
    def open(cls, path: Path | str, *, device: str = "auto", threads: int = 0, prewarm: bool | None = None):
        native = native_engine()
        model = native.Model(str(path), None)
        try:
            if model.arch != "chatterbox":
                raise ModelFileError(f"{Path(path).name} holds a {model.arch} model, not Chatterbox")
            context = native.Context(model, device, threads, None, None, -1 if prewarm is None else int(prewarm), 1)
        except BaseException:
            model.close()
            raise
        return cls(model, context)

    def __enter__(self) -> ChatterboxModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._context.close()
        self._model.close()

    @property
    def speaker_embedding_size(self) -> int:
        return self._model.embedding_size

    @cached_property
    def tokenizer(self) -> ByteLevelBPE:
        spec = self._model.meta("chatterbox.tokenizer")
        if not spec:
            raise ModelFileError("the model carries no text tokenizer")
        try:
            return ByteLevelBPE.from_tokenizer_json(json.loads(spec))
        except (ValueError, KeyError, TypeError) as e:
            raise ModelFileError(f"the model's text tokenizer cannot be read ({e})") from None

    def text_chunks(self, text: str) -> list[np.ndarray]:
        """The text tokens of each chunk of ``text`` (its sentences, long ones cut), each
        normalized as the reference does: what ``generate`` takes, one run a chunk."""
        if not text.strip():
            raise NothingToSpeakError("the text is empty")
        chunks = [np.asarray(self.tokenizer.encode(normalize_punctuation(c)), np.int32) for c in split_text(text)]
        if not chunks:
            raise NothingToSpeakError("the text holds nothing to speak")
        return chunks

    def speaker_embedding(self, audio: np.ndarray) -> np.ndarray:
        """The voice encoder's L2-normalized speaker embedding of mono ``audio`` at 16 kHz
        (silence at either end trimmed first, as the reference does)."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            raise InvalidArgumentError("no audio to embed")
        return self._context.embed(audio)

    def vocode(
        self,
        mel: np.ndarray,
        *,
        f0: np.ndarray | None = None,
        noise_scale: float | None = None,
        seed: int = 0,
        cancelled: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """24 kHz audio of a log-mel ``mel`` [80, frames] (S3Gen's, 50 frames a second) through
        the vocoder (HiFT). ``f0`` (Hz a frame) replaces its F0 predictor's; ``noise_scale``
        scales its excitation's noise (None: the reference's; 0: none, and no random phases)."""
        mel = np.asarray(mel, dtype=np.float32)
        if mel.ndim != 2 or mel.shape[0] != 80:
            raise InvalidArgumentError(f"a mel of 80 bands a frame, [80, frames]; not {mel.shape}")
        if noise_scale is not None and not 0.0 <= noise_scale <= 10.0:
            raise InvalidArgumentError(f"noise_scale must be from 0 to 10, not {noise_scale}")
        return self._context.vocode(
            np.ascontiguousarray(mel.T),
            f0=None if f0 is None else np.ascontiguousarray(f0, dtype=np.float32).reshape(-1),
            noise_scale=-1.0 if noise_scale is None else float(noise_scale),
            seed=seed,
            abort=cancelled,
        )

    def meta(self, key: str) -> str | None:
        return self._model.meta(key)

    def generate(
        self,
        text_tokens: np.ndarray,
        voice: Conditionals | None = None,
        *,
        max_tokens: int = 1000,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int = 0,
        speech_tokens: np.ndarray | None = None,
        on_stage: Callable[[str, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """Speech tokens (int32) for ``text_tokens`` (the text tokenizer's ids) in ``voice`` (None:
        the model's stock voice),
        drawn with the reference's sampling (None: the variant's default; ``temperature`` 0
        takes the most likely token) from ``seed``; the stop token ends them and is left out.
        ``speech_tokens``: taken in place of the draws (teacher forcing); the logits at each
        speech position are then ``output("t3_logits")``."""
        if not 1 <= max_tokens <= MAX_SPEECH_TOKENS:
            raise InvalidArgumentError(f"max_tokens must be from 1 to {MAX_SPEECH_TOKENS}, not {max_tokens}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise InvalidArgumentError(f"the seed must be a whole number from 0 to 2**64 - 1, not {seed!r}")
        checks = {"temperature": (temperature, 0.0, 10.0), "top_p": (top_p, 0.0, 1.0)}
        checks["repetition_penalty"] = (repetition_penalty, 1e-3, 100.0)
        for name, (value, low, high) in checks.items():
            if value is not None and not low <= value <= high:  # NaN fails too
                raise InvalidArgumentError(f"{name} must be from {low} to {high}, not {value}")
        if top_k is not None and top_k < 0:
            raise InvalidArgumentError(f"top_k must be 0 (no limit) or more, not {top_k}")
        forced = None if speech_tokens is None else np.ascontiguousarray(speech_tokens, dtype=np.int32).reshape(-1)
        return self._context.generate_tokens(
            np.ascontiguousarray(text_tokens, dtype=np.int32).reshape(-1),
            None if voice is None else voice.speaker_embedding,
            None if voice is None else voice.prompt_tokens,
            max_tokens=max(max_tokens, 0 if forced is None else len(forced)),
            temperature=-1.0 if temperature is None else float(temperature),
            top_k=-1 if top_k is None else int(top_k),
            top_p=-1.0 if top_p is None else float(top_p),
            repetition_penalty=-1.0 if repetition_penalty is None else float(repetition_penalty),
            seed=seed,
            speech_tokens=forced,
            on_stage=on_stage,
            abort=cancelled,
        )

    def timings(self) -> dict:
        return self._context.timings()

    def output(self, name: str) -> np.ndarray:
        return self._context.output(name)
