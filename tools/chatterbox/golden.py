"""Golden values of Chatterbox's stages from the reference implementation, on the weights of
tools/chatterbox/weights.py.

Needs torch and the reference package (``chatterbox-tts``), which the project does not use; run
it in a separate environment (tools/chatterbox/README.md):

    /tmp/cbref/bin/python -m tools.chatterbox.golden [--weights DIR]

Writes tests/data/chatterbox/golden_turbo.npz (Chatterbox-Turbo's stages),
tests/data/chatterbox/golden_multilingual.npz (Multilingual's: ``mtl_*``), and
tests/data/chatterbox/conds.pt: a stock voice's conditionals in the official file's layout (the
reference's Conditionals.save), from a fixed seed (conds_multilingual.pt: Multilingual's, with
150 prompt tokens). Inputs, drawn from a fixed seed: a speaker embedding (L2-normalized, as the
voice encoder gives), the prompt's speech tokens, text tokens and a teacher-forced run of speech
tokens. Outputs:

- ``t3_cond`` [8, dim]: the first rows of the conditioning encoder's output (T3.prepare_conditioning):
  the speaker projection, then the prompt's speech embeddings;
- ``t3_logits`` [speech, vocab]: the speech head's logits at each teacher-forced speech position
  (the start token first), one forward pass over conditioning, text and speech as
  T3.inference_turbo builds it;
- ``greedy_tokens``: T3.inference_turbo's loop at temperature 0: its repetition penalty (1.2)
  applied, then the most likely token taken in place of the random draw (the temperature,
  top-k and top-p warpers leave that token as it is), for up to 200 tokens (the stop token
  included where it came);
- ``ve.<clip>`` [256]: the voice encoder's speaker embedding of each clip of tests/data/speaker
  (VoiceEncoder.embeds_from_wavs at 16 kHz: silence trimmed at 20 dB, partials of 160 frames
  1.3 a second), and ``ve_mel.<clip>`` [frames, 40] the mel spectrogram of its trimmed audio;
- ``hift_mel`` [80, 40]: a log-mel; ``hift_f0`` [40]: S3Gen's vocoder's F0 predictor on it;
  ``hift_audio``, ``hift_source``: HiFTGenerator.inference's audio and excitation with its
  noise and random phases off; ``hift_f0_in`` [40] a voiced contour, and ``hift_audio_f0``,
  ``hift_source_f0`` the same with the predictor's F0 replaced by it;
- ``flow_tokens`` [40]: speech tokens, decoded in the voice of conds.pt (its S3Gen part: prompt
  tokens, prompt mel, x-vector) by S3Gen's flow (CausalMaskedDiffWithXvec.inference, mean-flow,
  2 steps) from ``flow_noise`` [80, frames] (its randn_like replaced by it): ``flow_mu`` [80,
  frames], the encoder's projection (prompt and tokens); ``flow_v.<step>`` [80, frames], the
  estimator's output at each step; ``flow_mel`` [80, 2 x tokens], the mel after the prompt's
  frames; ``s3gen_audio``: HiFT on that mel with its noise and random phases off, the first
  40 ms faded in as S3Token2Wav.inference does;
- ``s3tok_mel.<clip>`` [128, frames], ``s3tok_proj.<clip>`` [tokens, 8] and ``s3tok.<clip>``
  [tokens]: S3Gen's speech tokenizer (S3Tokenizer.forward) on each clip of tests/data/speaker:
  its log-mel, the FSQ projection before rounding, the codes;
- ``fbank.<clip>`` [frames, 80], ``xvector_head.<clip>`` [320, frames] and ``xvector.<clip>``
  [192]: S3Gen's speaker encoder (CAMPPlus.inference) on each clip: its Kaldi fbank with the
  mean over time taken off, its convolutional head's output, the x-vector;
- ``prompt_wav`` [samples] and ``prompt_mel`` [80, frames]: S3Gen's mel (mel_spectrogram) of 3 s
  of a clip at 24 kHz; ``conds.*``: ChatterboxTurboTTS.prepare_conditionals's steps on two
  clips end to end (CONDS_CLIPS; librosa's resampling, loudness to -27 LUFS): the speaker
  embedding, the token model's prompt tokens, and S3Gen's prompt tokens, prompt mel and x-vector;
- ``e2e_speech``, ``e2e_noise`` [80, frames] and ``e2e_audio``: generate's path after the text,
  T3's greedy tokens through S3Gen in conds.pt's voice (e2e_golden);
- ``mtl_*``: Chatterbox Multilingual's T3 on drawn inputs (a speaker embedding, 150 prompt
  tokens, 21 text tokens, 23 speech tokens, exaggeration 0.7, guidance 0.5): ``mtl_t3_cond``
  [34, dim] the conditioning encoder's output (speaker, perceiver, emotion);
  ``mtl_t3_logits`` and ``mtl_t3_logits_uncond`` [24, vocab] teacher forced, the two sequences
  of guidance as generate batches them; ``mtl_greedy_tokens`` T3.inference's run with the most
  likely token in place of its draw (the stop token included where it came), and
  ``mtl_alignment`` [tokens, text] its AlignmentStreamAnalyzer's alignment; ``mtl_flow_*``:
  its S3Gen's flow (10 Euler steps over a cosine span, guidance 0.7) on ``mtl_flow_tokens`` in
  conds_multilingual.pt's voice from ``mtl_flow_noise``: ``mtl_flow_v.<step>`` the guided velocity of each
  step, ``mtl_flow_mel`` the mel after the prompt's frames; ``mtl_text_*``: texts of
  tests/data/multilingual.txt and a few more in their languages, what the reference's punc_norm
  makes of them and the reference tokenizer's ids (MTLTokenizer on weights.py's grapheme
  tokenizer and Cangjie table), joined with -1 after each text; ``mtl_conds.*``: its
  prepare_conditionals's steps on conds_golden's recording (no loudness change, the token
  model's prompt from 6 s);
- ``punc_in`` and ``punc_out``: texts and what the reference's punc_norm makes of them;
- ``text_in`` and ``text_ids``: texts (the tokenizer's tags among them) and their ids by the
  reference's tokenizer (transformers' AutoTokenizer on the folder, as ChatterboxTurboTTS
  loads it), joined with -1 after each text.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from tools.chatterbox import weights
from tools.chatterbox.layout import t3_turbo

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "chatterbox" / "golden_turbo.npz"
SPEAKER = Path(__file__).resolve().parents[2] / "tests" / "data" / "speaker"
GREEDY_STEPS = 200
MTL_GREEDY_STEPS = 120
OUT_MULTILINGUAL = OUT.with_name("golden_multilingual.npz")
MULTILINGUAL_CONDS = OUT.with_name("conds_multilingual.pt")  # its stock voice's conds.pt


def inputs(hp) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    spk = rng.standard_normal(hp.speaker_embed_size).astype(np.float32)
    return {
        "speaker_emb": spk / np.linalg.norm(spk),
        "prompt_tokens": rng.integers(0, 6561, hp.speech_cond_prompt_len).astype(np.int32),
        "text_tokens": rng.integers(0, hp.text_tokens_dict_size, 23).astype(np.int32),
        "speech_tokens": np.concatenate([[hp.start_speech_token], rng.integers(0, 6561, 23)]).astype(np.int32),
    }


@torch.inference_mode()
def t3_golden(ckpt: Path) -> dict[str, np.ndarray]:
    from chatterbox.models.t3.modules.cond_enc import T3Cond

    t3 = t3_turbo()
    t3.load_state_dict(load_file(ckpt / "turbo" / "t3_turbo_v1.safetensors"))
    del t3.tfmr.wte
    t3.eval()
    hp = t3.hp
    x = inputs(hp)

    def cond():
        return T3Cond(
            speaker_emb=torch.from_numpy(x["speaker_emb"])[None],
            cond_prompt_speech_tokens=torch.from_numpy(x["prompt_tokens"]).long()[None],
            emotion_adv=0.5 * torch.ones(1, 1, 1),
        )

    text = torch.from_numpy(x["text_tokens"]).long()[None]
    speech = torch.from_numpy(x["speech_tokens"]).long()[None]
    out = dict(x)
    # The speaker projection and the first prompt rows (the rest are embedding lookups too).
    out["t3_cond"] = t3.prepare_conditioning(cond())[0, :8].numpy()

    embeds, _ = t3.prepare_input_embeds(t3_cond=cond(), text_tokens=text, speech_tokens=speech, cfg_weight=0.0)
    hidden = t3.tfmr(inputs_embeds=embeds)[0]
    out["t3_logits"] = t3.speech_head(hidden[0, -speech.shape[1] :]).numpy()

    # T3.inference_turbo, the draw replaced by the most likely token after the penalty.
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2)])
    start = hp.start_speech_token * torch.ones_like(text[:, :1])
    embeds, _ = t3.prepare_input_embeds(t3_cond=cond(), text_tokens=text, speech_tokens=start, cfg_weight=0.0)
    llm = t3.tfmr(inputs_embeds=embeds, use_cache=True)
    past = llm.past_key_values
    logits = t3.speech_head(llm[0][:, -1:])
    token = procs(start, logits[:, -1, :]).argmax(-1, keepdim=True)
    generated = [token]
    while len(generated) < GREEDY_STEPS and int(token) != hp.stop_speech_token:
        llm = t3.tfmr(inputs_embeds=t3.speech_emb(token), past_key_values=past, use_cache=True)
        past = llm.past_key_values
        logits = t3.speech_head(llm[0])
        token = procs(torch.cat(generated, dim=1), logits[:, -1, :]).argmax(-1, keepdim=True)
        generated.append(token)
    out["greedy_tokens"] = torch.cat(generated, dim=1)[0].numpy().astype(np.int32)
    return out


@torch.inference_mode()
def ve_golden(ckpt: Path) -> dict[str, np.ndarray]:
    import librosa
    import soundfile as sf

    from chatterbox.models.voice_encoder import VoiceEncoder
    from chatterbox.models.voice_encoder.melspec import melspectrogram

    ve = VoiceEncoder()
    ve.load_state_dict(load_file(ckpt / "turbo" / "ve.safetensors"))
    ve.eval()
    out = {}
    for path in sorted(SPEAKER.glob("*.flac")):
        wav, rate = sf.read(path, dtype="float32")
        assert rate == 16000, path
        out[f"ve.{path.stem}"] = ve.embeds_from_wavs([wav], sample_rate=rate)[0]
        trimmed = librosa.effects.trim(wav, top_db=20)[0]
        out[f"ve_mel.{path.stem}"] = melspectrogram(trimmed, ve.hp).T.astype(np.float32)
    return out


PUNC = [
    "hello there… this is: a test — of “quotes” and ‘single’ ones",
    "Already fine.",
    "ends with a comma,",
    "  spaces   everywhere   ",
    "a – b , c",
    "x",
]
TEXTS = [
    "Hello world! It's a test, isn't it? We'll see... 12345 and 3.14.",
    "[laugh] Oh no, [cough] that's it.",
    "Naïve café façade, “quotes” — and 日本語.",
    "  Spaces   and\ttabs\nnew lines  ",
    "I'M 'S won't, don't; can't!",
]


def text_golden(ckpt: Path) -> dict[str, np.ndarray]:
    from transformers import AutoTokenizer

    from chatterbox.tts_turbo import punc_norm

    tok = AutoTokenizer.from_pretrained(ckpt / "turbo")
    ids = []
    for t in TEXTS:
        ids += tok(t).input_ids + [-1]
    return {
        "punc_in": np.array(PUNC),
        "punc_out": np.array([punc_norm(t) for t in PUNC]),
        "text_in": np.array(TEXTS),
        "text_ids": np.array(ids, np.int32),
    }


@torch.inference_mode()
def hift_golden(ckpt: Path) -> dict[str, np.ndarray]:
    from chatterbox.models.s3gen import S3Gen, hifigan

    s3 = S3Gen(meanflow=True)
    state = load_file(ckpt / "turbo" / "s3gen_meanflow.safetensors")
    hift = s3.mel2wav
    hift.load_state_dict({k[len("mel2wav.") :]: v for k, v in state.items() if k.startswith("mel2wav.")})
    hift.eval()

    rng = np.random.default_rng(11)
    mel = torch.from_numpy((rng.standard_normal((1, 80, 40)) * 1.5 - 4.0).astype(np.float32))
    f0_in = np.zeros(40, np.float32)
    f0_in[5:31] = 120 + 60 * np.sin(np.arange(26) / 6.0)
    out = {"hift_mel": mel[0].numpy(), "hift_f0_in": f0_in}
    randn_like, uniform = torch.randn_like, hifigan.Uniform
    torch.randn_like, hifigan.Uniform = torch.zeros_like, _NoPhase
    try:
        out["hift_f0"] = hift.f0_predictor(mel)[0].numpy()
        wav, src = hift.inference(speech_feat=mel)
        out["hift_audio"], out["hift_source"] = wav[0].numpy(), src[0, 0].numpy()
        hift.f0_predictor.forward = lambda x: torch.from_numpy(f0_in)[None]
        wav, src = hift.inference(speech_feat=mel)
        out["hift_audio_f0"], out["hift_source_f0"] = wav[0].numpy(), src[0, 0].numpy()
    finally:
        torch.randn_like, hifigan.Uniform = randn_like, uniform
    return out


class _NoPhase:  # SineGen's random phases off
    def __init__(self, low, high):
        pass

    def sample(self, sample_shape):
        return torch.zeros(sample_shape)


def s3gen(ckpt: Path):
    """The reference's S3Gen (Turbo's, mean-flow) on the weights of ``ckpt``, in eval mode."""
    from chatterbox.models.s3gen import S3Gen

    s3 = S3Gen(meanflow=True)
    s3.load_state_dict(load_file(ckpt / "turbo" / "s3gen_meanflow.safetensors"))
    return s3.eval()


def record_flow(s3, tokens: np.ndarray, gen: dict, noise: np.ndarray, velocity=lambda v: v[0].numpy()):
    """S3Gen.flow_inference on ``tokens`` with ``noise`` as its starting noise; the mel, and the
    encoder's output and each solver step's velocity (``velocity`` of the estimator's batch) seen
    on the way."""
    mu, velocities = [], []
    hook = s3.flow.encoder_proj.register_forward_hook(lambda m, i, o: mu.append(o[0].T.numpy()))
    estimator = s3.flow.decoder.estimator
    forward = estimator.forward  # called directly by the solver, so no hook sees it

    def record(*args, **kwargs):
        v = forward(*args, **kwargs)
        velocities.append(velocity(v))
        return v

    def randn(*shape, **kwargs):  # the noise of the new frames, which Turbo's flow_inference draws
        return torch.from_numpy(noise[:, noise.shape[1] - shape[-1] :].copy())[None]

    estimator.forward = record
    saved = torch.randn_like, torch.randn
    torch.randn_like, torch.randn = (lambda x: torch.from_numpy(noise.copy())[None].to(x.dtype)), randn
    try:
        mel = s3.flow_inference(torch.from_numpy(tokens)[None], ref_dict=dict(gen), finalize=True)
    finally:
        torch.randn_like, torch.randn = saved
        hook.remove()
        estimator.forward = forward
    return mel, mu, velocities


@torch.inference_mode()
def flow_golden(ckpt: Path) -> dict[str, np.ndarray]:
    from chatterbox.models.s3gen import hifigan
    from chatterbox.tts_turbo import Conditionals

    s3 = s3gen(ckpt)
    gen = Conditionals.load(OUT.parent / "conds.pt").gen
    rng = np.random.default_rng(17)
    tokens = rng.integers(0, 6561, 40)
    frames = 2 * (gen["prompt_token"].shape[1] + tokens.size)
    noise = rng.standard_normal((80, frames)).astype(np.float32)
    out = {"flow_tokens": tokens.astype(np.int32), "flow_noise": noise}

    mel, mu, velocities = record_flow(s3, tokens, gen, noise)
    out["flow_mu"] = mu[0]
    for i, v in enumerate(velocities):
        out[f"flow_v.{i}"] = v
    out["flow_mel"] = mel[0].numpy()

    randn_like, uniform = torch.randn_like, hifigan.Uniform
    torch.randn_like, hifigan.Uniform = torch.zeros_like, _NoPhase
    try:
        wav, _ = s3.hift_inference(mel)
    finally:
        torch.randn_like, hifigan.Uniform = randn_like, uniform
    wav[:, : len(s3.trim_fade)] *= s3.trim_fade
    out["s3gen_audio"] = wav[0].numpy()
    return out


@torch.inference_mode()
def s3tok_golden(ckpt: Path) -> dict[str, np.ndarray]:
    import soundfile as sf

    s3 = s3gen(ckpt)
    tok = s3.tokenizer
    out, projected = {}, []
    hook = tok.quantizer._codebook.project_down.register_forward_hook(lambda m, i, o: projected.append(o))
    for path in sorted(SPEAKER.glob("*.flac")):
        wav, rate = sf.read(path, dtype="float32")
        assert rate == 16000, path
        tokens, _ = tok.forward([wav])
        out[f"s3tok_mel.{path.stem}"] = tok.log_mel_spectrogram(torch.from_numpy(wav)[None])[0].numpy()
        out[f"s3tok_proj.{path.stem}"] = projected[-1].numpy()
        out[f"s3tok.{path.stem}"] = tokens[0].numpy().astype(np.int32)
    hook.remove()
    return out


@torch.inference_mode()
def xvector_golden(ckpt: Path) -> dict[str, np.ndarray]:
    import soundfile as sf

    from chatterbox.models.s3gen.xvector import extract_feature

    s3 = s3gen(ckpt)
    campplus, out, head = s3.speaker_encoder, {}, []
    hook = campplus.head.register_forward_hook(lambda m, i, o: head.append(o[0]))
    for path in sorted(SPEAKER.glob("*.flac")):
        wav, rate = sf.read(path, dtype="float32")
        assert rate == 16000, path
        feats, _, _ = extract_feature([torch.from_numpy(wav)])
        out[f"fbank.{path.stem}"] = feats[0].numpy()
        out[f"xvector.{path.stem}"] = campplus.inference(torch.from_numpy(wav)[None])[0].numpy()
        out[f"xvector_head.{path.stem}"] = head[-1].numpy()
    hook.remove()
    return out


@torch.inference_mode()
def e2e_golden(ckpt: Path) -> dict[str, np.ndarray]:
    """ChatterboxTurboTTS.generate's path after the text: T3's greedy tokens (as t3_golden makes
    them), those S3Gen lacks dropped and three silent ones appended, S3Token2Wav.inference in
    conds.pt's voice with its noise given and HiFT's noise and random phases off."""
    from chatterbox.models.s3gen import hifigan
    from chatterbox.models.s3gen.const import S3GEN_SIL
    from chatterbox.tts_turbo import Conditionals

    tokens = t3_golden(ckpt)["greedy_tokens"]
    speech = np.concatenate([tokens[tokens < 6561], [S3GEN_SIL] * 3]).astype(np.int32)
    s3 = s3gen(ckpt)
    gen = Conditionals.load(OUT.parent / "conds.pt").gen
    frames = 2 * (gen["prompt_token"].shape[1] + speech.size)
    noise = torch.from_numpy(np.random.default_rng(19).standard_normal((1, 80, frames)).astype(np.float32))

    def randn_like(x, *args, **kwargs):  # the flow's noise; HiFT's excitation noise off
        return noise.to(x.dtype) if tuple(x.shape) == tuple(noise.shape) else torch.zeros_like(x)

    def randn(*shape, **kwargs):  # the noise of the new frames, which flow_inference draws itself
        return noise[..., frames - shape[-1] :].clone()

    saved = torch.randn_like, torch.randn, hifigan.Uniform
    torch.randn_like, torch.randn, hifigan.Uniform = randn_like, randn, _NoPhase
    try:
        wav, _ = s3.inference(torch.from_numpy(speech)[None], ref_dict=dict(gen), n_cfm_timesteps=2)
    finally:
        torch.randn_like, torch.randn, hifigan.Uniform = saved
    return {"e2e_speech": speech, "e2e_noise": noise[0].numpy(), "e2e_audio": wav[0].numpy()}


CONDS_CLIPS = ("kokoro_jf_alpha", "piper_joe")  # together past the reference's 5 s minimum


def conds_input() -> Path:
    """A recording for the conditionals: two speaker clips end to end, written as a 16 kHz WAV."""
    import soundfile as sf

    wav = np.concatenate([sf.read(SPEAKER / f"{c}.flac", dtype="float32")[0] for c in CONDS_CLIPS])
    path = Path("/tmp/chatterbox-conds-input.wav")
    sf.write(path, wav, 16000, subtype="FLOAT")
    return path


@torch.inference_mode()
def conds_golden(ckpt: Path) -> dict[str, np.ndarray]:
    import librosa
    import pyloudnorm

    from chatterbox.models.s3gen.utils.mel import mel_spectrogram
    from chatterbox.models.voice_encoder import VoiceEncoder

    s3 = s3gen(ckpt)
    ve = VoiceEncoder()
    ve.load_state_dict(load_file(ckpt / "turbo" / "ve.safetensors"))
    ve.eval()
    out = {}
    # S3Gen's mel on a given 24 kHz signal.
    wav24 = librosa.resample(librosa.load(SPEAKER / "piper_joe.flac", sr=16000)[0], orig_sr=16000, target_sr=24000)
    out["prompt_wav"] = wav24[: 3 * 24000].astype(np.float32)
    out["prompt_mel"] = mel_spectrogram(torch.from_numpy(out["prompt_wav"]))[0].numpy()
    # ChatterboxTurboTTS.prepare_conditionals on a recording, step by step.
    wav, sr = librosa.load(conds_input(), sr=24000)
    meter = pyloudnorm.Meter(sr)
    wav = wav * 10.0 ** ((-27 - meter.integrated_loudness(wav)) / 20.0)
    ref16 = librosa.resample(wav, orig_sr=24000, target_sr=16000)
    gen = s3.embed_ref(wav[: 10 * 24000], 24000)
    tokens, _ = s3.tokenizer.forward([ref16[: 15 * 16000]], max_len=375)
    out["conds.speaker_emb"] = ve.embeds_from_wavs([ref16], sample_rate=16000).mean(0)
    out["conds.prompt_tokens"] = tokens[0].numpy().astype(np.int32)
    out["conds.gen_prompt_tokens"] = gen["prompt_token"][0].numpy().astype(np.int32)
    out["conds.prompt_mel"] = gen["prompt_feat"][0].T.numpy()
    out["conds.xvector"] = gen["embedding"][0].numpy()
    return out


def write_conds(path: Path, prompt_tokens: int = 375) -> None:
    """A voice's conditionals in the official conds.pt layout (Conditionals.save), drawn from a
    fixed seed: what the converter turns into the model's stock voice (``prompt_tokens``: the
    token model's prompt, Turbo's 375 or Multilingual's 150)."""
    from chatterbox.models.t3.modules.cond_enc import T3Cond
    from chatterbox.tts_turbo import Conditionals

    rng = np.random.default_rng(13)
    spk = rng.standard_normal((1, 256)).astype(np.float32)
    t3 = T3Cond(
        speaker_emb=torch.from_numpy(spk / np.linalg.norm(spk)),
        cond_prompt_speech_tokens=torch.from_numpy(rng.integers(0, 6561, (1, prompt_tokens))),
        emotion_adv=0.5 * torch.ones(1, 1, 1),
    )
    n = 50  # prompt tokens of S3Gen's conditioning (2 s), and twice as many mel frames
    gen = {
        "prompt_token": torch.from_numpy(rng.integers(0, 6561, (1, n))),
        "prompt_token_len": torch.tensor([n]),
        "prompt_feat": torch.from_numpy((rng.standard_normal((1, 2 * n, 80)) - 5).astype(np.float32)),
        "prompt_feat_len": None,
        "embedding": torch.from_numpy(rng.standard_normal((1, 192)).astype(np.float32)),
    }
    Conditionals(t3, gen).save(path)


@torch.inference_mode()
def t3_multilingual_golden(ckpt: Path) -> dict[str, np.ndarray]:
    """Chatterbox Multilingual's T3 (Llama backbone, perceiver, emotion, guidance) on drawn inputs."""
    from chatterbox.models.t3.modules.cond_enc import T3Cond
    from tools.chatterbox.layout import t3_multilingual

    t3 = t3_multilingual()
    t3.load_state_dict(load_file(ckpt / "multilingual" / "t3_mtl23ls_v2.safetensors"))
    t3.eval()
    hp = t3.hp
    rng = np.random.default_rng(11)
    spk = rng.standard_normal(hp.speaker_embed_size).astype(np.float32)
    x = {
        "speaker_emb": spk / np.linalg.norm(spk),
        "prompt_tokens": rng.integers(0, 6561, hp.speech_cond_prompt_len).astype(np.int32),
        "text_tokens": rng.integers(1, hp.text_tokens_dict_size, 21).astype(np.int32),
        "speech_tokens": rng.integers(0, 6561, 23).astype(np.int32),
        "exaggeration": np.float32(0.7),
        "cfg_weight": np.float32(0.5),
    }

    def cond():
        return T3Cond(
            speaker_emb=torch.from_numpy(x["speaker_emb"])[None],
            cond_prompt_speech_tokens=torch.from_numpy(x["prompt_tokens"]).long()[None],
            emotion_adv=float(x["exaggeration"]) * torch.ones(1, 1, 1),
        )

    # As ChatterboxMultilingualTTS.generate: two sequences for guidance, between [START] and [STOP].
    text = torch.from_numpy(x["text_tokens"]).long()[None].repeat(2, 1)
    text = torch.nn.functional.pad(text, (1, 0), value=hp.start_text_token)
    text = torch.nn.functional.pad(text, (0, 1), value=hp.stop_text_token)
    speech = torch.from_numpy(np.concatenate([[hp.start_speech_token], x["speech_tokens"]])).long()[None]
    out = {f"mtl_{k}": v for k, v in x.items()}
    out["mtl_t3_cond"] = t3.prepare_conditioning(cond())[0].numpy()
    # Teacher forced, as T3HuggingfaceBackend.forward reads the last hidden states.
    embeds, _ = t3.prepare_input_embeds(
        t3_cond=cond(), text_tokens=text, speech_tokens=speech.repeat(2, 1), cfg_weight=float(x["cfg_weight"])
    )
    hidden = t3.tfmr(inputs_embeds=embeds, output_hidden_states=True, return_dict=True).hidden_states[-1]
    logits = t3.speech_head(hidden[:, -speech.shape[1] :]).numpy()
    out["mtl_t3_logits"], out["mtl_t3_logits_uncond"] = logits[0], logits[1]

    # T3.inference, its draw replaced by the most likely token (its temperature, min-p and top-p
    # leave that one as it is), its alignment guard on.
    multinomial = torch.multinomial
    torch.multinomial = lambda probs, num_samples: probs.argmax(-1, keepdim=True)
    try:
        tokens = t3.inference(
            t3_cond=cond(),
            text_tokens=text,
            max_new_tokens=MTL_GREEDY_STEPS,
            temperature=0.8,
            cfg_weight=float(x["cfg_weight"]),
            repetition_penalty=2.0,
            min_p=0.05,
            top_p=1.0,
        )
    finally:
        torch.multinomial = multinomial
    out["mtl_greedy_tokens"] = tokens[0].numpy().astype(np.int32)
    out["mtl_alignment"] = t3.patched_model.alignment_stream_analyzer.alignment.numpy()
    return out


STAGES = {
    "t3": t3_golden,
    "ve": ve_golden,
    "text": text_golden,
    "hift": hift_golden,
    "flow": flow_golden,
    "s3tok": s3tok_golden,
    "xvector": xvector_golden,
    "conds": conds_golden,
    "e2e": e2e_golden,
}


@torch.inference_mode()
def flow_multilingual_golden(ckpt: Path) -> dict[str, np.ndarray]:
    """Chatterbox Multilingual's S3Gen flow: 10 Euler steps over a cosine span, guided (0.7)."""
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.tts_turbo import Conditionals

    s3 = S3Gen()
    s3.load_state_dict(load_file(ckpt / "multilingual" / "s3gen.safetensors"))
    s3.eval()
    gen = Conditionals.load(MULTILINGUAL_CONDS).gen
    rng = np.random.default_rng(19)
    tokens = rng.integers(0, 6561, 30)
    frames = 2 * (gen["prompt_token"].shape[1] + tokens.size)
    noise = rng.standard_normal((80, frames)).astype(np.float32)
    out = {"mtl_flow_tokens": tokens.astype(np.int32), "mtl_flow_noise": noise}
    # The estimator's batch: the conditional and the unconditional estimate, guided by 0.7.
    mel, _, velocities = record_flow(s3, tokens, gen, noise, lambda v: 1.7 * v[0].numpy() - 0.7 * v[1].numpy())
    for i, v in enumerate(velocities):
        out[f"mtl_flow_v.{i}"] = v
    out["mtl_flow_mel"] = mel[0].numpy()
    return out


def text_multilingual_golden(ckpt: Path) -> dict[str, np.ndarray]:
    """Chatterbox Multilingual's text front end: mtl_tts.punc_norm, then MTLTokenizer.text_to_tokens
    on the test tokenizer (weights.py), its Cangjie table read from the folder (where the reference
    would fetch it from the Hub); pkuseg, pykakasi, Dicta and the Russian stress marker are not
    installed, as the reference runs without them."""
    from chatterbox.models.tokenizers import tokenizer as reference
    from chatterbox.mtl_tts import punc_norm

    folder = ckpt / "multilingual"
    fetch = reference.hf_hub_download
    reference.hf_hub_download = lambda repo_id, filename, cache_dir=None: str(folder / filename)
    try:
        tok = reference.MTLTokenizer(str(folder / "grapheme_mtl_merged_expanded_v1.json"))
    finally:
        reference.hf_hub_download = fetch
    texts = weights.multilingual_texts()
    texts += [("en", "hello... world - isn't it; fine: “quoted” — yes"), ("de", "ÄRGER über Öl"), ("ko", " 한국어 ")]
    texts += [("zh", "今天天气很好！我们去公园。"), ("en", "unknown ☃ glyphs ∑ here")]
    normed = [punc_norm(t) for _, t in texts]
    ids = [
        tok.text_to_tokens(t, language_id=lang)[0].tolist() + [-1] for (lang, _), t in zip(texts, normed, strict=True)
    ]
    return {
        "mtl_text_lang": np.array([lang for lang, _ in texts]),
        "mtl_text_in": np.array([t for _, t in texts]),
        "mtl_text_normed": np.array(normed),
        "mtl_text_ids": np.array([i for row in ids for i in row], np.int32),
    }


@torch.inference_mode()
def conds_multilingual_golden(ckpt: Path) -> dict[str, np.ndarray]:
    """ChatterboxMultilingualTTS.prepare_conditionals's steps on the recording of conds_golden: no
    loudness change, the token model's prompt from the first 6 s (at most 150 tokens)."""
    import librosa

    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.voice_encoder import VoiceEncoder

    s3 = S3Gen()
    s3.load_state_dict(load_file(ckpt / "multilingual" / "s3gen.safetensors"))
    s3.eval()
    ve = VoiceEncoder()
    ve.load_state_dict(load_file(ckpt / "multilingual" / "ve.safetensors"))
    ve.eval()
    wav, _ = librosa.load(conds_input(), sr=24000)
    ref16 = librosa.resample(wav, orig_sr=24000, target_sr=16000)
    gen = s3.embed_ref(wav[: 10 * 24000], 24000)
    tokens, _ = s3.tokenizer.forward([ref16[: 6 * 16000]], max_len=150)
    return {
        "mtl_conds.speaker_emb": ve.embeds_from_wavs([ref16], sample_rate=16000).mean(0),
        "mtl_conds.prompt_tokens": tokens[0].numpy().astype(np.int32),
        "mtl_conds.gen_prompt_tokens": gen["prompt_token"][0].numpy().astype(np.int32),
        "mtl_conds.prompt_mel": gen["prompt_feat"][0].T.numpy(),
        "mtl_conds.xvector": gen["embedding"][0].numpy(),
    }


# Chatterbox Multilingual's stages, written to OUT_MULTILINGUAL.
MULTILINGUAL_STAGES = {
    "mtl_t3": t3_multilingual_golden,
    "mtl_flow": flow_multilingual_golden,
    "mtl_text": text_multilingual_golden,
    "mtl_conds": conds_multilingual_golden,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", type=Path, default=Path("/tmp/chatterbox-weights"))
    ap.add_argument(
        "--stages", nargs="*", choices=sorted(STAGES | MULTILINGUAL_STAGES), help="remake these only (default: all)"
    )
    args = ap.parse_args()
    weights.write(args.weights)
    write_conds(OUT.parent / "conds.pt")
    write_conds(MULTILINGUAL_CONDS, prompt_tokens=150)
    for path, stages in ((OUT, STAGES), (OUT_MULTILINGUAL, MULTILINGUAL_STAGES)):
        chosen = [s for s in args.stages or stages if s in stages]
        if not chosen:
            continue
        out = {}
        if args.stages and path.exists():  # the others' values kept
            with np.load(path) as old:
                out = {k: old[k] for k in old.files}
        for stage in chosen:
            out |= stages[stage](args.weights)
        np.savez_compressed(path, **out)
        for k, v in out.items():
            print(k, v.shape, v.dtype)


if __name__ == "__main__":
    main()
