"""A speaker's reference recording: checks with reasons, trimming, normalization, loading."""

import numpy as np
import pytest
import soundfile as sf

from app.engine.errors import InvalidArgumentError
from app.profiles.speaker_reference import RATE, load, prepare


def speech_like(seconds: float, rate: int = 44100, level_db: float = -20.0, seed: int = 0) -> np.ndarray:
    """Voiced syllables (harmonics of a wandering F0, 4 a second) with short pauses, at a given RMS."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)), 0, None) ** 0.5
    x = voiced * envelope
    x *= 10 ** (level_db / 20) / np.sqrt(np.mean(x**2))
    return x.astype(np.float32)


def status(ref, name):
    return next(c for c in ref.checks if c.name == name).status


def test_a_good_recording_passes_and_is_normalized():
    ref = prepare(speech_like(15.0, level_db=-35.0), 44100)  # quieter than the target
    assert ref.usable and all(c.status == "pass" for c in ref.checks), ref.checks
    assert ref.sample_rate == RATE and ref.source_rate == 44100
    rms_db = 20 * np.log10(np.sqrt(np.mean(ref.audio.astype(np.float64) ** 2)))
    assert abs(rms_db - -20.0) < 0.5 and np.abs(ref.audio).max() <= 10 ** (-1 / 20) + 1e-6


def test_silence_at_both_ends_is_trimmed():
    rate = 16000
    quiet = np.random.default_rng(1).normal(0, 10 ** (-70 / 20), 2 * rate).astype(np.float32)
    audio = np.concatenate([quiet, speech_like(12.0, rate), quiet[:rate]])
    ref = prepare(audio, rate)
    assert ref.usable
    assert 12.0 <= ref.duration_s <= 12.0 + 0.3  # the speech and 100 ms either side


@pytest.mark.parametrize(("seconds", "expected"), [(2.0, "fail"), (6.0, "warn"), (12.0, "pass")])
def test_duration_is_judged_on_speech(seconds, expected):
    ref = prepare(speech_like(seconds), 44100)
    assert status(ref, "duration") == expected
    assert ref.usable == (expected != "fail")


def test_long_recordings_are_cut_to_a_minute():
    ref = prepare(speech_like(75.0, 16000), 16000)
    assert ref.usable and ref.duration_s <= 60.0 + 1e-6


def test_silence_is_refused_with_a_reason():
    ref = prepare(np.zeros(10 * 44100, np.float32), 44100)
    assert not ref.usable and status(ref, "speech") == "fail" and "silent" in ref.checks[-1].detail


def test_clipping_and_noise_are_reported():
    clipped = np.clip(speech_like(12.0, level_db=-3.0) * 4, -1, 1)
    assert status(prepare(clipped, 44100), "clipping") == "fail"
    noisy = speech_like(12.0) + np.random.default_rng(2).normal(0, 10 ** (-28 / 20), 12 * 44100).astype(np.float32)
    ref = prepare(noisy, 44100)
    assert status(ref, "noise") in ("warn", "fail") and "SNR" in next(c for c in ref.checks if c.name == "noise").detail
    assert status(prepare(speech_like(12.0, 8000), 8000), "sample rate") == "warn"


def test_files_load_as_mono_and_bad_files_are_named(tmp_path):
    stereo = np.stack([speech_like(4.0, 22050), speech_like(4.0, 22050, seed=3)], axis=1)
    sf.write(tmp_path / "me.flac", stereo, 22050)
    audio, rate = load(tmp_path / "me.flac")
    assert rate == 22050 and audio.ndim == 1 and len(audio) == len(stereo)
    (tmp_path / "bad.wav").write_bytes(b"RIFF nonsense")
    with pytest.raises(InvalidArgumentError, match="bad.wav"):
        load(tmp_path / "bad.wav")
