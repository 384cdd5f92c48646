"""Pitch and speaking rate of speech, with NumPy: what a profile's prosody is matched on.

- ``f0_track``: one F0 per 10 ms frame (0 where unvoiced) from the normalized
  autocorrelation of 40 ms windows at 16 kHz, 60-400 Hz, voiced where the peak's
  correlation is at least 0.5 and the frame is within 35 dB of the loudest;
- ``median_f0``: the median of the voiced frames (None with under 0.3 s voiced);
- ``speaking_rate``: syllable nuclei per second of speech, counting peaks of the
  band-limited (300-3000 Hz) energy envelope that stand 3 dB above their surroundings,
  at least 100 ms apart, over the time the speech detector keeps.
"""

from __future__ import annotations

import numpy as np

RATE = 16000
HOP = 160  # 10 ms
WINDOW = 640  # 40 ms
F0_MIN, F0_MAX = 60.0, 400.0


def _at_16k(audio: np.ndarray, rate: int) -> np.ndarray:
    from app.core.export import resample

    audio = np.asarray(audio, dtype=np.float32)
    return resample(audio, int(rate), RATE) if rate != RATE else audio


def _frames(x: np.ndarray, size: int) -> np.ndarray:
    n = 1 + max(0, len(x) - size) // HOP
    if len(x) < size:
        x = np.pad(x, (0, size - len(x)))
    idx = np.arange(size)[None, :] + HOP * np.arange(n)[:, None]
    return x[idx]


def f0_track(audio: np.ndarray, rate: int) -> np.ndarray:
    """F0 in Hz per 10 ms frame; 0 where unvoiced."""
    x = _at_16k(audio, rate).astype(np.float64)
    frames = _frames(x, WINDOW)
    frames = frames - frames.mean(axis=1, keepdims=True)
    energy = np.sum(frames**2, axis=1)
    spec = np.fft.rfft(frames, n=2 * WINDOW, axis=1)
    ac = np.fft.irfft(np.abs(spec) ** 2, axis=1)[:, :WINDOW]
    lo, hi = int(RATE / F0_MAX), int(RATE / F0_MIN)
    # Normalized by the energies of the overlapping parts (an unbiased estimate).
    lags = np.arange(lo, hi + 1)
    norm = ac[:, lags] / (ac[:, :1] * (WINDOW - lags) / WINDOW + 1e-12)
    rows = np.arange(len(norm))
    # The shortest lag near the highest peak (multiples of the period correlate as well),
    # then up to its own local maximum.
    top = norm.max(axis=1)
    best = np.argmax(norm >= 0.9 * top[:, None], axis=1)
    for _ in range(len(lags)):
        step = (best + 1 < len(lags)) & (norm[rows, np.minimum(best + 1, len(lags) - 1)] > norm[rows, best])
        if not step.any():
            break
        best = best + step
    peak = norm[rows, best]
    lag = lags[best].astype(np.float64)
    # Parabolic interpolation around the peak.
    i = best.clip(1, len(lags) - 2)
    a, b, c = norm[rows, i - 1], norm[rows, i], norm[rows, i + 1]
    denom = a - 2 * b + c
    shift = np.where(np.abs(denom) > 1e-12, 0.5 * (a - c) / np.where(denom == 0, 1, denom), 0.0)
    lag = np.where((best > 0) & (best < len(lags) - 1), lag + np.clip(shift, -0.5, 0.5), lag)
    loud = 10 * np.log10(energy + 1e-12) > 10 * np.log10(energy.max() + 1e-12) - 35.0
    voiced = (peak >= 0.5) & loud
    return np.where(voiced, RATE / lag, 0.0)


def median_f0(audio: np.ndarray, rate: int) -> float | None:
    track = f0_track(audio, rate)
    voiced = track[track > 0]
    if len(voiced) * HOP < 0.3 * RATE:
        return None
    return float(np.median(voiced))


def speaking_rate(audio: np.ndarray, rate: int) -> float | None:
    """Syllable nuclei per second of speech, or None for under 0.5 s of speech."""
    from scipy.signal import butter, find_peaks, sosfiltfilt

    from app.profiles.speaker_encoder import voice_mask

    x = _at_16k(audio, rate).astype(np.float64)
    speech_s = voice_mask(x.astype(np.float32)).sum() * 0.03
    if speech_s < 0.5:
        return None
    band = sosfiltfilt(butter(4, [300, 3000], btype="band", fs=RATE, output="sos"), x)
    env = np.sqrt(np.mean(_frames(band, 320) ** 2, axis=1))  # 20 ms windows every 10 ms
    env_db = 20 * np.log10(env + 1e-9)
    env_db = np.convolve(env_db, np.ones(5) / 5, mode="same")
    floor = env_db.max() - 30.0
    peaks, _ = find_peaks(np.maximum(env_db, floor), prominence=3.0, distance=10)
    return len(peaks) / speech_s
