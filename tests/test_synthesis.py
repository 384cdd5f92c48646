"""Behaviour of the engine a user relies on: seeds, G2P, chunks, cancellation, bad input."""

from pathlib import Path

import numpy as np
import pytest

from app.audio.dsp import log_mel_cosine
from app.engine.engine import Engine, EngineDebug
from app.engine.errors import CancelledError, InvalidArgumentError, NothingToSpeakError


def test_same_seed_same_audio_different_seed_differs(engine):
    a = engine.synthesize(text="Seeds make takes repeatable.", seed=7)
    b = engine.synthesize(text="Seeds make takes repeatable.", seed=7)
    c = engine.synthesize(text="Seeds make takes repeatable.", seed=8)
    assert np.array_equal(a.audio, b.audio)
    assert len(a.audio) != len(c.audio) or not np.allclose(a.audio, c.audio, atol=1e-3)


def test_a_sentence_sounds_the_same_wherever_it_stands(engine):
    """Its noise comes from the seed and its phonemes, so a script's sentence re-synthesized
    alone (or in another batch) gives the take it got among the others."""
    chunks = []
    engine.synthesize(text="A first sentence. The second one.", seed=4, on_chunk=lambda i, audio: chunks.append(audio))
    alone = engine.synthesize(text="The second one.", seed=4)
    assert len(chunks) == 2 and np.array_equal(chunks[1], alone.audio)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I have 42 apples.", "fˈɔːɹɾi tˈuː"),
        ("Dr. Smith is here.", "dˈɑːktɚ smˈɪθ"),
        ("Wait, what?", "wˈeɪt, wˌʌt?"),
        ('She said "hello" to me.', "həlˈoʊ"),
    ],
)
def test_g2p(engine, text, expected):
    assert expected in " ".join(engine.phonemize(text))


def test_g2p_keeps_punctuation_and_splits_sentences(engine):
    sentences = engine.phonemize("First one. Second, with a clause! Third?")
    assert len(sentences) == 3
    assert sentences[0].endswith(".")
    assert "," in sentences[1] and sentences[1].endswith("!")
    assert sentences[2].endswith("?")
    assert all("ˈ" in s for s in sentences)  # stress marks kept


def test_abbreviation_does_not_split_sentence(engine):
    assert len(engine.phonemize("Mr. Brown met Mrs. Green.")) == 1


def test_chunks_stream_in_order(engine):
    chunks = []
    take = engine.synthesize(text="One. Two. Three.", on_chunk=lambda i, audio: chunks.append((i, audio)))
    assert [i for i, _ in chunks] == [0, 1, 2]
    assert np.array_equal(np.concatenate([a for _, a in chunks]), take.audio)
    assert take.timings["chunks"] == 3
    assert take.timings["first_audio_ms"] < take.timings["total_ms"]


def test_stage_timings_reported_live(engine):
    seen = []
    take = engine.synthesize(text="Timings.", on_stage=lambda stage, chunk, ms: seen.append(stage))
    assert seen == ["phonemize", "encoder", "duration", "flow", "decoder"]
    assert all(ms >= 0 for ms in take.timings["stages_ms"].values())


def test_cancel_between_chunks(engine):
    done = []
    with pytest.raises(CancelledError):
        engine.synthesize(
            text="One. Two. Three. Four.",
            on_chunk=lambda i, audio: done.append(i),
            cancelled=lambda: len(done) >= 2,
        )
    assert done == [0, 1]


def test_callback_exception_reaches_caller_and_stops_the_run(engine):
    delivered = []

    def boom(i, audio):
        delivered.append(i)
        raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        engine.synthesize(text="One. Two. Three.", on_chunk=boom)
    assert delivered == [0]  # the sentences after the failing one are not synthesized


def test_many_texts_in_one_call_give_each_the_take_it_gets_alone(engine):
    texts = ["First things first. Then the rest.", "A short one.", "And the last, with a clause, here."]
    alone = [engine.synthesize(text=t, seed=2) for t in texts]
    stages = []
    takes = engine.synthesize_many(texts, seed=2, batch=3, on_stage=lambda stage, chunk, ms: stages.append(chunk))
    assert [len(t.audio) for t in takes] == [len(t.audio) for t in alone]
    for a, b in zip(alone, takes, strict=True):
        assert np.array_equal(a.audio, b.audio)
    assert takes[0].timings["chunks"] == 4 and sorted(set(stages)) == [0, 1, 2, 3]  # numbered across the texts
    # One text with nothing to speak fails the call, naming it; nothing is returned.
    with pytest.raises(NothingToSpeakError, match="input 1"):
        engine.synthesize_many(["Fine.", "...!?"])
    with pytest.raises(InvalidArgumentError):
        engine.synthesize_many([])


@pytest.mark.parametrize("text", ["", "   ", "...!?", "\n\n"])
def test_nothing_to_speak(engine, text):
    with pytest.raises(NothingToSpeakError):
        engine.synthesize(text=text)


def test_unknown_phonemes_are_skipped_with_warning(engine):
    take = engine.synthesize(phonemes="həlˈoʊ ☃☃ wˈɜːld", noise_scale=0.0, noise_w=0.0)
    assert len(take.audio) > 0
    assert take.timings["skipped_symbols"] == 2
    assert any("skipped" in w for w in take.warnings)


def test_emoji_and_odd_symbols_in_text(engine):
    take = engine.synthesize(text="Good morning 🌞 — ¿qué? ★ ok.")
    assert len(take.audio) > take.sample_rate // 4


def _chapter(min_chars: int) -> str:
    sentence = "This sentence is one of many in a very long chapter. "
    return sentence * (min_chars // len(sentence) + 1)


def test_huge_text_can_be_cancelled_between_chunks(engine):
    text = _chapter(50_000)
    assert len(engine.phonemize(text)) == text.count(".")
    chunks = []
    with pytest.raises(CancelledError):
        engine.synthesize(text=text, on_chunk=lambda i, a: chunks.append(i), cancelled=lambda: len(chunks) >= 3)
    assert chunks == [0, 1, 2]


@pytest.mark.slow
def test_huge_text_is_synthesized_to_the_end(engine):
    # 50,000 characters, every sentence a chunk; spoken four times faster to keep the run short.
    text = _chapter(50_000)
    assert len(text) >= 50_000
    sizes = []
    take = engine.synthesize(text=text, length_scale=0.25, on_chunk=lambda i, a: sizes.append((i, len(a))))
    n = text.count(".")
    assert [i for i, _ in sizes] == list(range(n))
    assert take.timings["chunks"] == n
    assert len(take.audio) == sum(size for _, size in sizes)
    assert min(size for _, size in sizes) > take.sample_rate // 4  # every sentence made a sound
    assert np.isfinite(take.audio).all() and np.abs(take.audio).max() <= 1.0


def test_input_over_limit_is_refused(engine):
    with pytest.raises(InvalidArgumentError):
        engine.synthesize(text="a" * 1_000_001)


def test_text_and_phonemes_are_exclusive(engine):
    with pytest.raises(InvalidArgumentError):
        engine.synthesize(text="a", phonemes="a")


def test_tiled_decoding_matches_whole_decoding(engine, joe_path):
    # Chunks longer than the decoder tile (256 frames by default) are vocoded in tiles
    # with halos; the seams must not be audible, or even measurable: in floats to 1e-6. The
    # integer convolutions (the default where the CPU's kernels have them) scale each stretch
    # of frames they take by its own largest value, and tiles start their stretches elsewhere:
    # within their quantization's error.
    text = (
        "This is a rather long sentence, written so that the vocoder must decode well over three seconds "
        "of audio in one chunk, which makes it go in tiles."
    )
    ipa = "\n".join(engine.phonemize(text))
    with Engine.open("piper:joe", device="cpu", threads=2, debug=EngineDebug(int16_kernels=False)) as floats:
        for e, atol in ((floats, 1e-6), (engine, 2e-3)):
            whole = e.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0, decoder_tile=-1)
            assert whole.timings["frames"] > 2 * 256
            for tile in (0, 1):  # the default, and the smallest tiles the engine allows
                tiled = e.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0, decoder_tile=tile)
                assert len(tiled.audio) == len(whole.audio)
                np.testing.assert_allclose(tiled.audio, whole.audio, atol=atol * np.abs(whole.audio).max(), rtol=0)


def test_prewarm_on_open_leaves_no_trace(joe_path):
    from app.engine.engine import Engine

    with Engine.open("piper:joe", device="cpu", threads=2) as cold:
        assert cold.prewarm_ms == 0.0  # the CPU is not prewarmed unless asked
        want = cold.synthesize(text="The first take after opening.", seed=3)
    with Engine.open("piper:joe", device="cpu", threads=2, prewarm=True) as warm:
        assert warm.prewarm_ms > 0.0
        # Every stage was built and checked while opening: nothing left the device.
        assert set(warm.fallback_ops) == set(warm.stages) and not any(warm.fallback_ops.values())
        with pytest.raises(InvalidArgumentError, match="no output"):
            warm.output("z")  # the prewarm's intermediates are dropped
        got = warm.synthesize(text="The first take after opening.", seed=3)
    assert np.array_equal(got.audio, want.audio)
    assert got.timings["chunks"] == want.timings["chunks"] == 1


def test_op_profile_counts_the_nodes_of_each_stage(engine):
    engine.set_op_profiling(True)
    take = engine.synthesize(text="Profiling every node.")
    engine.set_op_profiling(False)
    rows = engine.op_profile()
    assert {r["stage"] for r in rows} == {"encoder", "duration", "flow", "decoder"}
    assert rows == sorted(rows, key=lambda r: -r["ms"])
    assert all(r["count"] > 0 and r["ms"] >= 0 for r in rows)
    assert any(r["stage"] == "decoder" and r["op"] == "MUL_MAT" for r in rows)
    # Nodes are timed inside the stages, so their sum cannot exceed the stages' time.
    stage_ms = sum(ms for stage, ms in take.timings["stages_ms"].items() if stage != "phonemize")
    assert sum(r["ms"] for r in rows) <= stage_ms
    engine.synthesize(text="Not profiled.")
    assert engine.op_profile() == rows  # off: the last table stays, unchanged


def test_batch_gives_the_same_audio(engine):
    text = "One sentence. And another one, a little longer than the first."
    a = engine.synthesize(text=text, seed=5)
    b = engine.synthesize(text=text, seed=5, batch=2)
    assert np.array_equal(a.audio, b.audio) and b.timings["chunks"] == 2


def test_gpu_graphs_on_the_cpu_give_the_cpu_graphs_flow_and_audio(joe_path):
    """The graphs built for a GPU (im2col matrices, 1x1 convolutions straight from their input)
    run here on the CPU backend: on the same phonemes, noise off, they give the CPU graphs' flow
    output and audio (the CPU's in floats: integer convolutions are the CPU kernels' alone)."""
    from app.models import manager as models

    if models.installed_weights("piper:joe") not in (None, "f32"):
        pytest.skip("piper:joe is installed with other than F32 weights")
    text = "The quick brown fox, at last, jumps over the lazy dog."
    outs = {}
    for graphs in ("0", "1"):
        debug = EngineDebug(device_graphs=graphs == "1", int16_kernels=False)
        with Engine.open("piper:joe", device="cpu", threads=2, debug=debug) as e:
            take = e.synthesize(phonemes="\n".join(e.phonemize(text)), noise_scale=0.0, noise_w=0.0)
            outs[graphs] = (e.output("z"), take.audio)
    (z_cpu, audio_cpu), (z_dev, audio_dev) = outs["0"], outs["1"]
    assert z_dev.shape == z_cpu.shape and len(audio_dev) == len(audio_cpu)
    np.testing.assert_allclose(z_dev, z_cpu, atol=1e-4 * np.abs(z_cpu).max())
    np.testing.assert_allclose(audio_dev, audio_cpu, atol=1e-3)


def test_gpu_graphs_pack_a_batch_and_each_sentence_sounds_as_alone(joe_path):
    """Off the CPU a batch's sentences share each stage's graph, laid end to end with masked
    gaps and attention kept to each sentence. The CPU backend runs those graphs here (CI has
    no GPU). Exact only with F32 weights (the default install): with F16 ones, matmuls of
    another shape may round a token's duration across a frame boundary (tests/test_gpu.py
    checks that case on a GPU)."""
    from app.models import manager as models

    if models.installed_weights("piper:joe") not in (None, "f32"):
        pytest.skip("piper:joe is installed with other than F32 weights")
    ipa = "\n".join(
        [
            "hˈaɪ!",
            "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ, ænd ðˈɛn ɪt ɹˈʌnz fˈɑːɹ ɐwˈeɪ.",
            "wˈɛɹ ɪz ɪt?",
        ]
    )
    with Engine.open("piper:joe", device="cpu", threads=2, debug=EngineDebug(device_graphs=True)) as e:
        alone, together, tiled = [], [], []
        e.synthesize(phonemes=ipa, seed=3, on_chunk=lambda i, audio: alone.append(audio))
        logw, z = e.output("logw"), e.output("z")
        b = e.synthesize(phonemes=ipa, seed=3, batch=3, on_chunk=lambda i, audio: together.append(audio))
        assert b.timings["chunks"] == 3
        # The last sentence's intermediates, its noise drawn as alone.
        np.testing.assert_allclose(e.output("logw"), logw, atol=1e-4)
        np.testing.assert_allclose(e.output("z"), z, atol=1e-3)
        # Tiles of 120 frames: the short sentences share one, the long one goes alone in tiles.
        e.synthesize(phonemes=ipa, seed=3, batch=3, decoder_tile=120, on_chunk=lambda i, audio: tiled.append(audio))
        assert len(alone) == len(together) == len(tiled) == 3
        assert len(alone[1]) > 120 * 256 > len(alone[0]) + len(alone[2])
        for x, y, t in zip(alone, together, tiled, strict=True):
            assert len(x) == len(y) == len(t)
            np.testing.assert_allclose(y, x, atol=1e-4)
            np.testing.assert_allclose(t, x, atol=1e-4)
    # A device that takes tensors up to 16 MiB (a Vulkan device's limit can be 128): the
    # graphs built within it (the decoder's tile sized to its largest tensor, 64 KiB a latent
    # frame) give the same audio. The CPU has no such limit, so a tile too large for one
    # would go unseen here; what this checks is the sound.
    debug = EngineDebug(device_graphs=True, device_limits="16,0")
    with Engine.open("piper:joe", device="cpu", threads=2, debug=debug) as e:
        small = []
        e.synthesize(phonemes=ipa, seed=3, batch=3, on_chunk=lambda i, audio: small.append(audio))
        assert len(alone[1]) > 256 * 256
        for x, s in zip(alone, small, strict=True):
            assert len(x) == len(s)
            np.testing.assert_allclose(s, x, atol=1e-4)


def test_the_engines_cpu_kernels_give_ggmls_audio(engine, joe_path):
    """Piper's residual stacks in the engine's fused CPU kernel (LeakyReLU, dilated convolution,
    bias and residual add in one pass) in floats against the same stacks in ggml's ops; and in
    16-bit integers (the default where the CPU's kernels have them) against the floats: the
    same spectrum and level, measured."""
    from app.engine.binding import native_engine

    ipa = "\n".join(engine.phonemize("The quick brown fox jumps over the lazy dog. Hello there!"))
    takes = {}
    for name, debug in [("ggml", EngineDebug(engine_kernels=False)), ("floats", EngineDebug(int16_kernels=False))]:
        with Engine.open("piper:joe", device="cpu", threads=2, debug=debug) as e:
            takes[name] = e.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0).audio
    assert len(takes["floats"]) == len(takes["ggml"]) > 22050
    np.testing.assert_allclose(takes["floats"], takes["ggml"], atol=2e-5, rtol=0)
    got = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0).audio
    if native_engine().cpu_vector_floats() < 8:
        np.testing.assert_allclose(got, takes["floats"], atol=2e-5, rtol=0)
        return
    want = takes["floats"]
    assert len(got) == len(want) and not np.array_equal(got, want)
    assert log_mel_cosine(got, want, 22050) >= 0.99999
    assert abs(np.std(got) / np.std(want) - 1) <= 0.001
    assert np.max(np.abs(got - want)) <= 0.01 * np.max(np.abs(want))


@pytest.mark.parametrize("width", [4, 8])
def test_the_narrower_cpu_kernels_give_ggmls_audio_too(joe_path, width):
    """The kernels for AVX2 (8 floats) and for the build's own vectors (4), chosen with
    VOICESTUDIO_CPU_VECTOR_FLOATS on this CPU, with weights packed for them: Piper's audio as in
    ggml's ops, within 5e-5 (sums in another order; on an AMD EPYC without AVX-512, where ggml
    too is built for AVX2, the 8 floats' differ by 2.3e-5)."""
    import os
    import subprocess
    import sys

    probe = (
        "import numpy as np\n"
        "from app.engine.binding import native_engine\n"
        "from app.engine.engine import Engine, EngineDebug\n"
        "ipa = 'ðə kwˈɪk bɹˈaʊn fˈɑːks.'\n"
        "takes = []\n"
        "for on in (True, False):\n"
        "    debug = EngineDebug(engine_kernels=on, int16_kernels=False)\n"
        "    with Engine.open('piper:joe', device='cpu', threads=2, debug=debug) as e:\n"
        "        takes.append(e.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0).audio)\n"
        "a, b = takes\n"
        "print(native_engine().cpu_vector_floats(), len(a) == len(b), float(np.abs(a - b).max()))\n"
    )
    env = dict(os.environ, VOICESTUDIO_CPU_VECTOR_FLOATS=str(width))
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=root, capture_output=True, text=True, check=True)
    used, same_length, worst = out.stdout.split()
    assert int(used) == width and same_length == "True" and float(worst) <= 5e-5


def test_a_cpu_without_avx512_is_emulated_by_hiding_it(joe_path):
    """build/native/libvs-isa-mask.so (tools/cpu_table.py --isa avx2), preloaded, hides AVX-512
    from CPUID for the whole process: the engine then chooses its AVX2 kernels, numpy and
    onnxruntime their AVX2 paths, and the audio is what those kernels give."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    mask = root / "build" / "native" / "libvs-isa-mask.so"
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if not mask.exists() or "avx512f" not in flags or "cpuid_fault" not in flags:
        pytest.skip("needs x86-64 Linux with AVX-512 and CPUID faulting")
    probe = (
        "from numpy._core._multiarray_umath import __cpu_features__ as f\n"
        "import onnxruntime\n"
        "from app.engine.binding import native_engine\n"
        "print(native_engine().cpu_vector_floats(), f['AVX512F'], f['AVX2'], f['FMA3'])\n"
    )
    runs = {}
    for masked in (False, True):
        env = dict(os.environ, LD_PRELOAD=str(mask)) if masked else dict(os.environ)
        out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=root, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        runs[masked] = out.stdout.split()
    assert runs[False] == ["16", "True", "True", "True"]
    assert runs[True] == ["8", "False", "True", "True"]


def test_durations_are_each_tokens_frames(engine):
    """Piper's named output "durations": each token's frames (BOS, pad, each phoneme and its
    pad, EOS), the audio's length in frames of 256 samples (word timings come from them)."""
    ipa = "həlˈoʊ wˈɜːld."
    take = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
    durations = engine.output("durations")
    assert durations.shape == (2 * len(ipa) + 3, 1) and np.all(durations >= 0)
    assert durations.sum() * 256 == len(take.audio)
    np.testing.assert_array_equal(durations[:, 0], np.ceil(np.exp(engine.output("logw")[:, 0])))
