"""The script's audio on one timeline: waveform over log-mel spectrogram, x-linked.

pyqtgraph recipes: the waveform curve uses peak downsampling and clip-to-view so a
chapter stays fluid; the spectrogram is an ImageItem placed in seconds × mel bands
with a colour bar; sentence boundaries are lines with numbers; a region selects a
time span; a vertical line is the play-head. Spectrogram columns are computed once
per take and cached by take id, so streaming chunks and re-layouts stay cheap.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal

from app.audio.dsp import log_mel

N_MELS = 80
HOP = 256


class TimelineView(pg.GraphicsLayoutWidget):
    sentence_clicked = Signal(int)  # sentence index
    cursor_moved = Signal(float)  # seconds

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.wave = self.addPlot(row=0, col=0)
        self.wave.setLabel("left", "amplitude")
        self.wave.setYRange(-1.0, 1.0)
        self.wave.setMouseEnabled(x=True, y=False)
        self.wave.setDownsampling(auto=True, mode="peak")
        self.wave.setClipToView(True)
        self.wave.showGrid(x=True, y=False, alpha=0.2)
        self.curve = self.wave.plot(pen=pg.mkPen("#2563eb", width=1))
        self.spec = self.addPlot(row=1, col=0)
        self.spec.setLabel("left", "mel band")
        self.spec.setLabel("bottom", "time", units="s")
        self.spec.setMouseEnabled(x=True, y=False)
        self.spec.setXLink(self.wave)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.spec.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(-11.5, 2.0), colorMap=pg.colormap.get("viridis"), label="log power")
        self.colorbar.setImageItem(self.image)
        # The colour bar gets its own column and the waveform row an empty cell beside it,
        # so both plots span the same width and their time axes line up.
        self.addItem(self.colorbar, row=1, col=1)
        spacer = self.addLabel("", row=0, col=1)
        spacer.setFixedWidth(self.colorbar.boundingRect().width() or 60)
        self.ci.layout.setColumnStretchFactor(0, 1)
        self.ci.layout.setColumnStretchFactor(1, 0)
        self.region = pg.LinearRegionItem(values=(0, 0), brush=pg.mkBrush(37, 99, 235, 40), movable=True)
        self.region.setZValue(10)
        self.region.hide()
        self.wave.addItem(self.region)
        self.playhead = pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen("#dc2626", width=2))
        self.playhead.setZValue(20)
        self.playhead.hide()
        self.wave.addItem(self.playhead)
        self.marks: list = []
        self.segments: list = []
        self.audio = np.zeros(0, dtype=np.float32)
        self.rate = 0
        self._columns: dict[str, np.ndarray] = {}
        self.wave.scene().sigMouseClicked.connect(self._clicked)

    # -- content --------------------------------------------------------------
    def set_timeline(self, audio: np.ndarray, rate: int, segments: list) -> None:
        """The whole script's audio and where each sentence's take sits on it."""
        self.audio, self.rate, self.segments = audio, rate, segments
        t = np.arange(len(audio), dtype=np.float64) / rate if rate else np.zeros(0)
        self.curve.setData(t, audio)
        for item in self.marks:
            self.wave.removeItem(item)
        self.marks = []
        for seg in segments:
            line = pg.InfiniteLine(pos=seg.start_s, angle=90, pen=pg.mkPen("#9ca3af", style=Qt.PenStyle.DashLine))
            label = pg.TextItem(str(seg.index + 1), color="#6b7280", anchor=(0, 0))
            label.setPos(seg.start_s, 1.0)
            for item in (line, label):
                self.wave.addItem(item)
                self.marks.append(item)
        self._update_spectrogram()
        if rate:
            self.wave.setXRange(0, max(len(audio) / rate, 0.1), padding=0.01)

    def spectrogram(self) -> np.ndarray:
        """The image shown: [N_MELS, frames] log-mel power of the timeline."""
        return self.image.image if self.image.image is not None else np.zeros((N_MELS, 0))

    def _take_columns(self, take) -> np.ndarray:
        key = f"{take.id}:{self.rate}"
        if key not in self._columns:
            from app.core.export import resample

            audio = resample(take.audio, take.sample_rate, self.rate)
            self._columns[key] = log_mel(audio, self.rate, n_mels=N_MELS, hop=HOP).T.astype(np.float32)
        return self._columns[key]

    def _update_spectrogram(self) -> None:
        if not self.rate or not self.segments:
            self.image.clear()
            return
        frames = int(np.ceil(len(self.audio) / HOP)) + 1
        image = np.full((N_MELS, frames), np.log(1e-5), dtype=np.float32)
        for seg in self.segments:
            cols = self._take_columns(seg.take)
            first = int(round(seg.start_s * self.rate / HOP))
            n = min(cols.shape[1], frames - first)
            image[:, first : first + n] = cols[:, :n]
        self.image.setImage(image, autoLevels=False)
        self.image.setRect(0.0, 0.0, frames * HOP / self.rate, N_MELS)
        self.spec.setYRange(0, N_MELS, padding=0)

    # -- selection and play-head ---------------------------------------------
    def select_sentence(self, index: int) -> None:
        for seg in self.segments:
            if seg.index == index:
                self.region.setRegion((seg.start_s, seg.end_s))
                self.region.show()
                return
        self.region.hide()

    def selection(self) -> tuple[float, float] | None:
        if not self.region.isVisible():
            return None
        start, end = self.region.getRegion()
        return (start, end) if end > start else None

    def set_playhead(self, seconds: float | None) -> None:
        if seconds is None:
            self.playhead.hide()
        else:
            self.playhead.setPos(seconds)
            self.playhead.show()

    def _clicked(self, event) -> None:
        if not self.rate:
            return
        pos = self.wave.vb.mapSceneToView(event.scenePos())
        seconds = float(pos.x())
        self.cursor_moved.emit(seconds)
        for seg in self.segments:
            if seg.start_s <= seconds <= seg.end_s:
                self.sentence_clicked.emit(seg.index)
                return
