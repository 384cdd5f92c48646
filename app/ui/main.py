"""The studio window (first cut): script, voice and device, synthesize, timings, waveform."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QThreadPool, QTimer
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core import models
from app.core.engine import STAGES, Engine, devices
from app.ui.workers import SynthesisJob


class StudioWindow(QMainWindow):
    def __init__(self):
        super().__init__()
        self.setWindowTitle("Voice Studio")
        self.resize(960, 600)
        self.pool = QThreadPool.globalInstance()
        self.engine: Engine | None = None
        self.engine_key: tuple | None = None
        self.job: SynthesisJob | None = None
        self.take = None

        self.editor = QPlainTextEdit("Welcome to Voice Studio. Type a script and press Synthesize.")
        self.voice = QComboBox()
        for voice_id in sorted(models.STOCK_VOICES):
            self.voice.addItem(voice_id)
        self.device = QComboBox()
        self.device.addItem("auto", "auto")
        for d in devices():
            self.device.addItem(f"{d['id']} — {d['description']} ({d['type']})", d["id"])
        self.threads = QSpinBox()
        self.threads.setRange(0, 256)
        self.threads.setSpecialValueText("all cores")
        self.synth_button = QPushButton("Synthesize")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.timings = QLabel("")
        self.timings.setWordWrap(True)
        self.plot = pg.PlotWidget()
        self.plot.setDownsampling(mode="peak")
        self.plot.setClipToView(True)
        self.plot.setLabel("bottom", "time", units="s")
        self.curve = self.plot.plot(pen=pg.mkPen("#3b82f6"))

        form = QFormLayout()
        form.addRow("Voice", self.voice)
        form.addRow("Device", self.device)
        form.addRow("CPU threads", self.threads)
        buttons = QHBoxLayout()
        buttons.addWidget(self.synth_button)
        buttons.addWidget(self.cancel_button)
        side = QVBoxLayout()
        side.addLayout(form)
        side.addLayout(buttons)
        side.addWidget(self.timings)
        side.addStretch(1)
        top = QHBoxLayout()
        top.addWidget(self.editor, 2)
        top.addLayout(side, 1)
        root = QVBoxLayout()
        root.addLayout(top, 1)
        root.addWidget(self.plot, 1)
        central = QWidget()
        central.setLayout(root)
        self.setCentralWidget(central)

        self.synth_button.clicked.connect(self.synthesize)
        self.cancel_button.clicked.connect(self.cancel)

    def _engine(self) -> Engine:
        key = (self.voice.currentText(), self.device.currentData(), self.threads.value())
        if self.engine is None or self.engine_key != key:
            if self.engine is not None:
                self.engine.close()
            self.engine = Engine.open(key[0], device=key[1], threads=key[2])
            self.engine_key = key
        return self.engine

    def synthesize(self) -> None:
        if self.job is not None:
            return
        try:
            engine = self._engine()
        except Exception as exc:
            self.show_error(exc)
            return
        self.stage_ms = dict.fromkeys(STAGES, 0.0)
        self.chunks: list[np.ndarray] = []
        self.job = SynthesisJob(engine, self.editor.toPlainText())
        self.job.signals.stage.connect(self.on_stage)
        self.job.signals.chunk.connect(self.on_chunk)
        self.job.signals.finished.connect(self.on_finished)
        self.job.signals.failed.connect(self.on_failed)
        self.synth_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.timings.setText("synthesizing…")
        self.pool.start(self.job)

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def on_stage(self, stage: str, chunk: int, ms: float) -> None:
        self.stage_ms[stage] += ms
        self.timings.setText("  ".join(f"{s} {v:.0f} ms" for s, v in self.stage_ms.items()))

    def on_chunk(self, index: int, audio: np.ndarray) -> None:
        self.chunks.append(audio)
        self._show_audio(np.concatenate(self.chunks))

    def _show_audio(self, audio: np.ndarray) -> None:
        rate = self.engine.sample_rate if self.engine else 22050
        self.curve.setData(np.arange(len(audio)) / rate, audio)

    def on_finished(self, take) -> None:
        self.take = take
        self._show_audio(take.audio)
        t = take.timings
        stages = "  ".join(f"{s} {t['stages_ms'][s]:.0f} ms" for s in STAGES)
        self.timings.setText(
            f"{stages}\ntotal {t['total_ms']:.0f} ms for {take.duration_s:.2f} s of audio · RTF {take.rtf:.3f}"
            f" · first audio {t['first_audio_ms']:.0f} ms · {take.device} ×{take.threads}"
        )
        self._job_done()

    def on_failed(self, exc: Exception) -> None:
        self._job_done()
        self.show_error(exc)

    def _job_done(self) -> None:
        self.job = None
        self.synth_button.setEnabled(True)
        self.cancel_button.setEnabled(False)

    def show_error(self, exc: Exception) -> None:
        self.timings.setText(f"error: {exc}")
        if QApplication.platformName() != "offscreen":
            QMessageBox.critical(self, "Voice Studio", str(exc))

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self.cancel()
        self.pool.waitForDone()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        super().closeEvent(event)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="main.py")
    parser.add_argument("--screenshot", help="render the window offscreen after one synthesis, save a PNG, exit")
    parser.add_argument("--text")
    parser.add_argument("--voice")
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    if args.screenshot:
        import os

        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = StudioWindow()
    if args.text:
        window.editor.setPlainText(args.text)
    if args.voice:
        window.voice.setCurrentText(args.voice)
    if args.device:
        index = window.device.findData(args.device)
        window.device.setCurrentIndex(max(index, 0))
    window.show()
    if args.screenshot:
        status = {"code": 0}

        def save():
            window.grab().save(args.screenshot)
            app.quit()

        def finished(*_):
            QTimer.singleShot(50, save)

        def failed(exc):
            status["code"] = 1
            print(f"error: {exc}", file=sys.stderr)
            app.quit()

        window.synthesize()
        if window.job is None:
            return 1
        window.job.signals.finished.connect(finished)
        window.job.signals.failed.connect(failed)
        app.exec()
        window.close()
        return status["code"]
    code = app.exec()
    return code
