"""An engine for any voice a person picks: a stock voice, or a speaker profile (a Chatterbox
clone's conditionals, or a Kokoro style pack)."""

from __future__ import annotations

import functools

from app.engine.engine import Engine
from app.models import manager as models
from app.profiles import store


def open_engine(voice: str, **options) -> Engine:
    """``Engine.open`` for ``voice``, a stock voice id or a profile's ("profile:<name>"), spoken
    by the profile's model; ``options`` as ``Engine.open`` takes them."""
    if store.is_profile(voice):
        profile = store.load(voice)
        if profile.family == "chatterbox":
            return Engine.open(voice, clone=(profile.model, profile.conditionals), **options)
        return Engine.open(voice, pack=profile.pack, **options)
    return Engine.open(voice, **options)


def speaking_model(voice: str) -> str:
    """The model that speaks ``voice``: its own family's ("piper", "kokoro", a Chatterbox model's
    id), or for a profile the one it was made for (unreadable: "kokoro", whose controls are
    the broadest)."""
    if store.is_profile(voice):
        try:
            return store.load(voice).model
        except store.ProfileError:
            return "kokoro"
    return voice.split(":", 1)[0]


def phoneme_symbols(voice_id: str) -> frozenset[str] | None:
    """The phoneme symbols a voice reads (its model's inventory: Piper's phoneme map, Kokoro's
    vocabulary), to check IPA against; None for a voice that reads no phonemes (Chatterbox) or
    whose model is not installed."""
    family = speaking_model(voice_id)
    try:
        if family == "kokoro" or models.is_kokoro(voice_id):
            path, key = models.kokoro_path(), "kokoro.vocab_symbols"
        elif family == "piper":
            path, key = models.installed_path(voice_id), "piper.phonemes"
        else:
            return None
        return _symbols(str(path), key)
    except (OSError, KeyError, ValueError):
        return None


@functools.lru_cache(maxsize=8)
def _symbols(path: str, key: str) -> frozenset[str]:
    import gguf

    field = gguf.GGUFReader(path).fields[key]
    return frozenset(str(bytes(field.parts[i]), "utf-8") for i in field.data)
