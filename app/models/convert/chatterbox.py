"""Convert Chatterbox's official checkpoints (Resemble AI, MIT) into a GGUF the engine loads
(arch "chatterbox").

Reads a checkpoint folder as the Hugging Face Hub holds it, by the official file names:
Chatterbox-Turbo's ``t3_turbo_v1.safetensors`` (the token model: GPT-2 medium blocks with
learned positions, text and speech embeddings, the speech head, the speaker projection) and
``ve.safetensors`` (the voice encoder, which makes the token model's speaker embedding), and the
text tokenizer, GPT-2's byte-level BPE: ``tokenizer.json``, or ``vocab.json`` and ``merges.txt``
(with ``added_tokens.json``), written as one JSON string, ``chatterbox.tokenizer``, in
tokenizer.json's layout (its model's vocabulary and merges, the added tokens); and S3Gen's
``s3gen_meanflow.safetensors``, of which its vocoder (HiFT, ``mel2wav.*``).
Every tensor is checked against the names and shapes the reference implementation loads
(``load_state_dict(..., strict=True)``); hyperparameters go into the GGUF's metadata, read from
the shapes where the file holds them.

Tensors (ggml order, fastest axis first; C the model width, P positions, Vt and Vs the text
and speech vocabularies):

- ``t3.pos_emb`` [C, P]; ``t3.text_emb`` [C, Vt]; ``t3.speech_emb`` [C, Vs];
- ``t3.blk.{i}.attn_norm.{weight,bias}`` [C]; ``t3.blk.{i}.attn_qkv.weight`` [C, 3C] (rows q, k,
  v), ``.bias`` [3C]; ``t3.blk.{i}.attn_out.weight`` [C, C], ``.bias``; ``t3.blk.{i}.ffn_norm.*``;
  ``t3.blk.{i}.ffn_up.weight`` [C, 4C], ``.bias``; ``t3.blk.{i}.ffn_down.weight`` [4C, C], ``.bias``
  (GPT-2's Conv1D weights, stored [in, out], transposed);
- ``t3.out_norm.{weight,bias}`` [C]; ``t3.speech_head.weight`` [C, Vs], ``.bias`` [Vs];
- ``t3.spkr_enc.weight`` [E, C], ``.bias`` [C] (E: the voice encoder's embedding size).

The voice encoder's tensors are those of the "ge2e" architecture (app/models/convert/ge2e.py)
under ``ve.``: a 3-layer LSTM over 40 mel bands of 16 kHz audio and a linear layer with ReLU;
its front end (chatterbox/models/voice_encoder: librosa's STFT with reflected edges, power, the
same Slaney mel filters as Resemblyzer's; partials of 160 frames 1.3 a second cut as its
stride_as_partials does, at least 80% covered; silence trimmed at 20 dB by
VoiceEncoder.embeds_from_wavs) is written as ``chatterbox.ve.*`` metadata.

HiFT's tensors are its modules' under ``hift.`` with weight norm folded in (w = g v / |v|):
convolutions [IC, K, OC]; transposed convolutions [IC, OC, K'] with K' the taps rounded up to a
multiple of the stride (zeros after); Snake's ``alpha`` and ``inv_alpha`` = 1 / (alpha + 1e-9)
[C]; the F0 predictor's ``hift.f0.condnet.{0..4}``; ``hift.stft`` [16, 18] (the source's
Hann-windowed DFT, cos then -sin rows) and ``hift.istft`` [18, 1, 16] (the windowed inverse
real DFT of cos and sin parts, as a transposed convolution's taps). Its hyperparameters
(S3Token2Wav's HiFTGenerator) are ``chatterbox.hift.*`` metadata.

S3Gen's flow (speech tokens to a mel) is under ``flow.``: ``flow.token_emb`` [512, 6561],
``flow.spk_affine`` (the x-vector's projection), the conformer encoder ``flow.enc.*`` (input
projections ``embed``/``up_embed`` with their norms, ``lookahead.conv{1,2}``, ``blk.{i}`` and
``up_blk.{i}`` with ``attn_{q,k,v,out,pos}``, ``pos_bias_{u,v}`` [64 x 8], ``attn_norm``,
``ffn_norm``, ``ffn_up``, ``ffn_down``; ``up`` the upsampling convolution, ``out_norm``,
``proj`` to 80 bands) and the U-Net estimator ``flow.dec.*`` (``time.linear_{1,2}``,
``time_mixer``; ``down.``, ``mid.{i}.``, ``up.``: a causal residual block's ``block{1,2}.conv``,
``block{1,2}.norm``, ``time``, ``res_conv`` and its transformer blocks ``tfm.{j}.*``;
``down.conv``, ``up.conv``, ``final.conv``, ``final.norm``, ``proj``). Linear weights are
[in, out] (PyTorch's [out, in] as stored), convolutions [IC, K, OC], pointwise ones [IC, OC];
the hyperparameters and the variant's solver are ``chatterbox.flow.*`` metadata.

S3Gen's speech tokenizer is under ``s3tok.``: ``s3tok.dft`` [400, 402] (the periodic-Hann-
windowed DFT, cos then -sin rows), ``s3tok.mel`` [201, 128] (Slaney mel filters), ``conv1``,
``conv2``, ``blk.{i}.`` (``attn_norm``, ``attn_{q,k,v,out}``, ``fsmn`` [1280, 31] the depthwise
FSMN taps, ``ffn_norm``, ``ffn_up``, ``ffn_down``) and ``fsq`` (the quantizer's projection to
its 8 digits); its hyperparameters are ``chatterbox.s3tok.*`` metadata.

S3Gen's speaker encoder (CAMPPlus) is under ``xvec.``, its batch norms folded: ``head.*`` (the
2-D convolutions), ``tdnn``, ``block{1,2,3}.{j}.`` (``bn1`` as scale and shift, ``linear1``,
``local``, ``cam1``, ``cam2``), ``transit{i}``, ``out_bn``, ``dense``; its Kaldi fbank front end
``xvec.dft``, ``xvec.mel`` and ``xvec.window``; its hyperparameters ``chatterbox.xvec.*``.

Where the folder has ``conds.pt`` (the built-in voice's conditionals, Conditionals.save), it
becomes the model's stock voice: ``voice.speaker_emb`` [256], ``voice.prompt_tokens`` (the token
model's prompt), and for S3Gen ``voice.gen_prompt_tokens``, ``voice.prompt_feat`` [80, frames]
and ``voice.xvector`` [192]; all F32, token ids as whole numbers.

The text head, and GPT-2's own token embedding (``tfmr.wte``), are not used to speak and are
left out.

Chatterbox Multilingual (variant "multilingual") reads ``t3_mtl23ls_v2.safetensors``,
``ve.safetensors`` and ``s3gen.safetensors`` or, as the hub's repository ships them, ``ve.pt`` and
``s3gen.pt`` (torch.save of the same state dicts; any weights file of either variant is read from
its ``.pt`` where its ``.safetensors`` is missing) (S3Gen with the 10-step decoder: no time mixer; its
solver Euler steps over a cosine span with guidance 0.7). Its T3 is Llama_520M: ``t3.blk.{i}.``
``attn_norm``/``ffn_norm`` (RMS norm gains), ``attn_qkv`` (q, k and v stacked, no bias),
``attn_out``, ``ffn_gate``, ``ffn_up``, ``ffn_down``; ``t3.rope_freqs`` [32] Llama 3's rotary
scaling as frequency divisors; ``t3.text_pos_emb`` and ``t3.speech_pos_emb`` the learned
positions added to the embeddings; ``t3.out_norm.weight``; ``t3.speech_head.weight`` (no bias);
the conditioning encoder's ``t3.spkr_enc``, ``t3.emotion.weight`` [C] (the exaggeration's
projection) and perceiver ``t3.perceiver.query`` [C, 32], ``.norm``, ``.attn_{q,k,v,out}``. Its
metadata adds the text's start and stop tokens, the positions, the alignment guard's heads
(``chatterbox.t3.alignment_heads``, layer and head pairs) and generate's defaults
(``chatterbox.t3.default.*``: temperature, top-p, min-p, repetition penalty, guidance,
exaggeration). Its grapheme tokenizer ``grapheme_mtl_merged_expanded_v1.json`` (a BPE with the
Whitespace pre-tokenizer, [SPACE] for spaces, the languages' tags as added tokens) is written as
``chatterbox.tokenizer``, and where the folder has ``Cangjie5_TC.json`` (Chinese characters'
Cangjie codes), it is ``chatterbox.cangjie``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path
from app.models import torch_checkpoint
from app.models.convert import ge2e
from app.models.gguf_weights import WEIGHT_TYPES, add_weight
from app.models.safetensors import SafetensorsError, SafetensorsFile

ARCH = "chatterbox"
SAMPLE_RATE = 24000
VARIANTS = ("turbo", "multilingual")
T3_FILES = {"turbo": "t3_turbo_v1.safetensors", "multilingual": "t3_mtl23ls_v2.safetensors"}
VE_FILE = "ve.safetensors"
# The voice encoder (chatterbox/models/voice_encoder/config.py, VoiceEncoder.embeds_from_wavs).
VE_SAMPLE_RATE = 16000
VE_PARTIAL_RATE = 1.3
VE_MIN_COVERAGE = 0.8
VE_TRIM_TOP_DB = 20.0

# Token ids of T3's speech vocabulary (chatterbox/models/t3/modules/t3_config.py): 6561 speech
# tokens (the S3 tokenizer's codes), then start and stop.
START_SPEECH = 6561
STOP_SPEECH = 6562
# What ChatterboxTurboTTS.from_local sets: the prompt's speech tokens in the conditioning.
TURBO_PROMPT_TOKENS = 375
# Chatterbox Multilingual's T3 (T3Config.multilingual, LLAMA_520M_CONFIG_DICT, T3CondEnc): heads
# of 64 with Llama 3's rotary scaling, text between [START] (255) and [STOP] (0), 150 prompt
# tokens through a perceiver of 4 heads, and the alignment heads (layer, head) whose attention
# over the text its AlignmentStreamAnalyzer watches (LLAMA_ALIGNED_HEADS).
LLAMA_HEAD_DIM = 64
LLAMA_ROPE_BASE = 500000.0
MTL_START_TEXT, MTL_STOP_TEXT = 255, 0
MTL_PROMPT_TOKENS = 150
PERCEIVER_HEADS = 4
ALIGNMENT_HEADS = [12, 15, 13, 11, 9, 2]
# ChatterboxMultilingualTTS.generate's defaults.
MTL_SAMPLING = {"temperature": 0.8, "top_p": 1.0, "min_p": 0.05, "repetition_penalty": 2.0}
MTL_CFG_WEIGHT, MTL_EXAGGERATION = 0.5, 0.5


class ConversionError(ValueError):
    pass


def _weights(folder: Path, name: str, what: str):
    """The weights file ``name`` (.safetensors) of ``folder``, or where only the PyTorch
    checkpoint of the same stem is there (``ve.pt``, ``s3gen.pt``: as the hub's
    ResembleAI/chatterbox ships Multilingual's), that state dict."""
    path = folder / name
    if path.is_file():
        return SafetensorsFile(path)
    pt = path.with_suffix(".pt")
    if pt.is_file():
        return torch_checkpoint.TorchStateFile(pt)
    raise ConversionError(f"'{folder}' has no '{name}' or '{pt.name}' ({what})")


def _t3_gpt2(st: SafetensorsFile) -> tuple[dict[str, int], dict[str, tuple[np.ndarray, bool]]]:
    """Hyperparameters and tensors (values, reducible) of a GPT-2 T3 (Chatterbox-Turbo)."""

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in st:
            raise ConversionError(f"'{st.path.name}' lacks tensor '{name}'")
        if st.shape(name) != shape:
            raise ConversionError(f"'{st.path.name}': tensor '{name}' is {st.shape(name)}, expected {shape}")
        return np.ascontiguousarray(st.tensor(name), dtype=np.float32)

    for name in ("tfmr.wpe.weight", "speech_emb.weight", "text_emb.weight", "cond_enc.spkr_enc.weight"):
        if name not in st:
            raise ConversionError(f"'{st.path.name}' lacks tensor '{name}': not Chatterbox-Turbo's token model")
    n_pos, C = st.shape("tfmr.wpe.weight")
    Vs = st.shape("speech_emb.weight")[0]
    Vt = st.shape("text_emb.weight")[0]
    E = st.shape("cond_enc.spkr_enc.weight")[1]
    n_layer = 0
    while f"tfmr.h.{n_layer}.ln_1.weight" in st:
        n_layer += 1
    if n_layer == 0 or C % 64 or Vs != STOP_SPEECH + 1:
        raise ConversionError(
            f"'{st.path.name}': {n_layer} blocks of width {C} and {Vs} speech tokens: "
            "not Chatterbox-Turbo's token model"
        )
    hp = {
        "n_layer": n_layer,
        "n_embd": C,
        "n_head": C // 64,  # GPT-2 medium: heads of 64
        "n_positions": n_pos,
        "text_vocab": Vt,
        "speech_vocab": Vs,
        "start_speech": START_SPEECH,
        "stop_speech": STOP_SPEECH,
        "speaker_embed_size": E,
        "prompt_tokens": TURBO_PROMPT_TOKENS,
    }
    t: dict[str, tuple[np.ndarray, bool]] = {
        "t3.pos_emb": (get("tfmr.wpe.weight", (n_pos, C)), True),
        "t3.text_emb": (get("text_emb.weight", (Vt, C)), True),
        "t3.speech_emb": (get("speech_emb.weight", (Vs, C)), True),
    }
    for i in range(n_layer):
        p, q = f"tfmr.h.{i}.", f"t3.blk.{i}."
        t[q + "attn_norm.weight"] = (get(p + "ln_1.weight", (C,)), False)
        t[q + "attn_norm.bias"] = (get(p + "ln_1.bias", (C,)), False)
        t[q + "attn_qkv.weight"] = (np.ascontiguousarray(get(p + "attn.c_attn.weight", (C, 3 * C)).T), True)
        t[q + "attn_qkv.bias"] = (get(p + "attn.c_attn.bias", (3 * C,)), False)
        t[q + "attn_out.weight"] = (np.ascontiguousarray(get(p + "attn.c_proj.weight", (C, C)).T), True)
        t[q + "attn_out.bias"] = (get(p + "attn.c_proj.bias", (C,)), False)
        t[q + "ffn_norm.weight"] = (get(p + "ln_2.weight", (C,)), False)
        t[q + "ffn_norm.bias"] = (get(p + "ln_2.bias", (C,)), False)
        t[q + "ffn_up.weight"] = (np.ascontiguousarray(get(p + "mlp.c_fc.weight", (C, 4 * C)).T), True)
        t[q + "ffn_up.bias"] = (get(p + "mlp.c_fc.bias", (4 * C,)), False)
        t[q + "ffn_down.weight"] = (np.ascontiguousarray(get(p + "mlp.c_proj.weight", (4 * C, C)).T), True)
        t[q + "ffn_down.bias"] = (get(p + "mlp.c_proj.bias", (C,)), False)
    t["t3.out_norm.weight"] = (get("tfmr.ln_f.weight", (C,)), False)
    t["t3.out_norm.bias"] = (get("tfmr.ln_f.bias", (C,)), False)
    t["t3.speech_head.weight"] = (get("speech_head.weight", (Vs, C)), True)
    t["t3.speech_head.bias"] = (get("speech_head.bias", (Vs,)), False)
    t["t3.spkr_enc.weight"] = (get("cond_enc.spkr_enc.weight", (C, E)), True)
    t["t3.spkr_enc.bias"] = (get("cond_enc.spkr_enc.bias", (C,)), False)
    return hp, t


def _llama3_rope_factors(head_dim: int) -> np.ndarray:
    """Per rotary pair, the divisor of its frequency under Llama 3's rope scaling (T3's Llama_520M
    config: factor 8, low and high frequency factors 1 and 4, 8192 original positions), as
    transformers' _compute_llama3_parameters scales it."""
    factor, low, high, original = 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / LLAMA_ROPE_BASE ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    scaled = np.where(wavelen > original / low, 1.0 / factor, (1 - smooth) / factor + smooth)
    scaled = np.where(wavelen < original / high, 1.0, scaled)
    return (1.0 / scaled).astype(np.float32)


def _t3_llama(st: SafetensorsFile) -> tuple[dict[str, int], dict[str, tuple[np.ndarray, bool]]]:
    """Hyperparameters and tensors (values, reducible) of a Llama T3 (Chatterbox Multilingual):
    RMS-normed blocks with rotary positions, learned text and speech positions added to the
    embeddings, and the conditioning encoder's perceiver resampler and emotion projection."""
    for name in (
        "tfmr.layers.0.self_attn.q_proj.weight",
        "speech_emb.weight",
        "cond_enc.perceiver.pre_attention_query",
    ):
        if name not in st:
            raise ConversionError(f"'{st.path.name}' lacks tensor '{name}': not Chatterbox Multilingual's token model")
    Vs, C = st.shape("speech_emb.weight")
    Vt = st.shape("text_emb.weight")[0]
    E = st.shape("cond_enc.spkr_enc.weight")[1]
    F = st.shape("tfmr.layers.0.mlp.gate_proj.weight")[0]
    n_text_pos = st.shape("text_pos_emb.emb.weight")[0]
    n_speech_pos = st.shape("speech_pos_emb.emb.weight")[0]
    n_query = st.shape("cond_enc.perceiver.pre_attention_query")[1]
    n_layer = 0
    while f"tfmr.layers.{n_layer}.input_layernorm.weight" in st:
        n_layer += 1
    if n_layer == 0 or C % LLAMA_HEAD_DIM or Vs < STOP_SPEECH + 1:
        raise ConversionError(
            f"'{st.path.name}': {n_layer} blocks of width {C} and {Vs} speech tokens: "
            "not Chatterbox Multilingual's token model"
        )
    get = _getter(st, "", "Chatterbox Multilingual's token model")
    hp = {
        "n_layer": n_layer,
        "n_embd": C,
        "n_head": C // LLAMA_HEAD_DIM,
        "ffn": F,
        "n_positions": n_text_pos + n_speech_pos,
        "text_positions": n_text_pos,
        "speech_positions": n_speech_pos,
        "text_vocab": Vt,
        "speech_vocab": Vs,
        "start_speech": START_SPEECH,
        "stop_speech": STOP_SPEECH,
        "start_text": MTL_START_TEXT,
        "stop_text": MTL_STOP_TEXT,
        "speaker_embed_size": E,
        "prompt_tokens": MTL_PROMPT_TOKENS,
        "perceiver_queries": n_query,
        "perceiver_heads": PERCEIVER_HEADS,
    }
    t: dict[str, tuple[np.ndarray, bool]] = {
        "t3.text_emb": (get("text_emb.weight", (Vt, C)), True),
        "t3.speech_emb": (get("speech_emb.weight", (Vs, C)), True),
        "t3.text_pos_emb": (get("text_pos_emb.emb.weight", (n_text_pos, C)), True),
        "t3.speech_pos_emb": (get("speech_pos_emb.emb.weight", (n_speech_pos, C)), True),
        "t3.rope_freqs": (_llama3_rope_factors(LLAMA_HEAD_DIM), False),
    }
    for i in range(n_layer):
        p, q = f"tfmr.layers.{i}.", f"t3.blk.{i}."
        t[q + "attn_norm.weight"] = (get(p + "input_layernorm.weight", (C,)), False)
        qkv = [get(p + f"self_attn.{x}_proj.weight", (C, C)) for x in "qkv"]
        t[q + "attn_qkv.weight"] = (np.concatenate(qkv), True)
        t[q + "attn_out.weight"] = (get(p + "self_attn.o_proj.weight", (C, C)), True)
        t[q + "ffn_norm.weight"] = (get(p + "post_attention_layernorm.weight", (C,)), False)
        t[q + "ffn_gate.weight"] = (get(p + "mlp.gate_proj.weight", (F, C)), True)
        t[q + "ffn_up.weight"] = (get(p + "mlp.up_proj.weight", (F, C)), True)
        t[q + "ffn_down.weight"] = (get(p + "mlp.down_proj.weight", (C, F)), True)
    t["t3.out_norm.weight"] = (get("tfmr.norm.weight", (C,)), False)
    t["t3.speech_head.weight"] = (get("speech_head.weight", (Vs, C)), True)
    t["t3.spkr_enc.weight"] = (get("cond_enc.spkr_enc.weight", (C, E)), True)
    t["t3.spkr_enc.bias"] = (get("cond_enc.spkr_enc.bias", (C,)), False)
    t["t3.emotion.weight"] = (get("cond_enc.emotion_adv_fc.weight", (C, 1)).reshape(C), False)
    r = "cond_enc.perceiver."
    t["t3.perceiver.query"] = (get(r + "pre_attention_query", (1, n_query, C))[0], False)
    t["t3.perceiver.norm.weight"] = (get(r + "attn.norm.weight", (C,)), False)
    t["t3.perceiver.norm.bias"] = (get(r + "attn.norm.bias", (C,)), False)
    for x, name in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("out", "proj_out")):
        t[f"t3.perceiver.attn_{x}.weight"] = (get(r + f"attn.{name}.weight", (C, C)), True)
        t[f"t3.perceiver.attn_{x}.bias"] = (get(r + f"attn.{name}.bias", (C,)), False)
    return hp, t


def _voice_encoder(st: SafetensorsFile) -> dict[str, np.ndarray]:
    """The voice encoder's tensors as the "ge2e" architecture names them, under "ve."."""
    H, M = ge2e.HIDDEN, ge2e.N_MELS
    expected = {"proj.weight": (H, H), "proj.bias": (H,)}
    for layer in range(ge2e.LAYERS):
        expected[f"lstm.weight_ih_l{layer}"] = (4 * H, M if layer == 0 else H)
        expected[f"lstm.weight_hh_l{layer}"] = (4 * H, H)
        expected[f"lstm.bias_ih_l{layer}"] = (4 * H,)
        expected[f"lstm.bias_hh_l{layer}"] = (4 * H,)
    f = {}
    for name, shape in expected.items():
        if name not in st:
            raise ConversionError(f"'{st.path.name}' lacks tensor '{name}': not Chatterbox's voice encoder")
        if st.shape(name) != shape:
            raise ConversionError(f"'{st.path.name}': tensor '{name}' is {st.shape(name)}, expected {shape}")
        f[name] = np.ascontiguousarray(st.tensor(name), dtype=np.float32)
    t = {
        "ve.dft": ge2e.dft_basis(ge2e.N_FFT),
        "ve.mel": ge2e.slaney_mel_filterbank(VE_SAMPLE_RATE, ge2e.N_FFT, M),
        "ve.linear.weight": f["proj.weight"],
        "ve.linear.bias": f["proj.bias"],
    }
    for layer in range(ge2e.LAYERS):
        t[f"ve.lstm.{layer}.weight_ih"] = f[f"lstm.weight_ih_l{layer}"]
        t[f"ve.lstm.{layer}.weight_hh"] = f[f"lstm.weight_hh_l{layer}"]
        t[f"ve.lstm.{layer}.bias"] = f[f"lstm.bias_ih_l{layer}"] + f[f"lstm.bias_hh_l{layer}"]
    return t


S3GEN_FILES = {"turbo": "s3gen_meanflow.safetensors", "multilingual": "s3gen.safetensors"}
# S3Token2Wav's HiFTGenerator (chatterbox/models/s3gen/s3gen.py, hifigan.py).
HIFT = {
    "n_mels": 80,
    "channels": 512,
    "n_fft": 16,
    "hop": 4,
    "harmonics": 8,
    "f0_layers": 5,
    "sample_rate": SAMPLE_RATE,
    "upsample_rates": [8, 5, 3],
    "upsample_kernels": [16, 11, 7],
    "resblock_kernels": [3, 7, 11],
    "resblock_dilations": [1, 3, 5],
    "source_resblock_kernels": [7, 7, 11],
    "nsf_alpha": 0.1,
    "nsf_sigma": 0.003,
    "voiced_threshold": 10.0,
    "lrelu_slope": 0.1,
    "audio_limit": 0.99,
}


def _hift(st: SafetensorsFile) -> dict[str, np.ndarray]:
    """HiFT's tensors (``mel2wav.*``) laid out for the engine, weight norm folded in."""

    def get(name: str) -> np.ndarray:
        if name not in st:
            raise ConversionError(f"'{st.path.name}' lacks tensor '{name}': not S3Gen's vocoder")
        return np.asarray(st.tensor(name), dtype=np.float32)

    def weight(module: str) -> np.ndarray:
        if module + ".weight" in st:
            return get(module + ".weight")
        g = get(module + ".parametrizations.weight.original0").astype(np.float64)
        v = get(module + ".parametrizations.weight.original1").astype(np.float64)
        norm = np.sqrt((v * v).reshape(v.shape[0], -1).sum(axis=1)).reshape(-1, *([1] * (v.ndim - 1)))
        return (g * v / norm).astype(np.float32)

    def conv(out: str, module: str) -> None:
        t[out + ".weight"] = np.ascontiguousarray(weight(module).transpose(0, 2, 1))  # [OC, IC, K] -> [IC, K, OC]
        t[out + ".bias"] = get(module + ".bias")

    def resblock(out: str, module: str) -> None:
        for j in range(len(HIFT["resblock_dilations"])):
            for half in ("1", "2"):
                conv(f"{out}.convs{half}.{j}", f"{module}.convs{half}.{j}")
                alpha = get(f"{module}.activations{half}.{j}.alpha")
                t[f"{out}.activations{half}.{j}.alpha"] = alpha
                t[f"{out}.activations{half}.{j}.inv_alpha"] = (1.0 / (alpha.astype(np.float64) + 1e-9)).astype(
                    np.float32
                )

    m, t = "mel2wav.", {}
    conv("hift.conv_pre", m + "conv_pre")
    for i, (rate, kernel) in enumerate(zip(HIFT["upsample_rates"], HIFT["upsample_kernels"], strict=True)):
        w = weight(f"{m}ups.{i}").transpose(2, 1, 0)  # [IC, OC, K] -> [K, OC, IC]
        if w.shape[0] != kernel:
            raise ConversionError(f"'{st.path.name}': HiFT's upsampling {i} has {w.shape[0]} taps, expected {kernel}")
        taps = -(-kernel // rate) * rate
        t[f"hift.ups.{i}.weight"] = np.ascontiguousarray(np.pad(w, ((0, taps - kernel), (0, 0), (0, 0))))
        t[f"hift.ups.{i}.bias"] = get(f"{m}ups.{i}.bias")
        conv(f"hift.source_downs.{i}", f"{m}source_downs.{i}")
        resblock(f"hift.source_resblocks.{i}", f"{m}source_resblocks.{i}")
        for j in range(len(HIFT["resblock_kernels"])):
            n = i * len(HIFT["resblock_kernels"]) + j
            resblock(f"hift.resblocks.{n}", f"{m}resblocks.{n}")
    conv("hift.conv_post", m + "conv_post")
    for layer in range(HIFT["f0_layers"]):
        conv(f"hift.f0.condnet.{layer}", f"{m}f0_predictor.condnet.{2 * layer}")
    t["hift.f0.classifier.weight"] = get(m + "f0_predictor.classifier.weight")
    t["hift.f0.classifier.bias"] = get(m + "f0_predictor.classifier.bias")
    t["hift.m_source.l_linear.weight"] = get(m + "m_source.l_linear.weight")
    t["hift.m_source.l_linear.bias"] = get(m + "m_source.l_linear.bias")
    # The source's STFT and the output's inverse STFT (periodic Hann window, torch.stft/istft).
    n_fft = HIFT["n_fft"]
    n, k = np.arange(n_fft), np.arange(n_fft // 2 + 1)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)
    angle = 2 * np.pi * np.outer(k, n) / n_fft  # [bins, n]
    t["hift.stft"] = np.concatenate([np.cos(angle) * window, -np.sin(angle) * window]).astype(np.float32)
    scale = np.where((k == 0) | (k == n_fft // 2), 1.0, 2.0)[:, None] / n_fft
    inverse = np.concatenate([np.cos(angle) * scale, -np.sin(angle) * scale]) * window  # [2 bins, n]
    t["hift.istft"] = np.ascontiguousarray(inverse.T[:, None, :]).astype(np.float32)  # [n, 1, 2 bins]
    return t


# S3Token2Mel's flow (chatterbox/models/s3gen/s3gen.py, flow.py, flow_matching.py, decoder.py):
# speech tokens embedded, an upsampling conformer encoder (espnet relative positions), a
# projection to the mel's bands, and a conditional flow-matching U-Net decoder.
FLOW = {
    "vocab": 6561,
    "n_embd": 512,
    "n_head": 8,
    "ffn": 2048,
    "n_layer": 6,
    "n_up_layer": 4,
    "lookahead": 3,
    "silence_token": 4299,  # S3GEN_SIL: three of them close each run of tokens, a silent ending
    "token_mel_ratio": 2,
    "n_mels": 80,
    "xvector": 192,
    "dec_channels": 256,
    "dec_n_head": 8,
    "dec_head_dim": 64,
    "dec_n_tfm": 4,
    "dec_n_mid": 12,
    "dec_time_embed": 1024,
    "dec_time_sinusoid": 320,
}
# S3Gen's mel of a voice's recording (s3gen/utils/mel.py, Matcha-TTS's): 24 kHz, its edges
# reflected by (n_fft - hop) / 2, a Hann window of n_fft, magnitude, Slaney mel filters up to fmax,
# natural log floored at 1e-5.
FLOW_MEL = {"mel_sample_rate": 24000, "mel_n_fft": 1920, "mel_hop": 480, "mel_fmax": 8000}
# The variant's solver: Turbo's decoder is distilled to mean-flow steps (no guidance); the
# time span is linear there, cosine-warped otherwise.
FLOW_SOLVER = {
    "turbo": {"meanflow": 1, "steps": 2, "cfg_rate": 0.0},
    "multilingual": {"meanflow": 0, "steps": 10, "cfg_rate": 0.7},
}


def _getter(st: SafetensorsFile, prefix: str, what: str, dtype=np.float32):
    """get(name, shape=None): tensor ``prefix + name`` of ``st`` as ``dtype``, refused with a clear
    error where the file lacks it (naming ``what`` the file is not) or holds another shape."""

    def get(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        name = prefix + name
        if name not in st:
            raise ConversionError(f"'{st.path.name}' lacks tensor '{name}': not {what}")
        if shape is not None and st.shape(name) != shape:
            raise ConversionError(f"'{st.path.name}': tensor '{name}' is {st.shape(name)}, expected {shape}")
        return np.ascontiguousarray(st.tensor(name), dtype=dtype)

    return get


def _flow(st: SafetensorsFile, meanflow: bool) -> dict[str, tuple[np.ndarray, bool]]:
    """S3Gen's flow tensors (``flow.*``) laid out for the engine: linear weights [in, out] (as
    stored), convolutions [IC, K, OC], pointwise convolutions as matrices [IC, OC]; values
    with ``reduce`` where a matmul reads them."""
    C, H, F, M, D = FLOW["n_embd"], FLOW["n_head"], FLOW["ffn"], FLOW["n_mels"], FLOW["dec_channels"]
    TE, inner = FLOW["dec_time_embed"], FLOW["dec_n_head"] * FLOW["dec_head_dim"]
    t: dict[str, tuple[np.ndarray, bool]] = {}

    get = _getter(st, "flow.", "S3Gen's flow")

    def linear(out: str, module: str, n_in: int, n_out: int, bias: bool = True) -> None:
        t[out + ".weight"] = (get(module + ".weight", (n_out, n_in)), True)
        if bias:
            t[out + ".bias"] = (get(module + ".bias", (n_out,)), False)

    def norm(out: str, module: str, n: int) -> None:
        t[out + ".weight"] = (get(module + ".weight", (n,)), False)
        t[out + ".bias"] = (get(module + ".bias", (n,)), False)

    def conv(out: str, module: str, n_in: int, n_out: int, k: int) -> None:
        w = get(module + ".weight", (n_out, n_in, k))
        if k == 1:
            t[out + ".weight"] = (np.ascontiguousarray(w[:, :, 0]), True)
        else:
            t[out + ".weight"] = (np.ascontiguousarray(w.transpose(0, 2, 1)), False)  # [IC, K, OC] in ggml
        t[out + ".bias"] = (get(module + ".bias", (n_out,)), False)

    n_fft = FLOW_MEL["mel_n_fft"]
    angle = 2 * np.pi * np.outer(np.arange(n_fft // 2 + 1), np.arange(n_fft)) / n_fft
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    dft = np.concatenate([np.cos(angle) * window, -np.sin(angle) * window]).astype(np.float32)
    t["flow.mel_dft"] = (dft, False)  # [n_fft, 2 bins] in ggml: cos rows, then -sin rows
    t["flow.mel_filters"] = (
        ge2e.slaney_mel_filterbank(FLOW_MEL["mel_sample_rate"], n_fft, M, fmax=FLOW_MEL["mel_fmax"]),
        False,
    )
    t["flow.token_emb"] = (get("input_embedding.weight", (FLOW["vocab"], C)), True)
    linear("flow.spk_affine", "spk_embed_affine_layer", FLOW["xvector"], M)
    e = "encoder."
    conv("flow.enc.lookahead.conv1", e + "pre_lookahead_layer.conv1", C, C, FLOW["lookahead"] + 1)
    conv("flow.enc.lookahead.conv2", e + "pre_lookahead_layer.conv2", C, C, 3)
    conv("flow.enc.up", e + "up_layer.conv", C, C, 5)
    norm("flow.enc.out_norm", e + "after_norm", C)
    linear("flow.enc.proj", "encoder_proj", C, M)
    for embed in ("embed", "up_embed"):
        linear(f"flow.enc.{embed}", f"{e}{embed}.out.0", C, C)
        norm(f"flow.enc.{embed}_norm", f"{e}{embed}.out.1", C)
    for stack, n in (("encoders", FLOW["n_layer"]), ("up_encoders", FLOW["n_up_layer"])):
        for i in range(n):
            p, q = f"{e}{stack}.{i}.", f"flow.enc.{'up_blk' if stack == 'up_encoders' else 'blk'}.{i}."
            for name in ("q", "k", "v", "out"):
                linear(q + "attn_" + name, p + "self_attn.linear_" + name, C, C)
            linear(q + "attn_pos", p + "self_attn.linear_pos", C, C, bias=False)
            for bias in ("pos_bias_u", "pos_bias_v"):
                t[q + bias] = (get(p + "self_attn." + bias, (H, C // H)).reshape(-1), False)
            norm(q + "attn_norm", p + "norm_mha", C)
            norm(q + "ffn_norm", p + "norm_ff", C)
            linear(q + "ffn_up", p + "feed_forward.w_1", C, F)
            linear(q + "ffn_down", p + "feed_forward.w_2", F, C)

    d = "decoder.estimator."
    linear("flow.dec.time.linear_1", d + "time_mlp.linear_1", FLOW["dec_time_sinusoid"], TE)
    linear("flow.dec.time.linear_2", d + "time_mlp.linear_2", TE, TE)
    if meanflow:
        linear("flow.dec.time_mixer", d + "time_embed_mixer", 2 * TE, TE, bias=False)
    elif "flow." + d + "time_embed_mixer.weight" in st:
        raise ConversionError(f"'{st.path.name}' is a mean-flow S3Gen (Turbo's), not the 10-step decoder")

    def block(out: str, module: str, n_in: int) -> None:  # CausalResnetBlock1D, its transformer blocks
        r = module + "0."
        conv(out + "block1.conv", r + "block1.block.0", n_in, D, 3)
        norm(out + "block1.norm", r + "block1.block.2", D)
        conv(out + "block2.conv", r + "block2.block.0", D, D, 3)
        norm(out + "block2.norm", r + "block2.block.2", D)
        linear(out + "time", r + "mlp.1", TE, D)
        conv(out + "res_conv", r + "res_conv", n_in, D, 1)
        for j in range(FLOW["dec_n_tfm"]):
            p, q = f"{module}1.{j}.", f"{out}tfm.{j}."
            norm(q + "norm1", p + "norm1", D)
            for name in ("q", "k", "v"):
                linear(q + "attn_" + name, p + "attn1.to_" + name, D, inner, bias=False)
            linear(q + "attn_out", p + "attn1.to_out.0", inner, D)
            norm(q + "norm3", p + "norm3", D)
            linear(q + "ffn_up", p + "ff.net.0.proj", D, 4 * D)
            linear(q + "ffn_down", p + "ff.net.2", 4 * D, D)

    block("flow.dec.down.", d + "down_blocks.0.", 4 * M)  # the state, encoder output, speaker, prompt mel
    conv("flow.dec.down.conv", d + "down_blocks.0.2", D, D, 3)
    for i in range(FLOW["dec_n_mid"]):
        block(f"flow.dec.mid.{i}.", f"{d}mid_blocks.{i}.", D)
    block("flow.dec.up.", d + "up_blocks.0.", 2 * D)
    conv("flow.dec.up.conv", d + "up_blocks.0.2", D, D, 3)
    conv("flow.dec.final.conv", d + "final_block.block.0", D, D, 3)
    norm("flow.dec.final.norm", d + "final_block.block.2", D)
    conv("flow.dec.proj", d + "final_proj", D, M, 1)
    for name in ("down_blocks.1.", f"mid_blocks.{FLOW['dec_n_mid']}.", "up_blocks.1."):
        if any(k.startswith("flow." + d + name) for k in st.names()):
            raise ConversionError(f"'{st.path.name}': its flow decoder has more levels than S3Gen's")
    return t


# S3Gen's speech tokenizer (S3TokenizerV2, speech_tokenizer_v2_25hz; chatterbox/models/s3tokenizer).
S3TOK = {
    "sample_rate": 16000,
    "n_fft": 400,
    "hop": 160,
    "n_mels": 128,
    "n_state": 1280,
    "n_head": 20,
    "n_layer": 6,
    "fsmn_kernel": 31,
    "levels": 3,
    "digits": 8,
}
S3TOK_ROPE_BASE = 10000.0


def _speech_tokenizer(st: SafetensorsFile) -> dict[str, tuple[np.ndarray, bool]]:
    """The speech tokenizer's tensors (``tokenizer.*``) laid out for the engine; its front end
    (librosa's Slaney mel filters, a periodic Hann window folded into a DFT) computed here, as
    the reference computes it where the file lacks those buffers."""
    C, M, K = S3TOK["n_state"], S3TOK["n_mels"], S3TOK["fsmn_kernel"]
    t: dict[str, tuple[np.ndarray, bool]] = {}

    get = _getter(st, "tokenizer.", "S3Gen's speech tokenizer")

    def linear(out: str, module: str, n_in: int, n_out: int, bias: bool = True) -> None:
        t[out + ".weight"] = (get(module + ".weight", (n_out, n_in)), True)
        if bias:
            t[out + ".bias"] = (get(module + ".bias", (n_out,)), False)

    n_fft = S3TOK["n_fft"]
    n, k = np.arange(n_fft), np.arange(n_fft // 2 + 1)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)
    angle = 2 * np.pi * np.outer(k, n) / n_fft
    t["s3tok.dft"] = (np.concatenate([np.cos(angle) * window, -np.sin(angle) * window]).astype(np.float32), False)
    t["s3tok.mel"] = (np.ascontiguousarray(ge2e.slaney_mel_filterbank(S3TOK["sample_rate"], n_fft, M)), False)
    for n_in, name in ((M, "conv1"), (C, "conv2")):
        w = get(f"encoder.{name}.weight", (C, n_in, 3))
        t[f"s3tok.{name}.weight"] = (np.ascontiguousarray(w.transpose(0, 2, 1)), False)
        t[f"s3tok.{name}.bias"] = (get(f"encoder.{name}.bias", (C,)), False)
    for i in range(S3TOK["n_layer"]):
        p, q = f"encoder.blocks.{i}.", f"s3tok.blk.{i}."
        for norm, module in (("attn_norm", "attn_ln"), ("ffn_norm", "mlp_ln")):
            t[q + norm + ".weight"] = (get(p + module + ".weight", (C,)), False)
            t[q + norm + ".bias"] = (get(p + module + ".bias", (C,)), False)
        linear(q + "attn_q", p + "attn.query", C, C)
        linear(q + "attn_k", p + "attn.key", C, C, bias=False)
        linear(q + "attn_v", p + "attn.value", C, C)
        linear(q + "attn_out", p + "attn.out", C, C)
        t[q + "fsmn"] = (np.ascontiguousarray(get(p + "attn.fsmn_block.weight", (C, 1, K))[:, 0, :].T), False)
        linear(q + "ffn_up", p + "mlp.0", C, 4 * C)
        linear(q + "ffn_down", p + "mlp.2", 4 * C, C)
    fsq = "quantizer._codebook.project_down"
    t["s3tok.fsq.weight"] = (get(fsq + ".weight", (S3TOK["digits"], C)), False)
    t["s3tok.fsq.bias"] = (get(fsq + ".bias", (S3TOK["digits"],)), False)
    return t


# S3Gen's speaker encoder (CAMPPlus; chatterbox/models/s3gen/xvector.py) and its Kaldi fbank front
# end (torchaudio.compliance.kaldi.fbank's defaults, 80 bins).
XVEC = {
    "sample_rate": 16000,
    "frame": 400,
    "hop": 160,
    "n_fft": 512,
    "n_mels": 80,
    "head_channels": 32,
    "init_channels": 128,
    "growth": 32,
    "bn_channels": 128,
    "seg_len": 100,
    "embedding": 192,
    "block_layers": [12, 24, 16],
    "block_dilations": [1, 2, 2],
}
XVEC_PREEMPHASIS = 0.97
BN_EPS = 1e-5


def kaldi_mel_banks(n_mels: int, n_fft: int, sample_rate: int, low: float = 20.0) -> np.ndarray:
    """Kaldi's triangular mel banks [n_mels, n_fft // 2 + 1] (mel = 1127 ln(1 + f / 700), from
    ``low`` to Nyquist; the last FFT bin's weight zero), as torchaudio's get_mel_banks."""

    def mel(f):
        return 1127.0 * np.log(1.0 + np.asarray(f, np.float64) / 700.0)

    lo, hi = mel(low), mel(sample_rate / 2)
    delta = (hi - lo) / (n_mels + 1)
    b = np.arange(n_mels)[:, None]
    left, center, right = lo + b * delta, lo + (b + 1) * delta, lo + (b + 2) * delta
    freqs = mel(sample_rate / n_fft * np.arange(n_fft // 2))[None, :]
    banks = np.maximum(0.0, np.minimum((freqs - left) / (center - left), (right - freqs) / (right - center)))
    return np.pad(banks, ((0, 0), (0, 1))).astype(np.float32)


def _speaker_encoder(st: SafetensorsFile) -> dict[str, np.ndarray]:
    """CAMPPlus's tensors (``speaker_encoder.*``) for the engine: batch norms folded into the
    convolution before them, or kept as a per-channel scale and shift where a ReLU stands
    between; 2-D convolutions [KW, KH, IC, OC] with biases [1, 1, OC], 1-D ones [IC, K, OC],
    pointwise ones as matrices [IC, OC]."""
    t: dict[str, np.ndarray] = {}
    get = _getter(st, "speaker_encoder.", "S3Gen's speaker encoder", np.float64)  # batch norms folded in double

    def bn(module: str, affine: bool = True) -> tuple[np.ndarray, np.ndarray]:
        inv = 1.0 / np.sqrt(get(module + ".running_var") + BN_EPS)
        scale = get(module + ".weight") * inv if affine else inv
        shift = (get(module + ".bias") if affine else 0.0) - get(module + ".running_mean") * scale
        return scale, shift

    def f32(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float32)

    def conv2d(out: str, conv: str, norm: str) -> None:
        scale, shift = bn(norm)
        t[out + ".weight"] = f32(get(conv + ".weight") * scale[:, None, None, None])
        t[out + ".bias"] = f32(shift[:, None, None])

    def scale_shift(out: str, norm: str) -> None:
        t[out + ".scale"], t[out + ".shift"] = (f32(v) for v in bn(norm))

    conv2d("xvec.head.conv1", "head.conv1", "head.bn1")
    for layer in (1, 2):
        for b in (0, 1):
            q, p = f"xvec.head.layer{layer}.{b}.", f"head.layer{layer}.{b}."
            conv2d(q + "conv1", p + "conv1", p + "bn1")
            conv2d(q + "conv2", p + "conv2", p + "bn2")
            if b == 0:
                conv2d(q + "shortcut", p + "shortcut.0", p + "shortcut.1")
    conv2d("xvec.head.conv2", "head.conv2", "head.bn2")
    x = "xvector."
    scale, shift = bn(x + "tdnn.nonlinear.batchnorm")
    w = get(x + "tdnn.linear.weight") * scale[:, None, None]  # [OC, IC, K]
    t["xvec.tdnn.weight"], t["xvec.tdnn.bias"] = f32(w.transpose(0, 2, 1)), f32(shift)
    channels, G = XVEC["init_channels"], XVEC["growth"]
    for i, n in enumerate(XVEC["block_layers"], 1):
        for j in range(n):
            p, q = f"{x}block{i}.tdnnd{j + 1}.", f"xvec.block{i}.{j}."
            scale_shift(q + "bn1", p + "nonlinear1.batchnorm")
            scale, shift = bn(p + "nonlinear2.batchnorm")
            t[q + "linear1.weight"] = f32(get(p + "linear1.weight")[:, :, 0] * scale[:, None])
            t[q + "linear1.bias"] = f32(shift)
            t[q + "local.weight"] = f32(get(p + "cam_layer.linear_local.weight").transpose(0, 2, 1))
            for k in (1, 2):
                t[q + f"cam{k}.weight"] = f32(get(p + f"cam_layer.linear{k}.weight")[:, :, 0])
                t[q + f"cam{k}.bias"] = f32(get(p + f"cam_layer.linear{k}.bias"))
        channels += n * G
        scale_shift(f"xvec.transit{i}.bn", f"{x}transit{i}.nonlinear.batchnorm")
        t[f"xvec.transit{i}.weight"] = f32(get(f"{x}transit{i}.linear.weight", (channels // 2, channels, 1))[:, :, 0])
        channels //= 2
    scale_shift("xvec.out_bn", x + "out_nonlinear.batchnorm")
    scale, shift = bn(x + "dense.nonlinear.batchnorm", affine=False)
    dense = get(x + "dense.linear.weight", (XVEC["embedding"], 2 * channels, 1))[:, :, 0]
    t["xvec.dense.weight"], t["xvec.dense.bias"] = f32(dense * scale[:, None]), f32(shift)
    # The front end: a DFT of n_fft points (no window: Povey's is applied before, on the host),
    # Kaldi's mel banks, Povey's window (a symmetric Hann to the power 0.85).
    n_fft, n = XVEC["n_fft"], np.arange(XVEC["frame"])
    angle = 2 * np.pi * np.outer(np.arange(n_fft // 2 + 1), np.arange(n_fft)) / n_fft
    t["xvec.dft"] = f32(np.concatenate([np.cos(angle), -np.sin(angle)]))
    t["xvec.mel"] = kaldi_mel_banks(XVEC["n_mels"], n_fft, XVEC["sample_rate"])
    t["xvec.window"] = f32((0.5 - 0.5 * np.cos(2 * np.pi * n / (XVEC["frame"] - 1))) ** 0.85)
    return t


def _stock_voice(path: Path, hp: dict[str, int]) -> dict[str, np.ndarray]:
    """The built-in voice of conds.pt (Conditionals.save: {"t3": T3Cond's fields, "gen": S3Gen's
    reference dict}) as the GGUF's voice.* tensors."""
    try:
        conds = torch_checkpoint.load(path)
        t3, gen = conds["t3"], conds["gen"]
        spk = np.asarray(t3["speaker_emb"], np.float32).reshape(-1)
        prompt = np.asarray(t3["cond_prompt_speech_tokens"]).reshape(-1)
        gen_prompt = np.asarray(gen["prompt_token"]).reshape(-1)
        feat = np.asarray(gen["prompt_feat"], np.float32)
        xvector = np.asarray(gen["embedding"], np.float32).reshape(-1)
    except (torch_checkpoint.CheckpointError, KeyError, TypeError, ValueError) as e:
        raise ConversionError(f"'{path}' holds no Chatterbox conditionals ({e})") from None
    if spk.size != hp["speaker_embed_size"] or not np.all(np.isfinite(spk)):
        raise ConversionError(
            f"'{path}': a speaker embedding of {spk.size} values, expected {hp['speaker_embed_size']}"
        )
    if prompt.size > hp["prompt_tokens"] or prompt.size and not 0 <= prompt.min() <= prompt.max() < START_SPEECH:
        raise ConversionError(f"'{path}': its prompt's speech tokens are not the token model's")
    if feat.ndim != 3 or feat.shape[0] != 1 or feat.shape[2] != HIFT["n_mels"] or not np.all(np.isfinite(feat)):
        raise ConversionError(f"'{path}': a prompt mel of shape {feat.shape}, expected (1, frames, 80)")
    return {
        "voice.speaker_emb": spk,
        "voice.prompt_tokens": prompt.astype(np.float32),  # whole numbers, exact in F32
        "voice.gen_prompt_tokens": gen_prompt.astype(np.float32),
        "voice.prompt_feat": np.ascontiguousarray(feat[0]),
        "voice.xvector": xvector,
    }


def _tokenizer(checkpoint: Path, text_vocab: int) -> str:
    """The text tokenizer of the checkpoint folder, as a JSON string of tokenizer.json's layout."""
    path = checkpoint / "tokenizer.json"
    try:
        if path.is_file():
            spec = json.loads(path.read_text(encoding="utf-8"))
            model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
            kinds = {pre.get("type")} | {p.get("type") for p in pre.get("pretokenizers", [])}
            if model.get("type") != "BPE" or "ByteLevel" not in kinds or spec.get("normalizer"):
                raise ConversionError(f"'{path}' is not a byte-level BPE tokenizer (GPT-2's)")
            vocab, merges = model["vocab"], model.get("merges", [])
            added = spec.get("added_tokens", [])
        elif (checkpoint / "vocab.json").is_file() and (checkpoint / "merges.txt").is_file():
            vocab = json.loads((checkpoint / "vocab.json").read_text(encoding="utf-8"))
            lines = (checkpoint / "merges.txt").read_text(encoding="utf-8").splitlines()
            merges = [m for m in lines if m and not m.startswith("#version")]
            extra = checkpoint / "added_tokens.json"
            table = json.loads(extra.read_text(encoding="utf-8")) if extra.is_file() else {}
            added = [{"content": t, "id": i} for t, i in sorted(table.items(), key=lambda kv: kv[1])]
        else:
            raise ConversionError(
                f"'{checkpoint}' has no text tokenizer (tokenizer.json, or vocab.json and merges.txt)"
            )
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ConversionError(f"'{checkpoint}': the text tokenizer cannot be read ({e})") from None
    ids = list(vocab.values()) + [a["id"] for a in added]
    if not ids or min(ids) < 0 or max(ids) >= text_vocab:
        raise ConversionError(f"the text tokenizer's ids pass the token model's {text_vocab} text tokens")
    added = [{k: a[k] for k in ("content", "id", "lstrip", "rstrip") if k in a} for a in added]
    return json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": merges}, "added_tokens": added})


MTL_TOKENIZER_FILE = "grapheme_mtl_merged_expanded_v1.json"
CANGJIE_FILE = "Cangjie5_TC.json"


def _mtl_tokenizer(checkpoint: Path, text_vocab: int) -> tuple[str, str]:
    """Multilingual's grapheme tokenizer (a BPE with the Whitespace pre-tokenizer) and, where the
    folder has it, its Cangjie table for Chinese, each as a JSON string."""
    from app.engine.bpe import WhitespaceBPE
    from app.engine.chatterbox_text import Cangjie

    path = checkpoint / MTL_TOKENIZER_FILE
    if not path.is_file():
        raise ConversionError(f"'{checkpoint}' has no '{MTL_TOKENIZER_FILE}' (Chatterbox Multilingual's tokenizer)")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        bpe = WhitespaceBPE.from_tokenizer_json(spec)
        model = spec["model"]
        ids = list(bpe.vocab.values()) + [a["id"] for a in bpe.added]
        for token in ("[SPACE]", model.get("unk_token")):
            if token not in bpe.vocab:
                raise ValueError(f"its vocabulary lacks {token}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise ConversionError(f"'{path}' is not Chatterbox Multilingual's tokenizer ({e})") from None
    if not ids or min(ids) < 0 or max(ids) >= text_vocab:
        raise ConversionError(f"the text tokenizer's ids pass the token model's {text_vocab} text tokens")
    added = [{k: a[k] for k in ("content", "id", "lstrip", "rstrip") if k in a} for a in spec.get("added_tokens", [])]
    merges = model.get("merges", [])
    tokenizer = {
        "model": {"type": "BPE", "vocab": model["vocab"], "merges": merges, "unk_token": model.get("unk_token")},
        "pre_tokenizer": {"type": "Whitespace"},
        "added_tokens": added,
    }
    cangjie = ""
    if (checkpoint / CANGJIE_FILE).is_file():
        try:
            cangjie = (checkpoint / CANGJIE_FILE).read_text(encoding="utf-8")
            Cangjie.from_json(cangjie)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
            raise ConversionError(f"'{checkpoint / CANGJIE_FILE}' is not a Cangjie table ({e})") from None
        cangjie = json.dumps(json.loads(cangjie), ensure_ascii=False, separators=(",", ":"))
    return json.dumps(tokenizer, ensure_ascii=False), cangjie


def convert(
    checkpoint: Path, out_path: Path, *, variant: str = "turbo", weights: str = "f16", source: str = ""
) -> Path:
    """Write the Chatterbox ``variant`` whose official files are in folder ``checkpoint`` to
    ``out_path`` with matrices in ``weights`` (f32, f16 or q8_0; q4_0: the token model's in Q4_0,
    the rest in Q8_0)."""
    import gguf

    if variant not in VARIANTS:
        raise ConversionError(f"Chatterbox variant '{variant}' is not converted here; known: {', '.join(VARIANTS)}")
    if weights not in (*WEIGHT_TYPES, "q4_0"):
        raise ConversionError(f"weight type '{weights}': one of {', '.join(WEIGHT_TYPES)}, q4_0")
    # Q4_0 is the token model's (as the seeds quantize it); S3Gen's matrices go in Q8_0 then.
    rest = "q8_0" if weights == "q4_0" else weights
    path = Path(checkpoint) / T3_FILES[variant]
    if not path.is_file():
        raise ConversionError(f"'{checkpoint}' has no '{T3_FILES[variant]}' (Chatterbox-{variant}'s token model)")
    try:
        ve = _weights(Path(checkpoint), VE_FILE, "Chatterbox's voice encoder")  # found before the token model is read
        hp, tensors = (_t3_llama if variant == "multilingual" else _t3_gpt2)(SafetensorsFile(path))
        voice_encoder = _voice_encoder(ve)
    except (SafetensorsError, torch_checkpoint.CheckpointError) as e:
        raise ConversionError(str(e)) from None
    cangjie = ""
    if variant == "turbo":
        tokenizer = _tokenizer(Path(checkpoint), hp["text_vocab"])
    else:
        tokenizer, cangjie = _mtl_tokenizer(Path(checkpoint), hp["text_vocab"])
    stock = Path(checkpoint) / "conds.pt"
    voice = _stock_voice(stock, hp) if stock.is_file() else {}
    try:
        s3gen = _weights(Path(checkpoint), S3GEN_FILES[variant], "S3Gen: speech tokens to audio")
        hift, flow, s3tok = _hift(s3gen), _flow(s3gen, bool(FLOW_SOLVER[variant]["meanflow"])), _speech_tokenizer(s3gen)
        xvec = _speaker_encoder(s3gen)
    except (SafetensorsError, torch_checkpoint.CheckpointError) as e:
        raise ConversionError(str(e)) from None

    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), ARCH)
        writer.add_name(f"Chatterbox-{variant.capitalize()}")
        writer.add_string("general.license", "MIT")
        if source:
            writer.add_string("general.source", source)
        p = f"{ARCH}."
        writer.add_string(p + "variant", variant)
        writer.add_uint32(p + "sample_rate", SAMPLE_RATE)
        writer.add_string(p + "t3.backbone", "gpt2" if variant == "turbo" else "llama")
        writer.add_string(p + "tokenizer", tokenizer)
        if cangjie:
            writer.add_string(p + "cangjie", cangjie)
        if variant == "multilingual":
            writer.add_float32(p + "t3.rope_base", LLAMA_ROPE_BASE)
            writer.add_array(p + "t3.alignment_heads", ALIGNMENT_HEADS)
            for key, value in (MTL_SAMPLING | {"cfg_weight": MTL_CFG_WEIGHT, "exaggeration": MTL_EXAGGERATION}).items():
                writer.add_float32(p + "t3.default." + key, value)
            writer.add_uint32(p + "t3.default.top_k", 0)
        writer.add_float32(p + "t3.norm_eps", 1e-5)
        for key, value in hp.items():
            writer.add_uint32(p + "t3." + key, value)
        v = p + "ve."
        writer.add_uint32(v + "sample_rate", VE_SAMPLE_RATE)
        writer.add_uint32(v + "n_fft", ge2e.N_FFT)
        writer.add_uint32(v + "hop", ge2e.HOP)
        writer.add_uint32(v + "n_mels", ge2e.N_MELS)
        writer.add_uint32(v + "partial_frames", ge2e.PARTIAL_FRAMES)
        writer.add_float32(v + "partial_rate", VE_PARTIAL_RATE)
        writer.add_float32(v + "min_coverage", VE_MIN_COVERAGE)
        writer.add_uint32(v + "layers", ge2e.LAYERS)
        writer.add_uint32(v + "hidden", ge2e.HIDDEN)
        writer.add_string(v + "pad", "reflect")
        writer.add_string(v + "partials", "chatterbox")
        writer.add_float32(v + "trim_top_db", VE_TRIM_TOP_DB)
        for name, (data, reduce) in tensors.items():
            add_weight(writer, name, data, weights, reduce=reduce)
        for name, data in voice_encoder.items():
            writer.add_tensor(name, data)
        for key, value in HIFT.items():
            if isinstance(value, list):
                writer.add_array(p + "hift." + key, np.asarray(value, np.int32).tolist())
            elif isinstance(value, float):
                writer.add_float32(p + "hift." + key, value)
            else:
                writer.add_uint32(p + "hift." + key, value)
        for name, data in hift.items():
            writer.add_tensor(name, data)
        for key, value in (FLOW | FLOW_MEL | FLOW_SOLVER[variant]).items():
            if isinstance(value, float):
                writer.add_float32(p + "flow." + key, value)
            else:
                writer.add_uint32(p + "flow." + key, value)
        for name, (data, reduce) in flow.items():
            add_weight(writer, name, data, rest, reduce=reduce)
        for key, value in S3TOK.items():
            writer.add_uint32(p + "s3tok." + key, value)
        writer.add_float32(p + "s3tok.rope_base", S3TOK_ROPE_BASE)
        for name, (data, reduce) in s3tok.items():
            add_weight(writer, name, data, rest, reduce=reduce)
        for key, value in XVEC.items():
            if isinstance(value, list):
                writer.add_array(p + "xvec." + key, value)
            else:
                writer.add_uint32(p + "xvec." + key, value)
        writer.add_float32(p + "xvec.preemphasis", XVEC_PREEMPHASIS)
        for name, data in xvec.items():
            writer.add_tensor(name, data)
        for name, data in voice.items():
            writer.add_tensor(name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out_path
