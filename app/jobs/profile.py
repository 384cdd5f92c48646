"""A speaker profile's making (a clone's conditionals, or a style search) off the GUI thread:
its events, result, cancellation and failure delivered through a signals object."""

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
    """``model``: a Chatterbox model's id (a clone of the recording, and of ``more``), or "kokoro"
    (a style search)."""

    def __init__(
        self,
        audio: np.ndarray,
        rate: int,
        source: dict,
        settings: profile_builder.Settings,
        model: str = "kokoro",
        more: list[tuple[np.ndarray, int]] = (),
    ):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = BuildSignals()
        self.audio, self.rate, self.source, self.settings, self.model = audio, rate, source, settings, model
        self.more = list(more)  # a clone's other recordings
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        try:
            common = {"source": self.source, "settings": self.settings, "on_event": self.signals.event.emit,
                      "cancelled": self._cancel.is_set}  # fmt: skip
            if self.model == "kokoro":
                draft = profile_builder.build(self.audio, self.rate, **common)
            else:
                draft = profile_builder.clone(self.audio, self.rate, more=self.more, model=self.model, **common)
        except CancelledError:
            self.signals.cancelled.emit()
            return
        except Exception as exc:  # shown by the dialog
            self.signals.failed.emit(exc)
            return
        self.signals.finished.emit(draft)
