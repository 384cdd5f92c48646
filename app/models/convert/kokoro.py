"""Convert the Kokoro-82M int8 ONNX export, its voice packs and vocabulary into GGUF.

The export (kokoro-v1.0.int8.onnx) is dynamically quantized: convolutions are
``ConvInteger``, linear layers ``MatMulInteger``, embeddings a quantized ``Gather``
and the LSTMs ``DynamicQuantizeLSTM``; each weight is an int8/uint8 initializer
``X_quantized`` with ``X_scale`` (per tensor or per output channel) and a zero
point given as the node's input (zero points are shared between equal tensors).
Every weight is dequantized exactly, ``(q - zero_point) * scale`` in float32, and
named after the PyTorch module that owns it: by its own name where it has one, else
by the bias of the same node, else by the node's scope. Weight-normed convolutions
were folded by the export before quantization, so some output channels are all zero
after int8 rounding; they stay exactly zero (never a division by their norm).

LSTMs are stored per direction in PyTorch's layout and gate order (i, f, g, o; the
ONNX order is i, o, f, c): ``weight_ih`` [dirs, 4H, in], ``weight_hh`` [dirs, 4H, H],
``bias`` [dirs, 4H] (input and recurrent biases summed).

Layouts written (ggml ``ne`` order, fastest first): conv weights [IC, K, OC] as for
Piper (a row holds one im2col column's weights); linear weights [in, out]; conv-
transpose weights [IC, OC, K] (a mul_mat weight giving every tap of every output
channel); the depthwise upsampling convs [C, 3]; the iSTFT basis [22, n_fft];
embeddings [dim, vocab]. Voice packs: ``voice.<name>`` [256, 510]; the vocabulary as arrays.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path
from app.models.gguf_weights import WEIGHT_TYPES, add_weight

ARCH = "kokoro"
SAMPLE_RATE = 24000
LSTM_GATES_FROM_ONNX = (0, 2, 3, 1)  # ONNX blocks i, o, f, c -> PyTorch i, f, g(c), o


class ConversionError(RuntimeError):
    pass


class _Graph:
    def __init__(self, onnx_path: Path):
        import onnx
        from onnx import numpy_helper

        try:
            model = onnx.load(str(onnx_path))
        except Exception as exc:  # protobuf reports damage in many ways
            raise ConversionError(f"{onnx_path.name}: not a readable ONNX model ({exc})") from exc
        self.nodes = list(model.graph.node)
        self.inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers = collections.defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.consumers[i].append(n)

    def of_type(self, op: str) -> list:
        return [n for n in self.nodes if n.op_type == op]

    def downstream(self, node, steps: int = 3):
        frontier = [node]
        for _ in range(steps):
            frontier = [c for f in frontier for o in f.output for c in self.consumers[o]]
            yield from frontier


# The prosody predictor's F0/N branch runs through a method, not forward(), so the
# export's scopes leave out "predictor" for these children.
_PREDICTOR_CHILDREN = ("F0", "N", "shared", "F0_proj", "N_proj")


def _scope(node_name: str) -> str:
    """'/encoder/text_encoder/cnn.0/cnn.0.0/Conv_quant' -> 'encoder.text_encoder.cnn.0.0'."""
    parts: list[str] = []
    for comp in node_name.strip("/").split("/")[:-1]:
        if parts and comp.startswith(parts[-1] + "."):
            parts[-1] = comp
        else:
            parts.append(comp)
    if len(parts) > 1 and parts[0] == "encoder" and parts[1].split(".")[0] in _PREDICTOR_CHILDREN:
        parts.insert(1, "predictor")
    return ".".join(parts)


_UNROLLED = re.compile(r"^(.*)_\d+(\.weight)$")


def _drop_unrolled_copies(tensors: dict[str, np.ndarray]) -> int:
    """ALBERT applies one layer twelve times; the export quantized each application's
    matrices separately ('query', 'query_1', ...). They must be identical: keep one."""
    dropped = 0
    for name in sorted(tensors):
        match = _UNROLLED.match(name)
        if match and match.group(1) + match.group(2) in tensors:
            if not np.array_equal(tensors[name], tensors[match.group(1) + match.group(2)]):
                raise ConversionError(f"{name} differs from the shared layer it repeats")
            del tensors[name]
            dropped += 1
    return dropped


def _dequantize(g: _Graph, q_name: str, zp_name: str | None, axis: int) -> np.ndarray:
    if not q_name.endswith("_quantized"):
        raise ConversionError(f"{q_name}: expected a '_quantized' initializer")
    q = g.inits[q_name].astype(np.float32)
    scale = g.inits[q_name[: -len("_quantized")] + "_scale"].astype(np.float32)
    zp = g.inits[zp_name].astype(np.float32) if zp_name else np.zeros((), np.float32)
    shape = [1] * q.ndim
    if scale.ndim:
        shape[axis] = -1
    scale = scale.reshape(shape)
    zp = zp.reshape(shape) if zp.ndim else zp
    return (q - zp) * scale


def _bias_named(g: _Graph, node) -> str | None:
    """The '<module>.bias' initializer added to this node's output (directly or as a quantized bias)."""
    for i in node.input[2:3]:
        if i.endswith(".bias"):
            return i
    for c in g.downstream(node, 2):
        if c.op_type == "Add":
            if c.name.endswith(".bias_quantizedbias_add"):
                return c.name[: -len("_quantizedbias_add")]
            for i in c.input:
                if i.endswith(".bias") and i in g.inits:
                    return i
    return None


def _module_of(g: _Graph, node) -> str:
    bias = _bias_named(g, node)
    return bias[: -len(".bias")] if bias else _scope(node.name)


def dequantized_tensors(onnx_path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """Every weight of the export as float32 under its module name, plus facts found on the way."""
    g = _Graph(Path(onnx_path))
    out: dict[str, np.ndarray] = {}
    facts = {"zero_channels": 0, "convs_with_zero_channels": 0}

    def put(name: str, value: np.ndarray) -> None:
        if name in out:
            raise ConversionError(f"two tensors would be named {name}")
        if not np.all(np.isfinite(value)):
            raise ConversionError(f"{name}: not finite after dequantization")
        out[name] = np.ascontiguousarray(value, dtype=np.float32)

    def conv(module: str, w: np.ndarray) -> None:  # [OC, IC, K]
        zero = int(np.sum(~np.any(w.reshape(w.shape[0], -1) != 0, axis=1)))
        if zero:
            facts["zero_channels"] += zero
            facts["convs_with_zero_channels"] += 1
        put(module + ".weight", w)

    for n in g.of_type("ConvInteger"):
        conv(_module_of(g, n), _dequantize(g, n.input[1], n.input[3] if len(n.input) > 3 else None, axis=0))
    for n in g.of_type("Conv"):
        if n.input[1] in g.inits:
            conv(_module_of(g, n), g.inits[n.input[1]].astype(np.float32))
    for n in g.of_type("ConvTranspose"):
        if n.input[1] in g.inits and not n.input[1].endswith("inverse_basis"):
            put(_module_of(g, n) + ".weight", g.inits[n.input[1]].astype(np.float32))  # [IC, OC, K]
    for n in g.of_type("MatMulInteger"):
        w = _dequantize(g, n.input[1], n.input[3] if len(n.input) > 3 else None, axis=1)  # [in, out]
        name = n.input[1][: -len("_quantized")]
        put(name if name.endswith(".weight") else _module_of(g, n) + ".weight", w.T)
    for n in g.of_type("MatMul"):
        if n.input[1] in g.inits:
            put(_scope(n.name) + ".weight", g.inits[n.input[1]].astype(np.float32).T)  # [out, in]
    for n in g.of_type("Gather"):
        if n.input[0].endswith("_quantized"):
            deq = next(c for c in g.consumers[n.output[0]] if c.op_type == "DequantizeLinear")
            put(n.input[0][: -len("_quantized")], _dequantize(g, n.input[0], deq.input[2], axis=0))
    for n in g.of_type("DynamicQuantizeLSTM"):
        module = _scope(n.name)
        w = _dequantize(g, n.input[1], n.input[9], axis=0)  # [dirs, in, 4H], a scale per direction
        r = _dequantize(g, n.input[2], n.input[11], axis=0)  # [dirs, H, 4H]
        b = g.inits[n.input[3]].astype(np.float32)  # [dirs, 8H]: input then recurrent biases
        hidden = r.shape[1]

        def torch_gates(x: np.ndarray) -> np.ndarray:  # gates on the last axis, blocks of H
            blocks = np.split(x, 4, axis=-1)
            return np.concatenate([blocks[i] for i in LSTM_GATES_FROM_ONNX], axis=-1)

        put(module + ".weight_ih", torch_gates(w).transpose(0, 2, 1))
        put(module + ".weight_hh", torch_gates(r).transpose(0, 2, 1))
        put(module + ".bias", torch_gates(b[:, : 4 * hidden] + b[:, 4 * hidden :]))
    # Named float parameters: biases, norms, Snake alphas, the iSTFT basis.
    for name, value in g.inits.items():
        if name.startswith(("encoder.", "decoder.")) and not name.endswith(("_quantized", "_scale", "_zero_point")):
            if value.dtype == np.float32 and name not in out:
                put(name, value)
    for name, value in _stft_constants(g).items():
        put(name, value)
    facts["unrolled_copies"] = _drop_unrolled_copies(out)
    return out, facts


def _stft_constants(g: _Graph) -> dict[str, np.ndarray]:
    """The analysis window of the generator's STFT (the synthesis basis is a named initializer)."""
    stft = g.of_type("STFT")
    if len(stft) != 1:
        raise ConversionError(f"expected one STFT node, found {len(stft)}")
    window = g.inits.get(stft[0].input[2])
    if window is None:
        raise ConversionError("the STFT's window is not a constant")
    return {"decoder.decoder.generator.stft.window": window.astype(np.float32)}


def _engine_layout(name: str, value: np.ndarray) -> np.ndarray:
    if name.endswith("inverse_basis"):  # conv-transpose [22, 1, N_FFT] -> ggml [22, N_FFT]: a mul_mat weight
        return np.ascontiguousarray(value[:, 0, :].T)
    if name.endswith(".pool.weight"):  # depthwise conv-transpose [C, 1, 3] -> ggml [C, 3]: one row per tap
        return np.ascontiguousarray(value[:, 0, :].T)
    if _is_conv_transpose(name):  # conv-transpose [IC, OC, K] -> ggml [IC, OC, K]
        return np.ascontiguousarray(value.transpose(2, 1, 0))
    if value.ndim == 3 and name.endswith(".weight"):
        return np.ascontiguousarray(value.transpose(0, 2, 1))  # conv [OC, IC, K] -> ggml [IC, K, OC]
    return np.ascontiguousarray(value)


def _is_conv_transpose(name: str) -> bool:
    return ".ups." in name and name.endswith(".weight")


# GGUF tensor names (ggml allows 63 bytes): the PyTorch names without the wrappers.
_SHORT_PREFIXES = (
    ("encoder.bert.encoder.albert_layer_groups.0.albert_layers.0.", "bert.layer."),
    ("encoder.bert.encoder.", "bert."),
    ("encoder.bert.", "bert."),
    ("encoder.bert_encoder.", "bert_encoder."),
    ("encoder.predictor.", "predictor."),
    ("encoder.text_encoder.", "text_encoder."),
    ("decoder.decoder.generator.", "generator."),
    ("decoder.decoder.", "decoder."),
)


def gguf_name(name: str) -> str:
    for long, short in _SHORT_PREFIXES:
        if name.startswith(long):
            name = short + name[len(long) :]
            break
    if len(name.encode()) > 63:
        raise ConversionError(f"tensor name {name!r} is longer than GGUF allows")
    return name


def _feeds_mul_mat(name: str, data: np.ndarray) -> bool:
    """Matrices that take the reduced type: the decoder's and the generator's. BERT, the
    duration and prosody predictors and the text encoder stay F32, as for Piper: they are
    a tenth of the time, and durations are rounded to frames."""
    if not name.startswith("decoder.decoder."):
        return False
    if data.ndim < 2 or data.size < 64 or not name.endswith((".weight", ".weight_ih", ".weight_hh")):
        return False
    # Embeddings are gathered and the depthwise upsampling taps multiplied elementwise.
    return "embeddings" not in name and "embedding." not in name and not name.endswith(".pool.weight")


def convert(
    onnx_path: Path,
    voices_npz: Path,
    vocab_json: Path,
    out_path: Path,
    *,
    weights: str = "f32",
    source_package: str = "",
    progress: Callable[[float, str], None] | None = None,
) -> tuple[Path, dict]:
    """Write ``out_path`` (atomically); returns it and the facts found while dequantizing."""
    import gguf

    if weights not in WEIGHT_TYPES:
        raise ConversionError(f"weights must be one of {WEIGHT_TYPES}, not {weights!r}")
    report = progress or (lambda fraction, message: None)
    report(0.0, f"reading {Path(onnx_path).name}")
    tensors, facts = dequantized_tensors(Path(onnx_path))
    try:
        vocab = json.loads(Path(vocab_json).read_text(encoding="utf-8"))["vocab"]
        with np.load(str(voices_npz)) as npz:
            voices = {k: npz[k].astype(np.float32) for k in npz.files}
    except (OSError, ValueError, KeyError) as exc:
        raise ConversionError(f"unreadable voice packs or vocabulary ({exc})") from exc
    for name, pack in voices.items():
        if pack.shape != (510, 1, 256):
            raise ConversionError(f"voice {name}: shape {pack.shape}, expected (510, 1, 256)")

    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), ARCH)
        writer.add_name("Kokoro-82M")
        writer.add_string("general.source_package", source_package)
        writer.add_string("general.license", "Apache-2.0 (weights, voices); MIT (ONNX export, vocabulary)")
        p = f"{ARCH}."
        writer.add_uint32(p + "sample_rate", SAMPLE_RATE)
        symbols = sorted(vocab, key=lambda s: vocab[s])
        writer.add_array(p + "vocab_symbols", symbols)
        writer.add_array(p + "vocab_ids", [int(vocab[s]) for s in symbols])
        writer.add_array(p + "voices", sorted(voices))
        for name in sorted(voices):
            writer.add_tensor(f"voice.{name}", np.ascontiguousarray(voices[name][:, 0, :]))
        total = len(tensors)
        for i, (name, value) in enumerate(sorted(tensors.items())):
            data = _engine_layout(name, value)
            add_weight(writer, gguf_name(name), data, weights, reduce=_feeds_mul_mat(name, data))
            report(0.1 + 0.85 * (i + 1) / total, name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    report(1.0, f"wrote {Path(out_path).name}")
    return Path(out_path), facts
