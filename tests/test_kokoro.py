"""Kokoro-82M in the engine against onnxruntime's int8 export, on the same phonemes."""

import numpy as np
import pytest

from app.audio.dsp import log_mel_cosine
from app.engine.engine import Engine, EngineDebug
from app.engine.errors import CancelledError, InvalidArgumentError, NothingToSpeakError
from app.models import manager as models
from tools.devkit.reference import KokoroReference, kokoro_bert_float

SAMPLES_PER_FRAME = 600  # 24 kHz audio, 40 duration frames a second


@pytest.fixture(scope="module")
def kokoro():
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2) as eng:
        yield eng


@pytest.fixture(scope="module")
def kokoro_ref():
    return KokoroReference(threads=2, stages=True)


def cosine(a, b) -> float:
    a = np.asarray(a, np.float64).reshape(-1)
    b = np.asarray(b, np.float64).reshape(-1)
    assert a.shape == b.shape
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# Bounds against the export. It quantizes every activation to uint8 before each matrix
# product; the engine computes in float. Where that noise accumulates over many products
# (BERT: 72; the decoder: 10 convolutions of 1024 channels) the bound is the noise's,
# and the stage is checked against a float computation of the same weights as well.
STAGE_BOUNDS = {
    "bert": 0.985,
    "duration_logits": 0.999,
    "F0": 0.999,
    "N": 0.999,
    "text_encoder": 0.999,
    "decoder": 0.998,
}


def test_stages_match_reference_with_its_durations(kokoro, kokoro_ref, sentences):
    for text in sentences[:3]:
        for line in kokoro.phonemize(text):
            want_audio, _, want = kokoro_ref.synthesize(line, "jf_alpha")
            take = kokoro.synthesize(phonemes=line, durations=want["durations"])
            assert take.timings["chunks"] == 1
            for stage, bound in STAGE_BOUNDS.items():
                got = kokoro.output(stage)
                assert got.shape == want[stage].shape, stage
                value = cosine(got, want[stage])
                assert value >= bound, f"stage {stage}: cosine {value:.5f} < {bound} for {line!r}"
            bert_float = kokoro_bert_float(models.kokoro_path(), [0, *kokoro_ref.ids(line), 0])
            assert cosine(kokoro.output("bert"), bert_float) >= 0.99999, "stage bert against the float model"
            lm = log_mel_cosine(take.audio, want_audio, take.sample_rate)
            assert len(take.audio) == len(want_audio)
            assert lm >= 0.99, f"audio log-mel cosine {lm:.4f} for {line!r}"
            # The level: the harmonics' phase at DC and Nyquist as the reference's STFT has it
            # (a wrong sign there took a sixth off the level).
            level = np.sqrt(np.mean(take.audio**2)) / np.sqrt(np.mean(want_audio**2))
            assert abs(level - 1.0) <= 0.02, f"audio level {level:.3f} of the reference's for {line!r}"


@pytest.mark.slow
@pytest.mark.parametrize("voice", models.KOKORO_VOICES)
def test_free_running_matches_reference(voice, kokoro_ref, sentences):
    # Each voice speaks four of the ten sentences, every sentence spoken by two voices.
    assert len(sentences) >= 2 * len(models.KOKORO_VOICES) == 10
    k = models.KOKORO_VOICES.index(voice)
    total_got = total_want = 0
    with Engine.open(f"kokoro:{voice}", device="cpu", threads=2) as engine:
        for text in [sentences[(2 * k + j) % 10] for j in range(4)]:
            lines = engine.phonemize(text)
            want = np.concatenate([kokoro_ref.synthesize(line, voice)[0] for line in lines])
            got = engine.synthesize(phonemes="\n".join(lines)).audio
            total_got, total_want = total_got + len(got), total_want + len(want)
            lm = log_mel_cosine(got, want, 24000)
            assert lm >= 0.93, f"{voice}: log-mel cosine {lm:.4f} for {text!r}"
    assert abs(total_got - total_want) <= 0.01 * total_want, f"{voice}: {total_got} vs {total_want} samples"


def test_durations_and_speed(kokoro):
    line = kokoro.phonemize("The quick brown fox jumps over the lazy dog.")[0]
    base = kokoro.synthesize(phonemes=line)
    frames = kokoro.output("durations").reshape(-1)
    assert frames.min() >= 1 and len(base.audio) == frames.sum() * SAMPLES_PER_FRAME
    slow = kokoro.synthesize(phonemes=line, length_scale=2.0)  # speed 0.5
    fast = kokoro.synthesize(phonemes=line, length_scale=0.5)  # speed 2.0
    assert 1.8 <= len(slow.audio) / len(base.audio) <= 2.2
    assert 0.45 <= len(fast.audio) / len(base.audio) <= 0.62  # every token keeps at least one frame


def test_text_is_mapped_onto_the_vocabulary(kokoro, kokoro_ref):
    lines = kokoro.phonemize("Hello there! I bought a house, you know.")
    assert len(lines) == 2
    text = "".join(lines)
    assert "^" not in text and "O" in text and "I" in text and "W" in text  # oʊ, aɪ, aʊ
    assert all(c in kokoro_ref.vocab for c in text)
    take = kokoro.synthesize(text="Hello there! I bought a house, you know.")
    assert take.timings["skipped_symbols"] == 0 and take.timings["chunks"] == 2


def test_long_sentences_are_split_at_510_tokens(kokoro):
    word = "hˈɛlO, "
    exact = (word * 80)[:510]
    take = kokoro.synthesize(phonemes=exact)
    assert take.timings["chunks"] == 1 and take.timings["phoneme_ids"] == 512  # 510 and two pads
    longer = word * 80  # 560 symbols
    take = kokoro.synthesize(phonemes=longer)
    assert take.timings["chunks"] == 2
    assert take.timings["phoneme_ids"] == len(longer.rstrip()) + 4 - 1  # the space at the cut is dropped
    assert np.all(np.isfinite(take.audio)) and np.abs(take.audio).max() > 0.01


def test_bad_input_is_refused_with_a_reason(kokoro):
    with pytest.raises(NothingToSpeakError):
        kokoro.synthesize(phonemes=" , . ")
    with pytest.raises(InvalidArgumentError, match="forced durations"):
        kokoro.synthesize(phonemes="hˈɛlO", durations=np.ones(3, np.int32))
    with pytest.raises(InvalidArgumentError, match="256 columns"):
        kokoro.synthesize(phonemes="hˈɛlO", style=np.zeros((510, 128), np.float32))
    odd = kokoro.synthesize(phonemes="hˈɛlO ☃ wˈɜɹld")
    assert odd.timings["skipped_symbols"] == 1
    own = kokoro.synthesize(phonemes="hˈɛlO", style=np.zeros((1, 256), np.float32))
    assert np.all(np.isfinite(own.audio))


def test_unknown_voice_pack_is_named(kokoro):
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2) as engine:
        engine.style = "nobody"
        with pytest.raises(InvalidArgumentError, match="jf_alpha"):
            engine.synthesize(phonemes="hˈɛlO")


def test_cancel_between_chunks(kokoro):
    chunks = []
    with pytest.raises(CancelledError):
        kokoro.synthesize(
            phonemes="hˈɛlO.\nwˈɜɹld.\nəɡˈɛn.",
            on_chunk=lambda i, audio: chunks.append(i),
            cancelled=lambda: len(chunks) >= 1,
        )
    assert chunks == [0]


def test_batched_sentences_sound_as_they_do_alone(kokoro):
    # Lengths far apart, so that the batched LSTMs run past the short ones' ends.
    ipa = "hˈaɪ!\nðə kwˈɪk bɹˈaʊn fˈɑks dʒˈʌmps ˌOvəɹ ðə lˈAzi dˈɔɡ, ænd ðɛn ɪt ɹˈʌnz fˈɑɹ əwˈA.\nwˈɛɹ ɪz ɪt?"
    alone, together = [], []
    a = kokoro.synthesize(phonemes=ipa, on_chunk=lambda i, audio: alone.append((i, audio)))
    b = kokoro.synthesize(phonemes=ipa, batch=3, on_chunk=lambda i, audio: together.append((i, audio)))
    assert [i for i, _ in together] == [i for i, _ in alone] == [0, 1, 2]
    for (_, x), (_, y) in zip(alone, together, strict=True):
        assert len(x) == len(y)
        np.testing.assert_allclose(y, x, atol=1e-4)
    assert b.timings["chunks"] == 3 and len(b.audio) == len(a.audio)
    # A batch larger than the input, and the last chunk's intermediates, as without batching.
    c = kokoro.synthesize(phonemes=ipa, batch=8)
    np.testing.assert_allclose(c.audio, a.audio, atol=1e-4)
    assert kokoro.output("durations").shape[0] == len("wˈɛɹ ɪz ɪt?") + 2


def test_gpu_graphs_on_the_cpu_sound_like_the_cpu_graphs(kokoro):
    """The graphs built for GPUs, run by the CPU backend (CI has no GPU): AdaIN and Snake with
    time along ne0, convolutions as batched GEMMs over their input's phases (conv1d_phases), a
    batch's BERT in one masked graph, its decoder and F0/N blocks on the sentences packed
    along time."""
    # The longer sentence first: in the packing its frames are followed by the short one's.
    ipa = "wˈɛɹ ɪz ɪt?\nhˈaɪ!"
    alone = []
    kokoro.synthesize(phonemes=ipa, on_chunk=lambda i, audio: alone.append(audio))
    bert, durations = kokoro.output("bert"), kokoro.output("durations")
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2, debug=EngineDebug(device_graphs=True)) as gpu_graphs:
        together, one_by_one = [], []
        gpu_graphs.synthesize(phonemes=ipa, batch=2, on_chunk=lambda i, audio: together.append(audio))
        # The masked BERT keeps each sentence to itself: its second sentence as alone.
        np.testing.assert_allclose(gpu_graphs.output("bert"), bert, atol=1e-3 * np.abs(bert).max())
        np.testing.assert_array_equal(gpu_graphs.output("durations"), durations)
        for x, y in zip(alone, together, strict=True):
            assert len(x) == len(y)
            assert log_mel_cosine(y, x, kokoro.sample_rate) >= 0.999
            # Sample by sample too: a convolution reading its input a frame off (the generator's
            # conv_post, say) keeps the log-mel spectrum and moves the waveform.
            assert np.sqrt(np.mean((y - x) ** 2)) <= 0.05 * np.sqrt(np.mean(x**2))
        # Packed against the same graphs a sentence at a time. These round activations to F16
        # before each convolution, so sums in another order differ by a few percent of the
        # peak at most; convolutions reading a neighbour's frames (a gap too short) differ by
        # tens of percent.
        gpu_graphs.synthesize(phonemes=ipa, on_chunk=lambda i, audio: one_by_one.append(audio))
        for x, y in zip(one_by_one, together, strict=True):
            assert len(x) == len(y)
            assert np.abs(y - x).max() <= 0.1 * np.abs(x).max()


def test_graphs_within_a_vulkan_devices_limits_sound_like_the_gpu_graphs(kokoro):
    """A device whose ops take tensors up to a size, and no matmul over a fourth axis (a Vulkan
    device): dilated convolutions go through im2col in tiles, packings stay within the size,
    the batch's LSTMs take a matmul a sentence for their input projections."""
    ipa = "wˈɛɹ ɪz ɪt?\nhˈaɪ!"
    takes, durations = {}, {}
    for limits in (None, "16,0"):
        debug = EngineDebug(device_graphs=True, device_limits=limits or "")
        with Engine.open("kokoro:jf_alpha", device="cpu", threads=2, debug=debug) as e:
            takes[limits] = []
            e.synthesize(phonemes=ipa, batch=2, on_chunk=lambda i, audio, key=limits: takes[key].append(audio))
            durations[limits] = e.output("durations")
    # The LSTMs (duration, prosody, text encoder) compute the same sums either way.
    np.testing.assert_array_equal(durations["16,0"], durations[None])
    # The dilated convolutions took the other path: the same audio to within rounding, not bit for bit.
    assert not all(np.array_equal(x, y) for x, y in zip(takes[None], takes["16,0"], strict=True))
    for x, y in zip(takes[None], takes["16,0"], strict=True):
        assert len(x) == len(y)
        # Both round the convolutions' inputs to F16; only the order of the sums differs.
        assert np.abs(y - x).max() <= 0.02 * np.abs(x).max()
        assert log_mel_cosine(y, x, kokoro.sample_rate) >= 0.999


def test_packed_adain_statistics_agree_with_and_without_out_prod(kokoro):
    """A batch's AdaIN statistics (decoder, F0 and N blocks): products with the mask over time
    (out_prod) where the device has it, sums over transposed activations where it has not
    (Vulkan). Both take each sentence's own frames: F0 and N agree to rounding, the decoder's
    output to the F16 rounding of its convolutions' inputs."""
    ipa = "wˈɛɹ ɪz ɪt?\nhˈaɪ!"
    outputs, takes = {}, {}
    for limits in ("1024,1,1,1", "1024,1,1,0"):
        debug = EngineDebug(device_graphs=True, device_limits=limits)
        with Engine.open("kokoro:jf_alpha", device="cpu", threads=2, debug=debug) as e:
            takes[limits] = e.synthesize(phonemes=ipa, batch=2).audio
            outputs[limits] = {name: e.output(name) for name in ("F0", "N", "decoder")}
    with_op, without = outputs["1024,1,1,1"], outputs["1024,1,1,0"]
    for name, tol in (("F0", 1e-5), ("N", 1e-5), ("decoder", 2e-3)):
        assert with_op[name].shape == without[name].shape
        assert np.abs(with_op[name] - without[name]).max() <= tol * np.abs(without[name]).max(), name
    assert log_mel_cosine(takes["1024,1,1,1"], takes["1024,1,1,0"], kokoro.sample_rate) >= 0.999


def test_cancel_inside_a_batch(kokoro):
    stages = []
    with pytest.raises(CancelledError):
        kokoro.synthesize(
            phonemes="hˈɛlO.\nwˈɜɹld.\nəɡˈɛn.",
            batch=3,
            on_stage=lambda stage, chunk, ms: stages.append(stage),
            cancelled=lambda: "prosody" in stages,
        )
    assert "generator" not in stages


def test_the_engines_cpu_kernels_give_ggmls_audio(kokoro):
    """AdaIN's statistics and the generator's residual blocks in the engine's CPU kernels (the
    normalization, Snake, the dilated convolution, bias and residual add in one pass, in 16-bit
    integers where the kernels have them, else F32) against ggml's ops (F16 weights with F16
    activations): the same sound and level. (Samples
    differ more than the spectra: the harmonic source's phase follows F0's last digits.)"""
    line = kokoro.phonemize("The quick brown fox jumps over the lazy dog.")[0]
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2, debug=EngineDebug(engine_kernels=False)) as ggml_ops:
        want = ggml_ops.synthesize(phonemes=line).audio
    got = kokoro.synthesize(phonemes=line).audio
    assert len(got) == len(want) > 24000
    assert log_mel_cosine(got, want, 24000) >= 0.9999
    assert abs(np.std(got) / np.std(want) - 1) <= 0.002


def test_the_generators_integer_convolutions_sound_as_its_float_ones(kokoro):
    """Where the CPU's kernels have 16-bit integer convolutions (x86), the generator's residual
    blocks run in them by default: the same spectrum and level as the float kernels, measured
    (not the same samples: the switch to floats must take effect). The bounds hold on the two
    CPUs measured, which run the same integer kernels on ggml built for each: an AMD Zen 5
    (log-mel cosine above 0.99999) and an Intel Xeon with AMX (0.999984, peak difference 2.1%)."""
    from app.engine.binding import native_engine

    if native_engine().cpu_vector_floats() < 8:
        pytest.skip("this CPU's kernels have no integer convolutions")
    line = kokoro.phonemize("The quick brown fox jumps over the lazy dog.")[0]
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2, debug=EngineDebug(int16_kernels=False)) as floats:
        want = floats.synthesize(phonemes=line).audio
    got = kokoro.synthesize(phonemes=line).audio
    assert len(got) == len(want) > 24000
    assert not np.array_equal(got, want)
    assert log_mel_cosine(got, want, 24000) >= 0.99995
    assert abs(np.std(got) / np.std(want) - 1) <= 0.0005
    assert np.max(np.abs(got - want)) <= 0.03 * np.max(np.abs(want))
