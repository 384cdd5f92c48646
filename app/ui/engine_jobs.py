"""The studio's engine and jobs: an engine opened (and reopened) in a worker, synthesis jobs
queued on it, their takes placed."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from PySide6.QtCore import QThreadPool
from PySide6.QtWidgets import QFileDialog

from app.core import lexicon
from app.core.project import lost_symbols, new_take
from app.engine.engine import Engine
from app.engine.errors import InvalidArgumentError
from app.jobs.workers import OpenEngineJob, PreviewJob, ReadingJob, SynthesisJob
from app.models import manager as models
from app.profiles import speaker_reference
from app.profiles.voices import speaking_model

log = logging.getLogger("voicestudio.ui")


class EngineJobsMixin:
    """Methods of StudioWindow (app/ui/main.py), which has the state they use."""

    # -- engine ---------------------------------------------------------------
    def _desired_spec(self, voice: str | None = None) -> tuple:
        return (voice or self.project.voice, self.inspector.device.currentData(), self.inspector.engine_threads())

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
    def synthesize(self, which: str = "all", chapter: int | None = None) -> bool:
        """Queue a job for the current sentence, the stale ones, all, or a new take of the current
        one; for "stale" and "all", those of ``chapter`` alone where given (1: the first heading's).

        Returns whether a job was queued (``job_added`` follows once the engine is open)."""
        self.editor.flush()
        project = self.project
        if which in ("current", "regenerate"):
            index = self.editor.current_sentence()
            indices = [index] if index >= 0 else []
        else:
            indices = project.to_synthesize(which)
            if chapter is not None:
                within = project.chapter_range(chapter)
                indices = [i for i in indices if i in within]
        if not indices:
            self.statusBar().showMessage("nothing to synthesize", 4000)
            return False
        # A job for each voice and settings the script's [voice] and [speed] tags give its
        # sentences (in the order they first come), each on an engine of its voice.
        for voice, settings, params, items in project.synthesis_groups(indices):
            if which == "regenerate":
                params["seed"] = settings["seed"] + len(project.sentences[indices[0]].takes)
            params["lexicon"] = project.pronunciations()
            self.with_engine(
                lambda engine, v=voice, it=items, st=settings, pa=params: self._start_job(engine, it, which, st, pa, v),
                voice=voice,
            )
        return True

    def show_reading(self) -> None:
        """How the current sentence is read (its phonemes), in the inspector: numbers, dates and
        abbreviations as the voice's front end says them, before anything is synthesized."""
        index = self.editor.current_sentence()
        if index < 0:
            return
        text, voice = self.project.sentences[index].text, self.project.sentence_voice(index)
        self.inspector.reading.setText("…")

        def start(engine: Engine) -> None:
            job = ReadingJob(engine, text, self.project.pronunciations())
            job.signals.done.connect(self.inspector.reading.setText)
            job.signals.failed.connect(lambda exc: self.show_error(exc))
            self._run_kept(job, self.synth_pool, job.signals.done, job.signals.failed)

        self.with_engine(start, voice=voice)

    def preview_pronunciation(self, word: str, pronunciation: str) -> None:
        """Say ``word`` as a lexicon entry has it (whatever its part of speech), in the project's
        voice; nothing is kept."""
        word = lexicon.split_key(word)[0]
        entries, seed = {word: pronunciation}, self.project.settings["seed"]

        def start(engine: Engine) -> None:
            job = SynthesisJob(engine, [(-1, word)], kind="preview", lexicon=entries, seed=seed)
            job.signals.sentence_done.connect(
                lambda _, take: self._play_clip(np.asarray(take.audio, dtype=np.float32), take.sample_rate)
            )
            job.signals.failed.connect(lambda _, exc: self.show_error(exc))
            self._run_kept(job, self.synth_pool, job.signals.finished, job.signals.failed)

        self.with_engine(start)

    def revoice_current(self, recording: str | Path | None = None) -> bool:
        """A new take of the current sentence: its current take, or the audio file ``recording``
        (a take read from a file: a person's own reading of the line, an imported clip),
        re-voiced into the project's voice (a Chatterbox voice: a model's stock voice or a
        clone's) by S3Gen alone. Returns whether a job was queued."""
        self.editor.flush()
        project = self.project
        index = self.editor.current_sentence()
        sentence = project.sentences[index] if 0 <= index < len(project.sentences) else None
        if sentence is None or (recording is None and sentence.take is None):
            what = (
                "no sentence to re-voice into" if sentence is None else "the current sentence has no take to re-voice"
            )
            self.statusBar().showMessage(what, 4000)
            return False
        if speaking_model(project.voice) not in models.CHATTERBOX_MODELS:
            self.show_error(
                InvalidArgumentError(
                    f"re-voicing takes a Chatterbox voice (a model's stock voice or a clone's profile); "
                    f"the project's voice is {project.voice}"
                )
            )
            return False
        if recording is not None:
            try:
                source = speaker_reference.load(recording)
            except InvalidArgumentError as exc:
                self.show_error(exc)
                return False
        else:
            source = (sentence.take.audio, sentence.take.sample_rate)
        settings = dict(project.settings)
        params = {"source": source, "seed": settings["seed"] + len(sentence.takes)}
        items = [(index, sentence.text)]
        self.with_engine(lambda engine: self._start_job(engine, items, "revoice", settings, params))
        return True

    def revoice_recording_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Re-voice a recording into the current sentence", "",
            "Audio (*.wav *.flac *.ogg *.mp3);;All files (*)",
        )  # fmt: skip
        if path:
            self.revoice_current(path)

    def _start_job(
        self, engine: Engine, items: list, kind: str, settings: dict, params: dict, voice: str | None = None
    ) -> None:
        job = SynthesisJob(engine, items, kind=kind, **params)
        job.voice, job.settings = voice or self.project.voice, settings
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
        take = new_take(text, job.voice, job.settings, job.lexicon, etake.audio, etake.sample_rate, etake.timings)
        self.project.add_take(index, take)
        self._after_takes_changed(index, soon=True)
        left = job.remaining_s()
        if left is not None and job.done < len(job.items):  # a long render: how far, how long still
            minutes, seconds = divmod(int(round(left)), 60)
            self.statusBar().showMessage(
                f"synthesizing: {job.done} of {len(job.items)} sentences, about "
                + (f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s")
                + " left"
            )
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
        sentences = self.project.sentences
        takes = [(i, sentences[i].take) for i, _ in job.items if i < len(sentences) and sentences[i].take is not None]
        lost = [(i, lost_symbols(t)) for i, t in takes if lost_symbols(t)]
        if lost:  # never silently: which sentences lost what, the voice cannot read or pronounce
            where = "; ".join(f"sentence {i + 1}: {what}" for i, what in lost[:3]) + (" …" if len(lost) > 3 else "")
            self.statusBar().showMessage(f"job {job_id} {job.state}; not read aloud: {where}", 15000)
        else:
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

    def _run_kept(self, job, pool: QThreadPool, *ended) -> None:
        """Start a short job on ``pool``, kept alive until one of its ``ended`` signals comes."""
        self._previews.add(job)
        for signal in ended:
            signal.connect(lambda *_: self._previews.discard(job))
        pool.start(job)

    def busy(self) -> bool:
        """A synthesis job is queued, running, or has takes on their way to the GUI thread."""
        return any(not job.ended for job in self.jobs.values() if job.kind != "preview")

    def preview_voice(self, voice: str) -> None:
        text = f"This is {voice.split(':')[-1]}, one of the voices of Voice Studio."
        if models.is_kokoro_hub(voice) and not models.is_installed(voice) and models.kokoro_installed():
            # Heard before it is installed: its pack from the hub, spoken by the packaged model.
            job = PreviewJob(voice, text, self.inspector.device.currentData(), self.inspector.engine_threads())
            job.signals.done.connect(self._play_clip)
            job.signals.failed.connect(self.show_error)
            self.statusBar().showMessage(f"previewing {voice}: its voice pack from the hub…", 4000)
            self._run_kept(job, QThreadPool.globalInstance(), job.signals.done, job.signals.failed)
            return

        def start(engine: Engine) -> None:
            job = SynthesisJob(engine, [(-1, text)], kind="preview")
            job.signals.sentence_done.connect(lambda _, take: self._play_clip(take.audio, take.sample_rate))
            job.signals.failed.connect(lambda _, exc: self.show_error(exc))
            self.jobs[job.id] = job
            self.synth_pool.start(job)

        self.with_engine(start, voice=voice)


def _placement_note(engine: Engine) -> str:
    """Where the stages run: every one on the device, or which ops went to the CPU instead."""
    if engine.device == "cpu":
        return ""
    moved = {stage: ops for stage, ops in engine.fallback_ops.items() if ops}
    if not moved:
        return f"\nevery stage runs on {engine.device}"
    return "\non the CPU instead: " + "; ".join(f"{stage}: {', '.join(ops)}" for stage, ops in moved.items())
