"""Make a speaker profile from a reference recording: a Chatterbox clone (its conditionals
computed in seconds), or a Kokoro style search.

    draft = clone(*speaker_reference.load("ana.flac"), source={"file": "ana.flac"})
    profile = draft.save("Ana")   # profile:Ana, spoken by Chatterbox in Ana's voice

    draft = build(*speaker_reference.load("ana.flac"), source={"file": "ana.flac"})
    draft.preview_audio           # the best candidate speaking the search sentences
    profile = draft.save("Ana")

Qt-free: the CLI calls it directly, the studio on a worker thread with ``on_event``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine.errors import InvalidArgumentError
from app.models import manager as models
from app.profiles import speaker_reference, style_search
from app.profiles import store as profiles
from app.profiles.speaker_encoder import SpeakerEncoder, similarity


@dataclass
class Settings:
    seconds: float = 60.0
    seed: int = 0
    max_evaluations: int | None = None
    device: str = "cpu"
    threads: int = 0
    evaluate: bool = True  # measure profile vs best stock voice on held-out sentences


@dataclass
class Event:
    """What the builder is doing: ``stage`` (checking, embedding, searching, measuring,
    saving), a message, and during the search its Progress."""

    stage: str
    message: str
    progress: style_search.Progress | None = None


def stock_cache(engine) -> style_search.StockCache:
    """The stock voices' search features, cached per model file, engine version and device."""
    from app.engine.binding import native_engine

    _engine = native_engine()
    from app.core import paths

    model = models.kokoro_path()
    stat = model.stat()
    identity = {
        "model": [model.name, stat.st_size, stat.st_mtime_ns],
        "engine": _engine.version(),
        "device": engine.device,
        "sentences": list(style_search.SEARCH_SENTENCES),
    }
    return style_search.StockCache(paths.data_dir() / "cache" / "stock_features.json", identity)


def heldout_similarity(engine, encoder: SpeakerEncoder, target: np.ndarray, pack: np.ndarray) -> float:
    """Similarity to ``target`` of ``pack`` speaking the held-out sentences (not used in the search)."""
    take = engine.synthesize(text=" ".join(style_search.HELDOUT_SENTENCES), style=pack.reshape(-1, 256))
    return similarity(encoder.embed(take.audio, take.sample_rate), target)


@dataclass
class Draft:
    """A searched profile not yet saved."""

    reference: speaker_reference.Reference
    pack: np.ndarray
    embedding: np.ndarray
    preview_audio: np.ndarray | None  # at Kokoro's sample rate
    source: dict
    scores: dict
    search: dict

    def save(self, name: str, *, overwrite: bool = False) -> profiles.Profile:
        return profiles.save(
            name, **_stored(self.reference), pack=self.pack, embedding=self.embedding, source=self.source,
            scores=self.scores, search=self.search, overwrite=overwrite,
        )  # fmt: skip


def _stored(ref: speaker_reference.Reference) -> dict:
    """What a profile keeps of its reference: the prepared audio and its checks."""
    checks = [{"name": c.name, "status": c.status, "value": c.value, "detail": c.detail} for c in ref.checks]
    return {"reference": ref.audio, "sample_rate": ref.sample_rate, "checks": checks}


def _usable(audio: np.ndarray, rate: int) -> speaker_reference.Reference:
    """The reference prepared (trimmed, level-normalized), or why it cannot make a profile."""
    ref = speaker_reference.prepare(audio, rate)
    if not ref.usable:
        reasons = "; ".join(f"{c.name}: {c.detail}" for c in ref.checks if c.status == "fail")
        raise InvalidArgumentError(f"the reference cannot make a profile: {reasons}")
    return ref


def build(
    audio: np.ndarray,
    rate: int,
    *,
    source: dict | None = None,
    settings: Settings | None = None,
    on_event: Callable[[Event], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Draft:
    """Check the reference, search a style for it and (unless cancelled or told not to)
    measure it on held-out sentences. Cancelling the search keeps the best so far."""
    from app.engine.engine import Engine

    settings = settings or Settings()

    def emit(stage: str, message: str, progress=None) -> None:
        if on_event:
            on_event(Event(stage, message, progress))

    emit("checking", "checking the reference")
    ref = _usable(audio, rate)
    t0 = time.perf_counter()
    with (
        SpeakerEncoder.open(device=settings.device, threads=settings.threads) as encoder,
        Engine.open("kokoro:" + models.KOKORO_VOICES[0], device=settings.device, threads=settings.threads) as engine,
    ):
        threads = engine.threads
        emit("embedding", "embedding the reference")
        target = style_search.Target.from_audio(encoder, ref.audio, ref.sample_rate)
        packs = models.kokoro_packs()
        emit("searching", f"searching for {settings.seconds:g} s")
        preview: list = [None, None]  # the best candidate's audio so far, and its score

        def on_progress(p: style_search.Progress) -> None:
            if p.best_audio is not None:
                preview[:] = [p.best_audio, p.best]
            emit("searching", f"{p.evaluations} candidates, best similarity {p.best.similarity:.3f}", p)

        result = style_search.search(
            engine, encoder, target, packs,
            seconds=settings.seconds, max_evaluations=settings.max_evaluations, seed=settings.seed,
            on_progress=on_progress, cancelled=cancelled, stock_cache=stock_cache(engine),
        )  # fmt: skip
        # No audio of the winner: a stock voice whose features were cached, or the second
        # sentence chose another candidate than the search's best.
        if preview[0] is None or preview[1] is not result.best:
            take = engine.synthesize(text=" ".join(style_search.SEARCH_SENTENCES), style=result.pack.reshape(-1, 256))
            preview[0] = take.audio
        scores: dict = {
            "search": {
                "similarity": result.best.similarity,
                "score": result.best.total,
                "f0_hz": result.best.f0_hz,
                "stock": result.stock_scores,
            },
            "reference": {"f0_hz": target.f0_hz, "syllables_per_s": target.rate},
        }
        if settings.evaluate and not result.cancelled:
            emit("measuring", "measuring on held-out sentences")
            best_stock = max(result.stock_scores, key=result.stock_scores.get)
            stock_sim = heldout_similarity(engine, encoder, target.embedding, packs[best_stock])
            profile_sim = heldout_similarity(engine, encoder, target.embedding, result.pack)
            scores["heldout"] = {
                "sentences": list(style_search.HELDOUT_SENTENCES),
                "profile": profile_sim,
                "best_stock": {"voice": f"kokoro:{best_stock}", "similarity": stock_sim},
                "gain": profile_sim - stock_sim,
            }
    return Draft(
        reference=ref,
        pack=result.pack,
        embedding=target.embedding,
        preview_audio=preview[0],
        source=dict(source or {}, duration_s=ref.duration_s, source_rate=ref.source_rate),
        scores=scores,
        search={
            "seconds": settings.seconds,
            "seed": settings.seed,
            "max_evaluations": settings.max_evaluations,
            "evaluations": result.evaluations,
            "elapsed_s": result.elapsed_s,
            "total_s": time.perf_counter() - t0,
            "cancelled": result.cancelled,
            "base": result.base,
            "theta": result.theta,
            "history": result.history,
            "sentences": list(style_search.SEARCH_SENTENCES),
            "device": settings.device,
            "threads": threads,
        },
    )


PREVIEW_SENTENCE = "Here is my voice, made from the recording I gave."


def default_clone_model() -> str:
    """The Chatterbox model a clone is made for: Turbo where installed, else Multilingual; a
    clear error naming what to install where neither is."""
    for model in models.CHATTERBOX_MODELS:
        if models.chatterbox_installed(model):
            return model
    raise InvalidArgumentError(
        "a clone needs a Chatterbox model: run python main.py models install chatterbox-turbo --from <folder> "
        "(or chatterbox), or make a Kokoro style-search profile (--family kokoro)"
    )


@dataclass
class CloneDraft:
    """A clone not yet saved: the reference, the conditionals made of it, a preview take."""

    reference: speaker_reference.Reference
    conditionals: object  # app.engine.chatterbox.Conditionals
    model: str
    preview_audio: np.ndarray | None  # 24 kHz
    source: dict
    scores: dict

    def save(self, name: str, *, overwrite: bool = False) -> profiles.Profile:
        return profiles.save_clone(
            name, **_stored(self.reference), conditionals=self.conditionals, model=self.model, source=self.source,
            scores=self.scores, overwrite=overwrite,
        )  # fmt: skip


def clone(
    audio: np.ndarray,
    rate: int,
    *,
    more: list[tuple[np.ndarray, int]] = (),
    model: str | None = None,
    source: dict | None = None,
    settings: Settings | None = None,
    on_event: Callable[[Event], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> CloneDraft:
    """Check the reference and compute ``model``'s conditionals of it (None: default_clone_model);
    with ``settings.evaluate``, a preview sentence in the voice and, where the speaker encoder is
    installed, its similarity to the reference. ``more``: other recordings of the speaker, (audio,
    rate) each: the longest of them all after trimming is the reference (the prompts' source),
    and every one's speaker embedding goes into the voice's."""
    from app.engine.chatterbox import ChatterboxModel

    settings = settings or Settings()
    if model is not None and model not in models.CHATTERBOX_MODELS:
        raise InvalidArgumentError(f"'{model}' is no Chatterbox model ({', '.join(models.CHATTERBOX_MODELS)})")

    def emit(stage: str, message: str) -> None:
        if on_event:
            on_event(Event(stage, message))

    emit("checking", "checking the reference" + (f" and {len(more)} more recordings" if more else ""))
    refs = [_usable(a, r) for a, r in [(audio, rate), *more]]
    model = model or default_clone_model()
    best = max(range(len(refs)), key=lambda i: refs[i].duration_s)
    ref, others = refs[best], [r for i, r in enumerate(refs) if i != best]
    t0 = time.perf_counter()
    path = models.installed_path(f"{model}:{models.CHATTERBOX_VOICE}")
    with ChatterboxModel.open(path, device=settings.device, threads=settings.threads) as cb:
        emit("conditioning", f"computing {model}'s conditionals of the reference")
        conditionals = cb.conditionals(ref.audio, ref.sample_rate, more=[(r.audio, r.sample_rate) for r in others])
        scores: dict = {"conditioning_s": time.perf_counter() - t0}
        preview = None
        if settings.evaluate and not (cancelled and cancelled()):
            emit("previewing", "speaking a preview sentence in the voice")
            language = "en" if cb.variant == "multilingual" else None
            preview, _ = cb.synthesize(
                PREVIEW_SENTENCE, conditionals, language=language, seed=settings.seed, cancelled=cancelled
            )
    if preview is not None and models.speaker_encoder_installed():
        emit("measuring", "measuring the preview against the reference")
        with SpeakerEncoder.open(device=settings.device, threads=settings.threads) as encoder:
            target = encoder.embed(ref.audio, ref.sample_rate)
            scores["preview"] = {
                "sentence": PREVIEW_SENTENCE,
                "similarity": similarity(encoder.embed(preview, 24000), target),
            }
    return CloneDraft(
        reference=ref,
        conditionals=conditionals,
        model=model,
        preview_audio=preview,
        source=dict(
            source or {},
            duration_s=ref.duration_s,
            source_rate=ref.source_rate,
            reference=best,
            recordings=[{"duration_s": r.duration_s, "source_rate": r.source_rate} for r in refs],
        ),  # fmt: skip
        scores=scores,
    )
