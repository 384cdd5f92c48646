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

from app.core import lexicon
from app.core.project import time_left
from app.core.script import read_as, say_as_tags
from app.engine import sentences
from app.engine.engine import Engine
from app.engine.errors import CancelledError, NothingToSpeakError
from app.profiles.voices import open_engine

_ids = itertools.count(1)

# Sentences a GPU engine synthesizes in one call, their sentences batched together (their
# takes arrive together, a few hundred milliseconds apart at most) and divided between the
# engine's workers (opened with workers=None: up to AUTO_WORKERS contexts on a CUDA
# device, a thread each). On the CPU, where a batch saves little, each sentence is its own call and its take
# arrives when it is ready.
GPU_BATCH = 16


def batch_size(engine: Engine) -> int:
    return 1 if engine.device == "cpu" else GPU_BATCH


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
    """Synthesizes sentences in order with one engine; cancellable between and inside sentences.

    On a GPU the sentences go in groups of GPU_BATCH, each group one batched call."""

    def __init__(
        self,
        engine: Engine,
        items: list[tuple[int, str]],
        kind: str = "synthesize",
        lexicon: dict[str, str] | None = None,
        **params,
    ):
        super().__init__()
        self.lexicon = dict(lexicon or {})  # pronunciations (app.core.lexicon) the texts are read with
        self.setAutoDelete(False)
        self.id = next(_ids)
        self.kind = kind
        self.items = list(items)
        self.texts = dict(self.items)  # sentence index -> the text it was synthesized from
        self.signals = JobSignals()
        self.state = "queued"
        self.done = 0
        self.ended = False  # set on the GUI thread once the job's last signal was handled
        self.started_at: float | None = None  # time.monotonic() when it began running
        self.engine = engine
        self._params = params
        self._cancel = threading.Event()

    def remaining_s(self) -> float | None:
        """An estimate of the seconds the job still needs, from the characters done so far and
        the time they took (None before the first sentence is done)."""
        if not self.done or self.started_at is None:
            return None
        chars = [len(text) for _, text in self.items]
        return time_left(max(sum(chars[: self.done]), 1), sum(chars), time.monotonic() - self.started_at)

    def cancel(self) -> None:
        self._cancel.set()
        if self.state == "queued":
            self.state = "cancelled"

    def run(self) -> None:
        if self._cancel.is_set():
            self.signals.cancelled.emit(self.id)
            return
        self.state = "running"
        self.started_at = time.monotonic()
        self.signals.started.emit(self.id)
        try:
            size = 1 if self.kind == "revoice" else batch_size(self.engine)
            for start in range(0, len(self.items), size):
                group = self.items[start : start + size]
                if len(group) == 1:
                    self._alone(*group[0])
                    continue
                try:
                    self._together(group)
                except NothingToSpeakError:  # one at a time: the takes before that sentence stay
                    for index, text in group:
                        self._alone(index, text)
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

    def _on_stage(self, stage: str, chunk: int, ms: float) -> None:
        self.signals.stage.emit(stage, chunk, ms)

    def _alone(self, index: int, text: str) -> None:
        if self._cancel.is_set():
            raise CancelledError("cancelled")
        self.signals.sentence_started.emit(self.id, index)
        if self.kind == "revoice":  # params: source (the take's audio and rate), seed
            audio, rate = self._params["source"]
            take = self.engine.revoice(
                audio, rate, seed=self._params["seed"], cancelled=self._cancel.is_set,
                on_chunk=lambda _, piece: self.signals.chunk.emit(index, piece),
            )  # fmt: skip
            self.done += 1
            self.signals.sentence_done.emit(index, take)
            return
        take = sentences.speak(
            self.engine, text, self.lexicon,
            on_stage=self._on_stage,
            on_chunk=lambda _, audio: self.signals.chunk.emit(index, audio),
            cancelled=self._cancel.is_set,
            **self._params,
        )  # fmt: skip
        self.done += 1
        self.signals.sentence_done.emit(index, take)

    def _together(self, group: list[tuple[int, str]]) -> None:
        """The group's sentences in one call (batched); each still gets the take it gets alone."""
        if self._cancel.is_set():
            raise CancelledError("cancelled")
        if any(lexicon.used(text, self.lexicon) or say_as_tags(text) for _, text in group):  # one at a time
            for index, text in group:
                self._alone(index, text)
            return
        for index, _ in group:
            self.signals.sentence_started.emit(self.id, index)
        takes = self.engine.synthesize_many(
            [text for _, text in group],
            on_stage=self._on_stage,
            cancelled=self._cancel.is_set,
            batch=GPU_BATCH,
            **self._params,
        )
        for (index, text), take in zip(group, takes, strict=True):
            take.timings["unspoken"] = self.engine.unspoken(read_as(text)[0])
            if (timed := sentences.word_times(self.engine, text, {"text": text}, take, {})) is not None:
                take.timings["words"] = timed
            self.signals.chunk.emit(index, take.audio)
            self.done += 1
            self.signals.sentence_done.emit(index, take)


class ReadingSignals(QObject):
    done = Signal(str)  # the phonemes, a sentence a line
    failed = Signal(object)


class ReadingJob(QRunnable):
    """How a sentence is read, on the engine's thread: its phonemes after its "say as" tags and
    the lexicon (lexicon.engine_input, as a synthesis reads it), or its text where the voice
    reads no phonemes."""

    def __init__(self, engine: Engine, text: str, lexicon: dict[str, str]):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = ReadingSignals()
        self.engine, self.text, self.lexicon = engine, text, lexicon

    def run(self) -> None:
        try:
            read = lexicon.engine_input(self.engine, self.text, self.lexicon)
            if self.engine.takes_phonemes:
                reading = "\n".join(lexicon.phoneme_lines(self.engine, read))
            else:
                reading = f"read as written: {read['text']}"
        except Exception as exc:  # delivered to the GUI thread, never swallowed
            self.signals.failed.emit(exc)
            return
        self.signals.done.emit(reading)


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
            engine = open_engine(self.voice, device=self.device, threads=self.threads, workers=None)
        except Exception as exc:
            self.signals.failed.emit(exc)
            return
        self.signals.opened.emit(engine, (time.perf_counter() - start) * 1e3)


class InstallSignals(QObject):
    progress = Signal(float, str)  # fraction, message
    finished = Signal(str)  # voice id
    cancelled = Signal(str)
    failed = Signal(str, object)  # voice id, the exception


class InstallJob(QRunnable):
    """Installs a voice (a download from the hub or a package, then its conversion) in a worker,
    its progress reported and cancellable while it downloads."""

    def __init__(self, voice: str):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = InstallSignals()
        self.voice = voice
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:
        from app.models import manager as models

        try:
            models.install(self.voice, progress=self.signals.progress.emit, cancelled=self._cancel.is_set)
        except CancelledError:
            self.signals.cancelled.emit(self.voice)
            return
        except Exception as exc:  # shown by the panel
            self.signals.failed.emit(self.voice, exc)
            return
        self.signals.finished.emit(self.voice)


class PreviewSignals(QObject):
    done = Signal(object, int)  # float32 audio, sample rate
    failed = Signal(object)


class PreviewJob(QRunnable):
    """A catalogue Kokoro voice heard before it is installed: its voice pack downloaded into the
    download cache (checked against the catalogue, about half a megabyte), spoken by the packaged
    model, nothing installed."""

    def __init__(self, voice: str, text: str, device: str, threads: int):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = PreviewSignals()
        self.voice, self.text, self.device, self.threads = voice, text, device, threads

    def run(self) -> None:
        from app.models import manager as models

        try:
            pack = models.kokoro_preview_pack(self.voice)
            with Engine.open(self.voice, device=self.device, threads=self.threads, pack=pack) as engine:
                take = engine.synthesize(text=self.text)
        except Exception as exc:  # shown by the window
            self.signals.failed.emit(exc)
            return
        self.signals.done.emit(take.audio, take.sample_rate)
