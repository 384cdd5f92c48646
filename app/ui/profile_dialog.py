"""The "new speaker profile" dialog: record or import a reference, see its checks, make a
voice of it (a Chatterbox clone, in seconds; or a Kokoro style search with a live similarity
plot), preview it, save.

The making runs as a QRunnable on the global pool (app.jobs.profile: it opens its own engine
and speaker encoder on the chosen device); its events arrive queued on the GUI thread.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QThreadPool, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
)

from app.audio.playback import Player
from app.audio.recording import Recorder
from app.jobs.profile import BuildJob
from app.models import manager as models
from app.profiles import builder as profile_builder
from app.profiles import speaker_reference
from app.profiles import store as profiles

READING_SCRIPT = (
    "Read this aloud at your usual pace, about half a minute:\n\n"
    "When the sunlight strikes raindrops in the air, they act as a prism and form a rainbow. "
    "The rainbow is a division of white light into many beautiful colours. These take the shape "
    "of a long round arch, with its path high above, and its two ends apparently beyond the horizon. "
    "People look, but no one ever finds it. When a man looks for something beyond his reach, "
    "his friends say he is looking for the pot of gold at the end of the rainbow."
)
STATUS_COLOURS = {"pass": "#15803d", "warn": "#b45309", "fail": "#b91c1c"}


class NewProfileDialog(QDialog):
    saved = Signal(str)  # voice id of the new profile

    def __init__(self, parent=None, *, device: str = "cpu", threads: int = 0, player: Player | None = None):
        super().__init__(parent)
        self.setWindowTitle("New speaker profile")
        self.resize(760, 720)
        self.device, self.threads = device, threads
        self.evaluate = True  # measure the result on held-out sentences before it is offered
        self.player = player or Player()
        self.recorder: Recorder | None = None
        self.audio: np.ndarray | None = None
        self.rate = 0
        self.source: dict = {}
        self.reference: speaker_reference.Reference | None = None
        self.job: BuildJob | None = None
        self.draft: profile_builder.Draft | profile_builder.CloneDraft | None = None
        self.points: list[tuple[float, float]] = []  # (s, similarity) of every candidate
        self.best_curve: list[tuple[float, float]] = []
        self._preview: np.ndarray | None = None  # the best candidate's audio while searching

        # 1. reference
        script = QLabel(READING_SCRIPT)
        script.setWordWrap(True)
        self.record_button = QPushButton("Record")
        self.stop_button = QPushButton("Stop")
        self.import_button = QPushButton("Import file…")
        self.keep_button = QPushButton("Keep, add another take")
        self.keep_button.setToolTip("a clone takes several recordings: the longest gives its prompts, each its voice")
        self.kept_label = QLabel("")
        self.kept: list[tuple[np.ndarray, int, dict]] = []  # earlier takes of the reference, usable each
        self.stop_button.setEnabled(False)
        self.meter = QProgressBar(minimum=-60, maximum=0, value=-60, textVisible=False)
        self.clip_label = QLabel("")
        self.time_label = QLabel("0.0 s")
        row = QHBoxLayout()
        for w in (self.record_button, self.stop_button, self.import_button, self.time_label):
            row.addWidget(w)
        row.addWidget(self.meter, 1)
        row.addWidget(self.clip_label)
        row.addWidget(self.keep_button)
        row.addWidget(self.kept_label)
        self.checks = QTreeWidget()
        self.checks.setHeaderLabels(["", "check", "detail"])
        self.checks.setRootIsDecorated(False)
        self.checks.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.checks.setMaximumHeight(150)
        ref_box = QGroupBox("1. Reference recording")
        ref_layout = QVBoxLayout(ref_box)
        ref_layout.addWidget(script)
        ref_layout.addLayout(row)
        ref_layout.addWidget(self.checks)

        # 2. search
        self.name = QLineEdit()
        self.name.setPlaceholderText("name of the profile")
        self.kind = QComboBox()
        for model, label in (("chatterbox-turbo", "Clone with Chatterbox-Turbo"),
                             ("chatterbox", "Clone with Chatterbox Multilingual"),
                             ("kokoro", "Kokoro style search")):  # fmt: skip
            self.kind.addItem(label, model)
            if model != "kokoro" and not models.chatterbox_installed(model):
                item = self.kind.model().item(self.kind.count() - 1)
                item.setEnabled(False)
                item.setToolTip(f"not installed: python main.py models install {model} --from <folder>")
        self.kind.setCurrentIndex(next(i for i in range(self.kind.count()) if self.kind.model().item(i).isEnabled()))
        self.seconds = QSpinBox(minimum=5, maximum=3600, value=60, suffix=" s")
        self.seed = QSpinBox(minimum=0, maximum=2**31 - 1)
        self.create_button = QPushButton("Create")
        self.cancel_button = QPushButton("Stop search (keep best)")
        self.create_button.setEnabled(False)
        self.cancel_button.setEnabled(False)
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Voice", self.kind)
        form.addRow("Search time", self.seconds)
        form.addRow("Seed", self.seed)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setLabel("bottom", "search time", units="s")
        self.plot.setLabel("left", "similarity to the reference")
        self.scatter = pg.ScatterPlotItem(size=5, brush=pg.mkBrush(148, 163, 184))
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.best_line = self.plot.plot(pen=pg.mkPen("#2563eb", width=2))
        self.plot.addItem(self.scatter)
        self.plot.setMinimumHeight(200)
        self.status = QLabel("Record or import a reference.")
        self.status.setWordWrap(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.create_button)
        buttons.addWidget(self.cancel_button)
        search_box = QGroupBox("2. Make a voice")
        search_layout = QVBoxLayout(search_box)
        search_layout.addLayout(form)
        search_layout.addLayout(buttons)
        search_layout.addWidget(self.plot)
        search_layout.addWidget(self.status)

        # 3. preview and save
        self.preview_button = QPushButton("Play preview")
        self.save_button = QPushButton("Save profile")
        self.preview_button.setEnabled(False)
        self.save_button.setEnabled(False)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        end = QHBoxLayout()
        end.addWidget(self.preview_button)
        end.addWidget(self.save_button)
        end.addStretch(1)
        end.addWidget(close)

        layout = QVBoxLayout(self)
        layout.addWidget(ref_box)
        layout.addWidget(search_box, 1)
        layout.addLayout(end)

        self.record_button.clicked.connect(self.start_recording)
        self.stop_button.clicked.connect(self.stop_recording)
        self.import_button.clicked.connect(self._import_dialog)
        self.keep_button.clicked.connect(self.keep_take)
        self.create_button.clicked.connect(self.create)
        self.cancel_button.clicked.connect(self.cancel_search)
        self.preview_button.clicked.connect(self.play_preview)
        self.save_button.clicked.connect(self.save)
        self.name.textChanged.connect(self._update_buttons)
        self.kind.currentIndexChanged.connect(self._update_buttons)
        close.rejected.connect(self.reject)
        self._meter_timer = QTimer(self, interval=50)
        self._meter_timer.timeout.connect(self._poll_meter)
        self._update_buttons()

    # -- reference ------------------------------------------------------------
    def start_recording(self) -> None:
        self.recorder = self.recorder or Recorder()
        try:
            self.recorder.start()
        except Exception as exc:
            self._error(exc)
            return
        self.record_button.setEnabled(False)
        self.import_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.status.setText("Recording… read the text above, then press Stop.")
        self._meter_timer.start()

    def stop_recording(self) -> None:
        if self.recorder is None or not self.recorder.recording:
            return
        self.recorder.stop()
        self._meter_timer.stop()
        self._poll_meter()
        self.record_button.setEnabled(True)
        self.import_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.set_reference(self.recorder.audio(), self.recorder.sample_rate, {"recorded": True})

    def _poll_meter(self) -> None:
        rec = self.recorder
        if rec is None:
            return
        self.meter.setValue(int(max(-60.0, min(0.0, rec.level_db))))
        self.time_label.setText(f"{rec.seconds:.1f} s")
        self.clip_label.setText("CLIP" if rec.clipped else "")
        self.clip_label.setStyleSheet("color: #b91c1c; font-weight: bold" if rec.clipped else "")

    def _import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a reference recording", "", "Audio (*.wav *.flac *.ogg *.mp3);;All files (*)"
        )
        if path:
            self.import_file(path)

    def import_file(self, path: str | Path) -> None:
        try:
            audio, rate = speaker_reference.load(path)
        except Exception as exc:
            self._error(exc)
            return
        self.set_reference(audio, rate, {"file": Path(path).name})
        if not self.name.text():
            self.name.setText(Path(path).stem)

    def keep_take(self) -> None:
        """Keep the current reference as one of the clone's takes, and ask for another."""
        if self.audio is None or self.reference is None or not self.reference.usable:
            return
        self.kept.append((self.audio, self.rate, self.source))
        self.audio, self.reference, self.draft = None, None, None
        self.checks.clear()
        self.kept_label.setText(f"{len(self.kept)} take(s) kept")
        self.status.setText(f"{len(self.kept)} take(s) kept. Record or import another, or create from them.")
        self._update_buttons()

    def recordings(self) -> list[tuple[np.ndarray, int, dict]]:
        """The takes a profile is made of: those kept, and the current one where usable."""
        current = [(self.audio, self.rate, self.source)] if self.reference is not None and self.reference.usable else []
        return self.kept + current

    def set_reference(self, audio: np.ndarray, rate: int, source: dict) -> None:
        self.audio, self.rate, self.source = audio, rate, source
        self.draft = None
        self.reference = speaker_reference.prepare(audio, rate)
        self.checks.clear()
        for c in self.reference.checks:
            item = QTreeWidgetItem([c.status, c.name, c.detail])
            item.setForeground(0, pg.mkColor(STATUS_COLOURS[c.status]))
            self.checks.addTopLevelItem(item)
        if self.reference.usable:
            self.status.setText(f"Reference ready: {self.reference.duration_s:.1f} s of speech. Name it and create.")
        else:
            self.status.setText("This recording cannot make a profile: see the failed checks.")
        self._update_buttons()

    # -- search ---------------------------------------------------------------
    def _update_buttons(self) -> None:
        busy = self.job is not None
        usable = self.reference is not None and self.reference.usable
        searching = self.kind.currentData() == "kokoro"
        takes = len(self.recordings())
        ready = takes == 1 if searching else takes >= 1  # a style search takes one recording
        self.create_button.setEnabled(ready and not busy and bool(self.name.text().strip()))
        self.keep_button.setEnabled(usable and not busy and not searching)
        self.seconds.setEnabled(searching and not busy)
        self.kind.setEnabled(not busy)
        self.plot.setVisible(searching)
        self.cancel_button.setEnabled(busy)
        self.preview_button.setEnabled(self.draft is not None and self.draft.preview_audio is not None)
        self.save_button.setEnabled(self.draft is not None and not busy)

    def create(self) -> None:
        takes = self.recordings()
        if not takes or self.job is not None:
            return
        settings = profile_builder.Settings(
            seconds=float(self.seconds.value()), seed=self.seed.value(), device=self.device, threads=self.threads,
            evaluate=self.evaluate,
        )  # fmt: skip
        self.points.clear()
        self.best_curve.clear()
        self.draft = None
        (audio, rate, source), more = takes[0], [(a, r) for a, r, _ in takes[1:]]
        if more:
            source = dict(source, files=[s.get("file", "recorded") for _, _, s in takes])
        self.job = BuildJob(audio, rate, source, settings, self.kind.currentData(), more)
        self.job.signals.event.connect(self._on_event)
        self.job.signals.finished.connect(self._on_finished)
        self.job.signals.cancelled.connect(self._on_ended)
        self.job.signals.failed.connect(self._on_failed)
        self._update_buttons()
        QThreadPool.globalInstance().start(self.job)

    def cancel_search(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.status.setText("Stopping the search; the best candidate so far is kept…")

    def _on_event(self, ev: profile_builder.Event) -> None:
        self.status.setText(ev.message)
        p = ev.progress
        if p is None:
            return
        self.points.append((p.elapsed_s, p.current.similarity))
        self.best_curve.append((p.elapsed_s, p.best.similarity))
        xs, ys = zip(*self.points, strict=True)
        self.scatter.setData(list(xs), list(ys))
        # The best so far as steps: it holds until a better candidate arrives.
        bx, by = [self.best_curve[0][0]], [self.best_curve[0][1]]
        for x, y in self.best_curve[1:]:
            bx += [x, x]
            by += [by[-1], y]
        self.best_line.setData(bx, by)
        if p.best_audio is not None:
            self._preview = p.best_audio
            self.preview_button.setEnabled(True)

    def _on_finished(self, draft: profile_builder.Draft) -> None:
        self.job = None
        self.draft = draft
        s = draft.scores
        if isinstance(draft, profile_builder.CloneDraft):
            text = f"A clone for {draft.model}, made in {s['conditioning_s']:.1f} s."
            if "preview" in s:
                text += f" Its preview's similarity to the reference: {s['preview']['similarity']:.3f}."
            self.status.setText(text + " Preview it, then save.")
            self._update_buttons()
            return
        text = (
            f"Best similarity in the search {s['search']['similarity']:.3f}"
            f" after {draft.search['evaluations']} candidates."
        )
        if "heldout" in s:
            h = s["heldout"]
            text += (
                f" On sentences it never heard: {h['profile']:.3f} vs {h['best_stock']['similarity']:.3f}"
                f" for the closest stock voice ({h['best_stock']['voice']})."
            )
        self.status.setText(text + " Preview it, then save.")
        self._update_buttons()

    def _on_ended(self) -> None:
        self.job = None
        self.status.setText("Search stopped before any candidate was scored.")
        self._update_buttons()

    def _on_failed(self, exc: Exception) -> None:
        self.job = None
        self._update_buttons()
        self._error(exc)

    def play_preview(self) -> None:
        audio = self.draft.preview_audio if self.draft is not None else self._preview
        if audio is None:
            return
        try:
            self.player.load(audio, models.KOKORO_SAMPLE_RATE)
            self.player.play()
        except Exception as exc:
            self._error(exc)

    def save(self) -> profiles.Profile | None:
        if self.draft is None:
            return None
        try:
            profile = self.draft.save(self.name.text())
        except Exception as exc:
            self._error(exc)
            return None
        self.status.setText(f"Saved {profile.voice_id}.")
        self.saved.emit(profile.voice_id)
        return profile

    def _error(self, exc: Exception) -> None:
        message = str(exc) or type(exc).__name__
        self.status.setText(f"<span style='color:#b91c1c'>{html.escape(message)}</span>")

    def reject(self) -> None:
        if self.job is not None:
            self.job.cancel()
            QThreadPool.globalInstance().waitForDone(30000)
        if self.recorder is not None:
            self.recorder.stop()
        super().reject()
