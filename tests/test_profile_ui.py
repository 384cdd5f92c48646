"""Recording through real PortAudio, and the new-profile dialog from reference to saved voice."""

import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")

from app.audio.playback import Player  # noqa: E402
from app.audio.recording import Recorder  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.models import manager as models  # noqa: E402
from app.profiles import store as profiles  # noqa: E402
from app.ui.main import StudioWindow  # noqa: E402

CLIP = Path(__file__).parent / "data" / "speaker" / "piper_joe.flac"


@pytest.fixture
def store(tmp_path, monkeypatch):
    models_dir = models.paths.models_dir()
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VOICESTUDIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setattr(models.paths, "models_dir", lambda: models_dir)
    return tmp_path


@pytest.fixture
def window(qtbot, store, joe_path):
    settings = Settings()
    settings["device"] = "cpu"
    settings["threads"] = 2
    w = StudioWindow(settings, ask_recovery=False, persist=False)
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()


def test_recorder_hears_what_plays(null_sink):
    # The null sink's monitor is the PulseAudio server's only source: the recorder's default input.
    rate = 22050
    t = np.arange(int(1.5 * rate)) / rate
    tone = (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    rec, player = Recorder(), Player()
    rec.start()
    player.load(tone, rate)
    player.play()
    time.sleep(1.8)
    rec.stop()
    player.stop()
    audio = rec.audio()
    assert rec.seconds >= 1.2 and len(audio) == round(rec.seconds * rec.sample_rate)
    loud = audio[np.abs(audio) > 0.05]
    assert len(loud) > 0.5 * rec.sample_rate, "the tone did not reach the input"
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    peak_hz = np.argmax(spectrum) * rec.sample_rate / len(audio)
    assert abs(peak_hz - 440.0) < 5.0
    assert -20.0 < rec.peak_db < 0.0 and rec.clipped == 0


def test_new_profile_dialog_from_import_to_voice(qtbot, window):
    dialog = window.new_profile_dialog()
    dialog.evaluate = False
    dialog.import_file(CLIP)
    items = [dialog.checks.topLevelItem(i) for i in range(dialog.checks.topLevelItemCount())]
    statuses = {item.text(1): item.text(0) for item in items}
    assert statuses["duration"] == "warn"  # 4 s: usable, shorter than recommended
    assert "fail" not in statuses.values()
    assert dialog.name.text() == "piper_joe" and dialog.create_button.isEnabled()
    dialog.name.setText("Joe test")
    dialog.kind.setCurrentIndex(dialog.kind.findData("kokoro"))
    assert dialog.seconds.isEnabled() and not dialog.plot.isHidden()
    dialog.seconds.setValue(5)
    assert dialog.job is None  # nothing runs before Create
    dialog.create()
    assert not dialog.create_button.isEnabled() and dialog.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: dialog.draft is not None, timeout=180_000)
    assert dialog.draft.search["evaluations"] >= len(dialog.points) >= 5
    chosen = dialog.draft.scores["search"]["similarity"]
    assert any(y == pytest.approx(chosen) for _, y in dialog.points)  # the winner is a plotted candidate
    assert max(dialog.best_line.getData()[1]) >= chosen - 1e-9
    assert dialog.preview_button.isEnabled() and dialog.save_button.isEnabled()
    with qtbot.waitSignal(dialog.saved) as saved:
        dialog.save()
    assert saved.args == ["profile:Joe test"]
    assert "profile:Joe test" in window.voices.voices()
    assert window.inspector.voice.findText("profile:Joe test") >= 0
    profile = profiles.load("Joe test")
    assert profile.meta["checks"] and profile.meta["search"]["evaluations"] >= len(dialog.points)
    dialog.reject()


def test_dialog_refuses_a_silent_reference_and_says_why(qtbot, window):
    dialog = window.new_profile_dialog()
    dialog.set_reference(np.zeros(48000 * 5, dtype=np.float32), 48000, {"recorded": True})
    failed = [dialog.checks.topLevelItem(i) for i in range(dialog.checks.topLevelItemCount())]
    assert any(item.text(0) == "fail" for item in failed)
    dialog.name.setText("silence")
    assert not dialog.create_button.isEnabled()
    assert "cannot make a profile" in dialog.status.text()
    dialog.reject()


def test_cancel_keeps_the_best_so_far(qtbot, window):
    dialog = window.new_profile_dialog()
    dialog.evaluate = False
    dialog.import_file(CLIP)
    dialog.kind.setCurrentIndex(dialog.kind.findData("kokoro"))
    dialog.seconds.setValue(600)
    dialog.create()
    qtbot.waitUntil(lambda: len(dialog.points) >= 2, timeout=120_000)
    dialog.cancel_search()
    qtbot.waitUntil(lambda: dialog.job is None, timeout=60_000)
    assert dialog.draft is not None and dialog.draft.search["cancelled"]
    assert dialog.save_button.isEnabled()
    dialog.reject()


def test_without_chatterbox_the_dialog_offers_the_style_search_and_says_what_to_install(qtbot, window, monkeypatch):
    monkeypatch.setattr(models, "chatterbox_installed", lambda model="chatterbox-turbo": False)
    dialog = window.new_profile_dialog()
    kinds = {dialog.kind.itemData(i): dialog.kind.model().item(i) for i in range(dialog.kind.count())}
    assert list(kinds) == ["chatterbox-turbo", "chatterbox", "kokoro"]
    assert dialog.kind.currentData() == "kokoro"
    for model in ("chatterbox-turbo", "chatterbox"):
        assert not kinds[model].isEnabled()
        assert f"models install {model} --from" in kinds[model].toolTip()
    dialog.reject()


def test_with_chatterbox_installed_the_dialog_clones_by_default(qtbot, window, monkeypatch):
    monkeypatch.setattr(models, "chatterbox_installed", lambda model="chatterbox-turbo": model == "chatterbox")
    dialog = window.new_profile_dialog()
    assert dialog.kind.currentData() == "chatterbox"
    dialog.import_file(CLIP)
    assert not dialog.seconds.isEnabled() and dialog.plot.isHidden()  # a clone searches nothing
    dialog.reject()


def test_a_clone_takes_several_recordings_a_style_search_one(qtbot, window, monkeypatch):
    monkeypatch.setattr(models, "chatterbox_installed", lambda model="chatterbox-turbo": model == "chatterbox-turbo")
    dialog = window.new_profile_dialog()
    assert not dialog.keep_button.isEnabled()  # nothing to keep yet
    dialog.import_file(CLIP)
    assert dialog.keep_button.isEnabled() and dialog.create_button.isEnabled()
    dialog.keep_take()
    assert dialog.kept_label.text() == "1 take(s) kept" and dialog.checks.topLevelItemCount() == 0
    assert dialog.create_button.isEnabled() and len(dialog.recordings()) == 1  # a clone of the kept take
    dialog.import_file(CLIP)
    assert [s["file"] for _, _, s in dialog.recordings()] == ["piper_joe.flac", "piper_joe.flac"]
    dialog.kind.setCurrentIndex(dialog.kind.findData("kokoro"))
    assert not dialog.create_button.isEnabled() and not dialog.keep_button.isEnabled()
    dialog.reject()
