"""The studio window, offscreen: jobs, views, takes, devices, export, projects, playback."""

import re

import numpy as np
import pyloudnorm
import pytest
import soundfile

pytest.importorskip("PySide6")

from PySide6.QtWidgets import QApplication  # noqa: E402

from app.audio.dsp import log_mel  # noqa: E402
from app.core.project import Project, timeline  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.engine.engine import STAGES_BY_FAMILY, Engine, devices  # noqa: E402
from app.ui.main import StudioWindow  # noqa: E402
from app.ui.panels import auto_threads  # noqa: E402
from app.ui.timeline import HOP, N_MELS  # noqa: E402

STAGES = STAGES_BY_FAMILY["piper"]  # the window's default voice is piper:joe

TEXT = "Hello from the studio. A second sentence follows.\n\nA new paragraph ends it."


@pytest.fixture
def window(qtbot, joe_path, tmp_path, monkeypatch):
    monkeypatch.setenv("VOICESTUDIO_CONFIG_DIR", str(tmp_path / "config"))
    settings = Settings()
    settings["device"] = "cpu"
    settings["threads"] = 2
    w = StudioWindow(settings, ask_recovery=False, persist=False)
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()


def run_job(qtbot, window, which="all", timeout=120_000):
    """Start a job and wait for it to end; returns (job, the signals it emitted in order)."""
    events = []

    def hook(job):
        s = job.signals
        s.started.connect(lambda *_: events.append("started"))
        s.sentence_started.connect(lambda _, i: events.append(f"sentence {i}"))
        s.stage.connect(lambda stage, *_: events.append(stage))
        s.chunk.connect(lambda i, _: events.append(f"chunk {i}"))
        s.sentence_done.connect(lambda i, _: events.append(f"done {i}"))
        s.finished.connect(lambda *_: events.append("finished"))
        s.cancelled.connect(lambda *_: events.append("cancelled"))
        hook.job = job

    window.job_added.connect(hook)
    with qtbot.waitSignal(window.job_ended, timeout=timeout) as ended:
        assert window.synthesize(which)
    window.job_added.disconnect(hook)
    # job_ended comes from the window's own slot for the job's last signal; this hook's slots
    # for the same signals are queued events of their own, which may still be pending.
    if ended.args[1] in ("done", "cancelled"):
        qtbot.waitUntil(lambda: events[-1] in ("finished", "cancelled"), timeout=5_000)
    return hook.job, events, ended.args


def set_script(window, text):
    window.editor.setPlainText(text)
    window.editor.flush()


def test_synthesize_all_signals_in_order_and_views_match_the_takes(qtbot, window):
    set_script(window, TEXT)
    job, events, (job_id, state) = run_job(qtbot, window)
    assert state == "done" and job_id == job.id
    assert events[0] == "started" and events[-1] == "finished"
    for i in range(3):
        first = events.index(f"sentence {i}")
        stages = [e for e in events[first : events.index(f"done {i}")] if e in STAGES]
        assert stages == list(STAGES)  # every stage, in pipeline order, before the take
        assert events.index(f"chunk {i}") < events.index(f"done {i}")
    assert events.index("done 0") < events.index("sentence 1") < events.index("done 1") < events.index("sentence 2")

    project = window.project
    assert project.stale() == []
    audio, rate, segments = timeline(project, gap_s=window.settings["gap_s"])
    shown = window.timeline.curve.yData
    assert np.array_equal(shown, audio)
    image = window.timeline.spectrogram()
    assert image.shape[0] == N_MELS
    for seg in segments:
        cols = log_mel(seg.take.audio, rate, n_mels=N_MELS, hop=HOP).T
        first = int(round(seg.start_s * rate / HOP))
        np.testing.assert_allclose(image[:, first : first + cols.shape[1]], cols, rtol=1e-5, atol=1e-5)
    text = window.timings.text()
    for stage in STAGES:
        assert window.timings.stage_ms[stage] > 0, stage
        assert stage in text
    assert "RTF" in text and "cpu" in text
    assert window.timings.history.rowCount() == 1
    assert window.jobs_panel.state(job.id) == "done"


def test_timings_of_a_job_divided_between_workers_count_its_wall_clock(qtbot):
    """With workers, stages run at once: the summary's total (and RTF) is the job's wall
    clock, and the summed stage times are named for what they are."""
    from app.ui.panels import TimingsPanel

    panel = TimingsPanel()
    qtbot.addWidget(panel)
    for workers, want_total in ((1, 1200), (4, None)):
        panel.reset(("encoder", "decoder"))
        panel.add_stage("encoder", 500.0)
        panel.add_stage("decoder", 700.0)
        panel.finish("cuda0", 16, 3, 2.0, workers)
        total = float(panel.summary.text().split("total ")[1].split(" ms")[0])
        if want_total is not None:
            assert total == want_total and "workers" not in panel.summary.text()
        else:
            assert total < 1200  # the few milliseconds since reset, not 500 + 700
            assert "4 workers (stages summed: 1200 ms)" in panel.summary.text()
    assert panel.history.rowCount() == 2


def test_on_a_gpu_sentences_go_in_batches_and_get_the_takes_they_get_alone(qtbot, window, monkeypatch):
    """A GPU engine takes a job's sentences GPU_BATCH at a time in one call; forced here on the CPU."""
    from app.jobs import workers

    monkeypatch.setattr(workers, "batch_size", lambda engine: 2)
    set_script(window, TEXT)
    job, events, (_, state) = run_job(qtbot, window)
    assert state == "done"
    # Sentences 0 and 1 together (both started, then their stages, then their takes), then 2 alone.
    assert events.index("sentence 1") < events.index("encoder") < events.index("done 0") < events.index("sentence 2")
    for i in range(3):
        assert events.index(f"chunk {i}") < events.index(f"done {i}")
    engine, settings = window.engine, window.project.settings
    for sentence in window.project.sentences:
        alone = engine.synthesize(text=sentence.text, seed=settings["seed"], length_scale=1.0 / settings["speed"])
        assert np.array_equal(sentence.take.audio, alone.audio)
    assert window.timings.stage_ms["decoder"] > 0


def test_a_batched_job_divided_between_the_engines_workers(qtbot, window, monkeypatch):
    """The studio's GPU path with an engine of two workers (forced here on the CPU): their
    stages arrive from the workers' threads, every sentence gets the take it gets alone, and
    the summary counts the job's wall clock."""
    from app.engine.engine import Engine
    from app.jobs import workers

    real_open = Engine.open.__func__
    monkeypatch.setattr(Engine, "open", classmethod(lambda cls, *a, **k: real_open(cls, *a, **{**k, "workers": 2})))
    monkeypatch.setattr(workers, "batch_size", lambda engine: 3)
    set_script(window, TEXT)
    job, events, (_, state) = run_job(qtbot, window)
    assert state == "done" and window.engine.workers == 2
    assert [e for e in events if e.startswith("done")] == ["done 0", "done 1", "done 2"]
    engine, settings = window.engine, window.project.settings
    for sentence in window.project.sentences:
        alone = engine.synthesize(text=sentence.text, seed=settings["seed"], length_scale=1.0 / settings["speed"])
        assert np.array_equal(sentence.take.audio, alone.audio)
    assert "2 workers (stages summed:" in window.timings.summary.text()


def test_edits_make_sentences_stale_and_only_those_are_redone(qtbot, window):
    set_script(window, TEXT)
    run_job(qtbot, window)
    takes_before = [s.take for s in window.project.sentences]
    set_script(window, TEXT.replace("A second sentence follows.", "A changed sentence follows."))
    assert window.project.stale() == [1]
    job, _, (_, state) = run_job(qtbot, window, "stale")
    assert state == "done" and [i for i, _ in job.items] == [1]
    sentences = window.project.sentences
    assert sentences[0].take is takes_before[0] and sentences[2].take is takes_before[2]
    assert window.project.stale() == []


def test_regenerate_adds_a_take_and_takes_can_be_switched(qtbot, window):
    set_script(window, "Only one sentence here.")
    run_job(qtbot, window, "current")
    run_job(qtbot, window, "regenerate")
    sentence = window.project.sentences[0]
    assert len(sentence.takes) == 2 and sentence.active == 1
    assert sentence.takes[0].settings["seed"] == sentence.takes[1].settings["seed"]
    assert not np.array_equal(sentence.takes[0].audio, sentence.takes[1].audio)  # another seed
    assert window.inspector.takes.count() == 2
    window._take_activated(0)
    assert sentence.active == 0
    shown = window.timeline.curve.yData
    assert np.array_equal(shown, sentence.takes[0].audio)


def test_locked_sentences_are_skipped(qtbot, window):
    set_script(window, TEXT)
    window.project.sentences[1].locked = True
    job, _, _ = run_job(qtbot, window)
    assert [i for i, _ in job.items] == [0, 2]
    assert window.project.sentences[1].take is None


def test_cancel_mid_job_leaves_no_worker_and_no_partial_take(qtbot, window):
    set_script(window, " ".join(f"Sentence number {n} of a long script to cancel." for n in range(30)))

    def hook(job):
        job.signals.sentence_done.connect(lambda *_: window.cancel(job.id))

    window.job_added.connect(hook)
    with qtbot.waitSignal(window.job_ended, timeout=120_000) as ended:
        window.synthesize("all")
    assert ended.args[1] == "cancelled"
    assert window.synth_pool.waitForDone(10_000) and window.synth_pool.activeThreadCount() == 0
    with_take = [i for i, s in enumerate(window.project.sentences) if s.take is not None]
    assert with_take and with_take == list(range(len(with_take)))  # whole takes, in order, then nothing
    assert len(with_take) < 30
    for i in with_take:
        assert len(window.project.sentences[i].take.audio) > 0.5 * 22050


def test_device_picker_lists_the_engine_devices(window):
    ids = [window.inspector.device.itemData(i) for i in range(window.inspector.device.count())]
    assert ids == ["auto"] + [d["id"] for d in devices()]


def test_auto_threads_leave_a_core_to_the_desktop_on_four_or_more(window):
    assert [auto_threads(n) for n in (1, 2, 3, 4, 8, 16)] == [1, 2, 3, 3, 7, 15]
    threads = window.inspector.threads
    cores = threads.maximum()
    assert window.inspector.engine_threads() == 2  # the fixture's choice is kept
    threads.setValue(0)
    assert window.inspector.engine_threads() == auto_threads(cores)
    assert threads.specialValueText() == f"auto ({auto_threads(cores)} of {cores} cores)"


def test_unknown_device_falls_back_to_cpu_with_the_reason(qtbot, window):
    window.inspector.device.addItem("a device that is gone", "no-such-device")
    window.inspector.device.setCurrentIndex(window.inspector.device.count() - 1)
    set_script(window, "Hello.")
    run_job(qtbot, window, "current")
    status = window.inspector.engine_status.text()
    assert window.engine.device == "cpu" and "fell back to the CPU" in status and "no-such-device" in status


def test_export_hits_the_podcast_loudness(qtbot, window, tmp_path):
    set_script(window, TEXT)
    run_job(qtbot, window)
    report = window.export(tmp_path / "script.wav", loudness="podcast", subtype="pcm24")
    audio, rate = soundfile.read(str(report.path), dtype="float64")
    assert abs(pyloudnorm.Meter(rate).integrated_loudness(audio) - -16.0) <= 0.5
    window.editor.select_sentence(2)
    one = window.export(tmp_path / "one.wav", scope="sentences")
    assert abs(one.duration_s - window.project.sentences[2].take.duration_s) < 1e-3
    cursor = window.editor.textCursor()  # select from inside sentence 1 to inside sentence 2
    cursor.setPosition(window.project.sentences[1].start + 3)
    cursor.setPosition(window.project.sentences[2].start + 3, cursor.MoveMode.KeepAnchor)
    window.editor.setTextCursor(cursor)
    assert window.selected_sentences() == [1, 2]
    two = window.export(tmp_path / "two.wav", scope="sentences", gap_s=0.5)
    takes = [window.project.sentences[i].take for i in (1, 2)]
    assert abs(two.duration_s - (sum(t.duration_s for t in takes) + 0.5)) < 1e-3


def test_nothing_to_export_is_an_error_not_a_crash(window, tmp_path):
    set_script(window, "Nothing synthesized yet.")
    assert window.export(tmp_path / "x.wav") is None
    assert "nothing to export" in window.last_error
    assert not (tmp_path / "x.wav").exists()


def test_project_save_and_open_round_trip(qtbot, window, tmp_path):
    set_script(window, TEXT)
    run_job(qtbot, window)
    path = tmp_path / "story.vsproj"
    assert window._save_to(path)
    original = [s.take.audio.copy() for s in window.project.sentences]
    window.new_project()
    assert window.project.sentences == []
    assert window.open_project(path)
    assert window.editor.toPlainText() == TEXT
    for before, s in zip(original, window.project.sentences, strict=True):
        assert before.tobytes() == s.take.audio.tobytes()
    assert str(path.resolve()) in window.settings["recent_projects"]


def test_bad_project_file_shows_an_error(window, tmp_path):
    bad = tmp_path / "bad.vsproj"
    bad.write_bytes(b"garbage")
    assert not window.open_project(bad)
    assert "bad.vsproj" in window.last_error


def test_playback_reaches_the_sink(qtbot, window, null_sink):
    set_script(window, "Play this sentence out loud.")
    run_job(qtbot, window, "current")
    take = window.project.sentences[0].take
    recorded = null_sink(take.duration_s + 0.3, lambda: window.play_from(0.0))
    qtbot.waitUntil(lambda: window.player.state == "stopped", timeout=10_000)
    assert window.player.frames_written == len(take.audio)
    assert np.sqrt(np.mean(recorded**2)) > 0.25 * np.sqrt(np.mean(take.audio**2))


def test_closing_leaves_no_top_level_widgets(qtbot, joe_path, tmp_path, monkeypatch):
    monkeypatch.setenv("VOICESTUDIO_CONFIG_DIR", str(tmp_path))
    before = {id(w) for w in QApplication.topLevelWidgets() if w.isVisible()}
    w = StudioWindow(Settings(), ask_recovery=False, persist=False)
    qtbot.addWidget(w)
    w.show()
    bad = tmp_path / "bad.vsproj"
    bad.write_bytes(b"garbage")
    w.open_project(bad)  # leaves an error box open
    assert any(x.isVisible() and id(x) not in before for x in QApplication.topLevelWidgets() if x is not w)
    w.close()
    leaked = [x for x in QApplication.topLevelWidgets() if x.isVisible() and id(x) not in before]
    assert leaked == []


def test_project_is_qt_free():
    import subprocess
    import sys

    code = "import app.core.project, app.core.export, app.core.settings, sys; print('PySide6' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert Project("x").sentences


def test_signal_emission_keeps_reference_counts(qtbot):
    # PySide6 6.12.0 drops a reference to True on every emit(); on Python builds where
    # True is not immortal a long session then crashes. The pinned PySide6 must not.
    import sys

    from PySide6.QtCore import QObject, Signal

    class Emitter(QObject):
        ping = Signal()

    emitter = Emitter()
    before = sys.getrefcount(True)
    for _ in range(1000):
        emitter.ping.emit()
    assert abs(sys.getrefcount(True) - before) < 10


def test_voice_preview_plays(qtbot, window, null_sink):
    def preview():
        window.preview_voice("piper:joe")
        # the preview is synthesized in a worker; its take arrives through the event loop
        qtbot.waitUntil(lambda: window.player.frames_written > 22050, timeout=30_000)

    dirty, voice = window.project.dirty, window.project.voice
    recorded = null_sink(0.5, preview)
    assert np.abs(recorded).max() > 0.05
    assert (window.project.dirty, window.project.voice) == (dirty, voice)  # a preview changes nothing


def test_import_script_from_a_text_file(window, tmp_path):
    path = tmp_path / "chapter.md"
    path.write_text("# Chapter one\n\nIt begins here. Then it goes on.\n", encoding="utf-8")
    window.import_script(path)
    assert [s.text for s in window.project.sentences] == ["Chapter one", "It begins here.", "Then it goes on."]
    bad = tmp_path / "binary.txt"
    bad.write_bytes(b"\xff\xfe\x00bad")
    window.import_script(bad)
    assert "UTF-8" in window.last_error


def test_playback_started_during_a_job_plays_every_sentence(qtbot, window, null_sink):
    set_script(window, "One short sentence. Then a second. And a third one. The fourth ends it.")
    started = []

    def hook(job):
        def first_done(*_):
            if not started:
                started.append(True)
                window.play_from(0.0)  # only the first sentence exists yet

        job.signals.sentence_done.connect(first_done)

    window.job_added.connect(hook)
    with qtbot.waitSignal(window.job_ended, timeout=120_000):
        window.synthesize("all")
    qtbot.waitUntil(lambda: window.player.state == "stopped", timeout=60_000)
    audio, _, segments = timeline(window.project, gap_s=window.settings["gap_s"])
    assert len(segments) == 4
    assert window.player.frames_written == len(audio)  # later sentences were appended as they came


def test_a_kokoro_voice_synthesizes_with_its_own_stages(qtbot, window):
    window.voices.voice_chosen.emit("kokoro:jm_kumo")
    assert window.inspector.voice.currentText() == "kokoro:jm_kumo"
    set_script(window, "Kokoro speaks in the studio.")
    job, events, (_, state) = run_job(qtbot, window)
    assert state == "done"
    kokoro = STAGES_BY_FAMILY["kokoro"]
    first = events.index("sentence 0")
    assert [e for e in events[first : events.index("done 0")] if e in kokoro] == list(kokoro)
    assert window.timings.stages == kokoro and all(window.timings.stage_ms[s] > 0 for s in kokoro[1:])
    take = window.project.sentences[0].take
    assert take.sample_rate == 24000 and take.voice == "kokoro:jm_kumo"


def test_an_uncaught_exception_is_logged_and_shown_naming_the_log(window):
    import sys

    from app.ui.main import excepthook_for

    try:
        raise ValueError("nobody caught this")
    except ValueError:
        excepthook_for(window)(*sys.exc_info())
    assert window.last_error == "nobody caught this"
    assert str(window.log_path) in window._error_box.informativeText()
    logged = window.log_path.read_text(encoding="utf-8")
    assert "uncaught ValueError" in logged and "Traceback" in logged and "nobody caught this" in logged


def test_a_chatterbox_voice_turns_off_the_controls_it_has_none_of(window):
    inspector = window.inspector
    inspector.speed.setValue(1.3)
    inspector.noise_w.setValue(0.5)
    inspector.voice.setCurrentText("chatterbox-turbo:default")
    assert not inspector.speed.isEnabled() and not inspector.noise_w.isEnabled()
    assert inspector.noise_scale.isEnabled()  # its vocoder's noise
    settings = inspector.settings()
    assert settings["speed"] == 1.0 and settings["noise_w"] is None
    inspector.voice.setCurrentText("piper:joe")
    assert inspector.speed.isEnabled() and inspector.settings()["speed"] == 1.3


def test_chatterbox_multilingual_has_a_language_guidance_and_exaggeration(window):
    inspector = window.inspector
    inspector.voice.setCurrentText("chatterbox-turbo:default")
    assert not inspector.language.isEnabled() and "language" not in inspector.settings()
    inspector.voice.setCurrentText("chatterbox:default")
    assert inspector.language.isEnabled() and inspector.cfg_weight.isEnabled() and inspector.exaggeration.isEnabled()
    assert inspector.settings()["language"] is None  # no tag, as the reference takes no language
    inspector.language.setCurrentIndex(inspector.language.findData("de"))
    inspector.cfg_weight.setValue(0.3)
    settings = inspector.settings()
    assert (settings["language"], settings["cfg_weight"], settings["exaggeration"]) == ("de", 0.3, None)
    inspector.voice.setCurrentText("piper:joe")
    assert "language" not in inspector.settings()  # a Piper take's settings stay as they were
    inspector.set_settings("chatterbox:default", settings)
    assert inspector.settings() == settings and inspector.language.currentText() == "German (de)"


def test_a_recording_is_re_voiced_into_the_current_sentence(window, monkeypatch, tmp_path):
    """Synthesize › Re-voice a recording: the file's audio (any rate, any channels) is the
    source of a re-voicing job for the current sentence, in the project's Chatterbox voice."""
    import soundfile as sf

    queued = []
    monkeypatch.setattr(window, "with_engine", lambda then, voice=None: queued.append(then))
    monkeypatch.setattr(window, "_start_job", lambda engine, items, kind, settings, params: queued.append(
        (items, kind, params)))  # fmt: skip
    set_script(window, TEXT)
    window.editor.setTextCursor(window.editor.cursorForPosition(window.editor.rect().topLeft()))
    stereo = np.stack([np.linspace(-0.5, 0.5, 16000), np.zeros(16000)], axis=1).astype(np.float32)
    sf.write(str(tmp_path / "me.flac"), stereo, 16000)
    errors = []
    monkeypatch.setattr(window, "show_error", errors.append)
    assert not window.revoice_current(tmp_path / "me.flac") and "Chatterbox voice" in str(errors[-1])
    window.inspector.voice.setCurrentText("chatterbox-turbo:default")
    window.editor.flush()
    assert window.project.voice == "chatterbox-turbo:default"
    assert not window.revoice_current(tmp_path / "missing.wav") and "not an audio file" in str(errors[-1])
    assert window.revoice_current(tmp_path / "me.flac")
    queued.pop(0)(None)  # the engine opened: the job starts
    items, kind, params = queued[0]
    assert kind == "revoice" and items == [(0, window.project.sentences[0].text)]
    audio, rate = params["source"]
    assert rate == 16000 and audio.shape == (16000,)
    np.testing.assert_allclose(audio, stereo.mean(axis=1), atol=1e-4)  # FLAC's 16 bits, mixed to mono
    # Without a file, the current sentence's own take is the source; it has none yet.
    assert not window.revoice_current() and len(queued) == 1


def test_pause_tags_are_shown_and_a_malformed_one_is_named(window):
    set_script(window, "One. [pause 1.5s] Two.\nThree [pause] four.")
    assert [s.text for s in window.project.sentences] == ["One.", "Two.", "Three", "four."]
    tagged = [
        sel.cursor.selectedText()
        for sel in window.editor.extraSelections()
        if sel.format.foreground().color().name() == "#6d28d9"
    ]
    assert tagged == ["[pause 1.5s]", "[pause]"]
    assert window.editor.problems() == ["line 2: '[pause]': a pause is written [pause 1.5s] or with ms"]
    assert "malformed pause tag" in window.statusBar().currentMessage()
    assert "line 2" in window.statusBar().currentMessage()


def test_subtitles_time_each_sentence_as_the_exported_audio_places_it(qtbot, window, tmp_path):
    set_script(window, "The first sentence. [pause 1.25s] The second --> one.\n\nA third.")
    run_job(qtbot, window)
    audio = window.export(tmp_path / "x.wav", subtype="float", gap_s=float(window.settings["gap_s"]))
    written, rate = soundfile.read(str(audio.path), dtype="float32")
    srt = window.export_subtitles(tmp_path / "x.srt").read_text(encoding="utf-8")
    vtt = window.export_subtitles(tmp_path / "x.vtt").read_text(encoding="utf-8")
    times = re.findall(r"(\d\d):(\d\d):(\d\d),(\d\d\d) --> (\d\d):(\d\d):(\d\d),(\d\d\d)", srt)
    assert vtt.startswith("WEBVTT\n\n") and vtt.count(" --> ") == 3
    assert "The second → one." in re.sub(r"<[^>]+>", "", vtt)  # without the words' timestamps
    assert "2\n" in srt and "The second --> one." in srt and "A third." in srt
    sentences = window.project.sentences
    at = 0
    gaps = [1.25, float(window.settings["gap_s"])]
    for k, t in enumerate(times):
        start = int(t[0]) * 3600 + int(t[1]) * 60 + int(t[2]) + int(t[3]) / 1000
        end = int(t[4]) * 3600 + int(t[5]) * 60 + int(t[6]) + int(t[7]) / 1000
        take = sentences[k].take
        assert abs(start - at / rate) <= 0.0005 and abs(end - (at + len(take.audio)) / rate) <= 0.0005
        assert np.array_equal(written[at : at + len(take.audio)], take.audio)  # where the audio is
        at += len(take.audio) + (round(gaps[k] * rate) if k < 2 else 0)
    assert at == len(written)


def test_symbols_left_out_of_a_take_are_named_and_marked(qtbot, window):
    set_script(window, "A star ★ and a tick ✓. Plain words.")
    run_job(qtbot, window)
    first, second = window.project.sentences
    assert first.take.timings["unspoken"] == ["★", "✓"] and second.take.timings["unspoken"] == []
    assert "not read aloud: sentence 1: ★ ✓" in window.statusBar().currentMessage()
    underlines = {
        sel.cursor.selectedText(): sel.format.underlineColor().name() for sel in window.editor.extraSelections()
    }
    assert underlines[first.text] == "#dc2626" and underlines[second.text] != "#dc2626"
    window.editor.select_sentence(0)
    labels = [window.inspector.takes.item(i).text() for i in range(window.inspector.takes.count())]
    assert labels and labels[-1].endswith("not read aloud: ★ ✓")


def test_pronunciations_are_read_saved_and_make_their_sentences_stale(qtbot, window, tmp_path, monkeypatch):
    from app.core import lexicon
    from app.ui.lexicon_dialog import LexiconDialog

    set_script(window, "Mister Nguyen is here. Nobody else.")
    window.set_lexicons({"nguyen": "/ɡˈɑːbəlɡʊk/"}, {"else": "ɛlss"})
    assert lexicon.read(tmp_path / "config" / "lexicon.txt") == {"else": "ɛlss"}  # the user's, kept
    run_job(qtbot, window)
    first, second = window.project.sentences
    assert first.take.settings["lexicon"] == {"nguyen": "/ɡˈɑːbəlɡʊk/"}
    assert second.take.settings["lexicon"] == {"else": "ɛlss"}
    with Engine.open("piper:joe", device="cpu", threads=2) as e:  # what the studio read: the entry's phonemes
        want = e.synthesize(phonemes="mˈɪstɚ ɡˈɑːbəlɡʊk ɪz hˈɪɹ.", seed=window.project.settings["seed"]).audio
    assert np.array_equal(first.take.audio, want)
    window.set_lexicons({"nguyen": "/nwˈɪn/"}, {"else": "ɛlss"})
    assert window.project.stale() == [0] and window.project.dirty
    # The dialog keeps what was typed when an entry is malformed, and says why.
    warnings = []
    monkeypatch.setattr("app.ui.lexicon_dialog.QMessageBox.warning", lambda *a: warnings.append(a[2]))
    dialog = LexiconDialog(window, window.project.lexicon, window.user_lexicon, window.preview_pronunciation)
    dialog.project.add("two words", "x")
    dialog.accept()
    assert dialog.result() == 0 and "one word" in warnings[0] and dialog.project.table.rowCount() == 2
    dialog.project.table.selectRow(1)
    dialog.project.remove()
    assert dialog.project.entries() == {"nguyen": "/nwˈɪn/"}
    # Preview says the selected entry in the project's voice and keeps no take.
    dialog.project.table.selectRow(0)
    played = []
    monkeypatch.setattr(window, "_play_clip", lambda audio, rate: played.append(len(audio)))
    dialog.project._preview(window.preview_pronunciation)
    qtbot.waitUntil(lambda: bool(played), timeout=60_000)
    assert played[0] > 0 and [len(s.takes) for s in window.project.sentences] == [1, 1]


def test_a_script_with_headings_becomes_an_audiobook_with_its_chapters(qtbot, window, tmp_path):
    import mutagen.mp4

    set_script(window, "# Part One\nThe first sentence. The second.\n\n# Part Two\nThe last one.")
    assert [window.chapters.item(i).text() for i in range(window.chapters.count())] == [
        "○ Part One — 0/3",
        "○ Part Two — 0/2",
    ]
    with qtbot.waitSignal(window.job_ended, timeout=120_000):
        window.chapters.synthesize_chapter.emit(2)  # the chapter's context menu: that chapter alone
    assert [s.take is not None for s in window.project.sentences] == [False, False, False, True, True]
    qtbot.waitUntil(lambda: window.chapters.item(1).text() == "✓ Part Two — 2/2")
    assert window.chapters.item(0).text() == "○ Part One — 0/3"
    run_job(qtbot, window, "stale")
    assert [len(s.takes) for s in window.project.sentences] == [1, 1, 1, 1, 1]
    assert window.chapters.item(0).text() == "✓ Part One — 3/3"
    window.chapters.itemClicked.emit(window.chapters.item(1))
    assert window.editor.current_sentence() == 3
    cover = tmp_path / "cover.png"
    cover.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    book = {"title": "The Book", "author": "Someone", "cover": str(cover)}
    report = window.export(tmp_path / "book.m4b", gap_s=0.3, book=book)
    tags = mutagen.mp4.MP4(str(report.path))
    segments = window.timeline.segments
    assert [(c.title, round(c.start, 2)) for c in tags.chapters] == [
        ("Part One", 0.0),
        ("Part Two", round(segments[3].start_s, 2)),
    ]
    assert tags.tags["©nam"] == ["The Book"] and tags.tags["©ART"] == ["Someone"] and tags.tags["covr"]


def test_a_file_per_chapter(qtbot, window, tmp_path):
    set_script(window, "An opening line.\n# One: the start\nFirst. Second.\n# Two?\nLast.")
    run_job(qtbot, window)
    reports = window.export(tmp_path / "book.flac", scope="chapters", gap_s=0.25)
    names = [r.path.name for r in reports]
    assert names == ["book 00 Beginning.flac", "book 01 One the start.flac", "book 02 Two.flac"]
    takes = [s.take for s in window.project.sentences]
    for report, (a, b) in zip(reports, [(0, 1), (1, 4), (4, 6)], strict=True):
        want = sum(len(t.audio) for t in takes[a:b]) + round(0.25 * takes[0].sample_rate) * (b - a - 1)
        assert soundfile.info(str(report.path)).frames == want


def test_word_timings_follow_the_engines_durations(qtbot, window, tmp_path):
    """Each take records where its words are (from the durations of the call that made it): the
    WebVTT cues mark every word after the first within one frame of them, and while the timeline
    plays the editor marks the word being said."""
    from app.core.words import phoneme_word_frames

    set_script(window, "It was 1990, a cold day. Kind of the best.")
    run_job(qtbot, window)
    first, second = window.project.sentences
    assert second.take.timings.get("words") is None  # "of the": the front end joins them, so no timings
    timed = first.take.timings["words"]
    assert [first.text[a:b] for a, b, _, _ in timed] == ["It", "was", "1990", "a", "cold", "day"]
    with Engine.open("piper:joe", device="cpu", threads=2) as e:
        ipa = e.phonemize(first.text)[0]
        e.synthesize(phonemes=ipa, seed=window.project.settings["seed"])
        frames = phoneme_word_frames(ipa, e.output("durations"), "piper")
    frame_s = 256 / 22050
    # "1990" is two phoneme words: "nineteen ninety".
    starts = [f[0] * frame_s for f in frames[:2]] + [frames[2][0] * frame_s] + [f[0] * frame_s for f in frames[4:]]
    assert all(abs(w[2] - want) <= frame_s for w, want in zip(timed, starts, strict=True))
    vtt = window.export_subtitles(tmp_path / "x.vtt").read_text(encoding="utf-8")
    stamps = [int(m[0]) * 60 + float(m[1]) for m in re.findall(r"<00:(\d\d):(\d\d\.\d\d\d)>", vtt)]
    seg = window.timeline.segments[0]
    assert len(stamps) == 5 and all(
        abs(s - (seg.start_s + want)) <= 0.001 for s, want in zip(stamps, starts[1:], strict=True)
    )
    a, b, start, end = timed[4]  # "cold", while the timeline plays it
    assert window.word_playing(seg.start_s + (start + end) / 2) == (first.start + a, first.start + b)
    window.editor.highlight(window.word_playing(seg.start_s + (start + end) / 2))
    marked = [
        sel.cursor.selectedText()
        for sel in window.editor.extraSelections()
        if sel.format.background().color().name() == "#fde68a"
    ]
    assert marked == ["cold"]


def test_sentences_synthesized_together_get_the_word_timings_they_get_alone(qtbot, window, monkeypatch):
    monkeypatch.setattr("app.jobs.workers.batch_size", lambda engine: 16)  # a GPU's batches, on the CPU
    set_script(window, "It was 1990, a cold day. The wind blew hard all night.")
    run_job(qtbot, window)
    together = [s.take.timings["words"] for s in window.project.sentences]
    monkeypatch.setattr("app.jobs.workers.batch_size", lambda engine: 1)
    run_job(qtbot, window)
    assert together == [s.take.timings["words"] for s in window.project.sentences]
    assert [len(w) for w in together] == [6, 6]


def test_a_dialogue_reads_each_sentence_in_its_tags_voice_and_speed(qtbot, window):
    set_script(
        window, "The narrator speaks. [voice kokoro:jf_alpha] Hello there. [speed 2] Quickly. [voice default] Back."
    )
    done = []
    window.job_ended.connect(lambda job_id, state: done.append(state))
    assert window.synthesize("all")
    qtbot.waitUntil(lambda: len(done) == 4, timeout=180_000)  # a job per voice and speed
    assert done == ["done"] * 4
    takes = [s.take for s in window.project.sentences]
    assert [t.voice for t in takes] == ["piper:joe", "kokoro:jf_alpha", "kokoro:jf_alpha", "piper:joe"]
    assert [t.sample_rate for t in takes] == [22050, 24000, 24000, 22050]
    assert [t.settings["speed"] for t in takes] == [1.0, 1.0, 2.0, 2.0]
    assert window.project.stale() == []
    window.editor.select_sentence(1)
    assert window.inspector.sentence_label.text().endswith("read by kokoro:jf_alpha")
    audio, rate, segments = timeline(window.project)
    assert rate == 22050 and len(segments) == 4  # the Kokoro takes resampled onto the timeline


def test_say_as_tags_are_read_as_they_say_and_shown_as_their_word(qtbot, window, tmp_path):
    set_script(window, "Ask [spell NASA] now. Meet [say Nguyen as /ɡˈɑːbəlɡʊk/] here.")
    run_job(qtbot, window)
    first, second = window.project.sentences
    seed = window.project.settings["seed"]
    with Engine.open("piper:joe", device="cpu", threads=2) as e:
        assert np.array_equal(first.take.audio, e.synthesize(text="Ask N A S A now.", seed=seed).audio)
        ipa = f"mˈiːt ɡˈɑːbəlɡʊk {e.phonemize('here.')[0]}"
        assert np.array_equal(second.take.audio, e.synthesize(phonemes=ipa, seed=seed).audio)
    srt = window.export_subtitles(tmp_path / "x.srt").read_text(encoding="utf-8")
    assert "Ask NASA now." in srt and "Meet Nguyen here." in srt
    set_script(window, "A [say broken] tag.")
    assert window.editor.problems() == ["line 1: '[say broken]': a say tag is written [say GIF as jif] or "
                                        "[say Nguyen as /ŋwˈɪn/]"]  # fmt: skip


def test_how_a_sentence_is_read_shows_before_synthesis(qtbot, window):
    set_script(window, "It costs $5 on 3/4/2025. Call [spell UN] at [say noon as /nˈuːn/].")
    window.editor.select_sentence(0)
    window.inspector.show_reading.click()
    qtbot.waitUntil(lambda: window.inspector.reading.text() not in ("", "…"), timeout=60_000)
    # What the front end says, surprises included: "$5" as "dollar five", the date as slashes.
    assert "dˈɑːlɚ fˈaɪv" in window.inspector.reading.text() and "slˈæʃ" in window.inspector.reading.text()
    window.editor.select_sentence(1)
    window.inspector.show_reading.click()
    qtbot.waitUntil(lambda: window.inspector.reading.text() not in ("", "…"), timeout=60_000)
    reading = window.inspector.reading.text()
    assert "jˈuː ˈɛn æt nˈuːn" in reading and all(not s.takes for s in window.project.sentences)


def test_ipa_is_checked_against_the_voices_phonemes_as_it_is_typed(window):
    from app.ui.lexicon_dialog import LexiconDialog

    dialog = LexiconDialog(window, {"nguyen": "/ŋwˈɪn/"}, {}, window.preview_pronunciation, voice="piper:joe")
    cell = dialog.project.table.item(0, 1)
    assert cell.toolTip() == ""  # every symbol is one of joe's phonemes
    dialog.project.add("tomato", "/tə☃mˈɑːtoʊ☂/")
    bad = dialog.project.table.item(1, 1)
    assert bad.toolTip() == "not among piper:joe's phonemes: ☃ ☂" and bad.background().color().name() == "#fee2e2"
    bad.setText("/təmˈɑːtoʊ/")  # fixed as it is typed
    assert bad.toolTip() == ""
    dialog.project.add("gif", "jif")  # a respelling is text: not checked
    assert dialog.project.table.item(2, 1).toolTip() == ""


def test_help_about_shows_the_version_and_where_a_users_files_stay(window):
    from app import __version__
    from app.core import paths

    menus = [a.text() for a in window.menuBar().actions()]
    assert menus[-1] == "&Help"
    text = window.about_text()
    assert f"Voice Studio {__version__}" in text and str(paths.data_dir()) in text
