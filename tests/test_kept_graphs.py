"""Graphs kept between calls: on CUDA a context keeps each stage's graph by its shapes
(lengths rounded up, the added frames masked) and the next sentence of those shapes only
sets its inputs. A take must not depend on whether its graphs were built for it or kept
from another sentence. On the CPU, EngineDebug(keep_graphs=True) keeps them too and
device_graphs=True builds the graphs a GPU runs, so CI checks that path."""

import numpy as np
import pytest
from test_workers import TEXTS

from app.engine.engine import Engine, EngineDebug

OTHERS = [
    "Hello!",
    "The slow green turtle walks under the busy bridge, and then it sleeps.",
    "Who is that?",
    "Another sentence, of middling size.",
    "Six.",
    "And a last one, which ends the text.",
]
# (texts, batch): a batch; the same sentences in another order (the same rounded shapes,
# each sentence elsewhere in them); the first again; then one sentence a call, twice over.
CALLS = [(TEXTS, 6), (TEXTS[::-1], 6), (TEXTS, 6), (TEXTS + OTHERS, 1), (OTHERS + TEXTS, 1)]


def _calls(keep: bool, workers: int = 1, limit_mib: int | None = None, device_limits: str = ""):
    debug = EngineDebug(device_graphs=True, keep_graphs=keep, kept_graphs_mib=limit_mib, device_limits=device_limits)
    out = []
    with Engine.open("piper:joe", device="cpu", threads=2, workers=workers, debug=debug) as engine:
        for texts, batch in CALLS:
            takes = engine.synthesize_many(texts, seed=3, batch=batch)
            out.append(([t.audio for t in takes], takes[0].timings))
    return out


@pytest.fixture(scope="module")
def fresh(joe_path):
    return _calls(False)


def _assert_same_takes(calls, fresh):
    for (audio, _), (ref, _) in zip(calls, fresh, strict=True):
        for a, r in zip(audio, ref, strict=True):
            assert a.shape == r.shape  # the same durations: no frame moved
            assert np.max(np.abs(a - r)) < 5e-4 * max(1.0, float(np.max(np.abs(r))))


def test_kept_graphs_give_the_takes_of_graphs_built_for_them(fresh):
    kept = _calls(True)
    _assert_same_takes(kept, fresh)
    assert all(t["graphs_reused"] == 0 for _, t in fresh)
    reused = [t["graphs_reused"] for _, t in kept]
    # Piper's encoder, duration and flow graphs are kept (its decoder's are not): the batch in
    # another order runs all three again, and so does the first batch.
    assert reused[0] == 0 and reused[1] == 3 and reused[2] == 3
    # One sentence a call: sentences of the same rounded lengths share graphs (12 of the 36
    # are another sentence's, where exact lengths would share 2), and the second pass finds
    # every sentence's.
    assert reused[3] >= 10 and reused[4] == 36
    for (_, t), (_, f) in zip(kept, fresh, strict=True):
        assert t["graphs_built"] + t["graphs_reused"] == f["graphs_built"]


def test_workers_keep_graphs_of_their_own(fresh):
    kept = _calls(True, workers=3)
    _assert_same_takes(kept, fresh)
    assert kept[2][1]["graphs_reused"] == 9  # each worker's two sentences: its three graphs again


def test_a_limit_too_small_for_any_graph_keeps_none(fresh):
    kept = _calls(True, limit_mib=0)
    _assert_same_takes(kept, fresh)
    assert all(t["graphs_reused"] == 0 for _, t in kept)


def test_kept_graphs_within_a_vulkan_devices_limits(joe_path):
    """The graphs a Vulkan device gets (no matmul over a fourth axis, no strided matrices in
    a matmul: im2col for every convolution), kept with keep_graphs=True."""
    limits = "1024,0,0"
    fresh = _calls(False, device_limits=limits)
    kept = _calls(True, device_limits=limits)
    _assert_same_takes(kept, fresh)
    assert [t["graphs_reused"] for _, t in kept][1:3] == [3, 3]


def test_the_prewarm_leaves_graphs_for_short_sentences_and_long(joe_path):
    """Off the CPU the prewarm speaks seven lengths, from one word to 17 s, so that a first
    take of any length finds graphs of its rounded shapes kept: the encoder's and the
    duration predictor's (by its tokens) at least; the flow's frames follow the take's seed."""
    phrase = "ðə kwˈɪk bɹˈaʊn fˈɑːks"
    debug = EngineDebug(device_graphs=True, keep_graphs=True)
    with Engine.open("piper:joe", device="cpu", threads=2, prewarm=True, debug=debug) as engine:
        for ipa in ("fˈɑːks.", phrase + ".", f"{phrase}, {phrase}, {phrase}.", ", ".join([phrase] * 13) + "."):
            assert engine.synthesize(phonemes=ipa).timings["graphs_reused"] >= 2, ipa


# Kokoro keeps its graphs by their shapes: BERT's (the tokens rounded up, the added ones
# each attending only to itself), the duration predictor's and the text encoder's (their
# tokens rounded up: frame-by-frame ops, and convolutions whose input is masked), the
# F0/N and decoder graphs (a job alone packed as one segment, its frames rounded up as a
# gap) and, on CUDA, the LSTMs' input projections (their steps rounded up, the added ones
# not run). Three sentences one a call, in another order, then as one batch twice.
KOKORO_TEXTS = ["Hello there.", "The quick brown fox jumps over the lazy dog.", "A third one, of middling size."]
KOKORO_CALLS = [(KOKORO_TEXTS, 1), (KOKORO_TEXTS[::-1], 1), (KOKORO_TEXTS, 3), (KOKORO_TEXTS, 3)]


STAGE_OUTPUTS = ("text_encoder", "duration_logits", "F0", "N", "decoder")


def kokoro_calls(device: str, keep: bool, device_graphs: bool = False):
    """Each call's takes, timings, last sentence's BERT output, sample rate and last
    sentence's other stage outputs (by name)."""
    out = []
    debug = EngineDebug(device_graphs=device_graphs, keep_graphs=keep)
    with Engine.open("kokoro:jf_alpha", device=device, threads=2, debug=debug) as engine:
        for texts, batch in KOKORO_CALLS:
            takes = engine.synthesize_many(texts, seed=3, batch=batch)
            stages = {name: engine.output(name) for name in STAGE_OUTPUTS}
            out.append(
                ([t.audio for t in takes], takes[0].timings, engine.output("bert"), takes[0].sample_rate, stages)
            )
    return out


def assert_kokoro_kept_like_fresh(kept, fresh, per_call: int, on_gpu: bool = False, per_batch: int | None = None):
    """The same BERT output within rounding (other shapes sum in another order), the same
    durations, and the same sound: Kokoro's source integrates F0, so a rounding there moves
    the phase of its samples, not what they sound like. On a GPU, F16 matmuls of other shapes
    round more (BERT within 1%, as a batch's is) and may move a token near half a frame by
    a frame, shifting every later one: such takes need only be as long, within two frames.
    per_call: the graphs a call of one sentence keeps; per_batch: the batch's (as many
    unless given)."""
    from app.audio.dsp import log_mel_cosine

    assert [c[1]["graphs_reused"] for c in fresh] == [0, 0, 0, 0]
    reused = [c[1]["graphs_reused"] for c in kept]
    # Each sentence's graphs again, in another order; the batch's again.
    assert reused[1] == 3 * per_call and reused[3] == (per_call if per_batch is None else per_batch)
    same_length = n = 0
    for (audio, _, bert, sample_rate, stages), (ref, _, ref_bert, _, ref_stages) in zip(kept, fresh, strict=True):
        assert np.max(np.abs(bert - ref_bert)) <= (1e-2 if on_gpu else 1e-3) * np.max(np.abs(ref_bert))
        if not on_gpu:
            # The stages' outputs too: frames added to a graph change none of a sentence's
            # (the text encoder's convolutions read zeros there; a sentence alone packed as
            # one segment sums its statistics in another order).
            for name, tol in (("text_encoder", 1e-5), ("duration_logits", 1e-4), ("F0", 1e-4), ("N", 1e-4)):
                got, want = stages[name], ref_stages[name]
                assert got.shape == want.shape and np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)), name
            assert np.max(np.abs(stages["decoder"] - ref_stages["decoder"])) <= 2e-3 * np.max(
                np.abs(ref_stages["decoder"])
            )
        for a, r in zip(audio, ref, strict=True):
            assert np.isfinite(a).all() and abs(len(a) - len(r)) <= (2 * 600 if on_gpu else 0)
            if len(a) == len(r):
                assert log_mel_cosine(a, r, sample_rate) >= (0.99 if on_gpu else 0.999)
            same_length, n = same_length + (len(a) == len(r)), n + 1
    assert same_length >= n // 2


def test_kokoro_keeps_its_graphs():
    from app.models import manager as models

    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    fresh = kokoro_calls("cpu", False, device_graphs=True)
    kept = kokoro_calls("cpu", True, device_graphs=True)
    # BERT, the duration predictor's three AdaLayerNorms and projection, F0/N, the text
    # encoder and the decoder: 8 a call (the CPU's LSTMs are graphs of their steps, not kept).
    assert_kokoro_kept_like_fresh(kept, fresh, per_call=8)
    assert [c[1]["graphs_reused"] for c in kept] == [0, 24, 0, 8]  # no prewarm on the CPU
