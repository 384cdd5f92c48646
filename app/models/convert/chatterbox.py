"""Convert Chatterbox's official checkpoints (Resemble AI, MIT) into a GGUF the engine loads
(arch "chatterbox").

Reads a checkpoint folder as the Hugging Face Hub holds it, by the official file names:
Chatterbox-Turbo's ``t3_turbo_v1.safetensors`` (the token model: GPT-2 medium blocks with
learned positions, text and speech embeddings, the speech head, the speaker projection) and
``ve.safetensors`` (the voice encoder, which makes the token model's speaker embedding), and the
text tokenizer, GPT-2's byte-level BPE: ``tokenizer.json``, or ``vocab.json`` and ``merges.txt``
(with ``added_tokens.json``), written as one JSON string, ``chatterbox.tokenizer``, in
tokenizer.json's layout (its model's vocabulary and merges, the added tokens).
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

The text head, and GPT-2's own token embedding (``tfmr.wte``), are not used to speak and are
left out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path
from app.models.convert import ge2e
from app.models.gguf_weights import WEIGHT_TYPES, add_weight
from app.models.safetensors import SafetensorsError, SafetensorsFile

ARCH = "chatterbox"
SAMPLE_RATE = 24000
VARIANTS = ("turbo",)
T3_FILES = {"turbo": "t3_turbo_v1.safetensors"}
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


class ConversionError(ValueError):
    pass


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


def convert(
    checkpoint: Path, out_path: Path, *, variant: str = "turbo", weights: str = "f16", source: str = ""
) -> Path:
    """Write the Chatterbox ``variant`` whose official files are in folder ``checkpoint`` to
    ``out_path`` with matrices in ``weights`` (f32, f16 or q8_0)."""
    import gguf

    if variant not in VARIANTS:
        raise ConversionError(f"Chatterbox variant '{variant}' is not converted here; known: {', '.join(VARIANTS)}")
    if weights not in WEIGHT_TYPES:
        raise ConversionError(f"weight type '{weights}': one of {', '.join(WEIGHT_TYPES)}")
    path = Path(checkpoint) / T3_FILES[variant]
    if not path.is_file():
        raise ConversionError(f"'{checkpoint}' has no '{T3_FILES[variant]}' (Chatterbox-{variant}'s token model)")
    ve_path = Path(checkpoint) / VE_FILE
    if not ve_path.is_file():
        raise ConversionError(f"'{checkpoint}' has no '{VE_FILE}' (Chatterbox's voice encoder)")
    try:
        hp, tensors = _t3_gpt2(SafetensorsFile(path))
        voice_encoder = _voice_encoder(SafetensorsFile(ve_path))
    except SafetensorsError as e:
        raise ConversionError(str(e)) from None
    tokenizer = _tokenizer(Path(checkpoint), hp["text_vocab"])

    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), ARCH)
        writer.add_name(f"Chatterbox-{variant.capitalize()}")
        writer.add_string("general.license", "MIT")
        if source:
            writer.add_string("general.source", source)
        p = f"{ARCH}."
        writer.add_string(p + "variant", variant)
        writer.add_uint32(p + "sample_rate", SAMPLE_RATE)
        writer.add_string(p + "t3.backbone", "gpt2")
        writer.add_string(p + "tokenizer", tokenizer)
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
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out_path
