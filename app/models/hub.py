"""Models from the Hugging Face Hub, pinned by a reviewed catalogue.

``resources/catalogue.json`` names each voice's repository, its revision (a commit) and every
file it takes with the file's size and digest: the SHA-256 the hub keeps for a large (LFS) file,
the git blob SHA-1 for a small one; both are what the hub itself reports as the file's ETag.
``huggingface_hub`` downloads into its own cache (its layout, resuming an interrupted file, the
``HF_ENDPOINT``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` settings), and every file
is checked against the catalogue before anything reads it: a file that differs is deleted from
the cache and refused.

``VOICESTUDIO_CATALOGUE`` names another catalogue file (a mirror's, or a test's).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.engine.errors import CancelledError, ModelFileError, VoiceStudioError

CATALOGUE = Path(__file__).resolve().parents[2] / "resources" / "catalogue.json"
FAMILIES = ("piper", "kokoro", "chatterbox")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TRUE = {"1", "ON", "YES", "TRUE"}

Progress = Callable[[float, str], None]


class HubError(VoiceStudioError):
    """A file could not be downloaded from the hub, or is not the file the catalogue pins."""


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repository
    size: int
    sha256: str | None = None  # a large (LFS) file's
    git_sha1: str | None = None  # a small file's git blob id

    def check(self, local: Path) -> str | None:
        """None if ``local`` is this file, else what differs."""
        size = local.stat().st_size
        if size != self.size:
            return f"{size} bytes, not the catalogue's {self.size}"
        if self.sha256:
            digest = hashlib.sha256()
            header = b""
        else:
            digest = hashlib.sha1()  # the git blob id: sha1 of "blob <size>\0" and the bytes
            header = b"blob %d\0" % size
        digest.update(header)
        with open(local, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        want = self.sha256 or self.git_sha1
        got = digest.hexdigest()
        return None if got == want else f"{'sha256' if self.sha256 else 'git sha1'} {got}, not the catalogue's {want}"


@dataclass(frozen=True)
class HubEntry:
    voice_id: str  # "family:name"
    family: str
    language: str
    quality: str
    licence: str  # as the voice's model card states it, shown before a download
    repo: str
    revision: str  # a commit
    files: tuple[HubFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def gguf_name(self) -> str:
        return self.voice_id.replace(":", "-") + ".gguf"

    @property
    def source(self) -> str:
        return f"{self.repo}@{self.revision[:12]}"

    def file(self, suffix: str) -> HubFile:
        matches = [f for f in self.files if f.path.endswith(suffix)]
        if len(matches) != 1:
            raise ModelFileError(f"catalogue entry {self.voice_id} has {len(matches)} files ending in {suffix!r}")
        return matches[0]


def catalogue_path() -> Path:
    return Path(os.environ.get("VOICESTUDIO_CATALOGUE") or CATALOGUE)


def catalogue() -> dict[str, HubEntry]:
    """The catalogue's entries by voice id, each checked for what a download relies on."""
    path = catalogue_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        entries = {}
        for item in raw["voices"]:
            files = tuple(HubFile(f["path"], int(f["size"]), f.get("sha256"), f.get("git_sha1")) for f in item["files"])
            entry = HubEntry(
                item["id"], item["family"], item["language"], item["quality"], item["licence"], item["repo"],
                item["revision"], files,
            )  # fmt: skip
            _check_entry(entry)
            if entry.voice_id in entries:
                raise ValueError(f"{entry.voice_id} twice")
            entries[entry.voice_id] = entry
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"the voice catalogue {path} is unreadable ({e})") from None
    return entries


def _check_entry(e: HubEntry) -> None:
    if e.family not in FAMILIES:
        raise ValueError(f"{e.voice_id}: family {e.family!r} (the hub's families: {', '.join(FAMILIES)})")
    if e.family == "chatterbox":  # a model's files: its id is the model's stock voice
        from app.models.manager import CHATTERBOX_MODELS, CHATTERBOX_VOICE

        if e.voice_id not in [f"{m}:{CHATTERBOX_VOICE}" for m in CHATTERBOX_MODELS]:
            raise ValueError(f"{e.voice_id}: a Chatterbox entry is one of its models' stock voices")
    elif not e.voice_id.startswith(e.family + ":"):
        raise ValueError(f"{e.voice_id}: family {e.family!r} (the hub's families: {', '.join(FAMILIES)})")
    if e.family == "kokoro":  # a voice pack the packaged model speaks
        from app.models.manager import KOKORO_PACK_BYTES, KOKORO_VOICES

        if e.voice_id.split(":", 1)[1] in KOKORO_VOICES:
            raise ValueError(f"{e.voice_id}: a packaged Kokoro voice")
        if len(e.files) != 1 or e.files[0].size != KOKORO_PACK_BYTES or not e.files[0].sha256:
            raise ValueError(f"{e.voice_id}: a Kokoro entry is one voice pack of {KOKORO_PACK_BYTES} bytes, by sha256")
    if not _COMMIT.fullmatch(e.revision):
        raise ValueError(f"{e.voice_id}: revision {e.revision!r} is not a commit (40 hex digits)")
    if not e.files:
        raise ValueError(f"{e.voice_id}: no files")
    for f in e.files:
        if f.size < 0 or (f.sha256 is None) == (f.git_sha1 is None):
            raise ValueError(f"{e.voice_id}: {f.path} needs its size and one digest (sha256 or git_sha1)")
        if f.sha256 is not None and not _SHA256.fullmatch(f.sha256):
            raise ValueError(f"{e.voice_id}: {f.path}'s sha256 is not 64 hex digits")
        if f.git_sha1 is not None and not _COMMIT.fullmatch(f.git_sha1):
            raise ValueError(f"{e.voice_id}: {f.path}'s git_sha1 is not 40 hex digits")
        if f.path.startswith("/") or ".." in f.path.split("/"):
            raise ValueError(f"{e.voice_id}: {f.path} is not a path inside the repository")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def _bar_class(report: Callable[[int], None]):
    """huggingface_hub's progress bar, quiet, its byte counts reported (``report`` may raise
    CancelledError to stop the download; huggingface_hub then deletes the part it wrote)."""
    from huggingface_hub.utils import tqdm

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            report(int(kwargs.get("initial") or 0))

        def update(self, n=1):
            report(int(n or 0))
            return super().update(n)

    return Bar


def download(
    entry: HubEntry,
    *,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> dict[str, Path]:
    """Every file of ``entry`` in the hub cache, checked against the catalogue, by repository
    path. Files already in the cache are checked and not fetched again."""
    import httpx
    from huggingface_hub import errors as hub_errors
    from huggingface_hub import hf_hub_download

    total, done = max(entry.size, 1), 0
    paths: dict[str, Path] = {}
    for f in entry.files:
        start = done

        def report(n: int, start: int = start, f: HubFile = f) -> None:
            nonlocal done
            if cancelled is not None and cancelled():
                raise CancelledError(f"the download of {entry.voice_id} was cancelled")
            done = min(max(done + n, start), start + f.size)
            if progress is not None:
                progress(done / total, f"{entry.voice_id}: {f.path} ({done / 1e6:.1f} of {total / 1e6:.1f} MB)")

        try:
            local = hf_hub_download(
                entry.repo,
                f.path,
                revision=entry.revision,
                cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                endpoint=os.environ.get("HF_ENDPOINT") or None,
                local_files_only=offline(),
                tqdm_class=_bar_class(report),
            )
        except hub_errors.LocalEntryNotFoundError:
            why = "HF_HUB_OFFLINE is set" if offline() else "the hub cannot be reached"
            raise ModelFileError(
                f"{entry.voice_id}: {f.path} of {entry.source} is not in the download cache and {why}; "
                f"connect{' and unset HF_HUB_OFFLINE' if offline() else ''}, then run: "
                f"python main.py models install {entry.voice_id}"
            ) from None
        except hub_errors.GatedRepoError:
            raise HubError(
                f"{entry.repo} is gated: accept its terms on the hub, then log in (hf auth login) or set HF_TOKEN"
            ) from None
        except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError) as e:
            raise HubError(f"{entry.source} is not on the hub ({type(e).__name__})") from None
        except hub_errors.EntryNotFoundError:
            raise HubError(f"{f.path} is not in {entry.source}") from None
        except (hub_errors.HfHubHTTPError, httpx.HTTPError, OSError) as e:
            raise HubError(f"cannot download {f.path} of {entry.source}: {e}") from None
        local = Path(local)
        wrong = f.check(local)
        if wrong is not None:
            blob = Path(os.path.realpath(local))
            local.unlink(missing_ok=True)
            blob.unlink(missing_ok=True)
            raise HubError(f"{f.path} of {entry.source} is {wrong}: the download was refused and deleted")
        done = start + f.size
        paths[f.path] = local
    if progress is not None:
        progress(1.0, f"{entry.voice_id}: {len(paths)} files checked")
    return paths


def snapshot_folder(entry: HubEntry, paths: dict[str, Path]) -> Path:
    """The folder of the downloaded commit that holds the entry's files (huggingface_hub's
    snapshot of it): a model converted from a folder reads it there."""
    first = entry.files[0].path
    return Path(str(paths[first])[: -len(first)])
