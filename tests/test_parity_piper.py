"""The engine against onnxruntime on the same weights and phonemes, noise off."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.audio.dsp import log_mel_cosine

HOP = 256  # samples per frame of this voice


def test_audio_matches_reference(engine, reference, sentences):
    assert len(sentences) >= 10
    for text in sentences:
        ipa = "\n".join(engine.phonemize(text))
        ref_audio = np.concatenate([reference.synthesize(line)[0] for line in ipa.split("\n")])
        take = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
        assert abs(len(take.audio) - len(ref_audio)) <= HOP, text
        cos = log_mel_cosine(take.audio, ref_audio, take.sample_rate)
        assert cos >= 0.99, f"log-mel cosine {cos:.4f} for {text!r}"


@pytest.fixture(scope="module")
def reference_with_stages(reference):
    """The reference graph with its encoder statistics, durations and flow output exposed as outputs."""
    model = onnx.load(str(reference.onnx_path))
    producers = {out: node for node in model.graph.node for out in node.output}
    ceil = next(n for n in model.graph.node if n.op_type == "Ceil")
    split = next(n for n in model.graph.node if n.op_type == "Split" and n.name.startswith("/enc_p/"))
    conv_pre = next(n for n in model.graph.node if n.name == "/dec/conv_pre/Conv")
    stages = {"w": ceil.input[0], "m_p": split.output[0], "logs_p": split.output[1], "z": conv_pre.input[0]}
    assert producers[stages["w"]].op_type == "Mul"
    for name in stages.values():
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]), stages


def test_stages_match_reference(engine, reference, reference_with_stages):
    session, stages = reference_with_stages
    ipa = engine.phonemize("Rain, rain, go away; come again another day.")[0]
    ids = np.array([reference.ids(ipa)], dtype=np.int64)
    feeds = {
        "input": ids,
        "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
        "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
    }
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, feeds), strict=True))
    engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)

    m_p = out[stages["m_p"]][0].T  # [T, C]
    np.testing.assert_allclose(engine.output("m_p"), m_p, atol=1e-3, err_msg="encoder m_p")
    np.testing.assert_allclose(engine.output("logs_p"), out[stages["logs_p"]][0].T, atol=1e-3, err_msg="encoder logs_p")
    durations = np.exp(engine.output("logw")[:, 0])
    np.testing.assert_allclose(durations, out[stages["w"]].reshape(-1), rtol=1e-3, err_msg="duration predictor")
    # The flow's output, the decoder's input (noise off: the flow alone moves it from m_p).
    z = out[stages["z"]][0].T  # [frames, C]
    assert engine.output("z").shape == z.shape
    np.testing.assert_allclose(engine.output("z"), z, atol=1e-4 * np.abs(z).max(), err_msg="flow z")


def test_length_scale_matches_reference(engine, reference):
    ipa = engine.phonemize("Speed changes the length of the audio.")[0]
    normal = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
    for scale in (0.5, 2.0):
        take = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0, length_scale=scale)
        ref_audio, _ = reference.synthesize(ipa, length_scale=scale)
        assert abs(len(take.audio) - len(ref_audio)) <= HOP
        # Every token's frames are rounded up, so the change is less than proportional.
        assert (len(take.audio) > len(normal.audio)) == (scale > 1.0)
