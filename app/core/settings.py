"""The studio's settings: one JSON file under the user config directory.

``schema_version`` says which layout a file has; older layouts are migrated on load,
unknown keys are kept (a newer studio's settings survive an older one), values of
the wrong type or out of range (``RANGES``) fall back to the default, and a file that cannot be read is set
aside (``settings.json.bad``) rather than lost. Writes are atomic.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.core import paths
from app.core.atomic import write_bytes_atomic

SCHEMA_VERSION = 1
MAX_RECENT = 10

DEFAULTS: dict = {
    "schema_version": SCHEMA_VERSION,
    "voice": "piper:joe",
    "device": "auto",
    "threads": 0,
    "speed": 1.0,
    "seed": 0,
    "gap_s": 0.3,
    "export_format": "pcm16",
    "export_loudness": None,
    "autosave_s": 30,
    "recent_projects": [],
    "window_geometry": "",
    "window_state": "",
}


# The range a numeric setting may take; a value outside (or NaN) falls back to the default.
RANGES: dict[str, tuple[float, float]] = {
    "threads": (0, 1024),
    "speed": (0.25, 4.0),
    "seed": (0, 2**63 - 1),
    "gap_s": (0.0, 10.0),
    "autosave_s": (5, 3600),
}


def settings_path() -> Path:
    return paths.config_dir() / "settings.json"


def _migrate(data: dict) -> dict:
    version = data.get("schema_version", 0)
    if version == 0:  # unversioned: "last_voice" was the key for the voice
        if "last_voice" in data and "voice" not in data:
            data["voice"] = data.pop("last_voice")
        data["schema_version"] = 1
    return data


class Settings:
    def __init__(self, values: dict | None = None):
        self.values = dict(DEFAULTS)
        for key, value in (values or {}).items():
            default = DEFAULTS.get(key)
            if key in DEFAULTS and default is not None and not isinstance(value, type(default)):
                if not (isinstance(default, float) and isinstance(value, int)) or isinstance(value, bool):
                    continue  # wrong type: keep the default
            if key in RANGES and not RANGES[key][0] <= value <= RANGES[key][1]:
                continue  # out of range (NaN included): keep the default
            if key == "recent_projects" and not all(isinstance(p, str) for p in value):
                continue
            self.values[key] = value
        self.values["schema_version"] = SCHEMA_VERSION

    def __getitem__(self, key: str):
        return self.values[key]

    def __setitem__(self, key: str, value) -> None:
        self.values[key] = value

    def add_recent(self, path: Path | str) -> None:
        entry = str(Path(path).resolve())
        recent = [p for p in self.values["recent_projects"] if p != entry]
        self.values["recent_projects"] = [entry, *recent][:MAX_RECENT]

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        path = path or settings_path()
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except (OSError, ValueError, RecursionError):  # UnicodeDecodeError and JSON's errors are ValueErrors
            path.replace(path.with_name(path.name + ".bad"))
            return cls()
        return cls(_migrate(data))

    def save(self, path: Path | None = None) -> Path:
        path = path or settings_path()
        return write_bytes_atomic(path, json.dumps(self.values, indent=1, sort_keys=True).encode("utf-8"))
