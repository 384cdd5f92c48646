"""Locate libespeak-ng and its data from the espeakng-loader wheel."""

from __future__ import annotations

from pathlib import Path

from app.engine.errors import PhonemizerError


def espeak_paths() -> tuple[str, str]:
    """(library path, data directory) of the installed espeakng-loader."""
    try:
        import espeakng_loader
    except ImportError as exc:
        raise PhonemizerError("espeakng-loader is not installed; text input needs it") from exc
    library = Path(espeakng_loader.get_library_path())
    data = Path(espeakng_loader.get_data_path())
    if not library.is_file():
        raise PhonemizerError(f"espeak-ng library missing at {library}")
    return str(library), str(data)
