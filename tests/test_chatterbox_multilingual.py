"""Chatterbox Multilingual in the engine against the reference implementation: its token model
(Llama blocks with rotary positions, the perceiver over the prompt, the emotion projection,
classifier-free guidance as a batch of two, min-p, the alignment guard) and S3Gen's 10-step
guided flow.

The weights are the official checkpoint's layout and shapes, drawn by tools/chatterbox/weights.py;
the golden values come from the reference's own modules on the same weights
(tools/chatterbox/golden.py --stages mtl_t3 mtl_flow, run once in a separate environment)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.engine import chatterbox_text as mtl
from app.engine.chatterbox import ChatterboxModel, Conditionals
from app.engine.engine import EngineDebug
from app.engine.errors import InvalidArgumentError
from app.models.convert import chatterbox as convert
from tools.chatterbox import weights

DATA = Path(__file__).parent / "data" / "chatterbox"
CACHE = Path(os.environ.get("VS_TEST_CACHE", Path(__file__).resolve().parents[1] / "build" / "test-models"))


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(DATA / "golden_multilingual.npz"))


@pytest.fixture(scope="module")
def checkpoint():
    """Chatterbox Multilingual's official files, drawn from the layout (kept between runs)."""
    weights.write(CACHE / "chatterbox", weights.MULTILINGUAL)
    folder = CACHE / "chatterbox" / "multilingual"
    shutil.copyfile(DATA / "conds_multilingual.pt", folder / "conds.pt")  # the stock voice
    return folder


@pytest.fixture(scope="module")
def model(checkpoint, tmp_path_factory):
    path = convert.convert(
        checkpoint, tmp_path_factory.mktemp("mtl") / "mtl-f32.gguf", variant="multilingual", weights="f32"
    )
    # The token model's steps in graphs kept from step to step, as on CUDA: each step attends to
    # its positions rounded up to 256, the rest masked; the alignment the guard reads is their
    # attention, which sees any position the mask lets in or keeps out.
    with ChatterboxModel.open(path, device="cpu", threads=2, debug=EngineDebug(keep_graphs=True)) as m:
        yield m


@pytest.fixture(scope="module")
def voice(golden):
    return Conditionals(golden["mtl_speaker_emb"], golden["mtl_prompt_tokens"])


def cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def forced(model, golden, voice, **kw):
    kw = {"exaggeration": float(golden["mtl_exaggeration"]), "cfg_weight": float(golden["mtl_cfg_weight"])} | kw
    model.generate(golden["mtl_text_tokens"], voice, speech_tokens=golden["mtl_speech_tokens"], **kw)
    return model.output("t3_logits")


def test_the_guided_pair_matches_the_reference_teacher_forced(model, golden, voice):
    """Conditioning (speaker, perceiver, emotion), the text between its start and stop tokens,
    and both sequences of guidance: the conditional one and the one without text."""
    cond = forced(model, golden, voice)
    uncond = model.output("t3_logits_uncond")
    for ours, ref in ((cond, golden["mtl_t3_logits"]), (uncond, golden["mtl_t3_logits_uncond"])):
        assert ours.shape == ref.shape == (24, 8194)
        assert cosines(ours, ref).min() >= 0.999
        assert (ours.argmax(1) == ref.argmax(1)).all()
    # The two sequences differ by the text alone, which guidance weighs.
    assert cosines(cond, uncond).min() < 0.999


def test_greedy_tokens_and_the_alignment_guard_match_the_reference(model, golden, voice):
    """T3.inference with the draw replaced by the likeliest token: the guided logits, the guard's
    hold on the stop token, the repetition penalty over every token, the prefix's two start
    tokens; and the alignment the guard reads off three heads' attention over the text."""
    ref = golden["mtl_greedy_tokens"]
    tokens = model.generate(
        golden["mtl_text_tokens"],
        voice,
        max_tokens=len(ref),
        temperature=0,
        exaggeration=float(golden["mtl_exaggeration"]),
        cfg_weight=float(golden["mtl_cfg_weight"]),
    )
    ref = ref[ref != convert.STOP_SPEECH]
    np.testing.assert_array_equal(tokens, ref)
    alignment = model.output("t3_alignment")
    # A row a token fed: the prefix's two start tokens, then one a step.
    assert alignment.shape == golden["mtl_alignment"][: len(alignment)].shape == (len(ref) + 1, 23)
    np.testing.assert_allclose(alignment, golden["mtl_alignment"][: len(alignment)], atol=1e-5)


def test_without_guidance_the_conditional_sequence_runs_alone(model, golden, voice):
    guided = forced(model, golden, voice)
    alone = forced(model, golden, voice, cfg_weight=0.0)
    assert cosines(alone, guided).min() >= 0.99999
    with pytest.raises(InvalidArgumentError):
        model.output("t3_logits_uncond")


def test_exaggeration_conditions_the_tokens_and_the_cache_follows_it(model, golden, voice):
    """The emotion projection is part of the conditioning the cache keeps between calls in one
    voice: another exaggeration is computed afresh, and the first one's logits come back."""
    first = forced(model, golden, voice)
    other = forced(model, golden, voice, exaggeration=0.1)
    assert cosines(first, other).min() < 0.9999
    again = forced(model, golden, voice)
    np.testing.assert_allclose(again, first, rtol=0, atol=1e-4 * np.abs(first).max())


def test_the_guided_flow_matches_the_reference(model, golden):
    """S3Gen's 10 Euler steps over a cosine span, each velocity guided by an estimate without
    mu, speaker or prompt (rate 0.7), in the stock voice (conds_multilingual.pt)."""
    stages = []
    model.decode(
        golden["mtl_flow_tokens"],
        noise=golden["mtl_flow_noise"],
        noise_scale=0,
        on_stage=lambda name, *_: stages.append(name),
    )
    assert stages == ["encoder", "flow", "generator"]
    for step in range(10):
        ours, ref = model.output(f"flow_v.{step}"), golden[f"mtl_flow_v.{step}"].T
        assert cosines(ours, ref).min() >= 0.999, step
    mel, ref = model.output("mel"), golden["mtl_flow_mel"].T
    assert mel.shape == ref.shape
    assert cosines(mel, ref).min() >= 0.999


def test_bad_requests_are_refused_with_a_reason(model, golden, voice):
    with pytest.raises(InvalidArgumentError, match="text positions"):
        model.generate(np.ones(2049, np.int32), voice, max_tokens=4)
    with pytest.raises(InvalidArgumentError, match="cfg_weight"):
        model.generate(golden["mtl_text_tokens"], voice, cfg_weight=-1.0)
    with pytest.raises(InvalidArgumentError, match="prompt tokens"):
        model.generate(golden["mtl_text_tokens"], Conditionals(golden["mtl_speaker_emb"], np.zeros(151, np.int32)))


def test_the_converter_refuses_turbos_decoder_as_multilinguals(checkpoint, tmp_path):
    """Turbo's mean-flow S3Gen under Multilingual's file name is not taken for the 10-step one."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    for name in ("t3_mtl23ls_v2.safetensors", "ve.safetensors", "conds.pt", "grapheme_mtl_merged_expanded_v1.json"):
        (folder / name).symlink_to(checkpoint / name)
    weights.write(CACHE / "chatterbox", ["turbo/s3gen_meanflow.safetensors"])
    (folder / "s3gen.safetensors").symlink_to(CACHE / "chatterbox" / "turbo" / "s3gen_meanflow.safetensors")
    with pytest.raises(convert.ConversionError, match="mean-flow"):
        convert.convert(folder, tmp_path / "out.gguf", variant="multilingual", weights="f16")
    assert not (tmp_path / "out.gguf").exists()


def test_the_converter_reads_the_official_pytorch_checkpoints(checkpoint, tmp_path):
    """The hub's ResembleAI/chatterbox ships Multilingual's voice encoder and S3Gen as ve.pt and
    s3gen.pt (torch.save of their state dicts): read as the safetensors of the same weights are."""
    from app.models import torch_checkpoint
    from app.models.safetensors import SafetensorsFile

    folder = tmp_path / "official"
    folder.mkdir()
    ve = SafetensorsFile(checkpoint / "ve.safetensors")
    weights.write_torch(folder / "ve.pt", {name: ve.tensor(name) for name in ve.names()})
    s3gen = SafetensorsFile(checkpoint / "s3gen.safetensors")
    hift = [name for name in s3gen.names() if name.startswith("mel2wav.")]
    weights.write_torch(folder / "s3gen.pt", {name: s3gen.tensor(name) for name in hift})
    picked = convert._weights(folder, "ve.safetensors", "the voice encoder")
    assert isinstance(picked, torch_checkpoint.TorchStateFile) and picked.names() == ve.names()
    from_pt = convert._weights(folder, "s3gen.safetensors", "S3Gen")
    for got, want in ((convert._voice_encoder(picked), convert._voice_encoder(ve)),
                      (convert._hift(from_pt), convert._hift(s3gen))):  # fmt: skip
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    with pytest.raises(convert.ConversionError, match="has no 'x.safetensors' or 'x.pt'"):
        convert._weights(folder, "x.safetensors", "nothing")
    (folder / "ve.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    with pytest.raises(torch_checkpoint.CheckpointError):
        convert._weights(folder, "ve.safetensors", "the voice encoder")


def test_the_text_front_end_gives_the_reference_tokenizers_ids(model, golden):
    """mtl_tts.punc_norm, then MTLTokenizer: lower case, NFKD (Korean syllables as jamo), Chinese
    as Cangjie codes, the language's tag, [SPACE]; the grapheme BPE with its unknown token."""
    ids = np.split(golden["mtl_text_ids"], np.flatnonzero(golden["mtl_text_ids"] == -1) + 1)[:-1]
    langs, texts, normed = golden["mtl_text_lang"], golden["mtl_text_in"], golden["mtl_text_normed"]
    assert sorted(set(langs.tolist())) == model.languages
    for lang, text, want_text, want in zip(langs, texts, normed, ids, strict=True):
        assert mtl.normalize_punctuation(str(text)) == str(want_text)
        assert model.encode(str(text), str(lang)).tolist() == want[:-1].tolist(), (lang, text)


def test_a_language_it_does_not_speak_is_refused_by_name(model):
    for language in ("xx", "english", "zh-tw"):
        with pytest.raises(InvalidArgumentError, match="does not speak .*it speaks: ar, da, de"):
            model.text_chunks("Hello there.", language)
    # No language: the text without a tag, as the reference takes language_id=None.
    tagless, tagged = model.encode("Hello there.", None), model.encode("Hello there.", "en")
    assert tagged[1:].tolist() == tagless.tolist() and model.encode("Hello there.", "").tolist() == tagless.tolist()
    chunks = model.text_chunks("今天天气很好！我们去公园。Hello there.", "ZH")
    assert len(chunks) == 3  # Chinese sentence ends split it too


def test_text_to_speech_in_a_language(model):
    """synthesize's whole path: chunks in German, guided tokens, S3Gen's guided flow, the vocoder."""
    chunks = []
    audio, timings = model.synthesize("Guten Tag.", language="de", seed=3, on_chunk=lambda i, a: chunks.append(a))
    assert timings["n_chunks"] == len(chunks) == 1 and timings["n_tokens"] > 0
    assert set(timings["stages_ms"]) >= {"tokens", "encoder", "flow", "generator"}
    assert audio.dtype == np.float32 and np.isfinite(audio).all() and audio.size > 24000 * 0.5
    # Streamed: S3Gen's guided flow on the tokens so far (the run's first 40 tokens), its pieces
    # as long as the whole together.
    from app.audio.dsp import log_mel_cosine

    ids, pieces = model.encode("Guten Tag.", "de"), []
    whole, n = model.speak(ids, max_tokens=40, seed=3)
    streamed, m = model.speak(ids, max_tokens=40, seed=3, stream_tokens=12, on_piece=lambda i, a: pieces.append(a))
    assert len(pieces) >= 2 and m == n <= timings["n_tokens"] and streamed.size == whole.size
    assert log_mel_cosine(streamed, whole, 24000) >= 0.99
    # Two runs at once, guided (a pair of sequences each) and guarded: what each gives alone.
    texts = [model.encode("Guten Tag.", "de"), model.encode("Bonjour à tous, mes amis.", "fr")]
    alone = [model.speak(ids, max_tokens=20, seed=s) for ids, s in zip(texts, (4, 5), strict=True)]
    together = model.speak_many(texts, max_tokens=20, seeds=[4, 5])
    for (a, n), (want, m) in zip(together, alone, strict=True):
        assert n == m
        np.testing.assert_array_equal(a, want)


def test_the_cli_installs_and_speaks_a_language(checkpoint, tmp_path, home_cli):
    import json

    import soundfile

    run = home_cli

    run("models", "install", "chatterbox", "--from", str(checkpoint), "--weights", "f16")
    info = {v["id"]: v for v in json.loads(run("voices", "--json").stdout)}["chatterbox:default"]
    assert info["installed"] and info["family"] == "chatterbox" and info["language"] == "multilingual"
    out = tmp_path / "tag.wav"
    synth = ("synth", "--voice", "chatterbox:default", "--text", "Guten Tag.", "--out", str(out), "--threads", "2")
    refused = run(*synth, "--language", "xx", check=False)
    assert refused.returncode == 1 and "it speaks: ar, da, de" in refused.stderr and not out.exists()
    run(*synth, "--language", "de", "--cfg-weight", "0.3", "--exaggeration", "0.6")
    assert soundfile.info(str(out)).samplerate == 24000 and soundfile.info(str(out)).frames > 24000 * 0.5


def test_other_voices_take_no_language_or_guidance(engine):
    for option in ({"language": "de"}, {"cfg_weight": 0.5}, {"exaggeration": 0.5}):
        with pytest.raises(InvalidArgumentError, match="speaks its own language"):
            engine.synthesize(text="Hi.", **option)
    with pytest.raises(InvalidArgumentError, match="streams sentence by sentence, not by speech tokens"):
        engine.synthesize(text="Hi.", stream_tokens=10)


def test_conditionals_from_a_recording_follow_the_references_multilingual_steps(model, golden):
    """prepare_conditionals of Multilingual: the loudness as recorded, the token model's prompt
    from the first 6 s (150 tokens). The resamplers differ from the reference's (as for Turbo)."""
    import soundfile as sf

    speaker = Path(__file__).parent / "data" / "speaker"
    wav = np.concatenate([sf.read(speaker / f"{c}.flac", dtype="float32")[0] for c in ("kokoro_jf_alpha", "piper_joe")])
    voice = model.conditionals(wav, 16000)
    ref = {k.split(".", 1)[1]: v for k, v in golden.items() if k.startswith("mtl_conds.")}
    assert float(voice.speaker_embedding @ ref["speaker_emb"]) >= 0.999
    assert float(cosines(voice.xvector, ref["xvector"])) >= 0.999
    assert voice.prompt_mel.shape == ref["prompt_mel"].shape
    # Not brought to -27 LUFS: the log-mel stays within a little of the reference's, level and all.
    assert np.abs(voice.prompt_mel - ref["prompt_mel"]).mean() < 0.1
    for name in ("prompt_tokens", "gen_prompt_tokens"):
        ours, want = getattr(voice, name), ref[name]
        assert ours.shape == want.shape and (ours == want).mean() >= 0.7, name
    assert voice.prompt_tokens.shape == (150,)
