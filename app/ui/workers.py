"""Synthesis jobs on a QThreadPool: a QRunnable with a separate signals object."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, QRunnable, Signal

from app.core.engine import Engine


class JobSignals(QObject):
    started = Signal()
    stage = Signal(str, int, float)  # stage, chunk, ms
    chunk = Signal(int, object)  # chunk index, float32 audio
    finished = Signal(object)  # Take
    failed = Signal(object)  # the exception


class SynthesisJob(QRunnable):
    """Opens (or reuses) an engine and synthesizes text; cancellable between stages."""

    def __init__(self, engine: Engine, text: str, **params):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = JobSignals()
        self._engine = engine
        self._text = text
        self._params = params
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        self.signals.started.emit()
        try:
            take = self._engine.synthesize(
                text=self._text,
                on_stage=lambda stage, chunk, ms: self.signals.stage.emit(stage, chunk, ms),
                on_chunk=lambda index, audio: self.signals.chunk.emit(index, audio),
                cancelled=self._cancel.is_set,
                **self._params,
            )
        except Exception as exc:  # delivered to the GUI thread, never swallowed
            self.signals.failed.emit(exc)
            return
        self.signals.finished.emit(take)
