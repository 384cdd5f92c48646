"""Work off the GUI thread: QRunnables with a separate signals object each.

Synthesis jobs run one at a time on their own single-thread pool (an engine context
serves one caller at a time; queued jobs wait their turn and show as queued); opening
an engine runs on the global pool. Every signal is emitted from the worker and
delivered queued on the GUI thread.
"""

from __future__ import annotations

import itertools
import threading
import time

from PySide6.QtCore import QObject, QRunnable, Signal

from app.core.engine import Engine
from app.core.errors import CancelledError

_ids = itertools.count(1)


class JobSignals(QObject):
    started = Signal(int)  # job id
    sentence_started = Signal(int, int)  # job id, sentence index
    stage = Signal(str, int, float)  # stage, chunk, ms
    chunk = Signal(int, object)  # sentence index, float32 audio of one engine chunk
    sentence_done = Signal(int, object)  # sentence index, engine Take
    finished = Signal(int)  # job id: every sentence done
    cancelled = Signal(int)  # job id: stopped on request; sentences done so far keep their takes
    failed = Signal(int, object)  # job id, the exception


class SynthesisJob(QRunnable):
    """Synthesizes sentences in order with one engine; cancellable between and inside sentences."""

    def __init__(self, engine: Engine, items: list[tuple[int, str]], kind: str = "synthesize", **params):
        super().__init__()
        self.setAutoDelete(False)
        self.id = next(_ids)
        self.kind = kind
        self.items = list(items)
        self.texts = dict(self.items)  # sentence index -> the text it was synthesized from
        self.signals = JobSignals()
        self.state = "queued"
        self.done = 0
        self.ended = False  # set on the GUI thread once the job's last signal was handled
        self.engine = engine
        self._params = params
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()
        if self.state == "queued":
            self.state = "cancelled"

    def run(self) -> None:
        if self._cancel.is_set():
            self.signals.cancelled.emit(self.id)
            return
        self.state = "running"
        self.signals.started.emit(self.id)
        try:
            for index, text in self.items:
                if self._cancel.is_set():
                    raise CancelledError("cancelled")
                self.signals.sentence_started.emit(self.id, index)
                take = self.engine.synthesize(
                    text=text,
                    on_stage=lambda stage, chunk, ms: self.signals.stage.emit(stage, chunk, ms),
                    on_chunk=lambda _, audio, index=index: self.signals.chunk.emit(index, audio),
                    cancelled=self._cancel.is_set,
                    **self._params,
                )
                self.done += 1
                self.signals.sentence_done.emit(index, take)
        except CancelledError:
            self.state = "cancelled"
            self.signals.cancelled.emit(self.id)
            return
        except Exception as exc:  # delivered to the GUI thread, never swallowed
            self.state = "failed"
            self.signals.failed.emit(self.id, exc)
            return
        self.state = "done"
        self.signals.finished.emit(self.id)


class EngineSignals(QObject):
    opened = Signal(object, float)  # Engine, ms
    failed = Signal(object)


class OpenEngineJob(QRunnable):
    """Opens a voice on a device in a worker (loading and context setup stay off the GUI thread)."""

    def __init__(self, voice: str, device: str, threads: int):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = EngineSignals()
        self.voice, self.device, self.threads = voice, device, threads

    def run(self) -> None:
        start = time.perf_counter()
        try:
            engine = Engine.open(self.voice, device=self.device, threads=self.threads)
        except Exception as exc:
            self.signals.failed.emit(exc)
            return
        self.signals.opened.emit(engine, (time.perf_counter() - start) * 1e3)
