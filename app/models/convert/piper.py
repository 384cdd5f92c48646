"""Convert a Piper (VITS) ONNX export and its JSON config into a GGUF file.

Named initializers keep their PyTorch names. The flow's WaveNet convolutions are
exported anonymously (``onnx::Conv_*``, weight norm folded); each one is named
after the bias that the same ``Conv`` node consumes. Hyperparameters are read off
the graph (kernel sizes, dilations, strides, heads) rather than assumed.

Layouts written (ggml ``ne`` order, fastest first):
  conv weight          [IC, K, OC]  (PyTorch [OC, IC, K] with the taps inside each
                                     output row: a row holds one im2col column's
                                     weights, so a convolution is one mul_mat)
  conv-transpose       [IC, OC, K]  (PyTorch [IC, OC, K] permuted so that one
                                     mul_mat yields every tap of every channel)

Weight types: ``f32`` (default), ``f16`` or ``q8_0`` for the flow's and the decoder's
matrices; the text encoder, the duration predictor, norms and biases stay F32.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path
from app.models.gguf_weights import WEIGHT_TYPES, add_weight

ARCH = "piper"

# Spline tails of the stochastic duration predictor's ConvFlow (VITS constant,
# folded into the export as literals rather than a named value).
DP_TAIL_BOUND = 5.0


class ConversionError(RuntimeError):
    pass


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _read_graph(onnx_path: Path):
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(onnx_path))
    except Exception as exc:  # onnx raises DecodeError and friends
        raise ConversionError(f"{onnx_path.name}: not a readable ONNX model ({exc})") from exc
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return model.graph, inits


def _name_tensors(graph, inits: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map every weight the engine needs to its PyTorch name."""
    named: dict[str, np.ndarray] = {}
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input":
            named["enc_p.emb.weight"] = inits[node.input[0]]
        if node.op_type == "Conv" and node.input[1].startswith("onnx::Conv_"):
            if len(node.input) < 3 or not node.input[2].endswith(".bias"):
                raise ConversionError(f"anonymous conv {node.input[1]} has no named bias")
            named[node.input[2][: -len(".bias")] + ".weight"] = inits[node.input[1]]
    for name, value in inits.items():
        if "." in name and not name.startswith(("onnx::", "/")) and name != "sid":
            named[name] = value
    # ElementwiseAffine of the duration predictor: the export folds exp(-logs) into a constant.
    for name, value in inits.items():
        if name.endswith("/dp/flows.0/Exp_output_0"):
            named["dp.flows.0.exp_neg_logs"] = value
    if "enc_p.emb.weight" not in named:
        raise ConversionError("no phoneme embedding found (is this a Piper VITS export?)")
    return named


def _conv_attrs(graph) -> dict[str, dict]:
    """Conv attributes keyed by the PyTorch name of the weight."""
    out = {}
    for node in graph.node:
        if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
            name = node.input[1]
            if name.startswith("onnx::Conv_"):
                name = node.input[2][: -len(".bias")] + ".weight"
            out[name] = _attrs(node)
    return out


def _hyperparameters(named: dict[str, np.ndarray], conv: dict[str, dict]) -> dict:
    hidden = named["enc_p.emb.weight"].shape[1]
    rel_k = named["enc_p.encoder.attn_layers.0.emb_rel_k"]
    head_dim = rel_k.shape[2]
    n_layers = sum(1 for n in named if n.startswith("enc_p.encoder.attn_layers.") and n.endswith("conv_q.weight"))
    ffn_kernel = named["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[2]

    n_ups = sum(1 for n in named if n.startswith("dec.ups.") and n.endswith(".weight"))
    ups_kernels = [named[f"dec.ups.{i}.weight"].shape[2] for i in range(n_ups)]
    ups_rates = [conv[f"dec.ups.{i}.weight"]["strides"][0] for i in range(n_ups)]
    n_res = sum(1 for n in named if n.startswith("dec.resblocks.") and n.endswith("convs.0.weight"))
    n_kernels = n_res // n_ups
    res_kernels = [named[f"dec.resblocks.{j}.convs.0.weight"].shape[2] for j in range(n_kernels)]
    n_res_convs = sum(1 for n in named if n.startswith("dec.resblocks.0.convs.") and n.endswith(".weight"))
    res_dilations = [
        conv[f"dec.resblocks.{j}.convs.{c}.weight"]["dilations"][0]
        for j in range(n_kernels)
        for c in range(n_res_convs)
    ]
    for k, s in zip(ups_kernels, ups_rates, strict=True):
        if k != 2 * s:
            raise ConversionError(f"upsampling kernel {k} with stride {s}: the engine needs kernel == 2*stride")

    flow_ids = sorted({int(n.split(".")[2]) for n in named if n.startswith("flow.flows.") and n.endswith("pre.weight")})
    wn_layers = sum(
        1 for n in named if n.startswith(f"flow.flows.{flow_ids[0]}.enc.in_layers.") and n.endswith(".weight")
    )
    wn_kernel = named[f"flow.flows.{flow_ids[0]}.enc.in_layers.0.weight"].shape[2]
    wn_dilation = conv[f"flow.flows.{flow_ids[0]}.enc.in_layers.1.weight"]["dilations"][0] if wn_layers > 1 else 1
    dp_flow_ids = sorted(
        {int(n.split(".")[2]) for n in named if n.startswith("dp.flows.") and n.endswith("proj.weight")}
    )
    dp_layers = sum(1 for n in named if n.startswith("dp.convs.convs_sep.") and n.endswith(".weight"))
    dp_kernel = named["dp.convs.convs_sep.0.weight"].shape[2]
    dp_bins = (named[f"dp.flows.{dp_flow_ids[0]}.proj.weight"].shape[0] + 1) // 3

    return {
        "hidden_channels": hidden,
        "inter_channels": named["enc_p.proj.weight"].shape[0] // 2,
        "n_heads": hidden // head_dim,
        "n_layers": n_layers,
        "window_size": (rel_k.shape[1] - 1) // 2,
        "ffn_kernel": ffn_kernel,
        "ffn_channels": named["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[0],
        "dec_upsample_rates": ups_rates,
        "dec_upsample_kernels": ups_kernels,
        "dec_resblock_kernels": res_kernels,
        "dec_resblock_dilations": res_dilations,
        "dec_resblock_convs": n_res_convs,
        "dec_initial_channels": named["dec.conv_pre.weight"].shape[0],
        "flow_ids": flow_ids,
        "flow_wn_layers": wn_layers,
        "flow_wn_kernel": wn_kernel,
        "flow_wn_dilation_rate": wn_dilation,
        "dp_flow_ids": dp_flow_ids,
        "dp_layers": dp_layers,
        "dp_kernel": dp_kernel,
        "dp_num_bins": dp_bins,
        "dp_tail_bound": DP_TAIL_BOUND,
    }


def _engine_layout(name: str, value: np.ndarray) -> np.ndarray:
    if name.startswith("dec.ups.") and name.endswith(".weight"):
        return np.ascontiguousarray(value.transpose(2, 1, 0))
    if ".convs_sep." in name and name.endswith(".weight"):  # depthwise [C, 1, K] -> ggml [C, K]
        return np.ascontiguousarray(value[:, 0, :].T)
    if value.ndim == 3 and name.endswith(".weight"):  # conv [OC, IC, K] -> ggml [IC, K, OC]
        return np.ascontiguousarray(value.transpose(0, 2, 1))
    return np.ascontiguousarray(value)


def _feeds_mul_mat(name: str, data: np.ndarray) -> bool:
    # Only the flow's and the decoder's matrices take the reduced type. Vectors stay F32,
    # and so does everything of the text encoder (embeddings read with get_rows, relative-
    # position tables that are padded first) and the duration predictor (elementwise
    # depthwise convolutions): durations are rounded to whole frames, and a rounding that
    # flips moves every sample after it, while these two stages cost a tenth of the time.
    return data.ndim >= 2 and data.size >= 64 and not name.startswith(("enc_p.", "dp."))


def _phoneme_map(config: dict) -> tuple[list[str], list[int]]:
    phonemes, ids = [], []
    for phoneme, values in sorted(config["phoneme_id_map"].items(), key=lambda kv: kv[1][0]):
        if len(values) != 1:
            raise ConversionError(f"phoneme {phoneme!r} maps to {len(values)} ids; expected one")
        phonemes.append(phoneme)
        ids.append(int(values[0]))
    return phonemes, ids


def convert(
    onnx_path: Path,
    config_path: Path,
    out_path: Path,
    *,
    weights: str = "f32",
    voice_id: str = "",
    source_package: str = "",
    progress: Callable[[float, str], None] | None = None,
) -> Path:
    """Write ``out_path`` (atomically) from a Piper ONNX export and its config."""
    import gguf

    if weights not in WEIGHT_TYPES:
        raise ConversionError(f"weights must be one of {WEIGHT_TYPES}, not {weights!r}")
    report = progress or (lambda fraction, message: None)
    report(0.0, f"reading {onnx_path.name}")
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{Path(config_path).name}: unreadable voice config ({exc})") from exc
    graph, inits = _read_graph(Path(onnx_path))
    named = _name_tensors(graph, inits)
    hp = _hyperparameters(named, _conv_attrs(graph))
    phonemes, ids = _phoneme_map(config)
    inference = config.get("inference", {})

    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), ARCH)
        writer.add_name(voice_id or Path(onnx_path).stem)
        writer.add_string("general.source_package", source_package)
        writer.add_string("general.license", "MIT")
        p = f"{ARCH}."
        writer.add_uint32(p + "sample_rate", int(config["audio"]["sample_rate"]))
        writer.add_string(p + "quality", config["audio"].get("quality", ""))
        writer.add_string(p + "espeak_voice", config["espeak"]["voice"])
        writer.add_string(p + "language", config.get("language", {}).get("code", ""))
        writer.add_float32(p + "noise_scale", float(inference.get("noise_scale", 0.667)))
        writer.add_float32(p + "length_scale", float(inference.get("length_scale", 1.0)))
        writer.add_float32(p + "noise_w", float(inference.get("noise_w", 0.8)))
        writer.add_array(p + "phonemes", phonemes)
        writer.add_array(p + "phoneme_ids", ids)
        for key, value in hp.items():
            if isinstance(value, list):
                writer.add_array(p + key, [int(v) for v in value])
            elif isinstance(value, float):
                writer.add_float32(p + key, value)
            else:
                writer.add_uint32(p + key, int(value))

        total = len(named)
        for i, (name, value) in enumerate(sorted(named.items())):
            data = _engine_layout(name, value.astype(np.float32))
            add_weight(writer, name, data, weights, reduce=_feeds_mul_mat(name, data))
            report(0.1 + 0.8 * (i + 1) / total, name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    report(1.0, f"wrote {out_path.name}")
    return out_path
