"""Rendering takes to one file (WAV, FLAC, MP3, Opus or an M4B audiobook): gaps, sample rate,
sample format, loudness presets, chapters.

Loudness is measured with pyloudnorm (ITU-R BS.1770-4 integrated loudness); true
peak is the peak of the signal oversampled four times (BS.1770 annex 2). A preset
gains the audio to its target; where that would push the true peak over the
preset's ceiling, a look-ahead peak limiter holds it down and the gain is refined
until the measured loudness sits on the target.

Presets:
  podcast    -16 LUFS integrated, true peak <= -1 dBTP
  broadcast  -23 LUFS integrated (EBU R 128), true peak <= -1 dBTP
  acx        RMS -20 dBFS (ACX accepts -23..-18), true peak <= -3 dBTP
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from pathlib import Path

import numpy as np

from app.audio.m4b import BookInfo, write_m4b
from app.audio.wav import container_of, encoder_rate, file_subtype, write_audio


@dataclass(frozen=True)
class Preset:
    name: str
    lufs: float | None  # integrated loudness target
    rms_db: float | None  # RMS target (ACX)
    ceiling_dbtp: float


PRESETS = {
    "podcast": Preset("podcast", -16.0, None, -1.0),
    "broadcast": Preset("broadcast", -23.0, None, -1.0),
    "acx": Preset("acx", None, -20.0, -3.0),
}


class ExportError(RuntimeError):
    pass


@dataclass(frozen=True)
class ExportReport:
    path: Path
    sample_rate: int
    duration_s: float
    lufs: float
    rms_db: float
    true_peak_db: float
    gain_db: float
    limited: bool


def _db(x: float) -> float:
    return 20.0 * np.log10(max(x, 1e-12))


def integrated_loudness(audio: np.ndarray, sample_rate: int) -> float:
    import pyloudnorm

    block = 0.4
    if len(audio) < block * sample_rate:  # BS.1770 gating needs one 400 ms block
        audio = np.concatenate([audio, np.zeros(int(block * sample_rate) - len(audio) + 1, dtype=audio.dtype)])
    return float(pyloudnorm.Meter(sample_rate).integrated_loudness(np.asarray(audio, dtype=np.float64)))


def true_peak_db(audio: np.ndarray) -> float:
    from scipy.signal import resample_poly

    if len(audio) == 0:
        return -np.inf
    return _db(float(np.max(np.abs(resample_poly(audio.astype(np.float64), 4, 1)))))


def rms_db(audio: np.ndarray) -> float:
    return _db(float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if len(audio) else 0.0)


def limit(audio: np.ndarray, sample_rate: int, ceiling_db: float, lookahead_ms: float = 5.0) -> np.ndarray:
    """Look-ahead peak limiter: a smooth gain that keeps every sample under the ceiling."""
    from scipy.ndimage import minimum_filter1d, uniform_filter1d

    ceiling = 10.0 ** (ceiling_db / 20.0)
    need = np.minimum(1.0, ceiling / np.maximum(np.abs(audio), 1e-12))
    if need.min() >= 1.0:
        return audio
    half = max(1, int(lookahead_ms * 1e-3 * sample_rate))
    # The minimum over +-half samples, averaged over a window no wider than it, never
    # exceeds the gain a sample needs: the limiter attacks before each peak.
    gain = uniform_filter1d(minimum_filter1d(need, 2 * half + 1, mode="nearest"), half + 1, mode="nearest")
    return (audio * np.minimum(gain, need)).astype(np.float32)


def normalize(audio: np.ndarray, sample_rate: int, preset: Preset) -> tuple[np.ndarray, float, bool]:
    """Audio gained (and limited where needed) to the preset; also the gain in dB and whether it limited."""
    audio = np.asarray(audio, dtype=np.float32)
    if not np.any(audio):
        raise ExportError("the audio is silent; there is no loudness to normalize")

    def measure(x):
        return integrated_loudness(x, sample_rate) if preset.lufs is not None else rms_db(x)

    target = preset.lufs if preset.lufs is not None else preset.rms_db
    # Sample peaks are held 0.3 dB under the ceiling so that inter-sample peaks fit too.
    sample_ceiling = preset.ceiling_dbtp - 0.3
    gain_db, limited, out = 0.0, False, audio
    level = measure(out)
    for _ in range(6):
        gain_db += target - level
        out = audio * np.float32(10.0 ** (gain_db / 20.0))
        if true_peak_db(out) > preset.ceiling_dbtp:
            out, limited = limit(out, sample_rate, sample_ceiling), True
        level = measure(out)
        if abs(level - target) < 0.1:
            break
    return out.astype(np.float32), gain_db, limited


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    if rate_in == rate_out:
        return audio
    from scipy.signal import resample_poly

    g = gcd(rate_in, rate_out)
    return resample_poly(audio.astype(np.float64), rate_out // g, rate_in // g).astype(np.float32)


@dataclass(frozen=True)
class Silences:
    """The silence around clips laid end to end: before the first, between each and the next
    (one fewer than the clips), after the last; in seconds."""

    before: float
    between: tuple[float, ...]
    after: float

    @classmethod
    def even(cls, n_clips: int, gap_s: float) -> Silences:
        return cls(0.0, (gap_s,) * max(n_clips - 1, 0), 0.0)

    def samples(self, seconds: float, sample_rate: int) -> int:
        return int(round(seconds * sample_rate))

    def starts(self, lengths: list[int], sample_rate: int) -> list[int]:
        """The sample where each clip (of these lengths) starts, as render() lays them out."""
        out, at = [], self.samples(self.before, sample_rate)
        for k, length in enumerate(lengths):
            out.append(at)
            at += length + (self.samples(self.between[k], sample_rate) if k < len(lengths) - 1 else 0)
        return out


def render(
    clips: list[np.ndarray], sample_rate: int, *, gap_s: float = 0.3, silences: Silences | None = None
) -> np.ndarray:
    """Clips end to end with ``gap_s`` of silence between them, or the ``silences`` given (a
    script's pauses); each silence rounded to whole samples."""
    if not clips:
        raise ExportError("nothing to export: no sentence has a take yet")
    silences = silences or Silences.even(len(clips), gap_s)
    if len(silences.between) != len(clips) - 1:
        raise ExportError(f"{len(clips)} clips need {len(clips) - 1} silences between them")

    def zeros(seconds: float) -> np.ndarray:
        return np.zeros(silences.samples(seconds, sample_rate), dtype=np.float32)

    parts = [zeros(silences.before)]
    for i, clip in enumerate(clips):
        if i:
            parts.append(zeros(silences.between[i - 1]))
        parts.append(np.asarray(clip, dtype=np.float32))
    parts.append(zeros(silences.after))
    return np.concatenate(parts)


def _write_book(path, audio, rate, clips, silences: Silences, chapters, book: BookInfo) -> Path:
    """The M4B: each chapter marked where its first clip starts, as render() places it."""
    starts = silences.starts([len(c) for c in clips], rate)
    starts[0] = 0  # the first chapter holds the silence before the first clip
    marks = [(starts[k] / rate, title) for k, title in sorted(chapters) if 0 <= k < len(clips)]
    if not marks or marks[0][0] > 0:
        marks.insert(0, (0.0, book.title or "Beginning"))
    try:
        return write_m4b(path, audio, rate, chapters=marks, info=book)
    except ValueError as exc:
        raise ExportError(str(exc)) from None


def export_audio(
    path: Path | str,
    clips: list[np.ndarray],
    sample_rate: int,
    *,
    out_rate: int | None = None,
    subtype: str = "pcm16",
    gap_s: float = 0.3,
    silences: Silences | None = None,
    loudness: str | None = None,
    chapters: list[tuple[int, str]] | None = None,
    book: BookInfo | None = None,
) -> ExportReport:
    """Write the clips as one file (atomically; its container by its name: app.audio.wav) and
    report what was written. Silences (``gap_s`` between clips, or ``silences``) are counted in
    samples of the written rate; MP3 and Opus are written at the nearest rate their encoders
    take (an Opus file of 22.05 kHz audio at 24 kHz). An M4B audiobook takes ``chapters`` (the
    clip each starts with, and its title; audio before the first is a chapter of the book's
    title) and ``book`` (title, author, cover)."""
    try:
        container = container_of(path)
        file_subtype(container, subtype)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    if loudness is not None and loudness not in PRESETS:
        raise ExportError(f"loudness preset must be one of {sorted(PRESETS)}")
    rate = out_rate or sample_rate
    if not 8000 <= rate <= 192000:
        raise ExportError(f"sample rate {rate} Hz is outside 8000..192000")
    rate = encoder_rate(container, rate)
    clips = [resample(c, sample_rate, rate) for c in clips]
    silences = silences or Silences.even(len(clips), gap_s)
    audio = render(clips, rate, silences=silences)
    gain_db, limited = 0.0, False
    if loudness is not None:
        audio, gain_db, limited = normalize(audio, rate, PRESETS[loudness])
    elif (subtype != "float" or container != "WAV") and np.max(np.abs(audio)) > 1.0:
        audio = limit(audio, rate, -0.3)
        limited = True
    if container == "M4B":
        written = _write_book(path, audio, rate, clips, silences, chapters or [], book or BookInfo())
    else:
        written = write_audio(path, audio, rate, subtype=subtype)
    return ExportReport(
        written,
        rate,
        len(audio) / rate,
        integrated_loudness(audio, rate),
        rms_db(audio),
        true_peak_db(audio),
        gain_db,
        limited,
    )


def book_info(title: str = "", author: str = "", cover: Path | str | None = None) -> BookInfo:
    """An audiobook's title, author and cover (read from its file, checked when written)."""
    from app.audio.m4b import MAX_COVER_BYTES

    data = None
    if cover:
        cover = Path(cover)
        if cover.stat().st_size > MAX_COVER_BYTES:
            raise ExportError(f"{cover.name}: a cover is at most {MAX_COVER_BYTES >> 20} MiB")
        data = cover.read_bytes()
    return BookInfo(title, author, data)


def export_project(path: Path | str, project, indices: list[int] | None = None, *, gap_s: float = 0.3, **options):
    """A project's takes (of these sentences, or all) as one file, as export_audio writes it:
    at the first take's rate, with the script's pauses between them (``gap_s`` elsewhere) and
    its chapters marked in an audiobook. ``options``: export_audio's."""
    placed = project.takes_audio(indices)
    if not placed:
        raise ExportError("nothing to export: no sentence has a take yet")
    rate = placed[0][1].sample_rate
    clips = [resample(t.audio, t.sample_rate, rate) for _, t in placed]
    at = [i for i, _ in placed]
    return export_audio(
        path, clips, rate, silences=project.silences(at, gap_s), chapters=project.chapter_marks(at), **options
    )
