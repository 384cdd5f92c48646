"""Workers: contexts on one device, a thread each, that a batch's sentences are divided
between. A take must not depend on how many there are, and a cancellation or a failing
callback in any of them must stop the call cleanly."""

import threading

import numpy as np
import pytest

from app.engine.binding import native_engine
from app.engine.engine import AUTO_WORKERS, MAX_WORKERS, Engine, EngineDebug
from app.engine.errors import CancelledError, InvalidArgumentError

_engine = native_engine()

TEXTS = [
    "Hi!",
    "The quick brown fox jumps over the lazy dog, and then it runs far away.",
    "Where is it?",
    "A fourth sentence, of middling length.",
    "Five.",
    "And the sixth and last one, which closes the script.",
]


def _run(engine, batch=6):
    """synthesize_many over TEXTS: the takes, the chunks in the order they came and on which
    thread, and the threads on_stage was called from."""
    chunks, stage_threads = [], set()

    def on_stage(stage, chunk, ms):
        stage_threads.add(threading.get_ident())

    takes = engine.synthesize_many(TEXTS, seed=3, batch=batch, on_stage=on_stage)
    # synthesize_many hands no on_chunk through; synthesize does, over the same batches.
    take = engine.synthesize(
        text=" ".join(TEXTS),
        seed=3,
        batch=batch,
        on_chunk=lambda i, audio: chunks.append((i, threading.get_ident(), audio)),
    )
    return takes, take, chunks, stage_threads


@pytest.mark.parametrize("device_graphs", [False, True], ids=["cpu-graphs", "device-graphs"])
def test_workers_divide_a_batch_and_each_sentence_sounds_as_with_one(joe_path, device_graphs):
    """Piper on the CPU (with device_graphs, the packed graphs a GPU runs): three workers, a
    thread each, take two sentences each of a batch of six."""
    debug = EngineDebug(device_graphs=device_graphs)
    with Engine.open("piper:joe", device="cpu", threads=1, debug=debug) as one:
        takes1, take1, chunks1, _ = _run(one)
        z1, fallback1 = one.output("z"), one.fallback_ops
    with Engine.open("piper:joe", device="cpu", threads=1, workers=3, debug=debug) as three:
        assert three.workers == 3
        takes3, take3, chunks3, stage_threads = _run(three)
        z3 = three.output("z")
        assert three.fallback_ops == fallback1
    assert len(stage_threads) == 3  # the stages ran on three threads at once
    main = threading.get_ident()
    assert [i for i, _, _ in chunks3] == list(range(6)) and all(t == main for _, t, _ in chunks3)
    assert take3.timings["chunks"] == 6 and takes3[0].timings["chunks"] == 6
    assert take3.timings["samples"] == take1.timings["samples"]
    for stage, ms in take3.timings["stages_ms"].items():
        assert ms > 0 or stage == "phonemize", stage
    atol = 1e-4 if device_graphs else 0.0  # packed: each worker's pack has other shapes
    for a, b in zip(takes1 + [take1], takes3 + [take3], strict=True):
        assert len(a.audio) == len(b.audio)
        np.testing.assert_allclose(b.audio, a.audio, atol=atol, rtol=0)
    # The named outputs are the last chunk's, which the last worker made.
    np.testing.assert_allclose(z3, z1, atol=atol * 10, rtol=0)


def test_kokoro_workers_give_the_same_takes():
    """Kokoro batches its LSTM steps across a batch's sentences; divided between two workers
    each batches its own, and every take is the same."""
    texts = TEXTS[:3]
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=1) as one:
        takes1 = one.synthesize_many(texts, batch=3)
        durations1 = one.output("durations")
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=1, workers=2) as two:
        takes2 = two.synthesize_many(texts, batch=3)
        np.testing.assert_array_equal(two.output("durations"), durations1)
    for a, b in zip(takes1, takes2, strict=True):
        np.testing.assert_array_equal(b.audio, a.audio)


@pytest.fixture(scope="module")
def workers3(joe_path):
    with Engine.open("piper:joe", device="cpu", threads=1, workers=3) as e:
        yield e


def test_a_batchs_takes_each_carry_the_durations_they_have_alone(workers3):
    """Each input of one chunk gets its tokens' durations (for where its words are), whichever
    worker made it; an input of several chunks gets none."""
    texts = ["The first one.", "A second, longer sentence is here.", "Two sentences. In one text.", "Last."]
    takes = workers3.synthesize_many(texts, batch=4)
    for text, take in zip(texts, takes, strict=True):
        alone = workers3.synthesize(text=text)
        if text.count(".") > 1:
            assert take.durations is None and alone.durations is None
            continue
        np.testing.assert_array_equal(take.durations, alone.durations)
        assert take.durations.sum() * 256 == len(take.audio)


def test_cancel_inside_a_worker_stops_every_worker(workers3):
    """Cancelled as soon as a worker other than the caller's reports a stage: every worker
    stops at its next poll, the call raises, and the engine serves the next call."""
    main = threading.get_ident()
    reported = threading.Event()
    after: dict[int, int] = {}  # stages each thread finished once cancelled

    def on_stage(stage, chunk, ms):
        me = threading.get_ident()
        if reported.is_set():
            after[me] = after.get(me, 0) + 1
        elif me != main:
            reported.set()

    with pytest.raises(CancelledError):
        workers3.synthesize_many(TEXTS, batch=6, on_stage=on_stage, cancelled=reported.is_set)
    # Each worker stops before its next stage: at most the one it was in finishes.
    assert all(n <= 1 for n in after.values()), after
    takes = workers3.synthesize_many(TEXTS, batch=6, seed=3)
    with Engine.open("piper:joe", device="cpu", threads=1) as one:
        for a, b in zip(one.synthesize_many(TEXTS, batch=6, seed=3), takes, strict=True):
            np.testing.assert_array_equal(b.audio, a.audio)


def test_a_callback_failing_in_a_worker_reaches_the_caller(workers3):
    main = threading.get_ident()

    def on_stage(stage, chunk, ms):
        if threading.get_ident() != main:
            raise RuntimeError(f"from a worker, at chunk {chunk}")

    with pytest.raises(RuntimeError, match="from a worker"):
        workers3.synthesize_many(TEXTS, batch=6, on_stage=on_stage)
    assert len(workers3.synthesize_many(TEXTS[:2], batch=2)) == 2


def test_each_workers_time_is_reported_within_the_call(workers3):
    """A batch divided between three workers reports each one's time in its run, each within
    the call's; one sentence a call (no division) keeps the others idle."""
    divided = workers3.synthesize_many(TEXTS, batch=6)[0].timings
    assert len(divided["workers_ms"]) == 3
    assert all(0 < ms <= divided["total_ms"] for ms in divided["workers_ms"])
    alone = workers3.synthesize_many(TEXTS[:1], batch=1)[0].timings
    assert alone["workers_ms"][0] > 0 and alone["workers_ms"][1:] == [0, 0]


def test_fewer_sentences_than_workers_and_batches_of_one(workers3):
    alone = [workers3.synthesize(text=t, seed=1) for t in TEXTS[:2]]
    for batch in (1, 2):  # one a call (no division), two for three workers
        takes = workers3.synthesize_many(TEXTS[:2], batch=batch, seed=1)
        for a, b in zip(alone, takes, strict=True):
            np.testing.assert_array_equal(b.audio, a.audio)


def test_workers_argument(joe_path):
    assert (MAX_WORKERS, AUTO_WORKERS) == (_engine.MAX_WORKERS, _engine.AUTO_WORKERS)
    for bad in (0, -1, MAX_WORKERS + 1, 2.0, True):
        with pytest.raises(InvalidArgumentError, match="workers"):
            Engine.open("piper:joe", device="cpu", threads=1, workers=bad)
    with Engine.open("piper:joe", device="cpu", threads=1, workers=None) as e:
        assert e.workers == 1  # automatic: one on the CPU
    model = _engine.Model(str(joe_path), None)
    try:
        with pytest.raises(Exception, match="at most 16 workers"):
            _engine.Context(model, "cpu", 1, None, None, 0, MAX_WORKERS + 1)
    finally:
        model.close()


def test_a_job_estimates_the_time_it_still_needs_from_what_it_did():
    import time

    from app.jobs.workers import SynthesisJob

    job = SynthesisJob(None, [(0, "a" * 10), (1, "b" * 30), (2, "c" * 60)])
    assert job.remaining_s() is None  # nothing done yet
    job.started_at, job.done = time.monotonic() - 4.0, 1  # 10 characters in 4 s: 90 left
    assert 35.0 <= job.remaining_s() <= 37.0
    job.done = 3
    assert job.remaining_s() == 0.0
