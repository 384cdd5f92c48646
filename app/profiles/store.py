"""Speaker profiles on disk: a voice made from someone's recording.

One folder per profile under ``<data dir>/profiles/``; its ``family`` (profile.json) says which
model speaks it:

- ``profile.json``: schema_version, name, family, created, source (file, durations, rates),
  checks (the reference's pass/warn/fail list), scores (similarities), search (settings and
  outcome; Kokoro), model (Chatterbox: the model whose encoders made the conditionals);
- ``reference.flac``: the prepared reference (48 kHz, trimmed, level-normalized);
- Chatterbox (a clone): ``conditionals.npz``, the voice as Chatterbox takes it
  (app.engine.chatterbox.Conditionals);
- Kokoro (a style search): ``style.npy``, the voice pack [510, 1, 256] float32, and
  ``embedding.npy``, the reference's speaker embedding [256].

A profile is written into a temporary folder and renamed into place, so it appears whole
or not at all. Export writes the folder as one zip file (``.vsprofile``); import checks it
like a profile on disk. Voice id: ``profile:<name>``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import unicodedata
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from app.core import paths
from app.core.archive import MemberTooLarge, read_bounded
from app.core.atomic import atomic_path
from app.engine.errors import VoiceStudioError
from app.models.manager import CHATTERBOX_MODELS

SCHEMA_VERSION = 1
PREFIX = "profile:"
FAMILY_FILES = {
    "kokoro": ("profile.json", "reference.flac", "style.npy", "embedding.npy"),
    "chatterbox": ("profile.json", "reference.flac", "conditionals.npz"),
}
EXTENSION = ".vsprofile"
PACK_SHAPE = (510, 1, 256)
MAX_NAME = 64
MAX_REFERENCE_S = 600  # the reference recording (a profile keeps at most a few minutes)
# The most bytes each file of a profile may hold (on disk, and uncompressed in a .vsprofile):
# the arrays' exact sizes and room for their headers; a 48 kHz 24-bit FLAC of MAX_REFERENCE_S.
MAX_BYTES = {
    "profile.json": 1 << 20,
    "reference.flac": 128 << 20,
    "style.npy": 4 * 510 * 256 + 4096,
    "embedding.npy": 4 * 256 + 4096,
    # a speaker embedding, at most 375 + 500 prompt tokens, a 10 s prompt mel, an x-vector
    "conditionals.npz": 4 * (256 + 375 + 500 + 80 * 1001 + 192) + 8192,
}
MAX_JSON_DEPTH = 32


class ProfileError(VoiceStudioError):
    """A profile is missing, damaged, or its name is unusable."""


@dataclass
class Profile:
    name: str
    folder: Path
    meta: dict
    pack: np.ndarray | None = None  # Kokoro: [510, 1, 256]
    embedding: np.ndarray | None = None  # Kokoro: [256]
    conditionals: object | None = None  # Chatterbox: app.engine.chatterbox.Conditionals

    @property
    def family(self) -> str:
        return self.meta.get("family", "kokoro")

    @property
    def model(self) -> str:
        """The model that speaks the profile: a Chatterbox model's id, or "kokoro"."""
        return self.meta["model"] if self.family == "chatterbox" else "kokoro"

    @property
    def voice_id(self) -> str:
        return PREFIX + self.name

    def reference(self) -> tuple[np.ndarray, int]:
        import soundfile as sf

        audio, rate = sf.read(self.folder / "reference.flac", dtype="float32")
        return audio, rate


def profiles_dir() -> Path:
    path = paths.data_dir() / "profiles"
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_profile(voice_id: str) -> bool:
    return voice_id.startswith(PREFIX)


# Characters a name cannot hold: controls, invisible formatting (bidirectional overrides such
# as U+202E, zero-width joiners) and line or paragraph separators, which make one name look
# like another or break the lists it is shown in; and unassigned or private code points.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def check_name(name: str) -> str:
    if not isinstance(name, str):
        raise ProfileError("a profile name must be text")
    name = unicodedata.normalize("NFC", name).strip()
    if not name:
        raise ProfileError("a profile needs a name")
    if len(name) > MAX_NAME:
        raise ProfileError(f"a profile name has at most {MAX_NAME} characters")
    hidden = [c for c in name if unicodedata.category(c) in _HIDDEN_CATEGORIES]
    if hidden:
        codes = ", ".join(f"U+{ord(c):04X}" for c in dict.fromkeys(hidden))
        raise ProfileError(f"a profile name cannot hold control or invisible characters ({codes})")
    if "/" in name or "\\" in name:
        raise ProfileError(f"'{name}': a profile name cannot hold slashes")
    return name


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "profile"
    return slug[:MAX_NAME]


def _folder_for(name: str) -> Path:
    """A free folder for a new profile called ``name``."""
    base = profiles_dir()
    slug = _slug(name)
    candidate, n = base / slug, 2
    while candidate.exists():
        candidate, n = base / f"{slug}-{n}", n + 1
    return candidate


def _read(folder: Path, *, check_reference: bool = False) -> Profile:
    """The profile in ``folder``, every file checked; ``check_reference`` also decodes the
    reference recording (an imported file's: a profile made here wrote its own)."""
    where = folder.name

    def check_size(f: str) -> None:
        if not (folder / f).is_file():
            raise ProfileError(f"profile '{where}' is damaged: {f} is missing")
        size = (folder / f).stat().st_size
        if size > MAX_BYTES[f]:
            raise ProfileError(f"profile '{where}' is damaged: {f} has {size:,} bytes, at most {MAX_BYTES[f]:,}")

    check_size("profile.json")
    try:
        meta = json.loads((folder / "profile.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError) as exc:
        raise ProfileError(f"profile '{where}' is damaged: profile.json is unreadable ({exc})") from exc
    family = meta.get("family", "kokoro") if isinstance(meta, dict) else None
    if family not in FAMILY_FILES:
        raise ProfileError(f"profile '{where}' is damaged: family {family!r} (known: {', '.join(FAMILY_FILES)})")
    for f in FAMILY_FILES[family][1:]:
        check_size(f)
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ProfileError(f"profile '{where}' is damaged: profile.json has no name")
    try:
        check_name(meta["name"])
    except ProfileError as exc:
        raise ProfileError(f"profile '{where}' is damaged: {exc}") from exc
    if _depth(meta) > MAX_JSON_DEPTH:
        raise ProfileError(f"profile '{where}' is damaged: profile.json nests deeper than {MAX_JSON_DEPTH}")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ProfileError(
            f"profile '{meta['name']}' has schema version {version!r}; this version reads {SCHEMA_VERSION}"
        )
    if check_reference:
        _check_reference(folder / "reference.flac", meta["name"])
    if family == "chatterbox":
        return Profile(meta["name"], folder, meta, conditionals=_read_conditionals(folder, meta))
    try:
        pack = np.load(folder / "style.npy", allow_pickle=False)
        embedding = np.load(folder / "embedding.npy", allow_pickle=False)
    except Exception as exc:  # numpy's header parser raises what Python's tokenizer and literal_eval do
        raise ProfileError(f"profile '{meta['name']}' is damaged: {type(exc).__name__}: {exc}") from exc
    if pack.shape != PACK_SHAPE or pack.dtype != np.float32 or not np.all(np.isfinite(pack)):
        raise ProfileError(
            f"profile '{meta['name']}' is damaged: its style is {pack.shape} {pack.dtype},"
            f" expected {PACK_SHAPE} float32"
        )
    if embedding.shape != (256,) or not np.all(np.isfinite(embedding)):
        raise ProfileError(f"profile '{meta['name']}' is damaged: its embedding is {embedding.shape}")
    return Profile(meta["name"], folder, meta, pack, embedding.astype(np.float32))


def _read_conditionals(folder: Path, meta: dict):
    """A clone's conditionals, every array of the size Chatterbox takes."""
    from app.engine.chatterbox import Conditionals
    from app.engine.errors import InvalidArgumentError, ModelFileError

    name = meta["name"]
    if meta.get("model") not in CHATTERBOX_MODELS:
        raise ProfileError(f"profile '{name}' is damaged: model {meta.get('model')!r} is no Chatterbox model")
    try:
        c = Conditionals.load(folder / "conditionals.npz")
    except (ModelFileError, InvalidArgumentError) as exc:
        raise ProfileError(f"profile '{name}' is damaged: conditionals.npz: {exc}") from exc
    ok = (
        c.speaks
        and c.speaker_embedding.size == 256
        and c.xvector.size == 192
        and c.prompt_tokens.size <= 375
        and c.prompt_mel.shape[1] in (2 * c.gen_prompt_tokens.size, 2 * c.gen_prompt_tokens.size + 1)
    )
    if not (ok and all(t.size and 0 <= t.min() and t.max() < 6561 for t in (c.prompt_tokens, c.gen_prompt_tokens))):
        raise ProfileError(f"profile '{name}' is damaged: conditionals.npz is not a Chatterbox voice's")
    return c


def _depth(value, limit: int = 64) -> int:
    """How deeply lists and objects nest in a parsed JSON value (counting stops past ``limit``)."""
    depth, level = 0, [value]
    while level and depth <= limit:
        depth += 1
        level = [
            child
            for v in level
            if isinstance(v, dict | list)
            for child in (v.values() if isinstance(v, dict) else v)
            if isinstance(child, dict | list)
        ]
    return depth


def _check_reference(path: Path, name: str) -> None:
    """The reference decodes as audio of a sensible rate and length, every sample finite."""
    import soundfile as sf

    try:
        info = sf.info(str(path))
        if info.format != "FLAC" or not 8000 <= info.samplerate <= 192000 or info.channels != 1:
            raise ProfileError(f"profile '{name}' is damaged: reference.flac is not mono FLAC audio at 8-192 kHz")
        if info.frames > MAX_REFERENCE_S * info.samplerate:
            raise ProfileError(f"profile '{name}' is damaged: reference.flac is longer than {MAX_REFERENCE_S} s")
        audio, _ = sf.read(str(path), dtype="float32")
    except (RuntimeError, sf.LibsndfileError) as exc:
        raise ProfileError(f"profile '{name}' is damaged: reference.flac does not decode ({exc})") from exc
    if audio.size == 0 or not np.all(np.isfinite(audio)):
        raise ProfileError(f"profile '{name}' is damaged: reference.flac holds no usable audio")


def scan() -> tuple[list[Profile], list[tuple[str, str]]]:
    """Every readable profile, by name, and (folder, reason) of each one that cannot be read."""
    readable, broken = [], []
    for folder in sorted(profiles_dir().iterdir()):
        if folder.is_dir() and not folder.name.startswith("."):
            try:
                readable.append(_read(folder))
            except ProfileError as exc:
                broken.append((folder.name, str(exc)))
    return sorted(readable, key=lambda p: p.name.lower()), broken


def list_profiles() -> list[Profile]:
    """Every readable profile, by name. Damaged ones are left out (``damaged()`` names them)."""
    return scan()[0]


def voice_ids() -> list[str]:
    return [p.voice_id for p in list_profiles()]


def damaged() -> list[tuple[str, str]]:
    """(folder, reason) of each profile folder that cannot be read."""
    return scan()[1]


def _find_folder(name: str) -> Path | None:
    for folder in sorted(profiles_dir().iterdir()):
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        try:
            meta = json.loads((folder / "profile.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            meta = {}
        if isinstance(meta, dict) and meta.get("name") == name:
            return folder
    return None


def load(name_or_id: str) -> Profile:
    name = name_or_id[len(PREFIX) :] if is_profile(name_or_id) else name_or_id
    folder = _find_folder(name)
    if folder is None:
        known = ", ".join(p.name for p in list_profiles()) or "none yet"
        raise ProfileError(f"no profile named '{name}' (profiles: {known})")
    return _read(folder)


def exists(name: str) -> bool:
    return _find_folder(name) is not None


def _write_reference(folder: Path, reference: np.ndarray, rate: int) -> None:
    import soundfile as sf

    sf.write(folder / "reference.flac", np.asarray(reference, dtype=np.float32), rate, subtype="PCM_24")


def _place(tmp: Path, folder: Path) -> None:
    """Move a complete temporary folder into place (one rename)."""
    for f in tmp.iterdir():
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, folder)


def _store(name: str, meta: dict, write: Callable[[Path], None], overwrite: bool) -> Profile:
    """A profile of ``meta`` whose files ``write(folder)`` makes, placed whole (replacing the
    profile of that name where ``overwrite``)."""
    existing = _find_folder(name)
    if existing is not None and not overwrite:
        raise ProfileError(f"a profile named '{name}' exists already")
    meta = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **meta,
    }
    tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=profiles_dir()))
    try:
        (tmp / "profile.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        write(tmp)
        if existing is not None:
            trash = Path(tempfile.mkdtemp(prefix=".old-", dir=profiles_dir()))
            os.replace(existing, trash / "p")
            _place(tmp, existing)
            shutil.rmtree(trash, ignore_errors=True)
            folder = existing
        else:
            folder = _folder_for(name)
            _place(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _read(folder)


def save(
    name: str,
    *,
    reference: np.ndarray,
    sample_rate: int,
    pack: np.ndarray,
    embedding: np.ndarray,
    source: dict,
    checks: list[dict],
    scores: dict,
    search: dict,
    overwrite: bool = False,
) -> Profile:
    """A Kokoro profile: the style pack a search found for the reference."""
    name = check_name(name)
    pack = np.asarray(pack, dtype=np.float32).reshape(PACK_SHAPE)
    if not np.all(np.isfinite(pack)):
        raise ProfileError("the style holds NaN or infinite values")

    def write(folder: Path) -> None:
        _write_reference(folder, reference, sample_rate)
        np.save(folder / "style.npy", np.ascontiguousarray(pack, dtype=np.float32))
        np.save(folder / "embedding.npy", np.ascontiguousarray(embedding, dtype=np.float32))

    meta = {"family": "kokoro", "source": source, "checks": checks, "scores": scores, "search": search}
    return _store(name, meta, write, overwrite)


def save_clone(
    name: str,
    *,
    reference: np.ndarray,
    sample_rate: int,
    conditionals,
    model: str,
    source: dict,
    checks: list[dict],
    scores: dict,
    overwrite: bool = False,
) -> Profile:
    """A Chatterbox profile: the conditionals ``model``'s encoders made of the reference."""
    name = check_name(name)
    if model not in CHATTERBOX_MODELS:
        raise ProfileError(f"'{model}' is no Chatterbox model ({', '.join(CHATTERBOX_MODELS)})")

    def write(folder: Path) -> None:
        _write_reference(folder, reference, sample_rate)
        conditionals.save(folder / "conditionals.npz")

    meta = {"family": "chatterbox", "model": model, "source": source, "checks": checks, "scores": scores}
    return _store(name, meta, write, overwrite)


def delete(name: str) -> None:
    folder = _find_folder(name)
    if folder is None:
        raise ProfileError(f"no profile named '{name}'")
    trash = Path(tempfile.mkdtemp(prefix=".del-", dir=profiles_dir()))
    os.replace(folder, trash / "p")  # gone from the list at once, even if removal is interrupted
    shutil.rmtree(trash, ignore_errors=True)


def rename(old: str, new: str) -> Profile:
    new = check_name(new)
    profile = load(old)
    if new != old and exists(new):
        raise ProfileError(f"a profile named '{new}' exists already")
    meta = dict(profile.meta, name=new)
    path = profile.folder / "profile.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return _read(profile.folder)


def export(name: str, dest: Path | str) -> Path:
    """Write the profile as one file (a zip of its folder)."""
    profile = load(name)
    dest = Path(dest)
    if dest.suffix != EXTENSION:
        dest = dest.with_name(dest.name + EXTENSION)
    with atomic_path(dest) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for f in FAMILY_FILES[profile.family]:
                zf.write(profile.folder / f, f)
    return dest


def import_file(path: Path | str, *, name: str | None = None) -> Profile:
    """Add the profile in an exported file; ``name`` renames it (needed when taken)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            members = set(zf.namelist())
            files = FAMILY_FILES["chatterbox" if "conditionals.npz" in members else "kokoro"]
            missing = [f for f in files if f not in members]
            if missing:
                raise ProfileError(f"{path.name}: not a profile file ({', '.join(missing)} missing)")
            data = {f: read_bounded(zf, f, MAX_BYTES[f]) for f in files}
    except (OSError, zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError, MemberTooLarge) as exc:
        raise ProfileError(f"{path.name}: not a profile file ({exc})") from exc
    tmp = Path(tempfile.mkdtemp(prefix=".imp-", dir=profiles_dir()))
    try:
        for f, blob in data.items():
            (tmp / f).write_bytes(blob)
        profile = _read(tmp, check_reference=True)  # validates everything before it becomes visible
        new_name = check_name(name or profile.name)
        if exists(new_name):
            raise ProfileError(f"a profile named '{new_name}' exists already; import it under another name")
        if new_name != profile.name:
            meta = dict(profile.meta, name=new_name)
            (tmp / "profile.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        folder = _folder_for(new_name)
        _place(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _read(folder)
