"""Where Voice Studio keeps its files (platformdirs; VOICESTUDIO_DATA_DIR and
VOICESTUDIO_CONFIG_DIR override)."""

from __future__ import annotations

import os
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
