"""The studio's log file (data directory), named in every error dialog."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

from app.core import paths


def log_path() -> Path:
    directory = paths.data_dir() / "logs"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "studio.log"


def setup_logging() -> Path:
    """Log to the rotating studio log (once per process); returns its path."""
    path = log_path()
    root = logging.getLogger()
    if not any(getattr(h, "_voicestudio", False) for h in root.handlers):
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=2_000_000, backupCount=3, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._voicestudio = True
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    return path
