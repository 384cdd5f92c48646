"""Audio analysis with NumPy: STFT, mel filterbank, log-mel spectrograms."""

from __future__ import annotations

import numpy as np


def stft_magnitude(audio: np.ndarray, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    """|STFT| as [frames, n_fft // 2 + 1], Hann window, centred frames."""
    x = np.asarray(audio, dtype=np.float32)
    pad = n_fft // 2
    x = np.pad(x, (pad, pad), mode="reflect" if len(x) > pad else "constant")
    n_frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(n_frames)[:, None]
    window = np.hanning(n_fft + 1)[:-1].astype(np.float32)
    return np.abs(np.fft.rfft(x[idx] * window, axis=1))


def mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Slaney-style triangular filters on the HTK mel scale, [n_mels, n_fft // 2 + 1]."""
    fmax = fmax or sample_rate / 2

    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (np.asarray(m) / 2595.0) - 1.0)

    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    bins = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    lower = (bins[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - bins[None, :]) / (edges[2:, None] - edges[1:-1, None])
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.astype(np.float32)


def log_mel(audio: np.ndarray, sample_rate: int, n_mels: int = 80, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    """log(mel power + 1e-5) as [frames, n_mels]."""
    power = stft_magnitude(audio, n_fft, hop) ** 2
    return np.log(power @ mel_filterbank(sample_rate, n_fft, n_mels).T + 1e-5)


def log_mel_cosine(a: np.ndarray, b: np.ndarray, sample_rate: int) -> float:
    """Cosine similarity of two clips' log-mel spectrograms over their common length."""
    ma, mb = log_mel(a, sample_rate), log_mel(b, sample_rate)
    n = min(len(ma), len(mb))
    va, vb = ma[:n].ravel(), mb[:n].ravel()
    return float(np.dot(va, vb) / (np.linalg.norm(va) * np.linalg.norm(vb) + 1e-12))
