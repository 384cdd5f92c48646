"""The studio window: script editor, timeline, voices, inspector, timings, jobs.

The window renders a Qt-free ``Project`` and wires signals; engine work runs in
QRunnables (app.jobs.workers), playback on PortAudio's thread (app.audio.playback). Its
engine and jobs, playback and project files are methods of mixins of their own
(engine_jobs.py, playback.py, project_files.py) that use the window's state.
"""

from __future__ import annotations

import argparse
import html
import logging
import sys

from PySide6.QtCore import QByteArray, Qt, QThreadPool, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDockWidget,
    QMainWindow,
    QMessageBox,
    QSplitter,
)

from app.audio.playback import Player
from app.core import lexicon
from app.core.logs import setup_logging
from app.core.project import (
    DEFAULT_SETTINGS,
    Project,
    timeline,
)
from app.core.settings import Settings
from app.engine.engine import Engine, devices
from app.jobs.workers import OpenEngineJob, SynthesisJob
from app.ui.editor import ScriptEditor
from app.ui.engine_jobs import EngineJobsMixin
from app.ui.lexicon_dialog import LexiconDialog
from app.ui.panels import ChaptersPanel, Inspector, JobsPanel, TimingsPanel, VoicesPanel
from app.ui.playback import PlaybackMixin
from app.ui.profile_dialog import NewProfileDialog
from app.ui.project_files import ProjectFilesMixin
from app.ui.timeline import TimelineView

log = logging.getLogger("voicestudio.ui")
WELCOME = "Welcome to Voice Studio. Type a script here; every sentence becomes a take you can play and export."


class StudioWindow(EngineJobsMixin, PlaybackMixin, ProjectFilesMixin, QMainWindow):
    job_added = Signal(object)  # SynthesisJob, once queued, before it starts
    job_ended = Signal(int, str)  # job id, final state: done, cancelled or failed
    error_shown = Signal(str)

    def __init__(self, settings: Settings | None = None, *, ask_recovery: bool = True, persist: bool = True):
        """``persist``: restore and save window layout and settings (off for screenshots and tests)."""
        super().__init__()
        self.persist = persist
        self.log_path = setup_logging()
        self.settings = settings or Settings.load()
        self.user_lexicon = self._load_user_lexicon()
        self.setWindowTitle("Voice Studio")
        self.resize(1280, 800)
        self.engine: Engine | None = None
        self.engine_spec: tuple | None = None
        self._opening: OpenEngineJob | None = None
        self._engine_note = ""
        self._after_open: list = []
        self._retired: list[Engine] = []
        self.jobs: dict[int, SynthesisJob] = {}
        self._previews: set = set()  # PreviewJobs running (kept alive until they report)
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
        self.chapters = ChaptersPanel()
        self._dock("Chapters", self.chapters, Qt.DockWidgetArea.LeftDockWidgetArea)
        bottom = self._dock("Jobs", self.jobs_panel, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.resizeDocks([left, right], [250, 400], Qt.Orientation.Horizontal)
        self.resizeDocks([bottom], [150], Qt.Orientation.Vertical)
        self._actions()

        # wiring
        self.editor.script_changed.connect(self._script_changed)
        self.editor.current_sentence_changed.connect(self._current_sentence_changed)
        self.editor.tag_problems.connect(self._tag_problems)
        self.timeline.sentence_clicked.connect(self._sentence_clicked)
        self.chapters.chapter_clicked.connect(self._sentence_clicked)
        self.chapters.synthesize_chapter.connect(lambda n: self.synthesize("stale", chapter=n))
        self.timeline.cursor_moved.connect(self._cursor_moved)
        self.inspector.settings_changed.connect(self._settings_changed)
        self.inspector.device_apply.connect(self.apply_device)
        self.inspector.take_activated.connect(self._take_activated)
        self.inspector.lock_toggled.connect(self._lock_toggled)
        self.inspector.ab_requested.connect(self.play_ab)
        self.inspector.reading_requested.connect(self.show_reading)
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
        self._action(f, "&Import script (.txt, .md, .epub)…", self.import_dialog)
        self._action(f, "&Save", self.save, "Ctrl+S")
        self._action(f, "Save &as…", self.save_as)
        self._action(f, "&Export audio…", self.export_dialog, "Ctrl+E")
        self._action(f, "Export su&btitles (.srt, .vtt)…", self.export_subtitles_dialog)
        f.addSeparator()
        self._action(f, "&Quit", self.close, "Ctrl+Q")
        s = bar.addMenu("&Synthesize")
        self.act_current = self._action(s, "&Current sentence", lambda: self.synthesize("current"), "Ctrl+Return")
        self.act_stale = self._action(s, "&Stale sentences", lambda: self.synthesize("stale"), "Ctrl+Shift+Return")
        self.act_all = self._action(s, "&All sentences", lambda: self.synthesize("all"), "Ctrl+Alt+Return")
        self._action(s, "&Regenerate current", lambda: self.synthesize("regenerate"), "Ctrl+R")
        self._action(s, "Re-&voice current take", lambda: self.revoice_current(), "Ctrl+Shift+R")
        self._action(s, "Re-voice a rec&ording into the current sentence…", self.revoice_recording_dialog)
        self._action(s, "Cancel all &jobs", lambda: self.cancel(0), "Ctrl+Shift+K")
        s.addSeparator()
        self._action(s, "&Pronunciations…", self.lexicon_dialog, "Ctrl+Shift+L")
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
        h = bar.addMenu("&Help")
        self._action(h, "&About Voice Studio", self.about)
        self._fill_recent()

    def about_text(self) -> str:
        from app import __version__
        from app.core import paths

        return (
            f"<b>Voice Studio {__version__}</b><p>Speech synthesis in its own engine on ggml.</p>"
            "<p>To update, get the newest release where you got this one and replace this one with it: it keeps "
            f"nothing of yours. Your voices, profiles and settings stay in {html.escape(str(paths.data_dir()))} "
            f"and {html.escape(str(paths.config_dir()))}.</p><p>It never downloads code to update itself.</p>"
        )

    def about(self) -> None:
        QMessageBox.about(self, "About Voice Studio", self.about_text())

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for path in self.settings["recent_projects"]:
            self.recent_menu.addAction(path, lambda p=path: self.open_project(p))
        self.recent_menu.setEnabled(bool(self.settings["recent_projects"]))

    # -- project --------------------------------------------------------------
    def set_project(self, project: Project) -> None:
        self.project = project
        project.user_lexicon = self.user_lexicon
        self.inspector.set_settings(project.voice, project.settings)
        self.editor.set_project(project)
        self._refresh_timeline()
        self._current_sentence_changed(self.editor.current_sentence())
        self._title()

    def _load_user_lexicon(self) -> dict[str, str]:
        entries, problem = lexicon.read_user()
        if problem:
            logging.getLogger(__name__).warning("the user lexicon is not used: %s", problem)
        return entries

    def lexicon_dialog(self) -> None:
        dialog = LexiconDialog(
            self, self.project.lexicon, self.user_lexicon, self.preview_pronunciation, voice=self.project.voice
        )
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.set_lexicons(dialog.project.entries(), dialog.user.entries())

    def set_lexicons(self, project: dict[str, str], user: dict[str, str]) -> None:
        """The project's pronunciations and the user's (written to the settings folder); the
        sentences that use a changed entry turn stale."""
        if user != self.user_lexicon:
            try:
                lexicon.write(lexicon.user_path(), user)
            except OSError as exc:
                self.show_error(exc)
                return
            self.user_lexicon = user
        if project != self.project.lexicon:
            self.project.lexicon, self.project.dirty = dict(project), True
        self.project.user_lexicon = self.user_lexicon
        self.editor.refresh()
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

    def _tag_problems(self, problems: list) -> None:
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            self.statusBar().showMessage(f"malformed pause tag, not read aloud: {problems[0]}{more}", 10000)

    def _current_sentence_changed(self, index: int) -> None:
        sentence = self.project.sentences[index] if 0 <= index < len(self.project.sentences) else None
        voice = self.project.sentence_voice(index) if sentence is not None else None
        self.inspector.show_sentence(index, sentence, voice if voice != self.project.voice else None)
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
        self.chapters.show_chapters(self.project)

    def new_profile_dialog(self) -> NewProfileDialog:
        """Record or import a reference and make a speaker profile (on the CPU unless a
        device is chosen in the inspector)."""
        device = self.inspector.device.currentData() or "cpu"
        dialog = NewProfileDialog(
            self, device="cpu" if device == "auto" else device, threads=self.inspector.engine_threads(),
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
