"""The studio window: script editor, timeline, voices, inspector, timings, jobs.

The window renders a Qt-free ``Project`` and wires signals; engine work runs in
QRunnables (app.ui.workers), playback on PortAudio's thread (app.core.playback).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
from PySide6.QtCore import QByteArray, Qt, QThreadPool, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDockWidget,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QMainWindow,
    QMessageBox,
    QSplitter,
)

from app.core import export as export_mod
from app.core.engine import Engine, devices
from app.core.logs import setup_logging
from app.core.playback import Player
from app.core.project import (
    DEFAULT_SETTINGS,
    SUFFIX,
    Project,
    ProjectFileError,
    Take,
    discard_recovery,
    pending_recoveries,
    timeline,
)
from app.core.settings import Settings
from app.ui.editor import ScriptEditor
from app.ui.panels import Inspector, JobsPanel, TimingsPanel, VoicesPanel
from app.ui.profile_dialog import NewProfileDialog
from app.ui.timeline import TimelineView
from app.ui.workers import OpenEngineJob, SynthesisJob

log = logging.getLogger("voicestudio.ui")
WELCOME = "Welcome to Voice Studio. Type a script here; every sentence becomes a take you can play and export."


class StudioWindow(QMainWindow):
    job_added = Signal(object)  # SynthesisJob, once queued, before it starts
    job_ended = Signal(int, str)  # job id, final state: done, cancelled or failed
    error_shown = Signal(str)

    def __init__(self, settings: Settings | None = None, *, ask_recovery: bool = True, persist: bool = True):
        """``persist``: restore and save window layout and settings (off for screenshots and tests)."""
        super().__init__()
        self.persist = persist
        self.log_path = setup_logging()
        self.settings = settings or Settings.load()
        self.setWindowTitle("Voice Studio")
        self.resize(1280, 800)
        self.engine: Engine | None = None
        self.engine_spec: tuple | None = None
        self._opening: OpenEngineJob | None = None
        self._engine_note = ""
        self._after_open: list = []
        self._retired: list[Engine] = []
        self.jobs: dict[int, SynthesisJob] = {}
        self.synth_pool = QThreadPool(self)
        self.synth_pool.setMaxThreadCount(1)  # one engine call at a time; later jobs queue
        self.player = Player()
        self.timeline_cursor: float | None = None  # seconds, where the timeline was last clicked
        self.last_error: str | None = None
        self._error_box: QMessageBox | None = None
        self._stream_follow = False

        # central: editor over timeline
        self.editor = ScriptEditor()
        self.timeline = TimelineView()
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.editor)
        split.addWidget(self.timeline)
        split.setSizes([380, 420])
        self.setCentralWidget(split)

        # docks
        self.voices = VoicesPanel()
        self.inspector = Inspector(devices())
        self.timings = TimingsPanel()
        self.jobs_panel = JobsPanel()
        left = self._dock("Voices", self.voices, Qt.DockWidgetArea.LeftDockWidgetArea)
        right = self._dock("Inspector", self.inspector, Qt.DockWidgetArea.RightDockWidgetArea)
        self._dock("Timings", self.timings, Qt.DockWidgetArea.RightDockWidgetArea)
        bottom = self._dock("Jobs", self.jobs_panel, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.resizeDocks([left, right], [250, 400], Qt.Orientation.Horizontal)
        self.resizeDocks([bottom], [150], Qt.Orientation.Vertical)
        self._actions()

        # wiring
        self.editor.script_changed.connect(self._script_changed)
        self.editor.current_sentence_changed.connect(self._current_sentence_changed)
        self.timeline.sentence_clicked.connect(self._sentence_clicked)
        self.timeline.cursor_moved.connect(self._cursor_moved)
        self.inspector.settings_changed.connect(self._settings_changed)
        self.inspector.device_apply.connect(self.apply_device)
        self.inspector.take_activated.connect(self._take_activated)
        self.inspector.lock_toggled.connect(self._lock_toggled)
        self.inspector.ab_requested.connect(self.play_ab)
        self.voices.voice_chosen.connect(self.inspector.voice.setCurrentText)
        self.voices.preview_requested.connect(self.preview_voice)
        self.voices.new_profile_requested.connect(self.new_profile_dialog)
        self.voices.profiles_changed.connect(self.inspector.reload_voices)
        self.jobs_panel.cancel_requested.connect(self.cancel)
        self._timeline_timer = QTimer(self, singleShot=True, interval=250)
        self._timeline_timer.timeout.connect(self._refresh_timeline)
        self._playhead_timer = QTimer(self, interval=30)
        self._playhead_timer.timeout.connect(self._tick)
        self._autosave = QTimer(self, interval=max(5, int(self.settings["autosave_s"])) * 1000)
        self._autosave.timeout.connect(self.autosave)
        self._autosave.start()

        # state
        self._restore_settings()
        self.set_project(Project(WELCOME, self.settings["voice"], self._settings_from_store()))
        self.project.dirty = False
        if ask_recovery:
            QTimer.singleShot(0, self.offer_recovery)

    # -- construction helpers -------------------------------------------------
    def _dock(self, title, widget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(title)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _action(self, menu, text, slot, shortcut=None) -> QAction:
        action = QAction(text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _actions(self) -> None:
        bar = self.menuBar()
        f = bar.addMenu("&File")
        self._action(f, "&New project", self.new_project, "Ctrl+N")
        self._action(f, "&Open project…", self.open_dialog, "Ctrl+O")
        self.recent_menu = f.addMenu("Open &recent")
        self._action(f, "&Import script (.txt, .md)…", self.import_dialog)
        self._action(f, "&Save", self.save, "Ctrl+S")
        self._action(f, "Save &as…", self.save_as)
        self._action(f, "&Export WAV…", self.export_dialog, "Ctrl+E")
        f.addSeparator()
        self._action(f, "&Quit", self.close, "Ctrl+Q")
        s = bar.addMenu("&Synthesize")
        self.act_current = self._action(s, "&Current sentence", lambda: self.synthesize("current"), "Ctrl+Return")
        self.act_stale = self._action(s, "&Stale sentences", lambda: self.synthesize("stale"), "Ctrl+Shift+Return")
        self.act_all = self._action(s, "&All sentences", lambda: self.synthesize("all"), "Ctrl+Alt+Return")
        self._action(s, "&Regenerate current", lambda: self.synthesize("regenerate"), "Ctrl+R")
        self._action(s, "Cancel all &jobs", lambda: self.cancel(0), "Ctrl+Shift+K")
        p = bar.addMenu("&Playback")
        self._action(p, "&Play / pause", self.play_pause, "Ctrl+Space")
        self._action(p, "&Stop", self.stop, "Ctrl+.")
        self._action(p, "Play se&lection", self.play_selection, "Ctrl+Shift+Space")
        self._action(p, "Play from &cursor", self.play_from_cursor, "Ctrl+Alt+Space")
        tools = self.addToolBar("Main")
        tools.setObjectName("toolbar")
        for action in (self.act_current, self.act_stale, self.act_all):
            tools.addAction(action)
        view = bar.addMenu("&View")
        for dock in self.findChildren(QDockWidget):
            view.addAction(dock.toggleViewAction())
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for path in self.settings["recent_projects"]:
            self.recent_menu.addAction(path, lambda p=path: self.open_project(p))
        self.recent_menu.setEnabled(bool(self.settings["recent_projects"]))

    # -- project --------------------------------------------------------------
    def set_project(self, project: Project) -> None:
        self.project = project
        self.inspector.set_settings(project.voice, project.settings)
        self.editor.set_project(project)
        self._refresh_timeline()
        self._current_sentence_changed(self.editor.current_sentence())
        self._title()

    def _title(self) -> None:
        name = self.project.path.name if self.project.path else "untitled"
        self.setWindowTitle(f"{name}{' •' if self.project.dirty else ''} — Voice Studio")

    def _settings_from_store(self) -> dict:
        return dict(DEFAULT_SETTINGS, speed=self.settings["speed"], seed=self.settings["seed"])

    def _settings_changed(self) -> None:
        self.project.voice = self.inspector.voice.currentText()
        self.project.settings = self.inspector.settings()
        self.project.dirty = True
        self.editor.refresh()
        self._title()

    def _script_changed(self, _script: str) -> None:
        self._refresh_timeline()
        self._title()

    def _current_sentence_changed(self, index: int) -> None:
        sentence = self.project.sentences[index] if 0 <= index < len(self.project.sentences) else None
        self.inspector.show_sentence(index, sentence)
        self.timeline.select_sentence(index)

    def _sentence_clicked(self, index: int) -> None:
        self.editor.select_sentence(index)

    def _cursor_moved(self, seconds: float) -> None:
        self.timeline_cursor = seconds

    def _take_activated(self, take_index: int) -> None:
        index = self.editor.current_sentence()
        if 0 <= index < len(self.project.sentences):
            self.project.sentences[index].active = take_index
            self.project.dirty = True
            self._after_takes_changed(index)

    def _lock_toggled(self, locked: bool) -> None:
        index = self.editor.current_sentence()
        if 0 <= index < len(self.project.sentences):
            self.project.sentences[index].locked = locked
            self.project.dirty = True
            self.editor.refresh()

    def _after_takes_changed(self, index: int, *, soon: bool = False) -> None:
        """``soon``: takes arrive one by one during a job; redraw the timeline at most every 250 ms."""
        if soon:
            if not self._timeline_timer.isActive():
                self._timeline_timer.start()
        else:
            self._refresh_timeline()
        self.editor.refresh()
        if index == self.editor.current_sentence():
            self._current_sentence_changed(index)
        self._title()

    def _refresh_timeline(self) -> None:
        self._timeline_timer.stop()
        audio, rate, segments = timeline(self.project, gap_s=float(self.settings["gap_s"]))
        self.timeline.set_timeline(audio, rate, segments)

    # -- engine ---------------------------------------------------------------
    def _desired_spec(self, voice: str | None = None) -> tuple:
        return (voice or self.project.voice, self.inspector.device.currentData(), self.inspector.threads.value())

    def with_engine(self, then, voice: str | None = None) -> None:
        """Call ``then(engine)`` once an engine for ``voice`` (default: the project's) on the chosen device is open."""
        spec = self._desired_spec(voice)
        if self.engine is not None and self.engine_spec == spec:
            then(self.engine)
            return
        self._after_open.append((spec, then))
        if self._opening is None:
            self._open_engine(spec, spec)

    def _open_engine(self, spec: tuple, requested: tuple, fallback_reason: str | None = None) -> None:
        voice, device, threads = spec
        self.inspector.engine_status.setText(f"opening {voice} on {device}…")
        job = OpenEngineJob(voice, device, threads)
        job.signals.opened.connect(lambda engine, ms: self._engine_opened(requested, engine, ms, fallback_reason))
        job.signals.failed.connect(lambda exc: self._engine_failed(spec, requested, exc))
        self._opening = job
        QThreadPool.globalInstance().start(job)

    def _engine_opened(self, requested, engine: Engine, ms: float, fallback_reason: str | None) -> None:
        self._opening = None
        if self.engine is not None:
            self._retired.append(self.engine)
            self._close_retired()
        # Filed under the request, so a GPU that fell back to the CPU is not retried every job.
        self.engine, self.engine_spec = engine, requested
        note = f"{engine.voice_id} on {engine.device}"
        note += f" ×{engine.threads} threads" if engine.device == "cpu" else ""
        note += f" (opened in {ms:.0f} ms"
        note += f", {engine.prewarm_ms:.0f} of them a prewarm)" if engine.prewarm_ms > 0 else ")"
        if fallback_reason:
            note += f"\nfell back to the CPU: {fallback_reason}"
        self._engine_note = note
        self.inspector.engine_status.setText(note + _placement_note(engine))
        self.statusBar().showMessage(note.replace("\n", " — "), 8000)
        self._dispatch_pending()

    def _dispatch_pending(self) -> None:
        pending, self._after_open = self._after_open, []
        for spec, then in pending:
            if self.engine is not None and spec == self.engine_spec:
                then(self.engine)
            else:
                self._after_open.append((spec, then))
        if self._after_open and self._opening is None:
            spec = self._after_open[0][0]
            self._open_engine(spec, spec)

    def _engine_failed(self, spec, requested, exc: Exception) -> None:
        self._opening = None
        voice, device, threads = spec
        if device != "cpu":
            log.warning("opening %s on %s failed: %s; trying the CPU", voice, device, exc)
            self._open_engine((voice, "cpu", threads), requested, fallback_reason=f"{device}: {exc}")
            return
        self._after_open = [(s, t) for s, t in self._after_open if s != requested]
        self.inspector.engine_status.setText(f"cannot open {voice}: {exc}")
        self.show_error(exc)
        self._dispatch_pending()

    def apply_device(self, device: str, threads: int) -> None:
        self.settings["device"], self.settings["threads"] = device, threads
        self.with_engine(lambda engine: None)

    def _close_retired(self) -> None:
        if self.synth_pool.activeThreadCount() == 0:
            for engine in self._retired:
                engine.close()
            self._retired = []

    # -- synthesis ------------------------------------------------------------
    def synthesize(self, which: str = "all") -> bool:
        """Queue a job for the current sentence, the stale ones, all, or a new take of the current one.

        Returns whether a job was queued (``job_added`` follows once the engine is open)."""
        self.editor.flush()
        project = self.project
        if which in ("current", "regenerate"):
            index = self.editor.current_sentence()
            indices = [index] if index >= 0 else []
        else:
            indices = project.to_synthesize(which)
        if not indices:
            self.statusBar().showMessage("nothing to synthesize", 4000)
            return False
        items = [(i, project.sentences[i].text) for i in indices]
        settings = dict(project.settings)
        params = {
            "length_scale": 1.0 / settings["speed"],
            "noise_scale": settings["noise_scale"],
            "noise_w": settings["noise_w"],
            "seed": settings["seed"],
        }
        if which == "regenerate":
            params["seed"] = settings["seed"] + len(project.sentences[indices[0]].takes)

        def start(engine: Engine) -> None:
            job = SynthesisJob(engine, items, kind=which, **params)
            job.voice, job.settings = project.voice, settings
            job.signals.started.connect(self._job_started)
            job.signals.stage.connect(lambda stage, chunk, ms: self.timings.add_stage(stage, ms))
            job.signals.chunk.connect(lambda index, audio: self.timings.first_audio())
            job.signals.sentence_done.connect(lambda index, take, job=job: self._sentence_done(job, index, take))
            job.signals.finished.connect(self._job_ended)
            job.signals.cancelled.connect(self._job_ended)
            job.signals.failed.connect(self._job_failed)
            self.jobs[job.id] = job
            self.jobs_panel.add(job)
            self.job_added.emit(job)  # before it starts: a listener connected now misses none of its signals
            self.synth_pool.start(job)

        self.with_engine(start)
        return True

    def _job_started(self, job_id: int) -> None:
        job = self.jobs[job_id]
        self.timings.reset(job.engine.stages)
        self.jobs_panel.refresh_job(job)
        self.statusBar().showMessage(f"synthesizing {len(job.items)} sentence(s)…")

    def _sentence_done(self, job: SynthesisJob, index: int, etake) -> None:
        text = job.texts[index]
        sentences = self.project.sentences
        if not (0 <= index < len(sentences) and sentences[index].text == text):
            # The script changed meanwhile: the take belongs to the sentence with its text, if any.
            index = next((i for i, s in enumerate(sentences) if s.text == text), -1)
        self.jobs_panel.refresh_job(job)
        if index < 0:
            return
        take = Take(
            np.array(etake.audio, dtype=np.float32),
            etake.sample_rate,
            text,
            job.voice,
            dict(job.settings),
            dict(etake.timings),
        )
        self.project.add_take(index, take)
        self._after_takes_changed(index, soon=True)
        self._follow_stream(index)

    def _job_ended(self, job_id: int) -> None:
        job = self.jobs[job_id]
        job.ended = True  # its signals, takes included, have all been delivered
        self.jobs_panel.refresh_job(job)
        if self._timeline_timer.isActive():
            self._refresh_timeline()
        if job.state == "done" and self.engine is not None:
            audio_s = sum(
                self.project.sentences[i].take.duration_s
                for i, _ in job.items
                if i < len(self.project.sentences) and self.project.sentences[i].take is not None
            )
            engine = self.engine
            self.timings.finish(engine.device, engine.threads, len(job.items), audio_s, engine.workers)
            self.inspector.engine_status.setText(self._engine_note + _placement_note(self.engine))
        self.statusBar().showMessage(f"job {job_id} {job.state}", 5000)
        if not self.busy():
            self.player.finish()
            self._close_retired()
        self.job_ended.emit(job_id, job.state)

    def _job_failed(self, job_id: int, exc: Exception) -> None:
        self.show_error(exc)
        self._job_ended(job_id)

    def cancel(self, job_id: int = 0) -> None:
        for job in list(self.jobs.values()):
            if (job_id in (0, job.id)) and job.state in ("queued", "running"):
                job.cancel()
                self.jobs_panel.refresh_job(job)

    def busy(self) -> bool:
        """A synthesis job is queued, running, or has takes on their way to the GUI thread."""
        return any(not job.ended for job in self.jobs.values() if job.kind != "preview")

    def preview_voice(self, voice: str) -> None:
        text = f"This is {voice.split(':')[-1]}, one of the voices of Voice Studio."

        def start(engine: Engine) -> None:
            job = SynthesisJob(engine, [(-1, text)], kind="preview")
            job.signals.sentence_done.connect(lambda _, take: self._play_clip(take.audio, take.sample_rate))
            job.signals.failed.connect(lambda _, exc: self.show_error(exc))
            self.jobs[job.id] = job
            self.synth_pool.start(job)

        self.with_engine(start, voice=voice)

    def new_profile_dialog(self) -> NewProfileDialog:
        """Record or import a reference and make a speaker profile (on the CPU unless a
        device is chosen in the inspector)."""
        device = self.inspector.device.currentData() or "cpu"
        dialog = NewProfileDialog(
            self, device="cpu" if device == "auto" else device, threads=self.inspector.threads.value(),
            player=self.player,
        )  # fmt: skip
        dialog.saved.connect(self._profile_saved)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def _profile_saved(self, voice_id: str) -> None:
        self.voices.reload()
        self.inspector.reload_voices()
        self.statusBar().showMessage(f"speaker profile {voice_id} saved", 5000)

    # -- playback -------------------------------------------------------------
    def _play_clip(self, audio: np.ndarray, rate: int) -> None:
        """A clip that is not the timeline (a preview, an A/B pair)."""
        try:
            self.player.load(audio, rate)
            self.player.play()
        except Exception as exc:
            self.show_error(exc)
            return
        self._playhead_timer.start()

    def play_pause(self) -> None:
        state = self.player.state
        if state == "playing":
            self.player.pause()
        elif state == "paused":
            self.player.resume()
        else:
            self.play_from(0.0)

    def play_from(self, seconds: float, stop_s: float | None = None) -> None:
        if self._timeline_timer.isActive():
            self._refresh_timeline()  # takes that arrived since the last redraw
        audio, rate = self.timeline.audio, self.timeline.rate
        if not rate:
            self.statusBar().showMessage("nothing to play yet: synthesize a sentence first", 4000)
            return
        self._stream_follow = self.busy()
        try:
            self.player.load(audio, rate, final=not self._stream_follow)
            self.player.play(seconds, stop_s)
        except Exception as exc:
            self.show_error(exc)
            return
        self._playhead_timer.start()

    def play_selection(self) -> None:
        selection = self.timeline.selection()
        if selection is not None:
            self.play_from(*selection)

    def play_from_cursor(self) -> None:
        seconds = self.timeline_cursor
        if seconds is None:
            index = self.editor.current_sentence()
            seg = next((s for s in self.timeline.segments if s.index == index), None)
            seconds = seg.start_s if seg else 0.0
        self.play_from(seconds)

    def play_ab(self, a: int, b: int) -> None:
        index = self.editor.current_sentence()
        takes = self.project.sentences[index].takes
        ta, tb = takes[a], takes[b]
        clips = [ta.audio, export_mod.resample(tb.audio, tb.sample_rate, ta.sample_rate)]
        audio = export_mod.render(clips, ta.sample_rate, gap_s=0.6)
        self._play_clip(audio, ta.sample_rate)
        self.statusBar().showMessage(f"A: take {a + 1}, then B: take {b + 1}", 5000)

    def _follow_stream(self, index: int) -> None:
        """While playing a timeline that is still being synthesized, append sentences that land at its end."""
        if not self._stream_follow or self.player.state == "stopped" or not self.player.duration_s:
            return
        placed = [i for i, s in enumerate(self.project.sentences) if s.take is not None]
        if len(placed) < 2 or placed[-1] != index:
            return  # not the new end of the timeline: it shows up the next time playback starts
        take, rate = self.project.sentences[index].take, self.player.sample_rate
        gap = np.zeros(int(round(float(self.settings["gap_s"]) * rate)), dtype=np.float32)
        self.player.append(np.concatenate([gap, export_mod.resample(take.audio, take.sample_rate, rate)]))

    def stop(self) -> None:
        self.player.stop()
        self._playhead_timer.stop()
        self.timeline.set_playhead(None)

    def _tick(self) -> None:
        if self.player.state == "stopped":
            self._playhead_timer.stop()
            self.timeline.set_playhead(None)
            return
        self.timeline.set_playhead(self.player.position_s)

    # -- files ----------------------------------------------------------------
    def _confirm_discard(self) -> bool:
        if not self.project.dirty or QApplication.platformName() == "offscreen":
            return True
        answer = QMessageBox.question(
            self,
            "Voice Studio",
            "The project has unsaved changes. Save them first?",
            QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    def new_project(self) -> None:
        if self._confirm_discard():
            self.project.close()
            self.set_project(Project("", self.project.voice, dict(self.project.settings)))

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open project", "", f"Voice Studio projects (*{SUFFIX})")
        if path:
            self.open_project(path)

    def open_project(self, path) -> bool:
        if not self._confirm_discard():
            return False
        try:
            project = Project.open(path)
        except ProjectFileError as exc:
            self.show_error(exc)
            return False
        self.project.close()
        self.set_project(project)
        self.settings.add_recent(path)
        self._fill_recent()
        return True

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import script", "", "Text (*.txt *.md);;All files (*)")
        if path:
            self.import_script(path)

    def import_script(self, path) -> None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.show_error(RuntimeError(f"{path}: cannot read it as UTF-8 text ({exc})"))
            return
        if Path(path).suffix.lower() in (".md", ".markdown"):
            from app.core.script import markdown_to_script

            text = markdown_to_script(text)
        self.editor.setPlainText(text)
        self.editor.flush()

    def save(self) -> bool:
        if self.project.path is None:
            return self.save_as()
        return self._save_to(self.project.path)

    def save_as(self) -> bool:
        path, _ = QFileDialog.getSaveFileName(self, "Save project", "untitled" + SUFFIX, f"*{SUFFIX}")
        if not path:
            return False
        if not path.endswith(SUFFIX):
            path += SUFFIX
        return self._save_to(Path(path))

    def _save_to(self, path: Path) -> bool:
        self.editor.flush()
        try:
            self.project.save(path)
        except (OSError, ProjectFileError) as exc:
            self.show_error(exc)
            return False
        self.settings.add_recent(path)
        self._fill_recent()
        self._title()
        self.statusBar().showMessage(f"saved {path}", 4000)
        return True

    def autosave(self) -> None:
        self.editor.flush()
        if self.project.dirty:
            try:
                self.project.autosave()
            except OSError as exc:
                log.warning("autosave failed: %s", exc)

    def offer_recovery(self) -> None:
        recoveries = pending_recoveries()
        if not recoveries:
            return
        latest = recoveries[0]
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(latest.saved))
        name = latest.original.name if latest.original else "an unsaved project"
        answer = QMessageBox.question(
            self, "Recover work", f"Voice Studio did not close cleanly. Recover {name} as autosaved at {when}?"
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.recover(latest)
        else:
            for r in recoveries:
                discard_recovery(r.id)

    def recover(self, recovery) -> None:
        try:
            project = recovery.load()
        except ProjectFileError as exc:
            self.show_error(exc)
            return
        discard_recovery(recovery.id)
        self.set_project(project)
        self.project.dirty = True
        self._title()

    # -- export ---------------------------------------------------------------
    def export_dialog(self) -> None:
        dialog = ExportDialog(self, self.settings)
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export WAV", "script.wav", "WAV (*.wav)")
        if path:
            self.export(path, **dialog.options())

    def export(self, path, *, scope="all", subtype="pcm16", out_rate=None, gap_s=0.3, loudness=None):
        """Write the whole script, the selected sentence, or the timeline selection as one WAV."""
        self.editor.flush()
        if scope == "selection" and self.timeline.selection() is not None:
            start, end = self.timeline.selection()
            rate = self.timeline.rate
            clips = [self.timeline.audio[int(start * rate) : int(end * rate)]]
        else:
            indices = None if scope == "all" else self.selected_sentences()
            placed = self.project.takes_audio(indices)
            if not placed:
                self.show_error(export_mod.ExportError("nothing to export: no sentence has a take yet"))
                return None
            rate = placed[0][1].sample_rate
            clips = [export_mod.resample(t.audio, t.sample_rate, rate) for _, t in placed]
        try:
            report = export_mod.export_wav(
                path, clips, rate, out_rate=out_rate, subtype=subtype, gap_s=gap_s, loudness=loudness
            )
        except (export_mod.ExportError, OSError) as exc:
            self.show_error(exc)
            return None
        self.statusBar().showMessage(
            f"exported {report.path.name}: {report.duration_s:.1f} s, {report.lufs:.1f} LUFS,"
            f" true peak {report.true_peak_db:.1f} dBTP",
            8000,
        )
        return report

    def selected_sentences(self) -> list[int]:
        """Sentences the editor's selection touches; the current one when nothing is selected."""
        self.editor.flush()
        cursor = self.editor.textCursor()
        if not cursor.hasSelection():
            index = self.editor.current_sentence()
            return [index] if index >= 0 else []
        first = self.project.sentence_at(cursor.selectionStart())
        last = self.project.sentence_at(max(cursor.selectionStart(), cursor.selectionEnd() - 1))
        return list(range(first, last + 1)) if first >= 0 else []

    # -- errors, settings, closing -------------------------------------------
    def show_error(self, exc: Exception) -> None:
        message = str(exc) or type(exc).__name__
        log.error("%s: %s", type(exc).__name__, message)
        self.last_error = message
        self.statusBar().showMessage(f"error: {message}", 10000)
        box = QMessageBox(QMessageBox.Icon.Critical, "Voice Studio", message, parent=self)
        box.setInformativeText(f"Details are in the log: {self.log_path}")
        box.setWindowModality(Qt.WindowModality.WindowModal)
        self._error_box = box
        box.open()
        self.error_shown.emit(message)

    def _restore_settings(self) -> None:
        index = self.inspector.device.findData(self.settings["device"])
        self.inspector.device.setCurrentIndex(max(index, 0))
        self.inspector.threads.setValue(int(self.settings["threads"]))
        for key, restore in (("window_geometry", self.restoreGeometry), ("window_state", self.restoreState)):
            if self.settings[key] and self.persist:
                restore(QByteArray.fromBase64(self.settings[key].encode("ascii")))

    def _store_settings(self) -> None:
        self.settings["voice"] = self.project.voice
        self.settings["speed"] = float(self.project.settings.get("speed", 1.0))
        self.settings["seed"] = int(self.project.settings.get("seed", 0))
        self.settings["device"] = self.inspector.device.currentData()
        self.settings["threads"] = self.inspector.threads.value()
        self.settings["window_geometry"] = bytes(self.saveGeometry().toBase64()).decode("ascii")
        self.settings["window_state"] = bytes(self.saveState().toBase64()).decode("ascii")

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        if not self._confirm_discard():
            event.ignore()
            return
        self.cancel(0)
        self.stop()
        if self._error_box is not None:
            self._error_box.close()
        self.synth_pool.waitForDone()
        QThreadPool.globalInstance().waitForDone()
        self._autosave.stop()
        self.project.close()
        if self.persist:
            self._store_settings()
            try:
                self.settings.save()
            except OSError as exc:
                log.warning("settings not saved: %s", exc)
        for engine in [self.engine, *self._retired]:
            if engine is not None:
                engine.close()
        self.engine, self._retired = None, []
        super().closeEvent(event)


class ExportDialog(QDialog):
    SCOPES = {"all": "Whole script", "sentences": "Selected sentences", "selection": "Timeline selection"}
    FORMATS = {"pcm16": "16-bit PCM", "pcm24": "24-bit PCM", "float": "32-bit float"}
    LOUDNESS = {
        None: "as synthesized",
        "podcast": "Podcast (−16 LUFS)",
        "broadcast": "Broadcast (−23 LUFS)",
        "acx": "Audiobook ACX (−20 dB RMS, ≤ −3 dBTP)",
    }

    def __init__(self, parent, settings: Settings):
        super().__init__(parent)
        self.setWindowTitle("Export WAV")
        self.scope = self._combo(self.SCOPES, "all")
        self.rate = self._combo(
            {None: "voice's rate", 22050: "22050 Hz", 24000: "24000 Hz", 44100: "44100 Hz", 48000: "48000 Hz"}, None
        )
        self.format = self._combo(self.FORMATS, settings["export_format"])
        self.loudness = self._combo(self.LOUDNESS, settings["export_loudness"])
        self.gap = QDoubleSpinBox(minimum=0.0, maximum=5.0, singleStep=0.05, value=float(settings["gap_s"]))
        self.gap.setSuffix(" s")
        form = QFormLayout(self)
        form.addRow("What", self.scope)
        form.addRow("Sample rate", self.rate)
        form.addRow("Format", self.format)
        form.addRow("Silence between sentences", self.gap)
        form.addRow("Loudness", self.loudness)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    @staticmethod
    def _combo(options: dict, current) -> QComboBox:
        box = QComboBox()
        for value, label in options.items():
            box.addItem(label, value)
        box.setCurrentIndex(max(0, box.findData(current)))
        return box

    def options(self) -> dict:
        return {
            "scope": self.scope.currentData(),
            "out_rate": self.rate.currentData(),
            "subtype": self.format.currentData(),
            "gap_s": self.gap.value(),
            "loudness": self.loudness.currentData(),
        }


def _placement_note(engine: Engine) -> str:
    """Where the stages run: every one on the device, or which ops went to the CPU instead."""
    if engine.device == "cpu":
        return ""
    moved = {stage: ops for stage, ops in engine.fallback_ops.items() if ops}
    if not moved:
        return f"\nevery stage runs on {engine.device}"
    return "\non the CPU instead: " + "; ".join(f"{stage}: {', '.join(ops)}" for stage, ops in moved.items())


def excepthook_for(window: StudioWindow):
    """``sys.excepthook`` for the studio: an exception nothing caught (in a slot, a timer's
    callback) is logged with its traceback and shown in the window's error dialog, which
    names the log file; the studio goes on."""

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        log.error("uncaught %s", kind.__name__, exc_info=(kind, value, tb))
        window.show_error(value)

    return hook


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="main.py")
    parser.add_argument("--screenshot", help="render the window offscreen after one synthesis, save a PNG, exit")
    parser.add_argument("--text")
    parser.add_argument("--voice")
    parser.add_argument("--device")
    parser.add_argument("--quit-when-shown", action="store_true", help=argparse.SUPPRESS)  # startup benchmark
    args = parser.parse_args(argv)
    if args.screenshot:
        import os

        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Voice Studio")
    probe = bool(args.screenshot or args.quit_when_shown)
    window = StudioWindow(ask_recovery=not probe, persist=not probe)
    sys.excepthook = excepthook_for(window)
    if args.voice:
        window.inspector.voice.setCurrentText(args.voice)
    if args.device:
        index = window.inspector.device.findData(args.device)
        if index < 0:
            print(f"error: unknown device '{args.device}'", file=sys.stderr)
            return 2
        window.inspector.device.setCurrentIndex(index)
    if args.text:
        window.editor.setPlainText(args.text)
        window.editor.flush()
    window.show()
    if args.quit_when_shown:
        QTimer.singleShot(0, app.quit)
        app.exec()
        window.close()
        return 0
    if args.screenshot:
        return _screenshot(app, window, args.screenshot)
    return app.exec()


def _screenshot(app: QApplication, window: StudioWindow, out: str) -> int:
    status = {"code": 0}

    def save() -> None:
        window.grab().save(out)
        app.quit()

    def ended(job_id: int, state: str) -> None:
        if state != "done":
            status["code"] = 1
        QTimer.singleShot(100, save)

    def failed(message: str) -> None:
        status["code"] = 1
        print(f"error: {message}", file=sys.stderr)
        app.quit()

    def start() -> None:
        if not window.synthesize("all"):
            failed("nothing to synthesize")

    window.job_ended.connect(ended)
    window.error_shown.connect(failed)
    QTimer.singleShot(0, start)
    app.exec()
    window.close()
    return status["code"]
