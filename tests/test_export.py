"""Export: one WAV from several takes, formats, sample rates and loudness presets."""

import numpy as np
import pyloudnorm
import pytest
import soundfile

from app.core.export import PRESETS, ExportError, export_wav, rms_db, true_peak_db


@pytest.fixture(scope="module")
def clips(engine):
    lines = ["The first sentence of the chapter.", "A second one, a little longer than the first.", "Done!"]
    return [engine.synthesize(text=line, seed=3).audio.copy() for line in lines], 22050


@pytest.mark.parametrize("preset", ["podcast", "broadcast"])
def test_lufs_presets_hit_their_target(tmp_path, clips, preset):
    audio, rate = clips
    report = export_wav(tmp_path / "out.wav", audio, rate, subtype="pcm24", loudness=preset)
    written, written_rate = soundfile.read(str(report.path), dtype="float64")
    measured = pyloudnorm.Meter(written_rate).integrated_loudness(written)
    assert abs(measured - PRESETS[preset].lufs) <= 0.5
    assert true_peak_db(written.astype(np.float32)) <= PRESETS[preset].ceiling_dbtp + 0.1


def test_acx_preset_rms_and_peak(tmp_path, clips):
    audio, rate = clips
    report = export_wav(tmp_path / "book.wav", audio, rate, loudness="acx", out_rate=44100)
    written, written_rate = soundfile.read(str(report.path), dtype="float32")
    assert written_rate == 44100
    assert -23.0 <= rms_db(written) <= -18.0 and abs(rms_db(written) - -20.0) <= 0.5
    assert true_peak_db(written) <= -3.0 + 0.1


@pytest.mark.parametrize(("subtype", "expected"), [("pcm16", "PCM_16"), ("pcm24", "PCM_24"), ("float", "FLOAT")])
def test_formats_rates_and_gaps(tmp_path, clips, subtype, expected):
    audio, rate = clips
    report = export_wav(tmp_path / "x.wav", audio, rate, subtype=subtype, gap_s=0.5, out_rate=48000)
    info = soundfile.info(str(report.path))
    assert info.subtype == expected and info.samplerate == 48000 and info.channels == 1
    want_s = sum(len(c) for c in audio) / rate + 2 * 0.5
    assert abs(info.duration - want_s) < 0.01
    data, _ = soundfile.read(str(report.path), dtype="float32")
    first_gap = slice(int(len(audio[0]) / rate * 48000) + 200, int((len(audio[0]) / rate + 0.5) * 48000) - 200)
    assert np.max(np.abs(data[first_gap])) < 1e-3  # silence between sentences


def test_bad_exports_are_refused_and_write_nothing(tmp_path, clips):
    audio, rate = clips
    with pytest.raises(ExportError, match="no sentence"):
        export_wav(tmp_path / "a.wav", [], rate)
    with pytest.raises(ExportError, match="silent"):
        export_wav(tmp_path / "b.wav", [np.zeros(rate, dtype=np.float32)], rate, loudness="podcast")
    with pytest.raises(ExportError, match="preset"):
        export_wav(tmp_path / "c.wav", audio, rate, loudness="loud")
    with pytest.raises(ExportError, match="sample rate"):
        export_wav(tmp_path / "d.wav", audio, rate, out_rate=1000)
    assert list(tmp_path.iterdir()) == []
