"""An engine for any voice a person picks: a stock voice, or a speaker profile's style pack."""

from __future__ import annotations

from app.engine.engine import Engine
from app.profiles import store


def open_engine(voice: str, **options) -> Engine:
    """``Engine.open`` for ``voice``, a stock voice id or a profile's ("profile:<name>"), whose
    pack is then spoken with on Kokoro's model; ``options`` as ``Engine.open`` takes them."""
    if store.is_profile(voice):
        return Engine.open(voice, pack=store.load(voice).pack, **options)
    return Engine.open(voice, **options)
