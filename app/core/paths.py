"""Where Voice Studio keeps its files (platformdirs; VOICESTUDIO_DATA_DIR and
VOICESTUDIO_CONFIG_DIR override)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs

APP_NAME = "voicestudio"


def _user_dir(variable: str, default) -> Path:
    override = os.environ.get(variable)
    path = Path(override) if override else Path(default(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    return _user_dir("VOICESTUDIO_DATA_DIR", platformdirs.user_data_dir)


def config_dir() -> Path:
    """Settings (VOICESTUDIO_CONFIG_DIR overrides it)."""
    return _user_dir("VOICESTUDIO_CONFIG_DIR", platformdirs.user_config_dir)


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def packages_dir() -> Path:
    path = data_dir() / "packages"
    path.mkdir(parents=True, exist_ok=True)
    return path


def bundled_models_dir() -> Path | None:
    """The stock models an app bundle ships (read-only; VOICESTUDIO_BUNDLED_MODELS overrides
    it), or None outside a bundle."""
    override = os.environ.get("VOICESTUDIO_BUNDLED_MODELS")
    if override:
        return Path(override)
    base = getattr(sys, "_MEIPASS", None)  # where a PyInstaller bundle unpacks its data
    path = Path(base) / "models" if base else None
    return path if path is not None and path.is_dir() else None


def frozen() -> bool:
    """Whether this is an app bundle (no pip, no checkout)."""
    return bool(getattr(sys, "frozen", False))
