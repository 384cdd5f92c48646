"""A speaker profile's search off the GUI thread: its events, result, cancellation and failure
delivered through a signals object."""

from __future__ import annotations

import threading

import numpy as np
from PySide6.QtCore import QObject, QRunnable, Signal

from app.engine.errors import CancelledError
from app.profiles import builder as profile_builder


class BuildSignals(QObject):
    event = Signal(object)  # profile_builder.Event
    finished = Signal(object)  # Draft
    cancelled = Signal()
    failed = Signal(object)


class BuildJob(QRunnable):
    def __init__(self, audio: np.ndarray, rate: int, source: dict, settings: profile_builder.Settings):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = BuildSignals()
        self.audio, self.rate, self.source, self.settings = audio, rate, source, settings
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        try:
            draft = profile_builder.build(
                self.audio, self.rate, source=self.source, settings=self.settings,
                on_event=self.signals.event.emit, cancelled=self._cancel.is_set,
            )  # fmt: skip
        except CancelledError:
            self.signals.cancelled.emit()
            return
        except Exception as exc:  # shown by the dialog
            self.signals.failed.emit(exc)
            return
        self.signals.finished.emit(draft)
