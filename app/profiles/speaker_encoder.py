"""Speaker embeddings: the engine's GE2E encoder (resemblyzer's weights) on any audio.

    with SpeakerEncoder.open(threads=2) as enc:
        a = enc.embed(audio, rate)           # 256 values, L2-normalized
        similarity(a, enc.embed(other, rate2))

The mel front end, the partial utterances and the encoder run in the engine and match
resemblyzer's ``VoiceEncoder.embed_utterance`` (tests/test_speaker_encoder.py pins that
against embeddings its own code produced). Before that, audio is prepared as resemblyzer's
``preprocess_wav`` does: resampled to 16 kHz, raised (never lowered) to -30 dBFS RMS, and
silences longer than ~0.2 s shortened. resemblyzer finds silences with webrtcvad (not a
dependency here); this module uses an energy detector with the same 30 ms windows, moving
average and dilation, so on clean speech both keep the same audio.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.engine.errors import InvalidArgumentError
from app.models import manager as models

SAMPLE_RATE = 16000
TARGET_DBFS = -30.0
VAD_WINDOW = 480  # 30 ms at 16 kHz
VAD_AVERAGE = 8  # windows in the moving average
VAD_MAX_SILENCE = 6  # windows of silence kept around speech
INT16_MAX = 2**15 - 1


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def normalize_volume(audio: np.ndarray, target_dbfs: float = TARGET_DBFS) -> np.ndarray:
    """Raise the level to ``target_dbfs`` RMS; audio already louder is left alone."""
    rms = np.sqrt(np.mean((audio.astype(np.float64) * INT16_MAX) ** 2))
    if rms <= 0.0:
        return audio
    change = target_dbfs - 20.0 * np.log10(rms / INT16_MAX)
    return audio if change < 0 else (audio * 10.0 ** (change / 20.0)).astype(np.float32)


def voice_mask(audio: np.ndarray) -> np.ndarray:
    """One flag per 30 ms window: speech (or close enough to it to keep)."""
    n = len(audio) // VAD_WINDOW
    if n == 0:
        return np.zeros(0, dtype=bool)
    power = np.mean(audio[: n * VAD_WINDOW].reshape(n, VAD_WINDOW).astype(np.float64) ** 2, axis=1)
    db = 10.0 * np.log10(power + 1e-12)
    floor, peak = np.percentile(db, 10), np.percentile(db, 95)
    # Speech: 10 dB above the noise floor (or 20 dB below the loud parts, for speech with
    # no pauses), within 45 dB of the loud parts and above -70 dBFS.
    threshold = max(min(floor + 10.0, peak - 20.0), peak - 45.0, -70.0)
    flags = (db > threshold).astype(np.float64)
    width = VAD_AVERAGE
    padded = np.concatenate((np.zeros((width - 1) // 2), flags, np.zeros(width // 2)))
    smooth = np.convolve(padded, np.ones(width) / width, mode="valid")
    mask = np.round(smooth).astype(bool)
    # Dilate: a window is kept when speech lies within VAD_MAX_SILENCE / 2 windows of it.
    k = VAD_MAX_SILENCE + 1
    return np.convolve(mask.astype(np.float64), np.ones(k), mode="same") > 0


def trim_long_silences(audio: np.ndarray) -> np.ndarray:
    mask = voice_mask(audio)
    return audio[: len(mask) * VAD_WINDOW][np.repeat(mask, VAD_WINDOW)]


def preprocess(audio: np.ndarray, rate: int) -> np.ndarray:
    """16 kHz, level raised to -30 dBFS, long silences shortened (resemblyzer's preprocess_wav)."""
    from app.core.export import resample

    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise InvalidArgumentError("speaker embeddings take mono audio")
    if not np.all(np.isfinite(audio)):
        raise InvalidArgumentError("the audio holds NaN or infinite samples")
    audio = resample(audio, int(rate), SAMPLE_RATE) if rate != SAMPLE_RATE else audio
    return trim_long_silences(normalize_volume(audio))


class SpeakerEncoder:
    def __init__(self, model, context):
        self._model = model
        self._context = context
        self.last_timings: dict = {}

    @classmethod
    def open(
        cls,
        *,
        device: str = "cpu",
        threads: int = 0,
        model_path: Path | str | None = None,
        progress: Callable[[float, str], None] | None = None,
    ) -> SpeakerEncoder:
        """Open the encoder (installing it from the resemblyzer package on first use)."""
        from app.engine.binding import native_engine

        _engine = native_engine()

        path = Path(model_path) if model_path else models.install_speaker_encoder(progress=progress or models._quiet)
        model = _engine.Model(str(path))
        try:
            if model.embedding_size <= 0:
                raise InvalidArgumentError(f"{path.name} is a voice, not a speaker encoder")
            context = _engine.Context(model, device, threads)
        except BaseException:
            model.close()
            raise
        return cls(model, context)

    def __enter__(self) -> SpeakerEncoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._context is not None:
            self._context.close()
            self._context = None
        if self._model is not None:
            self._model.close()
            self._model = None

    @property
    def device(self) -> str:
        return self._context.device

    def embed_prepared(self, audio16k: np.ndarray) -> np.ndarray:
        """Embedding of 16 kHz audio taken as it is (resemblyzer's embed_utterance)."""
        audio16k = np.ascontiguousarray(audio16k, dtype=np.float32)
        if audio16k.ndim != 1 or audio16k.size == 0:
            raise InvalidArgumentError("speaker embeddings take non-empty mono audio")
        t0 = time.perf_counter()
        out = np.array(self._context.embed(audio16k))
        self.last_timings = dict(self._context.timings())
        self.last_timings["wall_ms"] = (time.perf_counter() - t0) * 1000.0
        return out

    def embed(self, audio: np.ndarray, rate: int) -> np.ndarray:
        """Embedding of audio at any rate, prepared as resemblyzer prepares it."""
        prepared = preprocess(audio, rate)
        if prepared.size < SAMPLE_RATE // 10:
            raise InvalidArgumentError("the audio holds no speech to take a voice from")
        return self.embed_prepared(prepared)

    def embed_file(self, path: Path | str) -> np.ndarray:
        from app.profiles.speaker_reference import load

        audio, rate = load(path)
        return self.embed(audio, rate)

    def output(self, name: str) -> np.ndarray:
        """Intermediates of the last embedding: "mel" [frames, 40], "partials" [n, 256]."""
        return np.array(self._context.output(name))
