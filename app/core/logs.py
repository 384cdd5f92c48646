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
    """Log to the rotating studio log of the data directory; returns its path. The handler
    is added once per process, and moved where the data directory has moved (the log named
    in an error dialog is the one written)."""
    path = log_path()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_voicestudio", False)]:
        if Path(old.baseFilename) == path.resolve():
            return path
        root.removeHandler(old)
        old.close()
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=2_000_000, backupCount=3, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler._voicestudio = True
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return path
