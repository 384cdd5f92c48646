"""Chatterbox-Turbo's token model (T3), voice encoder, text front end, S3Gen's flow and vocoder
(HiFT), and text to speech through them, in the engine against the reference implementation.

The weights are the official checkpoint's layout and shapes, drawn by tools/chatterbox/weights.py;
the golden values come from the reference's own modules on the same weights
(tools/chatterbox/golden.py, run once in a separate environment with torch)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from app.engine.chatterbox import ChatterboxModel, Conditionals, normalize_punctuation
from app.engine.engine import EngineDebug
from app.engine.errors import CancelledError, InvalidArgumentError, ModelFileError, NothingToSpeakError
from app.models.convert import chatterbox as convert
from tools.chatterbox import weights

GOLDEN = Path(__file__).parent / "data" / "chatterbox" / "golden_turbo.npz"
# Q4_0's 4-bit steps (a scale a block of 32) move the token model's logits more than Q8_0's: on
# these drawn weights, whose logits lie close together, to cosine 0.973 at worst.
Q4_FLOOR = 0.95
CACHE = Path(os.environ.get("VS_TEST_CACHE", Path(__file__).resolve().parents[1] / "build" / "test-models"))


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


@pytest.fixture(scope="module")
def checkpoint():
    """Chatterbox-Turbo's official token-model file, drawn from the layout (kept between runs)."""
    weights.write(CACHE / "chatterbox", weights.TURBO)
    folder = CACHE / "chatterbox" / "turbo"
    shutil.copyfile(GOLDEN.parent / "conds.pt", folder / "conds.pt")  # the stock voice
    return folder


@pytest.fixture(scope="module")
def turbo_f32(checkpoint, tmp_path_factory):
    return convert.convert(checkpoint, tmp_path_factory.mktemp("cb") / "turbo-f32.gguf", weights="f32")


@pytest.fixture(scope="module")
def t3(turbo_f32):
    # The token model's steps in graphs kept from step to step, as on CUDA: each step attends to
    # its positions rounded up to 256, the rest masked (the 200 greedy steps cross 512). Fresh
    # contexts below build a graph a step, each over its positions alone.
    with ChatterboxModel.open(turbo_f32, device="cpu", threads=2, debug=EngineDebug(keep_graphs=True)) as model:
        yield model


@pytest.fixture(scope="module")
def voice(golden):
    return Conditionals(golden["speaker_emb"], golden["prompt_tokens"])


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("clip", ["kokoro_jf_alpha", "kokoro_jm_kumo", "piper_joe"])
def test_the_voice_encoder_matches_the_reference(t3, golden, clip):
    import soundfile as sf

    wav, rate = sf.read(Path(__file__).parent / "data" / "speaker" / f"{clip}.flac", dtype="float32")
    assert rate == 16000
    e = t3.speaker_embedding(wav)
    assert e.shape == (256,)
    mel, ref_mel = t3.output("mel"), golden[f"ve_mel.{clip}"]
    assert mel.shape == ref_mel.shape  # the same silence trimmed
    assert np.abs(mel - ref_mel).max() <= 1e-4 * ref_mel.max()
    # The edge frames, on their own scale: the STFT reflects the audio there, as librosa pads.
    np.testing.assert_allclose(mel[[0, -1]], ref_mel[[0, -1]], rtol=1e-3, atol=1e-6 * np.abs(ref_mel[[0, -1]]).max())
    assert float(e @ golden[f"ve.{clip}"]) >= 0.999
    assert [s for s, ms in t3.timings()["stages_ms"].items() if ms > 0] == ["mel", "speaker"]


def test_the_voice_encoder_refuses_what_is_too_short(t3):
    with pytest.raises(InvalidArgumentError, match="silent or too short"):
        t3.speaker_embedding(np.full(150, 0.1, np.float32))
    with pytest.raises(InvalidArgumentError, match="no audio"):
        t3.speaker_embedding(np.zeros(0, np.float32))


def test_teacher_forced_logits_match_the_reference(t3, golden, voice):
    forced = golden["speech_tokens"][1:]  # after the start token
    tokens = t3.generate(golden["text_tokens"], voice, speech_tokens=forced)
    np.testing.assert_array_equal(tokens, forced)
    logits, ref = t3.output("t3_logits"), golden["t3_logits"]
    assert logits.shape == ref.shape
    assert cosines(logits, ref).min() >= 0.999
    np.testing.assert_array_equal(logits.argmax(1), ref.argmax(1))
    assert t3.timings()["stages_ms"]["tokens"] > 0


def test_greedy_tokens_match_the_reference_for_200_steps(t3, golden, voice):
    ref = golden["greedy_tokens"]
    ref = ref[: np.argmax(ref == convert.STOP_SPEECH)] if (ref == convert.STOP_SPEECH).any() else ref
    stages = []
    tokens = t3.generate(
        golden["text_tokens"], voice, max_tokens=200, temperature=0, on_stage=lambda *a: stages.append(a)
    )
    np.testing.assert_array_equal(tokens, ref)
    assert [s[0] for s in stages] == ["tokens"]


def test_sampling_is_reproducible_and_follows_the_seed(t3, golden, voice):
    text = golden["text_tokens"][:8]
    a = t3.generate(text, voice, max_tokens=12, seed=5)
    b = t3.generate(text, voice, max_tokens=12, seed=5)
    c = t3.generate(text, voice, max_tokens=12, seed=6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert ((a >= 0) & (a < convert.START_SPEECH)).all()
    # top_k 1 leaves one token: the draw is the greedy choice (without a penalty).
    greedy = t3.generate(text, voice, max_tokens=12, temperature=0, repetition_penalty=1)
    np.testing.assert_array_equal(
        t3.generate(text, voice, max_tokens=12, top_k=1, repetition_penalty=1, seed=9), greedy
    )


def test_a_voice_changes_the_tokens_and_round_trips(t3, golden, voice, tmp_path):
    text = golden["text_tokens"][:8]
    other = Conditionals(np.roll(voice.speaker_embedding, 1), voice.prompt_tokens[::-1])
    a = t3.generate(text, voice, max_tokens=16, temperature=0)
    b = t3.generate(text, other, max_tokens=16, temperature=0)
    assert not np.array_equal(a, b)
    voice.save(tmp_path / "me.npz")
    again = Conditionals.load(tmp_path / "me.npz")
    np.testing.assert_array_equal(t3.generate(text, again, max_tokens=16, temperature=0), a)
    # No prompt at all is a voice too.
    assert len(t3.generate(text, Conditionals(voice.speaker_embedding, []), max_tokens=4, temperature=0)) == 4


def test_bad_inputs_are_refused_with_what_is_wrong(t3, golden, voice, tmp_path):
    with pytest.raises(NothingToSpeakError, match="no text tokens"):
        t3.generate([], voice)
    with pytest.raises(InvalidArgumentError, match="text token 50276 is not in the model's vocabulary"):
        t3.generate([1, 50276], voice)
    with pytest.raises(InvalidArgumentError, match="prompt token 6561 is not a speech token"):
        t3.generate([1, 2], Conditionals(voice.speaker_embedding, [6561]))
    with pytest.raises(InvalidArgumentError, match="376 prompt tokens"):
        t3.generate([1, 2], Conditionals(voice.speaker_embedding, np.zeros(376)))
    with pytest.raises(InvalidArgumentError, match="speaker embedding has 255 values"):
        t3.generate([1, 2], Conditionals(voice.speaker_embedding[:255], []))
    with pytest.raises(InvalidArgumentError, match="NaN"):
        Conditionals(np.full(256, np.nan), [])
    with pytest.raises(InvalidArgumentError, match="pass the model's 8196 positions"):
        t3.generate(np.ones(8000, np.int32), voice, max_tokens=1000)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        t3.generate([1, 2], voice, temperature=float("nan"))
    (tmp_path / "bad.npz").write_bytes(b"not a voice")
    with pytest.raises(ModelFileError, match="no Chatterbox conditionals"):
        Conditionals.load(tmp_path / "bad.npz")
    # The context still works.
    assert len(t3.generate(golden["text_tokens"][:4], voice, max_tokens=3, temperature=0)) == 3


def test_cancellation_stops_the_token_loop(t3, golden, voice):
    calls = []

    def cancelled():
        calls.append(1)
        return len(calls) > 5

    with pytest.raises(CancelledError):
        t3.generate(golden["text_tokens"], voice, max_tokens=500, temperature=0, cancelled=cancelled)
    assert len(calls) < 50
    assert len(t3.generate(golden["text_tokens"][:4], voice, max_tokens=2, temperature=0)) == 2


def test_two_threads_each_with_a_context_on_one_model(turbo_f32, golden, voice):
    text = golden["text_tokens"][:6]
    results = {}

    def run(i):
        with ChatterboxModel.open(turbo_f32, device="cpu", threads=1) as m:
            results[i] = m.generate(text, voice, max_tokens=8, temperature=0)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(results[0], results[1])


def test_reduced_weights_keep_the_logits_and_the_mel(checkpoint, golden, voice, tmp_path):
    import gguf

    # q4_0: the token model in Q4_0 (as the seeds quantize it), S3Gen's matrices in Q8_0.
    for kind, t3_floor, mel_floor in (("f16", 0.999, 0.999), ("q8_0", 0.99, 0.99), ("q4_0", Q4_FLOOR, 0.99)):
        path = convert.convert(checkpoint, tmp_path / f"turbo-{kind}.gguf", weights=kind)
        if kind == "q4_0":
            types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
            assert types["t3.blk.0.attn_qkv.weight"] == gguf.GGMLQuantizationType.Q4_0
            assert types["flow.dec.proj.weight"] == gguf.GGMLQuantizationType.Q8_0
        with ChatterboxModel.open(path, device="cpu", threads=2) as m:
            m.generate(golden["text_tokens"], voice, speech_tokens=golden["speech_tokens"][1:])
            assert cosines(m.output("t3_logits"), golden["t3_logits"]).min() >= t3_floor, kind
            m.decode(golden["flow_tokens"], noise=golden["flow_noise"], noise_scale=0)
            assert cosines(m.output("mel"), golden["flow_mel"].T).min() >= mel_floor, kind
        path.unlink()


def test_the_converter_refuses_what_is_not_the_official_file(checkpoint, tmp_path):
    with pytest.raises(convert.ConversionError, match="has no 't3_turbo_v1.safetensors'"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "t3_turbo_v1.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(convert.ConversionError, match="has no 've.safetensors'"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "ve.safetensors").symlink_to(checkpoint / "ve.safetensors")
    (tmp_path / "t3_turbo_v1.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(convert.ConversionError, match="not a safetensors file|lacks tensor"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "t3_turbo_v1.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(convert.ConversionError, match="lacks tensor 'tfmr.wpe.weight'"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "t3_turbo_v1.safetensors").unlink()
    (tmp_path / "t3_turbo_v1.safetensors").symlink_to(checkpoint / "t3_turbo_v1.safetensors")
    with pytest.raises(convert.ConversionError, match="has no text tokenizer"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordPiece"}}')
    with pytest.raises(convert.ConversionError, match="not a byte-level BPE tokenizer"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer.json").symlink_to(checkpoint / "tokenizer.json")
    with pytest.raises(convert.ConversionError, match="has no 's3gen_meanflow.safetensors'"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    with pytest.raises(convert.ConversionError, match="variant 'nano'"):
        convert.convert(checkpoint, tmp_path / "x.gguf", variant="nano")
    with pytest.raises(convert.ConversionError, match="has no 't3_mtl23ls_v2.safetensors'"):
        convert.convert(checkpoint, tmp_path / "x.gguf", variant="multilingual")
    assert not (tmp_path / "x.gguf").exists()


def test_a_damaged_or_wrong_model_file_is_refused(turbo_f32, tmp_path, joe_path):
    cut = tmp_path / "cut.gguf"
    with open(turbo_f32, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(50 << 20))
    with pytest.raises(ModelFileError):
        ChatterboxModel.open(cut, device="cpu")
    with pytest.raises(ModelFileError, match="piper model, not Chatterbox"):
        ChatterboxModel.open(joe_path, device="cpu")


def test_the_kept_conditioning_gives_what_a_fresh_context_gives(turbo_f32, golden, voice):
    text = golden["text_tokens"][:10]
    other = Conditionals(-voice.speaker_embedding, voice.prompt_tokens[:100])
    with ChatterboxModel.open(turbo_f32, device="cpu", threads=2) as m:
        first = m.generate(text, voice, max_tokens=12, temperature=0)
        m.generate(text[:3], other, max_tokens=30, temperature=0)
        # The same voice twice in a row: the second call starts after the kept conditioning.
        m.generate(text[:5], voice, max_tokens=2, temperature=0)
        again = m.generate(text, voice, max_tokens=12, temperature=0)
    with ChatterboxModel.open(turbo_f32, device="cpu", threads=2) as m:
        fresh_other = m.generate(text[:3], other, max_tokens=30, temperature=0)
    np.testing.assert_array_equal(again, first)
    with ChatterboxModel.open(turbo_f32, device="cpu", threads=2) as m:
        m.generate(text, voice, max_tokens=12, temperature=0)
        np.testing.assert_array_equal(m.generate(text[:3], other, max_tokens=30, temperature=0), fresh_other)


def _gguf(path: Path, variant: str, **u32) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "chatterbox")
    w.add_string("chatterbox.variant", variant)
    w.add_uint32("chatterbox.sample_rate", 24000)
    w.add_string("chatterbox.t3.backbone", "gpt2")
    w.add_float32("chatterbox.t3.norm_eps", 1e-5)
    for k, v in u32.items():
        w.add_uint32("chatterbox.t3." + k, v)
    w.add_tensor("t3.pos_emb", np.zeros((16, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_model_of_another_variant_or_missing_tensors_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match="'chatterbox.variant' is 'nano'; this engine runs: turbo, multilingual"):
        ChatterboxModel.open(_gguf(tmp_path / "m.gguf", "nano"), device="cpu")
    hp = dict(n_layer=1, n_embd=64, n_head=1, n_positions=16, text_vocab=10, speech_vocab=6563)
    hp |= dict(start_speech=6561, stop_speech=6562, speaker_embed_size=4, prompt_tokens=4)
    with pytest.raises(ModelFileError, match="t3.text_emb"):
        ChatterboxModel.open(_gguf(tmp_path / "t.gguf", "turbo", **hp), device="cpu")
    with pytest.raises(ModelFileError, match="n_head"):
        ChatterboxModel.open(_gguf(tmp_path / "h.gguf", "turbo", **(hp | {"n_head": 3})), device="cpu")


def test_punctuation_is_normalized_as_the_reference_does(golden):
    for text, want in zip(golden["punc_in"], golden["punc_out"], strict=True):
        assert normalize_punctuation(str(text)) == str(want)


def test_the_tokenizer_gives_the_reference_tokenizers_ids(t3, golden):
    want = np.split(golden["text_ids"], np.flatnonzero(golden["text_ids"] == -1) + 1)[:-1]
    for text, ids in zip(golden["text_in"], want, strict=True):
        assert t3.tokenizer.encode(str(text)) == ids[:-1].tolist(), text


def test_long_text_is_cut_into_chunks_the_token_model_takes(t3, golden, voice):
    sentences = (Path(__file__).parent / "data" / "script.txt").read_text().split("\n")
    text = " ".join(s for s in sentences if s)
    text = (text + " ") * (50_000 // len(text) + 1)
    chunks = t3.text_chunks(text[:50_000])
    assert len(chunks) > 100
    assert all(0 < len(c) <= 120 for c in chunks)
    assert max(len(c) for c in chunks) > 20
    one = t3.text_chunks("[laugh] That's funny… isn't it")
    assert len(one) == 1 and one[0][0] == t3.tokenizer.encode("[laugh]")[0]
    assert len(t3.generate(one[0], voice, max_tokens=3, temperature=0)) == 3
    for empty in ("", "   ", "... !? ,"):
        with pytest.raises(NothingToSpeakError):
            t3.text_chunks(empty)


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Log power in 80 bands of 1024-sample frames every 256 samples (a comparison's view)."""
    frames = np.lib.stride_tricks.sliding_window_view(np.pad(audio, 512), 1024)[::256] * np.hanning(1024)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    bands = np.array_split(np.arange(power.shape[1]), 80)
    return np.log(np.stack([power[:, b].sum(1) for b in bands], 1) + 1e-10)


@pytest.mark.parametrize("given_f0", [False, True])
def test_the_vocoder_matches_the_reference(t3, golden, given_f0):
    f0 = golden["hift_f0_in"] if given_f0 else None
    audio = t3.vocode(golden["hift_mel"], f0=f0, noise_scale=0)
    ref = golden["hift_audio_f0" if given_f0 else "hift_audio"]
    assert audio.shape == ref.shape == (40 * 480,)
    # The residual blocks' convolutions in 16-bit integers where the CPU has them (the float
    # kernels' exact match is the next test's): within their quantization error.
    assert np.abs(audio - ref).max() <= 3e-3 * np.abs(ref).max()
    assert abs(np.sqrt(np.mean(audio**2) / np.mean(ref**2)) - 1) <= 1e-3
    a, b = log_mel(audio).ravel(), log_mel(ref).ravel()
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.99999
    source = t3.output("source")[:, 0]
    np.testing.assert_allclose(source, golden["hift_source_f0" if given_f0 else "hift_source"], atol=1e-5)
    if not given_f0:
        np.testing.assert_allclose(t3.output("f0")[:, 0], golden["hift_f0"], rtol=1e-4, atol=1e-5)
    assert t3.timings()["stages_ms"]["generator"] > 0


def test_the_vocoders_float_kernels_match_the_reference(turbo_f32, golden):
    with ChatterboxModel.open(turbo_f32, device="cpu", threads=2, debug=EngineDebug(int16_kernels=False)) as model:
        audio = model.vocode(golden["hift_mel"], noise_scale=0)
    ref = golden["hift_audio"]
    assert np.abs(audio - ref).max() <= 1e-4 * np.abs(ref).max()


def test_the_vocoder_noise_follows_the_seed(t3, golden):
    mel, f0 = golden["hift_mel"], golden["hift_f0_in"]
    a = t3.vocode(mel, f0=f0, seed=1)
    b = t3.vocode(mel, f0=f0, seed=1)
    c = t3.vocode(mel, f0=f0, seed=2)
    quiet = t3.vocode(mel, f0=f0, noise_scale=0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert 0 < np.abs(a - quiet).max() < 0.5


def test_the_vocoder_refuses_bad_mels_and_can_be_cancelled(t3, golden):
    mel = golden["hift_mel"]
    with pytest.raises(InvalidArgumentError, match="80 bands"):
        t3.vocode(mel.T)
    with pytest.raises(InvalidArgumentError, match="no mel frames"):
        t3.vocode(np.zeros((80, 0), np.float32))
    bad = mel.copy()
    bad[3, 7] = np.nan
    with pytest.raises(InvalidArgumentError, match="NaN"):
        t3.vocode(bad)
    with pytest.raises(InvalidArgumentError, match="39 F0 values for 40 frames"):
        t3.vocode(mel, f0=np.zeros(39))
    with pytest.raises(InvalidArgumentError, match="F0 value 3 is not from 0 to half the sample rate"):
        t3.vocode(mel, f0=np.where(np.arange(40) == 3, np.nan, 100.0))
    with pytest.raises(CancelledError):
        t3.vocode(mel, cancelled=lambda: True)
    assert t3.vocode(mel[:, :2], noise_scale=0).shape == (960,)


def test_the_stock_voice_is_the_checkpoints_conds(t3, golden):
    from app.models import torch_checkpoint

    conds = torch_checkpoint.load(GOLDEN.parent / "conds.pt")["t3"]
    voice = Conditionals(conds["speaker_emb"], conds["cond_prompt_speech_tokens"])
    text = golden["text_tokens"][:8]
    stock = t3.generate(text, max_tokens=10, temperature=0)
    np.testing.assert_array_equal(stock, t3.generate(text, voice, max_tokens=10, temperature=0))
    assert not np.array_equal(
        stock, t3.generate(text, Conditionals(golden["speaker_emb"], []), max_tokens=10, temperature=0)
    )


def test_a_damaged_conds_file_is_refused(checkpoint, tmp_path):
    for f in ("t3_turbo_v1.safetensors", "ve.safetensors", "s3gen_meanflow.safetensors", "tokenizer.json"):
        (tmp_path / f).symlink_to(checkpoint / f)
    (tmp_path / "conds.pt").write_bytes((GOLDEN.parent / "conds.pt").read_bytes()[:2000])
    with pytest.raises(convert.ConversionError, match="holds no Chatterbox conditionals"):
        convert.convert(tmp_path, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_a_zip_checkpoint_cannot_run_code(tmp_path):
    import io
    import pickle
    import zipfile

    from app.models import torch_checkpoint

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("conds/data.pkl", pickle.dumps({"t3": Evil()}, protocol=2))
        z.writestr("conds/byteorder", "little")
    (tmp_path / "conds.pt").write_bytes(buffer.getvalue())
    with pytest.raises(torch_checkpoint.CheckpointError, match="needs posix.system|needs os.system"):
        torch_checkpoint.load(tmp_path / "conds.pt")


def stock_conditionals() -> Conditionals:
    """conds.pt's voice, both parts, as a profile would hold it."""
    from app.models import torch_checkpoint

    conds = torch_checkpoint.load(GOLDEN.parent / "conds.pt")
    t3, gen = conds["t3"], conds["gen"]
    return Conditionals(
        t3["speaker_emb"],
        t3["cond_prompt_speech_tokens"],
        gen["prompt_token"],
        np.asarray(gen["prompt_feat"])[0].T,
        gen["embedding"],
    )


def test_the_flow_matches_the_reference_stage_by_stage(t3, golden):
    from app.audio.dsp import log_mel_cosine

    stages = []
    audio = t3.decode(
        golden["flow_tokens"], noise=golden["flow_noise"], noise_scale=0, on_stage=lambda *a: stages.append(a[0])
    )
    mu = t3.output("flow_mu")
    assert mu.shape == golden["flow_mu"].T.shape == (180, 80)  # the prompt's 100 frames, then the tokens' 80
    assert cosines(mu, golden["flow_mu"].T).min() >= 0.999
    # On these drawn weights attention is nearly uniform, so cosines barely feel the relative
    # positions; the values do (a shift off by its offset moves mu by 3e-3).
    assert np.abs(mu - golden["flow_mu"].T).max() <= 1e-4 * np.abs(golden["flow_mu"]).max()
    for step in (0, 1):  # each mean-flow step given the same state
        assert cosines(t3.output(f"flow_v.{step}"), golden[f"flow_v.{step}"].T).min() >= 0.999
    mel = t3.output("mel")
    assert mel.shape == (80, 80)
    assert cosines(mel, golden["flow_mel"].T).min() >= 0.999
    ref = golden["s3gen_audio"]
    assert audio.shape == ref.shape == (80 * 480,)
    assert log_mel_cosine(audio, ref, 24000) >= 0.995
    assert np.abs(audio - ref).max() <= 1e-3 * np.abs(ref).max()
    np.testing.assert_array_equal(audio[:480], 0.0)  # the fade-in: 20 ms of silence first
    assert stages == ["encoder", "flow", "generator"]


def test_a_voice_given_as_conditionals_speaks_as_the_stock_voice(t3, golden, tmp_path):
    voice = stock_conditionals()
    voice.save(tmp_path / "voice.npz")
    again = Conditionals.load(tmp_path / "voice.npz")
    assert again.speaks and again.prompt_mel.shape == (80, 100)
    tokens, noise = golden["flow_tokens"], golden["flow_noise"]
    stock = t3.decode(tokens, noise=noise, noise_scale=0)
    np.testing.assert_array_equal(t3.decode(tokens, again, noise=noise, noise_scale=0), stock)
    # Another voice: another x-vector, or no prompt at all.
    other = Conditionals(
        voice.speaker_embedding,
        voice.prompt_tokens,
        voice.gen_prompt_tokens,
        voice.prompt_mel,
        voice.xvector[::-1].copy(),
    )
    assert not np.allclose(t3.decode(tokens, other, noise=noise, noise_scale=0), stock, atol=1e-4)
    bare = Conditionals(voice.speaker_embedding, voice.prompt_tokens, [], np.zeros((80, 0)), voice.xvector)
    assert t3.decode(tokens, bare, noise_scale=0).shape == stock.shape


def test_the_flow_noise_follows_the_seed(t3, golden):
    tokens = golden["flow_tokens"][:12]
    a, b = t3.decode(tokens, seed=3, noise_scale=0), t3.decode(tokens, seed=3, noise_scale=0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, t3.decode(tokens, seed=4, noise_scale=0))


def test_decoding_refuses_bad_input_and_can_be_cancelled(t3, golden):
    tokens = golden["flow_tokens"]
    with pytest.raises(InvalidArgumentError, match="speech token 6561 is not one of the flow's 0 to 6560"):
        t3.decode(np.append(tokens, 6561))
    with pytest.raises(NothingToSpeakError):
        t3.decode(np.zeros(0, np.int32))
    voice = stock_conditionals()
    odd = Conditionals(
        voice.speaker_embedding, voice.prompt_tokens, voice.gen_prompt_tokens[:40], voice.prompt_mel, voice.xvector
    )
    with pytest.raises(InvalidArgumentError, match="100 frames for 40 prompt tokens"):
        t3.decode(tokens, odd)
    short = Conditionals(
        voice.speaker_embedding, voice.prompt_tokens, voice.gen_prompt_tokens, voice.prompt_mel, voice.xvector[:100]
    )
    with pytest.raises(InvalidArgumentError, match="x-vector has 100 values; the model takes 192"):
        t3.decode(tokens, short)
    with pytest.raises(InvalidArgumentError, match="lack S3Gen's part"):
        t3.decode(tokens, Conditionals(voice.speaker_embedding, voice.prompt_tokens))
    with pytest.raises(InvalidArgumentError, match="flow noise of 14320 values; 180 frames of 80 take 14400"):
        t3.decode(tokens, noise=np.zeros((80, 179)))
    # Cancelled between the encoder and the flow's steps, and within the vocoder.
    done = []
    with pytest.raises(CancelledError):
        t3.decode(tokens, on_stage=lambda *a: done.append(a[0]), cancelled=lambda: bool(done))
    assert done == ["encoder"]


def test_text_is_spoken_chunk_by_chunk(t3):
    chunks = []
    audio, timings = t3.synthesize("Hello there. Fine!", seed=2, on_chunk=lambda i, a: chunks.append((i, a.size)))
    assert [i for i, _ in chunks] == [0, 1] and timings["n_chunks"] == 2
    assert audio.size == sum(n for _, n in chunks) and np.all(np.isfinite(audio))
    assert set(timings["stages_ms"]) == {"tokens", "encoder", "flow", "generator"}
    assert 0 < timings["first_audio_ms"] <= timings["total_ms"]
    # Random weights rarely draw the stop token: each run ends at its guard, about three times
    # a normal speaking length (4 text tokens: 50 + 16 x 4 speech tokens at most).
    assert timings["n_tokens"] <= 2 * (50 + 16 * 4)
    # (The same text and seed give the same audio: test_several_runs_at_once_draw_what_each_draws_alone.)
    with pytest.raises(NothingToSpeakError):
        t3.synthesize("  ")


def test_speaking_in_one_call_is_generate_then_decode(t3):
    """speak without streaming: the tokens generate draws, those S3Gen lacks dropped and three
    silent ones appended, then decode, to the sample (in the stock voice)."""
    ids = t3.text_chunks("Hello there.")[0]
    tokens = t3.generate(ids, max_tokens=60, seed=4)
    # Those past S3Gen's vocabulary (6561 codes) dropped, three of its S3GEN_SIL (4299) appended.
    speech = np.concatenate([tokens[tokens < 6561], np.full(3, 4299)])
    want = t3.decode(speech, seed=4)
    stages = []
    audio, drawn = t3.speak(ids, max_tokens=60, seed=4, on_stage=lambda s, c, ms: stages.append(s))
    assert drawn == tokens.size
    np.testing.assert_array_equal(audio, want)
    assert stages == ["tokens", "encoder", "flow", "generator"]


def test_streamed_speech_comes_in_pieces_while_the_tokens_are_drawn(t3):
    """stream_tokens: S3Gen runs on the tokens drawn so far, its pieces out before the token
    model's run ends; together as long as the one-shot audio, with no seam where they meet."""
    from app.audio.dsp import log_mel_cosine

    ids = t3.text_chunks("Hello there, this is one sentence spoken in pieces.")[0]
    whole, n = t3.speak(ids, max_tokens=90, seed=5)
    events = []
    audio, drawn = t3.speak(
        ids, max_tokens=90, seed=5, stream_tokens=15,
        on_piece=lambda k, a: events.append(("piece", k, a.copy())),
        on_stage=lambda s, c, ms: events.append(("stage", s, None)),
    )  # fmt: skip
    pieces = [a for kind, _, a in events if kind == "piece"]
    assert [k for kind, k, _ in events if kind == "piece"] == list(range(len(pieces)))
    # S3Gen ran after 15 and 45 tokens of 90 (the second run on twice as many more), and at the
    # end: a piece each, the last frames of a run held back for the run after it.
    assert len(pieces) == 3 and drawn == n == 90
    # The first pieces came while the tokens were being drawn: before the token stage's end.
    assert events.index(("stage", "tokens", None)) > [e[0] for e in events].index("piece")
    np.testing.assert_array_equal(np.concatenate(pieces), audio)
    assert audio.size == whole.size
    assert log_mel_cosine(audio, whole, 24000) >= 0.99
    # No seam: where two pieces meet, the step between samples is no larger than the one-shot
    # audio's steps around the same place.
    for b in np.cumsum([p.size for p in pieces])[:-1]:
        assert abs(audio[b] - audio[b - 1]) <= 1.5 * np.abs(np.diff(whole[b - 240 : b + 240])).max()
    # The last run's condition: the stock voice's prompt mel, then the mel of the 25 tokens
    # before its own (their frames as the earlier runs made them), then nothing.
    from app.models import torch_checkpoint

    gen = torch_checkpoint.load(GOLDEN.parent / "conds.pt")["gen"]
    lead = 2 * np.asarray(gen["prompt_token"]).size
    cond, mel = t3.output("flow_cond"), t3.output("mel")
    np.testing.assert_array_equal(cond[:lead], np.asarray(gen["prompt_feat"], np.float32)[0, :lead])
    new = len(cond) - lead - 50
    np.testing.assert_array_equal(cond[lead : lead + 50], mel[len(mel) - new - 50 : len(mel) - new])
    assert np.abs(cond[lead : lead + 50]).max(axis=1).min() > 0 and not cond[lead + 50 :].any()
    # The same seed, the same pieces.
    again, _ = t3.speak(ids, max_tokens=90, seed=5, stream_tokens=15)
    np.testing.assert_array_equal(again, audio)


def test_several_runs_at_once_draw_what_each_draws_alone(t3):
    """speak_many: the token model's steps for three texts of different lengths in one graph a
    step; each run's tokens are those it draws alone with its seed, and its audio S3Gen's of them."""
    texts = [t3.text_chunks(t)[0] for t in ("Hello there.", "A longer sentence than the first one.", "Fine!")]
    runs = list(zip(texts, (40, 25, 33), (7, 8, 9), strict=True))
    alone = [t3.speak(ids, max_tokens=limit, seed=seed) for ids, limit, seed in runs]
    heard = []
    together = t3.speak_many(texts, max_tokens=[40, 25, 33], seeds=[7, 8, 9], on_audio=lambda i, a: heard.append(i))
    assert [n for _, n in together] == [n for _, n in alone] == [40, 25, 33]
    for (audio, _), (want, _) in zip(together, alone, strict=True):
        np.testing.assert_array_equal(audio, want)
    assert heard == [0, 1, 2]
    timings = t3.timings()
    assert timings["chunks"] == 3 and timings["stages_ms"]["tokens"] > 0
    # synthesize in batches of two: the same audio as one chunk at a time.
    text = "Hello there. Fine! One more."
    one, t1 = t3.synthesize(text, seed=3)
    two, t2 = t3.synthesize(text, seed=3, batch=2)
    np.testing.assert_array_equal(one, two)
    assert t1["n_tokens"] == t2["n_tokens"] and t2["n_chunks"] == 3


def test_streaming_refuses_bad_input_and_can_be_cancelled(t3, voice):
    ids = t3.text_chunks("Hello there.")[0]
    with pytest.raises(InvalidArgumentError, match="stream_tokens must be 0"):
        t3.speak(ids, stream_tokens=-1)
    with pytest.raises(InvalidArgumentError, match="lack S3Gen's part"):
        t3.speak(ids, Conditionals(voice.speaker_embedding, voice.prompt_tokens))
    pieces = []
    with pytest.raises(CancelledError):
        t3.speak(ids, max_tokens=80, stream_tokens=15, on_piece=lambda k, a: pieces.append(k),
                 cancelled=lambda: bool(pieces))  # fmt: skip
    assert pieces == [0]  # cancelled inside the token run, after its first piece
    # The context speaks on afterwards.
    audio, _ = t3.speak(ids, max_tokens=20, seed=1)
    assert audio.size > 0 and np.all(np.isfinite(audio))


def test_the_cli_installs_lists_speaks_and_benches_chatterbox(checkpoint, tmp_path, home_cli):
    import json

    import soundfile

    run = home_cli

    def listed():
        return {v["id"]: v for v in json.loads(run("voices", "--json").stdout)}["chatterbox-turbo:default"]

    assert listed()["installed"] is False
    refused = run("synth", "--voice", "chatterbox-turbo:default", "--text", "Hi.", "--out", "x.wav", check=False)
    assert refused.returncode == 1 and "models install chatterbox-turbo --from" in refused.stderr
    bare = run("models", "install", "chatterbox-turbo", check=False)
    assert bare.returncode == 1 and "give --from <folder>" in bare.stderr
    run("models", "install", "chatterbox-turbo", "--from", str(checkpoint), "--weights", "f16")
    info = listed()
    assert info["installed"] and info["family"] == "chatterbox" and info["sample_rate"] == 24000

    out = tmp_path / "hi.wav"
    run("synth", "--voice", "chatterbox-turbo:default", "--text", "Hi.", "--out", str(out), "--threads", "2")
    assert soundfile.info(str(out)).samplerate == 24000 and soundfile.info(str(out)).frames > 24000 * 0.5
    stock, _ = soundfile.read(out, dtype="float32")
    speed = run("synth", "--voice", "chatterbox-turbo:default", "--text", "Hi.", "--out", str(out), "--speed", "2",
                check=False)  # fmt: skip
    assert speed.returncode == 1 and "its own pace" in speed.stderr

    # Benched streamed: each stage timed, the first audio before the whole (a run of at most
    # 50 + 16 x 2 tokens).
    (tmp_path / "lines.txt").write_text("Hi.\n")
    run("bench", "--voice", "chatterbox-turbo:default", "--text-file", str(tmp_path / "lines.txt"), "--runs", "1",
        "--warmup", "0", "--threads", "2", "--stream-tokens", "20",
        "--json-out", str(tmp_path / "stream.json"))  # fmt: skip
    report = json.loads((tmp_path / "stream.json").read_text())
    item = report["items"][0]
    assert list(item["stages_ms"]) == ["tokens", "encoder", "flow", "generator"] and min(item["stages_ms"].values()) > 0
    assert report["total_audio_s"] > 0.5
    assert 0 < item["first_audio_ms"] < item["compute_ms"]

    # A clone: a profile of a recording's conditionals, spoken by the installed model.
    joe, rate = soundfile.read(Path(__file__).parent / "data" / "speaker" / "piper_joe.flac", dtype="float32")
    short = tmp_path / "short.flac"
    soundfile.write(short, joe, rate)
    refused = run("profile", "create", "--audio", str(short), "--name", "Joe", "--no-evaluate", check=False)
    assert refused.returncode == 1 and "needs more than 5 s" in refused.stderr
    me = tmp_path / "me.flac"
    soundfile.write(me, np.concatenate([joe, np.zeros(rate // 4, np.float32), joe]), rate)
    refused = run("profile", "create", "--audio", str(me), "--audio", str(me), "--name", "Joe", "--family", "kokoro",
                  check=False)  # fmt: skip
    assert refused.returncode == 1 and "style search takes one recording" in refused.stderr
    made = run("profile", "create", "--audio", str(me), "--name", "Joe", "--no-evaluate", "--threads", "2")
    assert "profile:Joe: a clone for chatterbox-turbo" in made.stdout
    listed = {r["id"]: r for r in json.loads(run("profile", "list", "--json").stdout)}["profile:Joe"]
    assert listed["family"] == "chatterbox" and listed["model"] == "chatterbox-turbo"
    voice = {v["id"]: v for v in json.loads(run("voices", "--json").stdout)}["profile:Joe"]
    assert voice["family"] == "chatterbox" and voice["installed"]
    run("synth", "--voice", "profile:Joe", "--text", "Hi.", "--out", str(out), "--threads", "2")
    cloned, _ = soundfile.read(out, dtype="float32")
    assert cloned.size > 0 and (cloned.size != stock.size or not np.array_equal(cloned, stock))
    # A recording re-voiced into the clone by S3Gen alone (25 tokens a second, 960 samples a token).
    run("revoice", "--audio", str(short), "--voice", "profile:Joe", "--out", str(out), "--threads", "2")
    revoiced = soundfile.info(str(out))
    assert revoiced.samplerate == 24000 and abs(revoiced.frames / 24000 - joe.size / rate) < 0.2
    refused = run("revoice", "--audio", str(short), "--voice", "piper:joe", "--out", str(out), check=False)
    assert refused.returncode == 1 and "re-voicing takes a Chatterbox voice" in refused.stderr
    # Exported and imported, the clone's files travel whole.
    run("profile", "export", "Joe", "--out", str(tmp_path / "joe.vsprofile"))
    run("profile", "import", str(tmp_path / "joe.vsprofile"), "--name", "Joe again")
    again = {r["id"]: r for r in json.loads(run("profile", "list", "--json").stdout)}["profile:Joe again"]
    assert again["family"] == "chatterbox"


def test_revoicing_speaks_a_recording_in_another_voice_through_s3gen_alone(t3, golden):
    """ChatterboxVC's path: the recording's speech tokens through S3Gen in a voice."""
    import soundfile as sf

    wav, rate = sf.read(Path(__file__).parent / "data" / "speaker" / "piper_joe.flac", dtype="float32")
    wav = wav[: 3 * rate]
    tokens = t3.speech_tokens(wav)
    stock = t3.revoice(wav, rate, seed=2)
    np.testing.assert_array_equal(stock, t3.decode(tokens, seed=2))
    assert stock.size == tokens.size * 2 * 480  # two mel frames a token, 480 samples a frame
    voice = Conditionals(*(golden[f"conds.{k}"] for k in
                           ("speaker_emb", "prompt_tokens", "gen_prompt_tokens", "prompt_mel", "xvector")))  # fmt: skip
    other = t3.revoice(wav, rate, voice, seed=2)
    # (a prompt of an odd number of frames overlays one: a frame less)
    assert 0 <= stock.size - other.size <= 480 and not np.array_equal(other[:1000], stock[:1000])
    # A piece at a time (30 s by default): each piece's tokens through S3Gen, from seed + k.
    pieces = []
    whole = t3.revoice(wav, rate, voice, seed=2, piece_s=1, on_chunk=lambda k, a: pieces.append(a))
    assert len(pieces) == 3 and np.array_equal(np.concatenate(pieces), whole)
    np.testing.assert_array_equal(pieces[1], t3.decode(t3.speech_tokens(wav[rate : 2 * rate]), voice, seed=3))
    for bad in (np.zeros(0, np.float32), np.full(1600, np.nan, np.float32)):
        with pytest.raises(InvalidArgumentError, match="no audio to re-voice"):
            t3.revoice(bad, rate)
    with pytest.raises(InvalidArgumentError, match="at most 600 s"):
        t3.revoice(np.zeros(8000 * 601, np.float32), 8000)


def test_the_studios_revoice_job_gives_the_engines_revoiced_take(t3, turbo_f32):
    """Synthesize › Re-voice current take runs a SynthesisJob of kind "revoice" on the project's
    engine: its take is the recording through S3Gen in the engine's voice."""
    import soundfile as sf

    from app.engine.engine import Engine
    from app.jobs.workers import SynthesisJob

    wav, rate = sf.read(Path(__file__).parent / "data" / "speaker" / "piper_joe.flac", dtype="float32")
    wav = wav[: 2 * rate]
    with Engine.open("chatterbox-turbo:default", model_path=turbo_f32, device="cpu", threads=2) as engine:
        job = SynthesisJob(engine, [(3, "Hello there.")], kind="revoice", source=(wav, rate), seed=2)
        done, pieces = [], []
        job.signals.sentence_done.connect(lambda index, take: done.append((index, take)))
        job.signals.chunk.connect(lambda index, audio: pieces.append(index))
        job.run()
    assert job.state == "done" and [index for index, _ in done] == [3] and pieces == [3]
    take = done[0][1]
    assert take.sample_rate == 24000 and take.timings["stages_ms"]["flow"] > 0
    np.testing.assert_array_equal(take.audio, t3.revoice(wav, rate, seed=2))


@pytest.mark.parametrize("clip", ["kokoro_jf_alpha", "kokoro_jm_kumo", "piper_joe"])
def test_the_speech_tokenizer_matches_the_reference(t3, golden, clip):
    import soundfile as sf

    wav, rate = sf.read(Path(__file__).parent / "data" / "speaker" / f"{clip}.flac", dtype="float32")
    tokens = t3.speech_tokens(wav)
    mel, ref_mel = t3.output("s3tok_mel"), golden[f"s3tok_mel.{clip}"].T
    assert mel.shape == ref_mel.shape
    assert np.abs(mel - ref_mel).max() <= 1e-4
    assert cosines(t3.output("s3tok_fsq"), golden[f"s3tok_proj.{clip}"]).min() >= 0.999
    ref = golden[f"s3tok.{clip}"]
    assert tokens.shape == ref.shape
    assert (tokens == ref).mean() >= 0.99
    assert [s for s, ms in t3.timings()["stages_ms"].items() if ms > 0] == ["mel", "encoder"]
    np.testing.assert_array_equal(t3.speech_tokens(wav, max_tokens=10), tokens[:10])


def test_the_speech_tokenizer_refuses_what_it_cannot_read(t3):
    with pytest.raises(InvalidArgumentError, match="no audio"):
        t3.speech_tokens(np.zeros(0, np.float32))
    with pytest.raises(InvalidArgumentError, match="too short for the speech tokenizer"):
        t3.speech_tokens(np.zeros(300, np.float32))
    with pytest.raises(InvalidArgumentError, match="NaN"):
        t3.speech_tokens(np.full(16000, np.nan, np.float32))
    with pytest.raises(InvalidArgumentError, match="at most 60 s"):
        t3.speech_tokens(np.zeros(16000 * 61, np.float32))


@pytest.mark.parametrize("clip", ["kokoro_jf_alpha", "kokoro_jm_kumo", "piper_joe"])
def test_the_xvector_matches_the_reference(t3, golden, clip):
    import soundfile as sf

    wav, _ = sf.read(Path(__file__).parent / "data" / "speaker" / f"{clip}.flac", dtype="float32")
    x = t3.xvector(wav)
    fbank, ref = t3.output("xvec_fbank"), golden[f"fbank.{clip}"]
    assert fbank.shape == ref.shape and np.abs(fbank - ref).max() <= 1e-3
    assert x.shape == (192,) and float(cosines(x[None], golden[f"xvector.{clip}"][None])[0]) >= 0.999
    assert [s for s, ms in t3.timings()["stages_ms"].items() if ms > 0] == ["mel", "speaker"]


def test_the_prompt_mel_matches_the_reference(t3, golden):
    mel = t3.prompt_mel(golden["prompt_wav"])
    assert mel.shape == golden["prompt_mel"].shape == (80, 150)
    assert np.abs(mel - golden["prompt_mel"]).max() <= 1e-3


def test_conditionals_from_a_recording_follow_the_reference_and_speak(t3, golden):
    import soundfile as sf

    speaker = Path(__file__).parent / "data" / "speaker"
    wav = np.concatenate([sf.read(speaker / f"{c}.flac", dtype="float32")[0] for c in ("kokoro_jf_alpha", "piper_joe")])
    voice = t3.conditionals(wav, 16000)
    # Each stage matches the reference on the same input; end to end the resamplers differ (the
    # reference's librosa/soxr and torchaudio against ours), which the embeddings barely feel
    # and the speech codes of these drawn weights (their projections near the rounding edges)
    # feel more.
    assert float(voice.speaker_embedding @ golden["conds.speaker_emb"]) >= 0.999
    assert float(cosines(voice.xvector[None], golden["conds.xvector"][None])[0]) >= 0.999
    assert voice.prompt_mel.shape == golden["conds.prompt_mel"].shape == (80, 423)
    assert cosines(voice.prompt_mel.T, golden["conds.prompt_mel"].T).min() >= 0.99
    for name in ("prompt_tokens", "gen_prompt_tokens"):
        ours, ref = getattr(voice, name), golden[f"conds.{name}"]
        assert ours.shape == ref.shape and (ours == ref).mean() >= 0.7, name
    audio = t3.decode(golden["flow_tokens"][:10], voice, seed=1)
    # The prompt's mel holds one frame more than two a token, which the reference takes from
    # the new ones: 19 frames of 480 samples.
    assert audio.shape == ((2 * 10 - 1) * 480,) and np.all(np.isfinite(audio))
    with pytest.raises(InvalidArgumentError, match=r"the recording is 4\.2 s; a voice needs more than 5 s"):
        t3.conditionals(wav[: int(4.2 * 16000)], 16000)
    with pytest.raises(InvalidArgumentError, match="the recording is silent"):
        t3.conditionals(np.zeros(16000 * 6, np.float32), 16000)
    with pytest.raises(InvalidArgumentError, match="sample rate"):
        t3.conditionals(wav, 100)
    # Several recordings of a speaker: the prompts this one's, the speaker embedding the mean of
    # every recording's voice-encoder embedding (each held to the same checks).
    other = np.concatenate(
        [sf.read(speaker / f"{c}.flac", dtype="float32")[0] for c in ("kokoro_jm_kumo", "piper_joe")]
    )
    both = t3.conditionals(wav, 16000, more=[(other, 16000)])
    for part in ("prompt_tokens", "gen_prompt_tokens", "prompt_mel", "xvector"):
        np.testing.assert_array_equal(getattr(both, part), getattr(voice, part))
    alone = t3.conditionals(other, 16000).speaker_embedding
    mean = (voice.speaker_embedding + alone) / 2
    np.testing.assert_allclose(both.speaker_embedding, mean / np.linalg.norm(mean), atol=1e-6)
    assert not np.array_equal(both.speaker_embedding, voice.speaker_embedding)
    with pytest.raises(InvalidArgumentError, match="the recording is silent"):
        t3.conditionals(wav, 16000, more=[(np.zeros(16000 * 6, np.float32), 16000)])


def test_text_tokens_to_audio_match_the_reference_end_to_end(t3, golden):
    """generate's path after the text: the reference's draws replaced by the most likely token and
    its noise by the same noise, T3 then S3Gen agree with the reference's chain."""
    from app.audio.dsp import log_mel_cosine

    stock = stock_conditionals()
    voice = Conditionals(golden["speaker_emb"], golden["prompt_tokens"], stock.gen_prompt_tokens, stock.prompt_mel,
                         stock.xvector)  # fmt: skip
    tokens = t3.generate(golden["text_tokens"], voice, max_tokens=200, temperature=0)
    # Those past S3Gen's vocabulary (6561 codes) dropped, three of its S3GEN_SIL (4299) appended.
    speech = np.concatenate([tokens[tokens < 6561], np.full(3, 4299)])
    np.testing.assert_array_equal(speech, golden["e2e_speech"])
    audio = t3.decode(speech, voice, noise=golden["e2e_noise"], noise_scale=0)
    assert audio.shape == golden["e2e_audio"].shape
    assert log_mel_cosine(audio, golden["e2e_audio"], 24000) >= 0.99
