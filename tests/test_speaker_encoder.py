"""The engine's GE2E speaker encoder against resemblyzer's own implementation.

Golden values: tests/data/speaker/golden.npz, written by tools/golden_speaker_encoder.py
(resemblyzer 0.1.4 with torch) from the clips in tests/data/speaker/.
"""

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from app.engine.errors import InvalidArgumentError, VoiceStudioError
from app.models import manager as models
from app.profiles.speaker_encoder import SpeakerEncoder, preprocess, similarity, trim_long_silences

DATA = Path(__file__).parent / "data" / "speaker"
CLIPS = ("piper_joe", "kokoro_jf_alpha", "kokoro_jm_kumo")


@pytest.fixture(scope="module")
def golden():
    return np.load(DATA / "golden.npz")


@pytest.fixture(scope="module")
def encoder():
    with SpeakerEncoder.open(device="cpu", threads=2) as enc:
        yield enc


def clip(name):
    audio, rate = sf.read(DATA / f"{name}.flac", dtype="float32")
    assert rate == 16000
    return audio


@pytest.mark.parametrize("name", CLIPS)
def test_stages_match_resemblyzer(encoder, golden, name):
    embedding = encoder.embed_prepared(clip(name))
    partials = encoder.output("partials")
    assert partials.shape == golden[f"{name}.partials"].shape, "partial utterances cut differently"
    for i, (ours, ref) in enumerate(zip(partials, golden[f"{name}.partials"], strict=True)):
        assert similarity(ours, ref) >= 0.999, f"partial {i}"
    assert similarity(embedding, golden[f"{name}.embedding"]) >= 0.999
    assert abs(np.linalg.norm(embedding) - 1.0) < 1e-5
    mel_key = f"{name}.mel"
    if mel_key in golden:
        ref = golden[mel_key]
        mel = encoder.output("mel")
        assert mel.shape == ref.shape
        assert np.abs(mel - ref).max() <= 1e-4 * ref.max()


@pytest.mark.parametrize("name", CLIPS)
def test_preparation_close_to_resemblyzers(encoder, golden, name):
    # resemblyzer trims silences with webrtcvad, we with an energy detector.
    assert similarity(encoder.embed(clip(name), 16000), golden[f"{name}.preprocessed"]) >= 0.99


def test_embedding_does_not_depend_on_the_file_rate(encoder):
    from app.core.export import resample

    audio = clip("piper_joe")
    at_48k = resample(audio, 16000, 48000)
    assert similarity(encoder.embed(audio, 16000), encoder.embed(at_48k, 48000)) >= 0.995


def test_same_voice_is_closer_than_another_voice(encoder, engine):
    joe = encoder.embed(clip("piper_joe"), 16000)
    take = engine.synthesize(text="Tomorrow the train leaves early, so pack your bags tonight.")
    joe_again = encoder.embed(take.audio, take.sample_rate)
    others = [encoder.embed(clip(name), 16000) for name in CLIPS[1:]]
    assert similarity(joe, joe_again) > max(similarity(joe, o) for o in others) + 0.1


def test_long_silences_are_shortened():
    rng = np.random.default_rng(0)
    speech = (0.1 * rng.standard_normal(16000)).astype(np.float32)
    gap = np.zeros(32000, dtype=np.float32)
    trimmed = trim_long_silences(np.concatenate([speech, gap, speech]))
    assert 32000 <= len(trimmed) < 32000 + 0.5 * 16000  # the 2 s gap shrinks to about 0.2 s
    assert len(preprocess(np.concatenate([speech, speech]), 16000)) == 32000 - 32000 % 480


def test_bad_audio_gets_a_clear_error(encoder):
    with pytest.raises(InvalidArgumentError, match="no speech"):
        encoder.embed(np.zeros(48000, dtype=np.float32), 16000)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        encoder.embed(np.full(16000, np.nan, dtype=np.float32), 16000)
    with pytest.raises(InvalidArgumentError, match="mono"):
        encoder.embed(np.zeros((100, 2), dtype=np.float32), 16000)
    with pytest.raises(InvalidArgumentError):
        encoder.embed_prepared(np.zeros(0, dtype=np.float32))


def test_voices_and_encoders_are_not_confused(engine, joe_path):
    from app.engine.binding import native_engine

    _engine = native_engine()

    with pytest.raises(InvalidArgumentError, match="not a speaker encoder"):
        SpeakerEncoder.open(model_path=joe_path)
    model = _engine.Model(str(models.install_speaker_encoder()))
    try:
        assert model.arch == "ge2e" and model.embedding_size == 256 and model.sample_rate == 16000
        assert model.stages == ["mel", "speaker"]
        ctx = _engine.Context(model, "cpu", 1)
        with pytest.raises(VoiceStudioError, match="cannot speak"):
            ctx.synthesize("hello")
        ctx.close()
    finally:
        model.close()


def test_encoder_install_is_verified(tmp_path, monkeypatch):
    path = models.install_speaker_encoder()
    assert models.speaker_encoder_installed()
    manifest = path.with_suffix(".json")
    saved = manifest.read_bytes()
    try:
        manifest.write_text("{}")
        assert not models.speaker_encoder_installed()
    finally:
        manifest.write_bytes(saved)
    assert models.speaker_encoder_installed()


def test_prewarmed_encoder_embeds_the_same(encoder):
    from app.engine.binding import native_engine

    _engine = native_engine()

    want = encoder.embed_prepared(clip("piper_joe"))
    model = _engine.Model(str(models.install_speaker_encoder()))
    warm = SpeakerEncoder(model, _engine.Context(model, "cpu", 2, prewarm=1))
    try:
        assert warm._context.prewarm_ms > 0
        assert warm._context.fallback_ops == {"mel": [], "speaker": []}
        with pytest.raises(InvalidArgumentError, match="no output"):
            warm.output("partials")  # the prewarm's intermediates are dropped
        got = warm.embed_prepared(clip("piper_joe"))
    finally:
        warm.close()
    np.testing.assert_array_equal(got, want)
