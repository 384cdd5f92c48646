"""Chatterbox in the engine: speech in a voice given by its conditionals (or the model's stock
voice), text to speech tokens (T3) to audio (S3Gen's flow and vocoder).

    with ChatterboxModel.open("chatterbox-turbo.gguf", device="cpu", threads=2) as cb:
        audio = cb.synthesize("Hello there.", seed=1)  # 24 kHz, the stock voice
        tokens = cb.generate(cb.text_chunks("Hello there.")[0], voice, seed=1)
        audio = cb.decode(tokens, voice)

Qt-free; the native call releases the GIL. One ChatterboxModel must be used by one thread at a time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from app.core.atomic import atomic_path
from app.engine import chatterbox_text as mtl
from app.engine.binding import native_engine
from app.engine.bpe import ByteLevelBPE, WhitespaceBPE
from app.engine.errors import InvalidArgumentError, ModelFileError, NothingToSpeakError

if TYPE_CHECKING:
    from app.engine.engine import EngineDebug

MAX_SPEECH_TOKENS = 4096
# A voice's recording, as ChatterboxTurboTTS.prepare_conditionals takes it: more than 5 s, its
# loudness brought to -27 LUFS; S3Gen's prompt from its first 10 s, the token model's from its
# first 15 s (at most 375 tokens).
MIN_PROMPT_S = 5.0
MAX_RECORDING_S = 60
REVOICE_S, MAX_REVOICE_S = 30, 600  # re-voiced a piece at a time; at most 10 minutes a call
TARGET_LUFS = -27.0
SILENT_LUFS = -70.0
GEN_PROMPT_S = 10
T3_PROMPT_S = 15
T3_PROMPT_TOKENS = 375
# ChatterboxMultilingualTTS.prepare_conditionals: the token model's prompt from the first 6 s (at
# most 150 tokens), the loudness left as recorded.
MTL_T3_PROMPT_S = 6
MTL_T3_PROMPT_TOKENS = 150
S3GEN_RATE = 24000
S3_RATE = 16000
# The guard against a run that never draws its stop token: at most this many speech tokens a
# text token and a few more (about three times a normal speaking rate), and never more than the
# reference's 1000 (40 s).
TOKENS_PER_TEXT_TOKEN = 16
TOKENS_EXTRA = 50
MAX_RUN_TOKENS = 1000
# The longest chunk of text spoken in one run of the token model: the reference drifts on
# runs past about 30 s, and a sentence of 300 characters takes about 20 s.
MAX_CHUNK_CHARS = 300

# Chatterbox-Turbo's punc_norm (tts_turbo.py): what its text was trained with; Multilingual's
# replacements but for ellipses, spaced dashes and semicolons.
_PUNCTUATION = [r for r in mtl.PUNCTUATION if r[0] not in ("...", " - ", ";")]
_ENDERS = (".", "!", "?", "-", ",")


def _integrated_loudness(audio: np.ndarray, rate: int) -> float:
    """ITU-R BS.1770-4 integrated loudness (pyloudnorm), -inf where nothing passes its gates."""
    import warnings

    import pyloudnorm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its note on clipping: the gain is applied regardless
        return float(pyloudnorm.Meter(rate).integrated_loudness(audio.astype(np.float64)))


def normalize_punctuation(text: str) -> str:
    """Chatterbox-Turbo's punc_norm (tts_turbo.py)."""
    return mtl.normalize_punctuation(text, _PUNCTUATION, _ENDERS)


def split_text(text: str, max_chars: int = MAX_CHUNK_CHARS) -> list[str]:
    """Sentences of ``text``, each at most ``max_chars`` characters: a longer sentence is cut
    after its last clause mark (, ; :) before the limit that keeps a quarter of it, else after
    its last space, else at the limit. Blank pieces are dropped."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+|(?<=[。！？])|\n\s*\n", text):
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


def _sampling(max_tokens, temperature, top_k, top_p, repetition_penalty, min_p, cfg_weight, exaggeration, seed) -> dict:
    """The token model's run and sampling as the native call takes them (-1: the variant's
    default), each checked."""
    if not 1 <= max_tokens <= MAX_SPEECH_TOKENS:
        raise InvalidArgumentError(f"max_tokens must be from 1 to {MAX_SPEECH_TOKENS}, not {max_tokens}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise InvalidArgumentError(f"the seed must be a whole number from 0 to 2**64 - 1, not {seed!r}")
    floats = {
        "temperature": (temperature, 0.0, 10.0),
        "top_p": (top_p, 0.0, 1.0),
        "repetition_penalty": (repetition_penalty, 1e-3, 100.0),
        "min_p": (min_p, 0.0, 1.0),
        "cfg_weight": (cfg_weight, 0.0, 100.0),
        "exaggeration": (exaggeration, 0.0, 100.0),
    }
    for name, (value, low, high) in floats.items():
        if value is not None and not low <= value <= high:  # NaN fails too
            raise InvalidArgumentError(f"{name} must be from {low} to {high}, not {value}")
    if top_k is not None and top_k < 0:
        raise InvalidArgumentError(f"top_k must be 0 (no limit) or more, not {top_k}")
    args = {name: -1.0 if value is None else float(value) for name, (value, _, _) in floats.items()}
    return args | {"max_tokens": max_tokens, "top_k": -1 if top_k is None else int(top_k), "seed": seed}


def _noise_scale(value: float | None) -> float:
    """The vocoder's noise scale as the native calls take it (-1: the reference's), checked."""
    if value is not None and not 0.0 <= value <= 10.0:
        raise InvalidArgumentError(f"noise_scale must be from 0 to 10, not {value}")
    return -1.0 if value is None else float(value)


def _check_rate(sample_rate) -> None:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or not 8000 <= sample_rate <= 192000:
        raise InvalidArgumentError(f"the sample rate must be from 8000 to 192000 Hz, not {sample_rate!r}")


def _speaking_voice(voice: Conditionals | None) -> tuple:
    """A voice's conditionals as the native speak calls take them (all None: the stock voice),
    S3Gen's part checked present."""
    if voice is None:
        return (None,) * 5
    if not voice.speaks:
        raise InvalidArgumentError("the voice's conditionals lack S3Gen's part (prompt mel and x-vector)")
    prompt_mel = np.ascontiguousarray(voice.prompt_mel.T)
    return voice.speaker_embedding, voice.prompt_tokens, voice.gen_prompt_tokens, prompt_mel, voice.xvector


@dataclass(frozen=True)
class Conditionals:
    """A voice as Chatterbox takes it, computed from a recording of the speaker. The token
    model's part: the voice encoder's speaker embedding (L2-normalized) and the recording's
    speech tokens (the S3 tokenizer's codes). S3Gen's part (None where only tokens are made):
    the recording's speech tokens for S3Gen, its log-mel at 24 kHz [80, frames] (two frames a
    token) and its x-vector (CAMPPlus, 192 values)."""

    speaker_embedding: np.ndarray
    prompt_tokens: np.ndarray
    gen_prompt_tokens: np.ndarray | None = None
    prompt_mel: np.ndarray | None = None
    xvector: np.ndarray | None = None

    def __post_init__(self):
        spk = np.ascontiguousarray(self.speaker_embedding, dtype=np.float32).reshape(-1)
        tokens = np.ascontiguousarray(self.prompt_tokens, dtype=np.int32).reshape(-1)
        if not np.all(np.isfinite(spk)):
            raise InvalidArgumentError("the speaker embedding holds a NaN or infinite value")
        object.__setattr__(self, "speaker_embedding", spk)
        object.__setattr__(self, "prompt_tokens", tokens)
        gen = (self.gen_prompt_tokens, self.prompt_mel, self.xvector)
        if any(v is None for v in gen):
            if any(v is not None for v in gen):
                raise InvalidArgumentError("S3Gen's conditionals need its prompt tokens, prompt mel and x-vector")
            return
        mel = np.asarray(self.prompt_mel, dtype=np.float32)
        if mel.ndim != 2 or mel.shape[0] != 80:
            raise InvalidArgumentError(f"a prompt mel of 80 bands a frame, [80, frames]; not {mel.shape}")
        xvector = np.ascontiguousarray(self.xvector, dtype=np.float32).reshape(-1)
        if not (np.all(np.isfinite(mel)) and np.all(np.isfinite(xvector))):
            raise InvalidArgumentError("S3Gen's conditionals hold a NaN or infinite value")
        object.__setattr__(self, "gen_prompt_tokens", np.ascontiguousarray(self.gen_prompt_tokens, np.int32).ravel())
        object.__setattr__(self, "prompt_mel", np.ascontiguousarray(mel))
        object.__setattr__(self, "xvector", xvector)

    @property
    def speaks(self) -> bool:
        """Whether the conditionals hold S3Gen's part, which audio needs."""
        return self.xvector is not None

    def save(self, path: Path) -> None:
        """Write to ``path`` (.npz), atomically."""
        parts = {"speaker_embedding": self.speaker_embedding, "prompt_tokens": self.prompt_tokens}
        if self.speaks:
            parts |= {"gen_prompt_tokens": self.gen_prompt_tokens, "prompt_mel": self.prompt_mel}
            parts["xvector"] = self.xvector
        with atomic_path(Path(path)) as tmp, open(tmp, "wb") as f:
            np.savez(f, **parts)

    @classmethod
    def load(cls, path: Path) -> Conditionals:
        import zipfile
        import zlib

        try:
            with open(Path(path), "rb") as fh:
                z = np.load(fh, allow_pickle=False)
                if not isinstance(z, np.lib.npyio.NpzFile):
                    raise ValueError("one array, not an .npz of a voice's parts")
                with z:
                    gen = [z[k] if k in z.files else None for k in ("gen_prompt_tokens", "prompt_mel", "xvector")]
                    return cls(z["speaker_embedding"], z["prompt_tokens"], *gen)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile, zlib.error, EOFError) as e:
            raise ModelFileError(f"'{path}' holds no Chatterbox conditionals ({e})") from None


class ChatterboxModel:
    """A Chatterbox model opened on a device: its voice encoder, its token model (T3) and S3Gen
    (flow and vocoder)."""

    def __init__(self, model, context):
        self._model = model
        self._context = context

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        device: str = "auto",
        threads: int = 0,
        prewarm: bool | None = None,
        debug: EngineDebug | None = None,
    ):
        native = native_engine()
        model = native.Model(str(path), None)
        try:
            if model.arch != "chatterbox":
                raise ModelFileError(f"{Path(path).name} holds a {model.arch} model, not Chatterbox")
            context = native.Context(
                model,
                device,
                threads,
                None,
                None,
                -1 if prewarm is None else int(prewarm),
                1,
                None if debug is None else debug.native(),
            )
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
    def device(self) -> str:
        return self._context.device

    @property
    def fallback_ops(self) -> dict[str, list[str]]:
        """Per stage, the ops that ran on the CPU instead of the chosen device ("OP(type)"),
        from the prewarm on open and every call since."""
        return {stage: list(ops) for stage, ops in self._context.fallback_ops.items()}

    @property
    def prewarm_ms(self) -> float:
        return self._context.prewarm_ms

    @property
    def speaker_embedding_size(self) -> int:
        return self._model.embedding_size

    @property
    def variant(self) -> str:
        """ "turbo" (English) or "multilingual"."""
        return self._model.meta("chatterbox.variant") or ""

    @property
    def languages(self) -> list[str]:
        """The language codes the model speaks."""
        return sorted(mtl.LANGUAGES) if self.variant == "multilingual" else ["en"]

    @cached_property
    def tokenizer(self) -> ByteLevelBPE | WhitespaceBPE:
        spec = self._model.meta("chatterbox.tokenizer")
        if not spec:
            raise ModelFileError("the model carries no text tokenizer")
        try:
            spec = json.loads(spec)
            if (spec.get("pre_tokenizer") or {}).get("type") == "Whitespace":
                return WhitespaceBPE.from_tokenizer_json(spec)
            return ByteLevelBPE.from_tokenizer_json(spec)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelFileError(f"the model's text tokenizer cannot be read ({e})") from None

    @cached_property
    def _cangjie(self) -> mtl.Cangjie | None:
        table = self._model.meta("chatterbox.cangjie")
        try:
            return mtl.Cangjie.from_json(table) if table else None
        except (ValueError, TypeError) as e:
            raise ModelFileError(f"the model's Cangjie table cannot be read ({e})") from None

    def _language(self, language: str | None) -> str | None:
        if self.variant == "multilingual":
            return mtl.check_language(language)
        if language not in (None, "en"):
            raise InvalidArgumentError(f"Chatterbox-Turbo speaks English (en), not {language!r}")
        return None

    def encode(self, text: str, language: str | None = None) -> np.ndarray:
        """The text tokens of ``text`` as one run, normalized and tokenized as the reference does
        (``language``: Multilingual's language code, one of ``languages``, or None for text without
        a language tag; Turbo speaks English)."""
        language = self._language(language)
        if self.variant != "multilingual":
            ids = self.tokenizer.encode(normalize_punctuation(text))
        else:
            ids = self.tokenizer.encode(mtl.prepare(mtl.normalize_punctuation(text), language, self._cangjie))
        return np.asarray(ids, np.int32)

    def text_chunks(self, text: str, language: str | None = None) -> list[np.ndarray]:
        """The text tokens of each chunk of ``text`` (its sentences, long ones cut), each as
        ``encode`` makes them: what ``generate`` takes, one run a chunk."""
        self._language(language)
        if not text.strip():
            raise NothingToSpeakError("the text is empty")
        chunks = [self.encode(chunk, language) for chunk in split_text(text)]
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

    def speech_tokens(self, audio: np.ndarray, *, max_tokens: int = 1500) -> np.ndarray:
        """S3Gen's speech tokens (int32, 0 to 6560, 25 a second) of mono ``audio`` at 16 kHz (at
        most 60 s), at most ``max_tokens`` of them: a voice's prompt tokens. Outputs afterwards:
        "s3tok_mel" ([frames, 128]) and "s3tok_fsq" ([tokens, 8])."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            raise InvalidArgumentError("no audio to tokenize")
        if not 1 <= max_tokens <= 1500:
            raise InvalidArgumentError(f"max_tokens must be from 1 to 1500, not {max_tokens}")
        return self._context.speech_tokens(audio, max_tokens=max_tokens)

    def xvector(self, audio: np.ndarray) -> np.ndarray:
        """S3Gen's x-vector (its CAMPPlus speaker encoder, 192 values) of mono ``audio`` at 16 kHz
        (at most 60 s). Output afterwards: "xvec_fbank" ([frames, 80])."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            raise InvalidArgumentError("no audio for the x-vector")
        return self._context.xvector(audio)

    def prompt_mel(self, audio: np.ndarray) -> np.ndarray:
        """S3Gen's log-mel [80, frames] (50 a second) of mono ``audio`` at 24 kHz (at most 60 s):
        a voice's prompt mel."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            raise InvalidArgumentError("no audio for the prompt mel")
        return np.ascontiguousarray(self._context.prompt_mel(audio).T)

    def conditionals(
        self,
        audio: np.ndarray,
        sample_rate: int,
        *,
        normalize_loudness: bool | None = None,
        more: list[tuple[np.ndarray, int]] = (),
    ) -> Conditionals:
        """A voice's conditionals from a recording of the speaker, as the reference's
        prepare_conditionals makes them: the audio at 24 kHz, its loudness brought to -27 LUFS
        (Turbo's; ``normalize_loudness`` None: the variant's way); S3Gen's part from its first
        10 s (prompt mel, and at 16 kHz its speech tokens and x-vector); the token model's prompt
        tokens from its first 15 s at 16 kHz (at most 375; Multilingual: 6 s, 150); the voice
        encoder's speaker embedding of all of it. The recording must hold more than 5 s and not
        be silent; at most 60 s are taken. ``more``: other recordings of the speaker, (audio,
        rate) each, held to the same: the speaker embedding is then the mean of every
        recording's (as the reference's voice encoder embeds a speaker from several), the
        prompts this recording's alone."""
        multilingual = self.variant == "multilingual"
        if normalize_loudness is None:
            normalize_loudness = not multilingual
        from app.core.export import resample

        wav24 = self._prepared(audio, sample_rate, normalize_loudness)
        wav16 = resample(wav24, S3GEN_RATE, S3_RATE)
        ref24 = wav24[: GEN_PROMPT_S * S3GEN_RATE]
        ref16 = resample(ref24, S3GEN_RATE, S3_RATE)
        mel = self.prompt_mel(ref24)
        gen_tokens = self.speech_tokens(ref16)
        gen_tokens = gen_tokens[: mel.shape[1] // 2]  # two mel frames a token (the reference trims so)
        prompt_s, prompt_tokens = (
            (MTL_T3_PROMPT_S, MTL_T3_PROMPT_TOKENS) if multilingual else (T3_PROMPT_S, T3_PROMPT_TOKENS)
        )
        prompt = self.speech_tokens(wav16[: prompt_s * S3_RATE], max_tokens=prompt_tokens)
        embeds = [self.speaker_embedding(wav16)]
        for other, rate in more:
            other24 = self._prepared(other, rate, normalize_loudness)
            embeds.append(self.speaker_embedding(resample(other24, S3GEN_RATE, S3_RATE)))
        speaker = embeds[0]
        if len(embeds) > 1:
            speaker = np.mean(embeds, axis=0)
            speaker /= max(float(np.linalg.norm(speaker)), 1e-12)
        return Conditionals(speaker, prompt, gen_tokens, mel, self.xvector(ref16))

    def _prepared(self, audio: np.ndarray, sample_rate: int, normalize_loudness: bool) -> np.ndarray:
        """A recording for conditioning: checked, its first MAX_RECORDING_S at 24 kHz, its
        loudness brought to TARGET_LUFS where ``normalize_loudness``."""
        from app.core.export import resample

        _check_rate(sample_rate)
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not np.all(np.isfinite(audio)):
            raise InvalidArgumentError("the recording holds a NaN or infinite sample")
        seconds = audio.size / sample_rate
        if seconds <= MIN_PROMPT_S:
            raise InvalidArgumentError(
                f"the recording is {seconds:.1f} s; a voice needs more than {MIN_PROMPT_S:g} s of speech"
            )
        wav24 = resample(audio[: MAX_RECORDING_S * sample_rate], sample_rate, S3GEN_RATE)
        loudness = _integrated_loudness(wav24, S3GEN_RATE)
        if not np.isfinite(loudness) or loudness < SILENT_LUFS:
            raise InvalidArgumentError(
                f"the recording is silent (its loudness {loudness:.0f} LUFS is below {SILENT_LUFS:g})"
            )
        if normalize_loudness:
            wav24 = (wav24 * 10.0 ** ((TARGET_LUFS - loudness) / 20.0)).astype(np.float32)
        return wav24

    def revoice(
        self,
        audio: np.ndarray,
        sample_rate: int,
        voice: Conditionals | None = None,
        *,
        seed: int = 0,
        piece_s: int = REVOICE_S,
        on_chunk: Callable[[int, np.ndarray], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """The speech of ``audio`` in ``voice`` (None: the stock voice), as the reference's
        ChatterboxVC makes it: its S3 speech tokens (at 16 kHz) through S3Gen in the voice's
        conditionals, the token model not involved. Taken ``piece_s`` seconds at a time (at most
        MAX_REVOICE_S in all), piece k from ``seed`` + k, each piece's audio to
        ``on_chunk(k, audio)`` as it is made; 24 kHz."""
        if isinstance(piece_s, bool) or not isinstance(piece_s, int) or not 1 <= piece_s <= REVOICE_S:
            raise InvalidArgumentError(f"piece_s must be from 1 to {REVOICE_S} s, not {piece_s!r}")
        from app.core.export import resample

        _check_rate(sample_rate)
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0 or not np.all(np.isfinite(audio)):
            raise InvalidArgumentError("no audio to re-voice (empty, or a NaN or infinite sample)")
        if audio.size > MAX_REVOICE_S * sample_rate:
            raise InvalidArgumentError(f"{audio.size / sample_rate:.0f} s to re-voice: at most {MAX_REVOICE_S} s")
        wav16 = resample(audio, sample_rate, S3_RATE)
        pieces = []
        for k, start in enumerate(range(0, wav16.size, piece_s * S3_RATE)):
            piece = wav16[start : start + piece_s * S3_RATE]
            if piece.size < S3_RATE // 10:  # under 0.1 s: no token's worth
                break
            tokens = self.speech_tokens(piece)
            if tokens.size == 0:
                continue
            pieces.append(self.decode(tokens, voice, seed=seed + k, cancelled=cancelled))
            if on_chunk is not None:
                on_chunk(len(pieces) - 1, pieces[-1])
        if not pieces:
            raise NothingToSpeakError("the audio holds no speech tokens to re-voice")
        return np.concatenate(pieces)

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
        native_noise = _noise_scale(noise_scale)
        return self._context.vocode(
            np.ascontiguousarray(mel.T),
            f0=None if f0 is None else np.ascontiguousarray(f0, dtype=np.float32).reshape(-1),
            noise_scale=native_noise,
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
        min_p: float | None = None,
        cfg_weight: float | None = None,
        exaggeration: float | None = None,
        seed: int = 0,
        speech_tokens: np.ndarray | None = None,
        on_stage: Callable[[str, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """Speech tokens (int32) for ``text_tokens`` (the text tokenizer's ids) in ``voice`` (None:
        the model's stock voice),
        drawn with the reference's sampling (None: the variant's default; ``temperature`` 0
        takes the most likely token) from ``seed``; the stop token ends them and is left out.
        Multilingual: ``cfg_weight`` the classifier-free guidance (0: none), ``exaggeration``
        the emotion conditioning; its text goes between the start and stop text tokens, and its
        alignment guard ends a run that goes past the text or repeats.
        ``speech_tokens``: taken in place of the draws (teacher forcing); the logits at each
        speech position are then ``output("t3_logits")`` (with guidance, the unconditional
        sequence's ``output("t3_logits_uncond")``)."""
        args = _sampling(
            max_tokens, temperature, top_k, top_p, repetition_penalty, min_p, cfg_weight, exaggeration, seed
        )
        forced = None if speech_tokens is None else np.ascontiguousarray(speech_tokens, dtype=np.int32).reshape(-1)
        if forced is not None:
            args["max_tokens"] = max(args["max_tokens"], len(forced))
        return self._context.generate_tokens(
            np.ascontiguousarray(text_tokens, dtype=np.int32).reshape(-1),
            None if voice is None else voice.speaker_embedding,
            None if voice is None else voice.prompt_tokens,
            **args,
            speech_tokens=forced,
            on_stage=on_stage,
            abort=cancelled,
        )

    def decode(
        self,
        speech_tokens: np.ndarray,
        voice: Conditionals | None = None,
        *,
        noise: np.ndarray | None = None,
        noise_scale: float | None = None,
        seed: int = 0,
        on_stage: Callable[[str, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """24 kHz audio of S3Gen's ``speech_tokens`` (0 to 6560, 25 a second) in ``voice`` (None:
        the model's stock voice): its flow's mel from noise drawn from ``seed`` (or ``noise``
        [80, frames] over the prompt's frames and the new ones), then the vocoder (its noise
        scaled by ``noise_scale`` as in ``vocode``), the first 40 ms faded in. Outputs
        afterwards: "flow_mu", "flow_cond" (the flow's condition: the prompt's mel, zeros after),
        "flow_v.<step>" and "mel" ([frames, 80])."""
        tokens = np.ascontiguousarray(speech_tokens, dtype=np.int32).reshape(-1)
        if tokens.size == 0:
            raise NothingToSpeakError("no speech tokens to decode")
        if voice is not None and not voice.speaks:
            raise InvalidArgumentError("the voice's conditionals lack S3Gen's part (prompt mel and x-vector)")
        native_noise = _noise_scale(noise_scale)
        if noise is not None:
            noise = np.asarray(noise, dtype=np.float32)
            if noise.ndim != 2 or noise.shape[0] != 80:
                raise InvalidArgumentError(f"flow noise of 80 bands a frame, [80, frames]; not {noise.shape}")
            noise = np.ascontiguousarray(noise.T)
        return self._context.decode_tokens(
            tokens,
            prompt_tokens=None if voice is None else voice.gen_prompt_tokens,
            prompt_mel=None if voice is None else np.ascontiguousarray(voice.prompt_mel.T),
            xvector=None if voice is None else voice.xvector,
            noise=noise,
            noise_scale=native_noise,
            seed=seed,
            on_stage=on_stage,
            abort=cancelled,
        )

    def speak(
        self,
        text_tokens: np.ndarray,
        voice: Conditionals | None = None,
        *,
        max_tokens: int = 1000,
        stream_tokens: int = 0,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        min_p: float | None = None,
        cfg_weight: float | None = None,
        exaggeration: float | None = None,
        noise_scale: float | None = None,
        seed: int = 0,
        on_piece: Callable[[int, np.ndarray], None] | None = None,
        on_stage: Callable[[str, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> tuple[np.ndarray, int]:
        """24 kHz audio of one run of ``text_tokens`` in ``voice`` (None: the stock voice): speech
        tokens drawn as ``generate`` draws them, those S3Gen lacks dropped and three silent ones
        appended, then S3Gen as ``decode`` runs it (its vocoder's noise scaled by
        ``noise_scale``), in one native call. With ``stream_tokens`` > 0, S3Gen runs while the
        tokens are drawn: on the first ``stream_tokens``, then each time twice as many more have
        come as the time before (at most eight times ``stream_tokens``), each run's flow
        conditioned on the mel already made, and ``on_piece(k, audio)`` gets each piece of audio
        as soon as it is made. 0: S3Gen once, on every token (the audio of ``generate`` then
        ``decode``). Returns the audio and the number of speech tokens drawn."""
        native_noise = _noise_scale(noise_scale)
        if isinstance(stream_tokens, bool) or not isinstance(stream_tokens, int) or stream_tokens < 0:
            raise InvalidArgumentError(f"stream_tokens must be 0 (no streaming) or more, not {stream_tokens!r}")
        args = _sampling(
            max_tokens, temperature, top_k, top_p, repetition_penalty, min_p, cfg_weight, exaggeration, seed
        )
        return self._context.speak_tokens(
            np.ascontiguousarray(text_tokens, dtype=np.int32).reshape(-1),
            *_speaking_voice(voice),
            stream_tokens=stream_tokens,
            noise_scale=native_noise,
            on_stage=on_stage,
            on_chunk=on_piece,
            abort=cancelled,
            **args,
        )

    def speak_many(
        self,
        texts: list[np.ndarray],
        voice: Conditionals | None = None,
        *,
        max_tokens: int | list[int] = 1000,
        seeds: list[int] | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        min_p: float | None = None,
        cfg_weight: float | None = None,
        exaggeration: float | None = None,
        noise_scale: float | None = None,
        on_audio: Callable[[int, np.ndarray], None] | None = None,
        on_stage: Callable[[str, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[tuple[np.ndarray, int]]:
        """``speak`` (unstreamed) for several runs at once: the token model's steps for all of
        them in one graph a step, so that its matmuls read the weights once for all, then S3Gen
        on each in turn. Run i: ``texts[i]``, at most ``max_tokens`` (or ``max_tokens[i]``)
        tokens, drawn from ``seeds[i]`` (default i); its tokens are those ``speak`` draws for it
        alone with that seed. ``on_audio(i, audio)`` gets each run's audio once made. Returns
        each run's audio and speech tokens drawn."""
        if not texts:
            raise InvalidArgumentError("no texts to speak")
        native_noise = _noise_scale(noise_scale)
        limits = [max_tokens] * len(texts) if isinstance(max_tokens, int) else list(max_tokens)
        seeds = list(range(len(texts))) if seeds is None else list(seeds)
        if len(limits) != len(texts) or len(seeds) != len(texts):
            raise InvalidArgumentError(f"{len(texts)} texts take as many limits and seeds")
        args = [_sampling(m, temperature, top_k, top_p, repetition_penalty, min_p, cfg_weight, exaggeration, seed)
                for m, seed in zip(limits, seeds, strict=True)]  # fmt: skip
        common = {k: v for k, v in args[0].items() if k not in ("max_tokens", "seed")}
        return self._context.speak_many(
            [np.ascontiguousarray(t, dtype=np.int32).reshape(-1) for t in texts],
            *_speaking_voice(voice),
            max_tokens=[a["max_tokens"] for a in args],
            seeds=[a["seed"] for a in args],
            noise_scale=native_noise,
            on_stage=on_stage,
            on_chunk=on_audio,
            abort=cancelled,
            **common,
        )

    def synthesize(
        self,
        text: str,
        voice: Conditionals | None = None,
        *,
        language: str | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        min_p: float | None = None,
        cfg_weight: float | None = None,
        exaggeration: float | None = None,
        noise_scale: float | None = None,
        seed: int = 0,
        stream_tokens: int = 0,
        batch: int = 1,
        on_chunk: Callable[[int, np.ndarray], None] | None = None,
        on_stage: Callable[[str, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> tuple[np.ndarray, dict]:
        """24 kHz audio of ``text`` in ``voice`` (None: the stock voice), as the reference's
        ChatterboxTurboTTS.generate (Multilingual: ChatterboxMultilingualTTS.generate, in
        ``language``, with its guidance and exaggeration) makes it, one chunk (a sentence; long
        ones cut) at a time: its text normalized and tokenized, then ``speak`` (chunk i from seed
        + i; a run without its stop token ends at about three times a normal speaking length;
        ``stream_tokens`` > 0: S3Gen streamed through the run; ``batch`` > 1: that many chunks'
        runs at once, ``speak_many``, the same audio). ``on_chunk(k, audio)`` gets each
        piece of audio as soon as it is made (a chunk's, or with streaming a part of one),
        numbered through the call. Returns the audio and the timings summed over the chunks
        (``stages_ms``, ``total_ms``, ``first_audio_ms``, ``n_chunks``, ``n_tokens``,
        ``graphs_built``, ``graphs_reused``, ``captures_replayed``)."""
        t0 = time.perf_counter()
        chunks = self.text_chunks(text, language)
        stages: dict[str, float] = {}
        graphs = {"graphs_built": 0, "graphs_reused": 0, "captures_replayed": 0}
        first_audio_ms, n_tokens, pieces = 0.0, 0, []

        def piece(_k: int, audio: np.ndarray) -> None:
            nonlocal first_audio_ms
            if not pieces:
                first_audio_ms = (time.perf_counter() - t0) * 1000.0
            if on_chunk is not None:
                on_chunk(len(pieces), audio)
            pieces.append(audio)

        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgumentError(f"batch must be 1 or more, not {batch!r}")
        if batch > 1 and stream_tokens:
            raise InvalidArgumentError("streaming speaks one chunk at a time: batch 1")
        sampling = {
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "repetition_penalty": repetition_penalty,
            "min_p": min_p,
            "cfg_weight": cfg_weight,
            "exaggeration": exaggeration,
            "noise_scale": noise_scale,
            "cancelled": cancelled,
        }
        for first in range(0, len(chunks), batch):
            group = chunks[first : first + batch]
            limits = [min(MAX_RUN_TOKENS, TOKENS_EXTRA + TOKENS_PER_TEXT_TOKEN * ids.size) for ids in group]
            seeds = [(seed + first + k) % 2**64 for k in range(len(group))]
            sampling["on_stage"] = (
                None if on_stage is None else lambda s, c, ms, first=first: on_stage(s, first + c, ms)
            )
            if len(group) == 1:
                _, drawn = self.speak(group[0], voice, max_tokens=limits[0], stream_tokens=stream_tokens,
                                      seed=seeds[0], on_piece=piece, **sampling)  # fmt: skip
                n_tokens += drawn
            else:
                runs = self.speak_many(group, voice, max_tokens=limits, seeds=seeds, on_audio=piece, **sampling)
                n_tokens += sum(drawn for _, drawn in runs)
            self._add_stages(stages, graphs)
        timings = {
            "stages_ms": stages,
            "total_ms": (time.perf_counter() - t0) * 1000.0,
            "first_audio_ms": first_audio_ms,
            "n_chunks": len(chunks),
            "n_tokens": n_tokens,
            **graphs,
        }
        return np.concatenate(pieces), timings

    def _add_stages(self, stages: dict[str, float], graphs: dict[str, int]) -> None:
        t = self._context.timings()
        for name, ms in t["stages_ms"].items():
            if ms > 0:
                stages[name] = stages.get(name, 0.0) + ms
        for key in graphs:
            graphs[key] += t[key]

    def timings(self) -> dict:
        return self._context.timings()

    def output(self, name: str) -> np.ndarray:
        return self._context.output(name)
