"""The engine on a GPU backend, where this ggml build has one (skipped elsewhere, as in CI)."""

import numpy as np
import pytest

from app.audio.dsp import log_mel_cosine
from app.engine.engine import Engine, EngineDebug, devices

GPUS = [d["id"] for d in devices() if d["type"] in ("gpu", "igpu")]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPUS, reason="this ggml build reports no GPU")]


@pytest.mark.parametrize("voice", ["piper:joe", "kokoro:jf_alpha"])
@pytest.mark.parametrize("device", GPUS)
def test_opening_on_a_gpu_prewarms_and_checks_every_stage(device, voice, joe_path):
    from app.models import manager as models

    if voice.startswith("kokoro") and not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    with Engine.open(voice, device=device) as gpu:
        # Before any synthesis: the prewarm built every stage's graphs on the device.
        assert gpu.prewarm_ms > 0
        assert set(gpu.fallback_ops) == set(gpu.stages)
        assert gpu.fallback_ops == {stage: [] for stage in gpu.stages}
        take = gpu.synthesize(text="The first take after opening.")
        assert take.duration_s > 1.0 and np.isfinite(take.audio).all()


@pytest.mark.parametrize("device", GPUS)
def test_gpu_speaks_like_the_cpu_with_every_stage_on_the_device(device, sentences, joe_path):
    with Engine.open("piper:joe", device="cpu", threads=2) as cpu, Engine.open("piper:joe", device=device) as gpu:
        assert gpu.device == device
        for text in sentences[:6]:
            ipa = "\n".join(cpu.phonemize(text))
            want = cpu.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
            got = gpu.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
            # Durations are rounded to frames; another summation order may move one by a frame or two.
            assert abs(len(got.audio) - len(want.audio)) <= 2 * 256, text
            assert np.isfinite(got.audio).all()
            assert log_mel_cosine(got.audio, want.audio, want.sample_rate) >= 0.99, text
        assert gpu.fallback_stages == []


@pytest.mark.parametrize("device", GPUS)
def test_gpu_packs_a_piper_batch_and_each_sentence_sounds_as_alone(device, sentences, joe_path):
    with Engine.open("piper:joe", device=device) as gpu:
        ipa = "\n".join(line for text in sentences for line in gpu.phonemize(text))
        alone, together = [], []
        gpu.synthesize(phonemes=ipa, on_chunk=lambda i, audio: alone.append(audio))
        logw = gpu.output("logw")
        take = gpu.synthesize(phonemes=ipa, batch=len(alone), on_chunk=lambda i, audio: together.append(audio))
        assert len(together) == len(alone) > 6 and take.timings["chunks"] == len(alone)
        # Packed graphs have other shapes, so F16 matmuls round differently (not more):
        # attending or convolving across sentences would move the edge tokens far more.
        assert np.abs(gpu.output("logw") - logw).max() <= 0.02 * np.abs(logw).max()
        same_length = 0
        for x, y in zip(alone, together, strict=True):
            # A token's frames are a ceiling: one near a whole number may round the other way.
            assert abs(len(x) - len(y)) <= 2 * 256
            assert np.isfinite(y).all()
            if len(x) == len(y):
                assert log_mel_cosine(y, x, gpu.sample_rate) >= 0.999
                same_length += 1
            else:  # the frames after the moved one are shifted
                assert log_mel_cosine(y, x, gpu.sample_rate) >= 0.98
        assert same_length >= len(alone) // 2
        assert gpu.fallback_stages == []


@pytest.mark.parametrize("device", GPUS)
def test_gpu_runs_all_of_kokoro(device, sentences):
    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    voice = "kokoro:jf_alpha"
    with Engine.open(voice, device="cpu", threads=2) as cpu, Engine.open(voice, device=device) as gpu:
        assert gpu.device == device
        for text in sentences[:6]:
            for line in cpu.phonemize(text):
                want = cpu.synthesize(phonemes=line)
                # The CPU's durations, so that a token near a .5 boundary cannot shift the rest.
                got = gpu.synthesize(phonemes=line, durations=cpu.output("durations").reshape(-1).astype(np.int32))
                assert len(got.audio) == len(want.audio) and np.isfinite(got.audio).all()
                assert log_mel_cosine(got.audio, want.audio, want.sample_rate) >= 0.99, line
                # The decoder's output, which a CUDA device leaves there for the generator and
                # reads back for this: the CPU's, frame for frame.
                dec, dec_cpu = gpu.output("decoder"), cpu.output("decoder")
                assert dec.shape == dec_cpu.shape
                cosine = np.dot(dec.ravel(), dec_cpu.ravel()) / (np.linalg.norm(dec) * np.linalg.norm(dec_cpu))
                assert cosine >= 0.98, line
                free = gpu.synthesize(phonemes=line)
                assert abs(len(free.audio) - len(want.audio)) <= 2 * 600, line  # at most two frames
        assert gpu.fallback_stages == []


@pytest.mark.parametrize("device", GPUS)
def test_gpu_batch_sounds_like_one_at_a_time(device, sentences):
    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    with Engine.open("kokoro:jf_alpha", device=device) as gpu:
        ipa = "\n".join(line for text in sentences[:6] for line in gpu.phonemize(text))
        alone, together = [], []
        gpu.synthesize(phonemes=ipa, on_chunk=lambda i, audio: alone.append(audio))
        bert_alone = gpu.output("bert")  # the last sentence's
        gpu.set_op_profiling(device.startswith("cuda"))
        gpu.synthesize(phonemes=ipa, batch=6, on_chunk=lambda i, audio: together.append(audio))
        if device.startswith("cuda"):  # the generator's kernels take the six packed: one pass a stage
            passes = {r["op"]: r["count"] for r in gpu.op_profile() if r["stage"] == "generator"}
            assert passes.get("residual stacks (engine's CUDA kernels)", 0) <= 4  # 12 one at a time
        # Its BERT shared one graph with the other five (a block-diagonal attention mask);
        # matmuls of another size may round differently, attending across sentences would not be close.
        assert np.abs(gpu.output("bert") - bert_alone).max() <= 0.01 * np.abs(bert_alone).max()
        assert len(alone) == len(together) >= 6
        same_length = 0
        for x, y in zip(alone, together, strict=True):
            assert abs(len(x) - len(y)) <= 2 * 600  # a token near .5 may round to another frame
            if len(x) == len(y):  # else every later frame is shifted, and the spectra with it
                assert log_mel_cosine(y, x, gpu.sample_rate) >= 0.99
                same_length += 1
        assert same_length >= len(alone) - 2
        assert gpu.fallback_stages == []


@pytest.mark.parametrize("voice", ["piper:joe", "kokoro:jf_alpha"])
@pytest.mark.parametrize("device", GPUS)
def test_workers_on_a_gpu_give_the_takes_of_one(device, voice, sentences, joe_path):
    """Four workers, each its own queue and thread on the device, each take a pair of a
    batch of eight (two sentences, four times over): every pair packs as one worker packs
    those two alone, so every take is that one's, whichever worker made it."""
    from app.models import manager as models

    if voice.startswith("kokoro") and not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    pair = sentences[1:3]
    with Engine.open(voice, device=device) as one, Engine.open(voice, device=device, workers=4) as four:
        assert four.workers == 4 and four.fallback_stages == []
        want = one.synthesize_many(pair, batch=2, seed=5)
        for _ in range(2):  # all four at once, twice
            got = four.synthesize_many(pair * 4, batch=8, seed=5)
            assert got[0].timings["chunks"] == 8
            for k, take in enumerate(got):
                ref = want[k % 2].audio
                assert len(take.audio) == len(ref) and np.isfinite(take.audio).all()
                assert np.abs(take.audio - ref).max() <= 1e-3 * np.abs(ref).max(), k
        assert four.fallback_stages == []


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_kept_graphs_on_a_gpu_give_the_takes_of_graphs_built_for_them(device, joe_path):
    """A CUDA device keeps Piper's stage graphs by their rounded shapes: a batch in another
    order, then one sentence a call (other sentences of the same rounded lengths), runs
    kept graphs, and every take is the one a graph built for it gives."""
    from test_kept_graphs import CALLS

    def run(keep: str):
        with Engine.open("piper:joe", device=device, debug=EngineDebug(keep_graphs=keep == "1")) as gpu:
            return [gpu.synthesize_many(texts, seed=3, batch=batch) for texts, batch in CALLS]

    kept, fresh = run("1"), run("0")
    assert [c[0].timings["graphs_reused"] for c in fresh] == [0] * len(CALLS)
    reused = [c[0].timings["graphs_reused"] for c in kept]
    assert reused[1] == reused[2] == 3 and reused[3] >= 10 and reused[4] == 36
    same_length = n = 0
    for got, want in zip(kept, fresh, strict=True):
        for a, b in zip(got, want, strict=True):
            # The rounded shapes change the F16 matmuls' order of summation, which may move
            # a duration near a whole frame by one: the frames after it are then shifted.
            assert abs(len(a.audio) - len(b.audio)) <= 2 * 256 and np.isfinite(a.audio).all()
            same = len(a.audio) == len(b.audio)
            assert log_mel_cosine(a.audio, b.audio, b.sample_rate) >= (0.999 if same else 0.98)
            same_length, n = same_length + same, n + 1
    assert same_length >= n // 2


@pytest.mark.parametrize("keep", ["1", "0"])
@pytest.mark.parametrize("voice", ["piper:joe", "kokoro:jf_alpha"])
@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_a_take_repeated_on_cuda_is_the_same_and_only_kept_graphs_are_captured(
    device, voice, keep, sentences, joe_path, capfd
):
    """The same sentence four times in a row. Where ggml is built with CUDA graphs it
    captures a graph run twice with the same nodes and replays it: a kept graph's replays
    must give the take of its first, direct run; a graph built for one call must never be
    captured (each such run is new to ggml), which ggml would report on stderr."""
    from app.models import manager as models

    if voice.startswith("kokoro") and not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    capfd.readouterr()
    with Engine.open(voice, device=device, debug=EngineDebug(keep_graphs=keep == "1")) as gpu:
        takes = [gpu.synthesize_many([sentences[4]], seed=2)[0].audio for _ in range(4)]
        reused = gpu.synthesize_many([sentences[4]], seed=2)[0].timings["graphs_reused"]
    for take in takes[1:]:
        assert len(take) == len(takes[0]) and np.isfinite(take).all()
        assert np.abs(take - takes[0]).max() <= 1e-4 * np.abs(takes[0]).max()
    assert (reused > 0) == (keep == "1")
    if keep == "0":
        assert "CUDA graph warmup complete" not in capfd.readouterr().err


@pytest.mark.parametrize("voice", ["piper:joe", "kokoro:jf_alpha"])
@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_inputs_staged_in_pinned_memory_give_the_takes_of_inputs_set_one_by_one(device, voice, sentences, joe_path):
    """On CUDA a graph's inputs are copied on the device's stream through pinned host memory
    without a wait each, the next compute waiting for them all. The takes must be those of
    inputs each set and waited for (staging_kib=0), also where that memory is so
    small (1 KiB) that a call fills it again and again (waited for, then used from its
    start) and grows it for larger inputs."""
    from app.models import manager as models

    if voice.startswith("kokoro") and not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    takes = {}
    for kib in ("0", "1", "4096"):
        with Engine.open(voice, device=device, prewarm=False, debug=EngineDebug(staging_kib=int(kib))) as gpu:
            alone = [t.audio for t in gpu.synthesize_many(sentences[:3], seed=2)]
            batch = [t.audio for t in gpu.synthesize_many(sentences[:4], seed=2, batch=4)]
            takes[kib] = alone + batch
    for kib in ("1", "4096"):
        for got, want in zip(takes[kib], takes["0"], strict=True):
            assert len(got) == len(want) and np.isfinite(got).all(), kib
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), kib


@pytest.mark.parametrize("voice", ["piper:joe", "kokoro:jf_alpha"])
@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_graphs_queued_without_a_wait_give_the_takes_of_graphs_waited_for(device, voice, sentences):
    """On CUDA the host queues a graph and goes on without waiting for it; ggml's stream and
    the engine's kernels' are ordered by events, and the host waits at each stage's end. The
    takes must be those of every graph waited for (wait_each_graph): one sentence a
    call (the same ones again, through the captured graphs), a batch, and a batch divided
    between two workers."""
    from app.models import manager as models

    if voice.startswith("kokoro") and not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    takes = {}
    for wait in ("1", "0"):
        debug = EngineDebug(wait_each_graph=wait == "1")
        with Engine.open(voice, device=device, prewarm=False, debug=debug) as one:
            alone = [t.audio for _ in range(2) for t in one.synthesize_many(sentences[:4], seed=2)]
            batch = [t.audio for t in one.synthesize_many(sentences[:6], seed=2, batch=6)]
        with Engine.open(voice, device=device, prewarm=False, workers=2, debug=debug) as two:
            split = [t.audio for t in two.synthesize_many(sentences[:6], seed=2, batch=6)]
        takes[wait] = alone + batch + split
    for got, want in zip(takes["0"], takes["1"], strict=True):
        assert len(got) == len(want) and np.isfinite(got).all()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("voice", ["piper:joe", "kokoro:jf_alpha"])
@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_a_first_take_of_the_prewarms_shapes_replays_what_it_captured(device, voice, capfd):
    """ggml captures a kept graph on its second run, milliseconds more than a replay; the
    prewarm runs its sentences twice so that a first take of their shapes captures nothing."""
    from app.models import manager as models

    if voice.startswith("kokoro") and not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    capfd.readouterr()
    with Engine.open(voice, device=device, prewarm=True) as gpu:
        opening = capfd.readouterr().err
        take = gpu.synthesize(phonemes="fˈɑːks.")  # the prewarm's last sentence
        during = capfd.readouterr().err
    captured = "CUDA graph warmup complete"  # ggml's debug line for each graph it captures
    if captured not in opening + during:
        pytest.skip("ggml is built without CUDA graphs")
    assert captured in opening and captured not in during
    assert take.timings["graphs_reused"] > 0 and np.isfinite(take.audio).all()


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_kokoro_stacks_captured_at_one_length_replay_for_the_others_of_its_bucket(device, sentences, monkeypatch):
    """On CUDA a sentence alone runs its generator at its length's buckets, its own length
    masked: its residual stacks run the first time a bucket comes, captured the second and
    replayed after, for the other lengths of that bucket too; its graphs are kept by those
    buckets. Each take must be the one its own length's graphs and kernels give launched
    one by one (ggml's captures and the engine's off), to its last samples: the frames past
    a sentence's end add nothing to them (they are near silence, so an error there is
    measured against them)."""
    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    voice = "kokoro:jf_alpha"
    with Engine.open(voice, device=device, prewarm=False) as gpu:
        line = gpu.phonemize(sentences[2])[0]
        gpu.synthesize(phonemes=line)
        durations = gpu.output("durations").reshape(-1).astype(np.int32)
        longest = int(np.argmax(durations))
        assert durations[longest] > 5
        variants = []
        for fewer in (0, 0, 0, 1, 2, 3, 4, 5):  # that length three times, then shorter ones
            d = durations.copy()
            d[longest] -= fewer
            variants.append(d)
        takes = [gpu.synthesize(phonemes=line, durations=d, seed=2) for d in variants]
    monkeypatch.setenv("GGML_CUDA_DISABLE_GRAPHS", "1")  # ggml's own switch
    with Engine.open(voice, device=device, prewarm=False, debug=EngineDebug(captures=False)) as direct:
        wants = [direct.synthesize(phonemes=line, durations=d, seed=2) for d in variants]
        assert all(w.timings["captures_replayed"] == 0 for w in wants)
    # The call that gave the durations ran the stacks of this length, the first take captured
    # them (both stages'), the second replayed them.
    replayed = [t.timings["captures_replayed"] for t in takes]
    assert replayed[:3] == [0, 2, 2]
    assert sum(r == 2 for r in replayed[3:]) >= 3, replayed  # shorter ones of the same buckets
    for got, want in zip(takes, wants, strict=True):
        assert len(got.audio) == len(want.audio) and np.isfinite(got.audio).all()
        peak = np.abs(want.audio).max()
        assert np.abs(got.audio - want.audio).max() <= 1e-4 * peak
        tail, want_tail = got.audio[-300:], want.audio[-300:]  # the last 12.5 ms
        assert np.abs(tail - want_tail).max() <= 0.1 * np.abs(want_tail).max() + 1e-6 * peak


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_kokoro_outputs_left_on_the_device_read_back_as_ggml_ops_give_them(device, sentences):
    """On CUDA the decoder's output and the generator's source spectrum ("har") stay on the
    device, read back only when asked for. They must be what the stages computed: the same
    device with the engine's kernels off (every stage in ggml ops, its outputs read back as
    each stage ends) gives them within rounding, and a later call's replace them."""
    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    voice, names = "kokoro:jf_alpha", ("decoder", "har")
    with Engine.open(voice, device=device, prewarm=False) as gpu:
        first = gpu.phonemize(sentences[1])[0]
        gpu.synthesize(phonemes=first)
        first_outputs = {name: gpu.output(name).copy() for name in names}
        line = gpu.phonemize(sentences[3])[0]
        take = gpu.synthesize(phonemes=line, seed=1)
        durations = gpu.output("durations").reshape(-1).astype(np.int32)
        got = {name: gpu.output(name) for name in names}
        assert all(np.array_equal(gpu.output(name), got[name]) for name in names)  # asked for again
    with Engine.open(voice, device=device, prewarm=False, debug=EngineDebug(engine_kernels=False)) as ops:
        want_take = ops.synthesize(phonemes=line, durations=durations, seed=1)
        want = {name: ops.output(name) for name in names}
    assert len(take.audio) == len(want_take.audio)
    for name in names:
        assert got[name].shape == want[name].shape != first_outputs[name].shape, name
    # har's second half of columns is the source's phases, which follow F0's integral: F0's
    # rounding in the other path moves them (by up to a turn at the end); its magnitudes not.
    half = got["har"].shape[1] // 2
    for name, a, b in (
        ("decoder", got["decoder"], want["decoder"]),
        ("har", got["har"][:, :half], want["har"][:, :half]),
    ):
        a, b = a.ravel(), b.ravel()
        assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) >= 0.999, name


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_kokoro_outputs_of_a_batch_across_workers_are_its_last_sentences(device, sentences):
    """With workers, a call's outputs are its last sentence's, made by the last worker in its
    own device memory and copied on the device into the engine's. Read back from another
    thread, as the studio's window reads them, they must be one worker's of the same pair,
    and a later call's must replace them."""
    import threading

    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    voice, names = "kokoro:jf_alpha", ("decoder", "har")
    pair, other = sentences[1:3], sentences[3:5]
    with Engine.open(voice, device=device) as one, Engine.open(voice, device=device, workers=4) as four:
        one.synthesize_many(pair, batch=2, seed=5)
        want = {name: one.output(name) for name in names}
        for batch in (other, pair):  # the second call's outputs replace the first's
            four.synthesize_many(batch * 4, batch=8, seed=5)
        got = {}
        reader = threading.Thread(target=lambda: got.update({name: four.output(name) for name in names}))
        reader.start()
        reader.join()
    for name in names:
        assert want[name] is not None and got[name].shape == want[name].shape, name
        assert np.abs(got[name] - want[name]).max() <= 1e-3 * np.abs(want[name]).max(), name


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_kokoro_kept_graphs_on_a_gpu_give_the_takes_of_graphs_built_for_them(device):
    from test_kept_graphs import assert_kokoro_kept_like_fresh, kokoro_calls

    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    kept, fresh = kokoro_calls(device, True), kokoro_calls(device, False)
    # The CPU's 8 a call and the six LSTMs' input projections (their recurrences in the
    # engine's kernel), less four graphs computed in the next LSTM's projections graph: the
    # duration encoder's three AdaLayerNorms and the text encoder's convolutions. A sentence
    # alone also keeps the generator's three graphs around its residual stacks (by the
    # stacks' buckets), which a batch builds for its sentences.
    assert_kokoro_kept_like_fresh(kept, fresh, per_call=13, on_gpu=True, per_batch=10)


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_kokoro_graphs_dropped_for_room_and_built_again_give_the_same_takes(device, sentences):
    """With room for a few sentences' kept graphs, each sentence drops others' (captured by
    ggml: each is run twice) and new ones are built in their metadata, at the addresses
    ggml keys its captures by. No replay or update may run a dropped graph's kernels: every
    take must be the first take of its sentence."""
    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    first, again, rebuilt = {}, {}, 0
    with Engine.open("kokoro:jf_alpha", device=device, debug=EngineDebug(kept_graphs_mib=64)) as gpu:
        for round_ in range(3):
            for i, text in enumerate(sentences):
                for repeat in range(2):
                    take = gpu.synthesize_many([text], seed=2)[0]
                    assert np.isfinite(take.audio).all()
                    want = first.setdefault(i, take.audio)
                    assert len(take.audio) == len(want), (round_, text)
                    assert np.abs(take.audio - want).max() <= 1e-4 * np.abs(want).max(), (round_, text)
                    # A take right after its sentence's builds only the graphs never kept.
                    built = take.timings["graphs_built"]
                    if repeat == 1:
                        again.setdefault(i, built)
                    elif round_ > 0:
                        rebuilt += built > again[i]
    assert rebuilt > 0  # kept graphs were dropped and built again


@pytest.mark.parametrize("device", GPUS)
def test_automatic_workers_on_cuda_with_room_for_them(device, joe_path):
    """workers=None (the studio's): 4 on a CUDA device with 16 GiB free, 2 with 8, else 1;
    1 on other backends, where ggml serializes the contexts."""
    from app.engine.engine import AUTO_WORKERS

    free = next(d["memory_free"] for d in devices() if d["id"] == device)
    want = 1
    if device.startswith("cuda"):
        want = AUTO_WORKERS if free >= 16 * 2**30 else 2 if free >= 8 * 2**30 else 1
    with Engine.open("piper:joe", device=device, workers=None) as e:
        assert e.workers == want


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_cuda_kernels_match_the_ggml_ops(device):
    """Kokoro's LSTMs and its generator's residual stacks run in the engine's own CUDA kernels;
    ggml's ops on the same device are the reference."""
    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    voice = "kokoro:jf_alpha"
    ipa = "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ, ænd ðˈɛn ɪt ɹˈʌnz fˈɑːɹ ɐwˈeɪ."
    with Engine.open(voice, device=device) as fast:
        fast.set_op_profiling(True)
        audio = fast.synthesize(phonemes=ipa).audio
        kernels = {row["op"]: row["count"] for row in fast.op_profile() if row["stage"] == "generator"}
        got = {name: fast.output(name) for name in ("duration_logits", "durations", "F0", "N", "text_encoder")}
    # Two stages, each a residual stack and a mean of three: in the kernels, not in ggml's ops.
    assert kernels.get("residual stacks (engine's CUDA kernels)") == 2
    assert "GROUP_NORM" not in kernels
    with Engine.open(voice, device=device, debug=EngineDebug(engine_kernels=False)) as ops:
        want_audio = ops.synthesize(phonemes=ipa, durations=got["durations"].reshape(-1).astype(np.int32)).audio
        for name in ("duration_logits", "F0", "N", "text_encoder"):
            want = ops.output(name)
            assert got[name].shape == want.shape, name
            scale = float(np.abs(want).max())
            assert float(np.abs(got[name] - want).max()) <= 1e-3 * scale, name
    assert len(audio) == len(want_audio) and np.isfinite(audio).all()
    # On an H100 the two agree to 0.9998 (log-mel) and 5% (RMS of the difference); with the
    # Snake's 1/alpha left out of the kernels they were 0.9947 and 40%.
    assert log_mel_cosine(audio, want_audio, 24000) >= 0.999
    assert np.sqrt(np.mean((audio - want_audio) ** 2)) <= 0.15 * np.sqrt(np.mean(want_audio**2))


@pytest.mark.parametrize("device", [d for d in GPUS if d.startswith("cuda")])
def test_piper_decoder_kernels_match_the_ggml_ops(device, sentences, joe_path):
    """With F16 or F32 weights (F32 ones read as F16 copies), Piper's decoder runs its residual
    blocks in the engine's CUDA kernels, one sentence at a time and packed (the gaps masked
    inside the kernels); ggml's ops on the same device, with the installed weights, are the
    reference."""
    from app.models import manager as models

    if models.installed_weights("piper:joe") not in (None, "f32", "f16"):
        pytest.skip("the kernels take F16 or F32 weights: python main.py models install piper:joe --weights f16")
    lines = sentences[:5]

    def run(engine):
        ipa = "\n".join(line for text in lines for line in engine.phonemize(text))
        alone, packed = [], []
        engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0, on_chunk=lambda i, a: alone.append(a))
        engine.synthesize(
            phonemes=ipa, noise_scale=0.0, noise_w=0.0, batch=len(alone), on_chunk=lambda i, a: packed.append(a)
        )
        return alone, packed

    with Engine.open("piper:joe", device=device) as fast:
        fast.set_op_profiling(True)
        fast.synthesize(text=lines[0], noise_scale=0.0, noise_w=0.0)
        kernels = {row["op"]: row["count"] for row in fast.op_profile() if row["stage"] == "decoder"}
        fast.set_op_profiling(False)
        got = run(fast)
    assert kernels.get("residual blocks (engine's CUDA kernels)") == 3  # one a upsampling stage
    with Engine.open("piper:joe", device=device, debug=EngineDebug(engine_kernels=False)) as ops:
        want = run(ops)
    for got_takes, want_takes in zip(got, want, strict=True):
        assert len(got_takes) == len(want_takes) == len(lines)
        for a, b in zip(got_takes, want_takes, strict=True):
            assert len(a) == len(b) and np.isfinite(a).all()
            assert log_mel_cosine(a, b, 22050) >= 0.999
            assert np.sqrt(np.mean((a - b) ** 2)) <= 0.05 * np.sqrt(np.mean(b**2))


@pytest.mark.parametrize("device", GPUS)
def test_speaker_encoder_on_the_gpu_embeds_as_the_cpu(device):
    """On CUDA its three LSTM layers run in the engine's kernel; the CPU's ggml graph is the reference."""
    from app.profiles.speaker_encoder import SAMPLE_RATE, SpeakerEncoder, similarity

    # 4 s of a voiced-like signal (harmonics of a gliding pitch, a little noise): seven partials.
    t = np.arange(4 * SAMPLE_RATE) / SAMPLE_RATE
    phase = 2 * np.pi * np.cumsum(120 + 40 * np.sin(2 * np.pi * 0.5 * t)) / SAMPLE_RATE
    audio = sum(np.sin(k * phase) / k for k in range(1, 12)) * 0.1
    audio = (audio + 0.005 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)
    with SpeakerEncoder.open(device="cpu", threads=2) as cpu, SpeakerEncoder.open(device=device) as gpu:
        want, got = cpu.embed_prepared(audio), gpu.embed_prepared(audio)
        assert gpu.device == device and not any(gpu._context.fallback_ops.values())
        assert similarity(got, want) >= 0.9999
        np.testing.assert_allclose(gpu.output("partials"), cpu.output("partials"), atol=1e-3)
