"""An engine for any voice a person picks: a stock voice, or a speaker profile (a Chatterbox
clone's conditionals, or a Kokoro style pack)."""

from __future__ import annotations

from app.engine.engine import Engine
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
