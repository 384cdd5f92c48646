"""Where Voice Studio keeps its files (platformdirs; VOICESTUDIO_DATA_DIR overrides)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "voicestudio"


def data_dir() -> Path:
    override = os.environ.get("VOICESTUDIO_DATA_DIR")
    path = Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def packages_dir() -> Path:
    path = data_dir() / "packages"
    path.mkdir(parents=True, exist_ok=True)
    return path
