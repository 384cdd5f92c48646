"""Convert resemblyzer's GE2E speaker encoder into a GGUF the engine loads (arch "ge2e").

The front end is resemblyzer's, parameter for parameter (resemblyzer/hparams.py and
audio.wav_to_mel_spectrogram, which calls librosa.feature.melspectrogram):

- 16 kHz mono; frames of 400 samples (25 ms) every 160 samples (10 ms), centred
  (200 zeros padded at each end, librosa's default since 0.10), periodic Hann window;
- power spectrum |X|^2 of the 201 bins, 40 mel bands, Slaney mel scale with Slaney area
  normalization (librosa.filters.mel defaults, 0 to 8000 Hz); no log;
- partial utterances of 160 frames (1.6 s), 1.3 per second (a step of 77 frames); the last
  one kept only if the audio covers 75% of it; at least one.

The encoder: a 3-layer LSTM (40 -> 256 -> 256 -> 256) whose last layer's final hidden state
goes through Linear(256, 256) and ReLU, then L2 normalization; the utterance embedding is
the L2-normalized mean of its partials' embeddings.

Tensors (ggml order, fastest axis first):
- ``dft`` [400, 402]: Hann-windowed DFT basis, rows cos_k, -sin_k interleaved per bin k;
- ``mel`` [201, 40]: the filterbank;
- ``lstm.{l}.weight_ih`` [in, 1024], ``lstm.{l}.weight_hh`` [256, 1024], ``lstm.{l}.bias``
  [1024] (b_ih + b_hh), gates i, f, g, o as in PyTorch;
- ``linear.weight`` [256, 256], ``linear.bias`` [256].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path

ARCH = "ge2e"
SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 40
PARTIAL_FRAMES = 160
PARTIAL_RATE = 1.3
MIN_COVERAGE = 0.75
LAYERS = 3
HIDDEN = 256


def _hz_to_mel_slaney(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def _mel_to_hz_slaney(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def slaney_mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmax: float | None = None) -> np.ndarray:
    """Triangular filters on the Slaney mel scale with Slaney area normalization,
    [n_mels, n_fft // 2 + 1], as librosa.filters.mel(sr, n_fft, n_mels, fmax=fmax) computes them
    (fmax None: half the sample rate)."""
    top = sample_rate / 2 if fmax is None else fmax
    bins = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(0.0), _hz_to_mel_slaney(top), n_mels + 2))
    fdiff = np.diff(edges)
    ramps = edges[:, None] - bins[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.astype(np.float32)


def dft_basis(n_fft: int) -> np.ndarray:
    """[2 * (n_fft // 2 + 1), n_fft]: periodic-Hann-windowed cos and -sin rows, interleaved."""
    n = np.arange(n_fft)
    k = np.arange(n_fft // 2 + 1)
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / n_fft)
    angle = 2.0 * np.pi * np.outer(k, n) / n_fft
    basis = np.empty((2 * len(k), n_fft))
    basis[0::2] = np.cos(angle) * window
    basis[1::2] = -np.sin(angle) * window
    return basis.astype(np.float32)


class ConversionError(ValueError):
    pass


def convert(state: dict[str, np.ndarray], out_path: Path, *, source_package: str) -> Path:
    """Write the encoder whose state dict is ``state`` (resemblyzer's names) to ``out_path``."""
    import gguf

    expected = {"linear.weight": (HIDDEN, HIDDEN), "linear.bias": (HIDDEN,)}
    for layer in range(LAYERS):
        expected[f"lstm.weight_ih_l{layer}"] = (4 * HIDDEN, N_MELS if layer == 0 else HIDDEN)
        expected[f"lstm.weight_hh_l{layer}"] = (4 * HIDDEN, HIDDEN)
        expected[f"lstm.bias_ih_l{layer}"] = (4 * HIDDEN,)
        expected[f"lstm.bias_hh_l{layer}"] = (4 * HIDDEN,)
    for name, shape in expected.items():
        if name not in state:
            raise ConversionError(f"speaker encoder checkpoint lacks '{name}'")
        if tuple(state[name].shape) != shape:
            raise ConversionError(f"speaker encoder '{name}' has shape {tuple(state[name].shape)}, expected {shape}")

    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), ARCH)
        writer.add_name("GE2E speaker encoder")
        writer.add_string("general.source_package", source_package)
        writer.add_string("general.license", "Apache-2.0")
        p = f"{ARCH}."
        writer.add_uint32(p + "sample_rate", SAMPLE_RATE)
        writer.add_uint32(p + "n_fft", N_FFT)
        writer.add_uint32(p + "hop", HOP)
        writer.add_uint32(p + "n_mels", N_MELS)
        writer.add_uint32(p + "partial_frames", PARTIAL_FRAMES)
        writer.add_float32(p + "partial_rate", PARTIAL_RATE)
        writer.add_float32(p + "min_coverage", MIN_COVERAGE)
        writer.add_uint32(p + "layers", LAYERS)
        writer.add_uint32(p + "hidden", HIDDEN)
        writer.add_tensor("dft", dft_basis(N_FFT))
        writer.add_tensor("mel", slaney_mel_filterbank(SAMPLE_RATE, N_FFT, N_MELS))
        for layer in range(LAYERS):
            f32 = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()}
            writer.add_tensor(f"lstm.{layer}.weight_ih", f32[f"lstm.weight_ih_l{layer}"])
            writer.add_tensor(f"lstm.{layer}.weight_hh", f32[f"lstm.weight_hh_l{layer}"])
            writer.add_tensor(f"lstm.{layer}.bias", f32[f"lstm.bias_ih_l{layer}"] + f32[f"lstm.bias_hh_l{layer}"])
        writer.add_tensor("linear.weight", np.ascontiguousarray(state["linear.weight"], dtype=np.float32))
        writer.add_tensor("linear.bias", np.ascontiguousarray(state["linear.bias"], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out_path
