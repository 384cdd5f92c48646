"""Export: one WAV from several takes, formats, sample rates and loudness presets."""

import numpy as np
import pyloudnorm
import pytest
import soundfile

from app.core.export import PRESETS, ExportError, export_audio, rms_db, true_peak_db


@pytest.fixture(scope="module")
def clips(engine):
    lines = ["The first sentence of the chapter.", "A second one, a little longer than the first.", "Done!"]
    return [engine.synthesize(text=line, seed=3).audio.copy() for line in lines], 22050


@pytest.mark.parametrize("preset", ["podcast", "broadcast"])
def test_lufs_presets_hit_their_target(tmp_path, clips, preset):
    audio, rate = clips
    report = export_audio(tmp_path / "out.wav", audio, rate, subtype="pcm24", loudness=preset)
    written, written_rate = soundfile.read(str(report.path), dtype="float64")
    measured = pyloudnorm.Meter(written_rate).integrated_loudness(written)
    assert abs(measured - PRESETS[preset].lufs) <= 0.5
    assert true_peak_db(written.astype(np.float32)) <= PRESETS[preset].ceiling_dbtp + 0.1


def test_acx_preset_rms_and_peak(tmp_path, clips):
    audio, rate = clips
    report = export_audio(tmp_path / "book.wav", audio, rate, loudness="acx", out_rate=44100)
    written, written_rate = soundfile.read(str(report.path), dtype="float32")
    assert written_rate == 44100
    assert -23.0 <= rms_db(written) <= -18.0 and abs(rms_db(written) - -20.0) <= 0.5
    assert true_peak_db(written) <= -3.0 + 0.1


@pytest.mark.parametrize(("subtype", "expected"), [("pcm16", "PCM_16"), ("pcm24", "PCM_24"), ("float", "FLOAT")])
def test_formats_rates_and_gaps(tmp_path, clips, subtype, expected):
    audio, rate = clips
    report = export_audio(tmp_path / "x.wav", audio, rate, subtype=subtype, gap_s=0.5, out_rate=48000)
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
        export_audio(tmp_path / "a.wav", [], rate)
    with pytest.raises(ExportError, match="silent"):
        export_audio(tmp_path / "b.wav", [np.zeros(rate, dtype=np.float32)], rate, loudness="podcast")
    with pytest.raises(ExportError, match="preset"):
        export_audio(tmp_path / "c.wav", audio, rate, loudness="loud")
    with pytest.raises(ExportError, match="sample rate"):
        export_audio(tmp_path / "d.wav", audio, rate, out_rate=1000)
    with pytest.raises(ExportError, match="FLAC holds 16- or 24-bit PCM"):
        export_audio(tmp_path / "e.flac", audio, rate, subtype="float")
    with pytest.raises(ExportError, match=r"must end in \.wav, \.flac, \.mp3, \.opus or \.m4b"):
        export_audio(tmp_path / "f.aiff", audio, rate)
    assert list(tmp_path.iterdir()) == []


def test_flac_holds_the_wavs_samples_and_mp3_and_opus_sound_as_it(tmp_path, clips):
    """FLAC is lossless: the same 16-bit samples as the WAV. MP3 and Opus are lossy: their
    encoders' rates (Opus takes 22.05 kHz audio at 24 kHz), about the WAV's length (the
    encoders pad a frame or so), and the WAV's spectrum."""
    from app.audio.dsp import log_mel_cosine
    from app.core.export import resample

    audio, rate = clips
    wav = export_audio(tmp_path / "x.wav", audio, rate, gap_s=0.25)
    want, _ = soundfile.read(str(wav.path), dtype="int16")
    flac = export_audio(tmp_path / "x.flac", audio, rate, gap_s=0.25)
    got, got_rate = soundfile.read(str(flac.path), dtype="int16")
    assert soundfile.info(str(flac.path)).format == "FLAC" and got_rate == rate
    assert np.array_equal(got, want)
    reference = want.astype(np.float32) / 32768
    for name, container, subtype, written_rate in (
        ("x.mp3", "MP3", "MPEG_LAYER_III", rate),
        ("x.opus", "OGG", "OPUS", 24000),
    ):
        report = export_audio(tmp_path / name, audio, rate, gap_s=0.25)
        info = soundfile.info(str(report.path))
        assert (
            (info.format, info.subtype, info.samplerate)
            == (container, subtype, written_rate)
            == (container, subtype, report.sample_rate)
        )
        decoded, _ = soundfile.read(str(report.path), dtype="float32")
        assert abs(len(decoded) / written_rate - len(reference) / rate) < 0.1
        back = resample(decoded, written_rate, rate)
        n = min(len(back), len(reference))
        assert log_mel_cosine(back[:n], reference[:n], rate) >= 0.97, name


def test_an_audiobook_has_its_chapters_title_author_and_cover_for_other_readers(tmp_path, clips):
    """An M4B read back by PyAV and by mutagen: AAC at the voice's rate, chapter marks where
    their clips start (after the gaps), the title, the author and the cover."""
    import av
    import mutagen.mp4

    from app.audio.m4b import BookInfo

    audio, rate = clips
    cover = b"\x89PNG\r\n\x1a\n" + bytes(200)
    book = BookInfo("A Book", "An Author", cover)
    report = export_audio(tmp_path / "b.m4b", audio, rate, gap_s=0.5, chapters=[(1, "Two"), (2, "Three")], book=book)
    starts = [0.0, len(audio[0]) / rate + 0.5, (len(audio[0]) + len(audio[1])) / rate + 1.0]
    with av.open(str(report.path)) as f:
        assert f.streams.audio[0].codec_context.name == "aac" and f.streams.audio[0].rate == rate
        marks = [(c["start"] * c["time_base"], c["metadata"]["title"]) for c in f.chapters()]
        assert f.metadata["title"] == "A Book" and f.metadata["artist"] == "An Author"
    assert [t for _, t in marks] == ["A Book", "Two", "Three"]
    assert all(abs(float(got) - want) <= 0.001 for (got, _), want in zip(marks, starts, strict=True))
    tags = mutagen.mp4.MP4(str(report.path))
    assert [(round(c.start, 3), c.title) for c in tags.chapters] == [
        (round(s, 3), t) for s, (_, t) in zip(starts, marks, strict=True)
    ]
    assert bytes(tags.tags["covr"][0]) == cover and abs(tags.info.length - report.duration_s) < 0.1
    with pytest.raises(ExportError, match="JPEG or PNG"):
        export_audio(tmp_path / "c.m4b", audio, rate, book=BookInfo(cover=b"GIF89a"))
    assert not (tmp_path / "c.m4b").exists()
