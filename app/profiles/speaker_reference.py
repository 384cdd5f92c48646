"""A speaker's reference recording: load, check and say why, trim, normalize.

    ref = prepare(*load("me.flac"))
    for c in ref.checks: print(c.name, c.status, c.detail)
    if ref.usable: ref.audio  # 48 kHz mono float32, trimmed, level-normalized, at most 60 s

Checks (each pass / warn / fail with the measured value and the reason):
duration after trimming silence (fail < 3 s, warn < 10 s; up to 60 s are used),
clipping (share of samples at full scale), speech level (RMS of the voiced frames),
noise floor and SNR (quietest vs loudest frames), and the source sample rate.
Qt-free; the recording dialog and the profile builder use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.engine.errors import InvalidArgumentError

RATE = 48000
MIN_SECONDS, WARN_SECONDS, MAX_SECONDS = 3.0, 10.0, 60.0
FRAME_S = 0.02  # analysis frames
TARGET_RMS_DB = -20.0  # speech level after normalization
PEAK_CEILING_DB = -1.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "pass", "warn" or "fail"
    value: float
    detail: str


@dataclass
class Reference:
    audio: np.ndarray  # float32, RATE, trimmed and normalized
    sample_rate: int
    source_rate: int
    checks: list[Check] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate


def load(path: Path | str) -> tuple[np.ndarray, int]:
    """Any file libsndfile reads (WAV, FLAC, OGG, MP3) as float32 mono and its rate."""
    import soundfile as sf

    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as exc:
        raise InvalidArgumentError(f"{Path(path).name}: not an audio file this build can read ({exc})") from exc
    if data.size == 0:
        raise InvalidArgumentError(f"{Path(path).name}: the file holds no audio")
    return data.mean(axis=1).astype(np.float32), int(rate)


def _frame_db(audio: np.ndarray, rate: int) -> np.ndarray:
    n = max(1, int(FRAME_S * rate))
    frames = len(audio) // n
    if frames == 0:
        return np.array([-120.0])
    power = np.mean(audio[: frames * n].reshape(frames, n).astype(np.float64) ** 2, axis=1)
    return 10.0 * np.log10(power + 1e-12)


def _db(x: float) -> float:
    return 20.0 * np.log10(max(x, 1e-9))


def prepare(audio: np.ndarray, rate: int) -> Reference:
    """Check the recording, trim silence at both ends, normalize its level, resample to 48 kHz."""
    from app.core.export import resample

    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(audio)):
        raise InvalidArgumentError("the recording holds non-finite samples")
    checks: list[Check] = []

    if rate < 8000:
        checks.append(Check("sample rate", "fail", rate, f"{rate} Hz is too coarse for speech (8 kHz at least)"))
    elif rate < 16000:
        checks.append(Check("sample rate", "warn", rate, f"{rate} Hz loses the upper half of speech's spectrum"))
    else:
        checks.append(Check("sample rate", "pass", rate, f"{rate} Hz"))

    clipped = float(np.mean(np.abs(audio) >= 0.999))
    status = "fail" if clipped > 0.01 else "warn" if clipped > 0.001 else "pass"
    checks.append(Check("clipping", status, clipped, f"{clipped:.2%} of samples at full scale"))

    db = _frame_db(audio, rate)
    loud = float(np.percentile(db, 95))
    noise = float(np.percentile(db, 10))
    # Speech frames: within 35 dB of the loud frames and above the floor by 6 dB.
    speech = db > max(loud - 35.0, noise + 6.0)
    n = max(1, int(FRAME_S * rate))
    if not speech.any() or loud < -60.0:
        checks.append(Check("speech", "fail", 0.0, "no speech found: the recording is silent"))
        return Reference(np.zeros(0, np.float32), RATE, rate, checks)
    first, last = int(np.argmax(speech)), len(speech) - int(np.argmax(speech[::-1]))
    pad = int(0.1 * rate)  # keep 100 ms around the speech
    trimmed = audio[max(0, first * n - pad) : min(len(audio), last * n + pad)]
    if len(trimmed) / rate > MAX_SECONDS:
        trimmed = trimmed[: int(MAX_SECONDS * rate)]

    seconds = len(trimmed) / rate  # from the first to the last speech, at most a minute
    if seconds < MIN_SECONDS:
        checks.append(Check("duration", "fail", seconds, f"{seconds:.1f} s of speech; {MIN_SECONDS:.0f} s needed"))
    elif seconds < WARN_SECONDS:
        better = f"{WARN_SECONDS:.0f} s or more is better"
        checks.append(Check("duration", "warn", seconds, f"{seconds:.1f} s of speech; {better}"))
    else:
        checks.append(Check("duration", "pass", seconds, f"{seconds:.1f} s of speech used"))

    level = float(10.0 * np.log10(np.mean(10.0 ** (db[speech] / 10.0))))
    status = "warn" if level < -40.0 or level > -6.0 else "pass"
    why = "too quiet" if level < -40.0 else "very hot" if level > -6.0 else "good"
    checks.append(Check("level", status, level, f"speech at {level:.1f} dBFS RMS ({why})"))

    snr = level - noise
    status = "fail" if snr < 10.0 else "warn" if snr < 20.0 else "pass"
    checks.append(Check("noise", status, snr, f"noise floor {noise:.1f} dBFS, SNR {snr:.0f} dB"))

    out = resample(trimmed, rate, RATE) if rate != RATE else trimmed.copy()
    rms = float(np.sqrt(np.mean(out.astype(np.float64) ** 2)))
    gain = 10.0 ** ((TARGET_RMS_DB - _db(rms)) / 20.0)
    peak = float(np.max(np.abs(out))) * gain
    gain *= min(1.0, 10.0 ** (PEAK_CEILING_DB / 20.0) / max(peak, 1e-9))
    return Reference((out * gain).astype(np.float32), RATE, rate, checks)
