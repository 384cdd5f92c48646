"""Build the Linux app: PyInstaller's one-folder build of the studio, laid out as an AppDir
(AppRun, the desktop entry and its icon at the top, the app under usr/lib/voicestudio), with
ggml's portable CPU build (AVX2 and FMA; the engine's own kernels still pick AVX-512 at run
time) and the stock models installed here (Piper's joe, the speaker encoder), then made an
AppImage: the runtime (packaging/runtime/runtime.c) followed by a SquashFS image of the AppDir.
Prints its size. Run by ``make bundle``.

With --cuda, the CUDA app instead: the CPU app's AppDir with the engine built for NVIDIA GPUs in
place of its own (packaging/build_cuda.py: ggml with its CUDA backend, the binding with the
engine's CUDA kernels) and the CUDA runtime's libraries beside them; the GPU driver is the
user's. Run by ``make bundle-cuda``.

    .venv/bin/python packaging/build_bundle.py --runtime build/bundle/runtime [--ggml build/ggml-avx2]
    python3 packaging/build_bundle.py --runtime build/bundle/runtime --cuda build/cuda
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app import __version__  # noqa: E402

# ggml's libraries under the names the engine asks for and the names they ask each other for
# (their SONAMEs), not the fully versioned file: two names suffice (voicestudio.spec's rule too).
GGML_NAME = re.compile(r"libggml[\w-]*\.so(\.\d+)?")

DESKTOP = """[Desktop Entry]
Type=Application
Name=Voice Studio
GenericName=Speech synthesis studio
Comment=Type a script, pick a voice and a device, synthesize, play and export takes
Exec=voicestudio
Icon=voicestudio
Terminal=false
Categories=AudioVideo;Audio;
StartupWMClass=voicestudio
X-AppImage-Version={version}
"""

# The AppDir's entry point: the bundle's executable, wherever the AppDir was unpacked or mounted.
APPRUN = """#!/bin/sh
HERE="$(dirname "$(readlink -f "$0")")"
exec "$HERE/usr/lib/voicestudio/voicestudio" "$@"
"""


def stock_models(dest: Path) -> list[str]:
    """The installed stock models (GGUF and manifest) copied into dest, checked first."""
    from app.models import manager

    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for voice_id in manager.STOCK_VOICES:
        if not manager.is_installed(voice_id):
            raise SystemExit(f"{voice_id} is not installed here: run make models first")
        names.append(manager.gguf_path(voice_id))
    if not manager.speaker_encoder_installed():
        raise SystemExit("the speaker encoder is not installed here: run make models first")
    names.append(manager.speaker_encoder_path())
    for gguf in names:
        info = json.loads(gguf.with_suffix(".json").read_text(encoding="utf-8"))
        if info.get("gguf_size") != gguf.stat().st_size:
            raise SystemExit(f"{gguf} does not match its manifest: install it again")
        shutil.copyfile(gguf, dest / gguf.name)
        shutil.copyfile(gguf.with_suffix(".json"), dest / gguf.with_suffix(".json").name)
    return [g.name for g in names]


def cuda_appdir(cpu: Path, cuda: Path, appdir: Path) -> None:
    """The CPU app's AppDir copied to appdir, with the CUDA engine and runtime in place."""
    internal = Path("usr") / "lib" / "voicestudio" / "_internal"
    (engine,) = (cpu / internal / "app").glob("_engine*")
    (cuda_engine,) = (cuda / "app").glob("_engine*")
    if cuda_engine.name != engine.name:
        raise SystemExit(f"{cuda_engine.name} is not for the app's Python ({engine.name}): build it with the same")
    ggml = [p for p in (cuda / "ggml").glob("lib*/libggml*.so*") if GGML_NAME.fullmatch(p.name)]
    cuda_libs = sorted((cuda / "lib").glob("lib*.so*"))
    if not any(p.name.startswith("libggml-cuda") for p in ggml) or not cuda_libs:
        raise SystemExit(f"{cuda} holds no CUDA build: run packaging/build_cuda.py")
    shutil.rmtree(appdir, ignore_errors=True)
    shutil.copytree(cpu, appdir, symlinks=True)
    for old in (appdir / internal).glob("libggml*"):
        old.unlink()
    for lib in [*ggml, *cuda_libs]:
        shutil.copyfile(lib.resolve(), appdir / internal / lib.name)
    shutil.copyfile(cuda_engine, appdir / internal / "app" / engine.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ggml", type=Path, default=ROOT / "build" / "ggml-avx2", help="ggml's libraries to ship")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bundle")
    ap.add_argument("--runtime", type=Path, required=True, help="the AppImage runtime (make bundle builds it)")
    ap.add_argument("--cuda", type=Path, help="the CUDA engine (packaging/build_cuda.py): make the CUDA app")
    ap.add_argument("--cpu-appdir", type=Path, help="with --cuda: the CPU app's AppDir (default: make bundle's)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cuda:
        appdir = args.out / "VoiceStudio-cuda.AppDir"
        cuda_appdir(args.cpu_appdir or args.out / "VoiceStudio.AppDir", args.cuda, appdir)
        image = args.out / f"VoiceStudio-{__version__}-x86_64-cuda.AppImage"
        appimage(appdir, image, args.runtime)
        print("  the CUDA engine and runtime: " + ", ".join(sorted(p.name for p in (args.cuda / "lib").iterdir())))
        return 0
    from app.core import paths

    if not list(args.ggml.glob("libggml*.so*")):
        raise SystemExit(f"no ggml libraries in {args.ggml}: run make ggml-avx2")
    appdir = args.out / "VoiceStudio.AppDir"
    shutil.rmtree(appdir, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        models = Path(tmp) / "models"
        shipped = stock_models(models)
        env = dict(os.environ, VS_BUNDLE_GGML=str(args.ggml.resolve()), VS_BUNDLE_MODELS=str(models))
        subprocess.run(
            [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "ERROR",
             "--distpath", str(Path(tmp) / "dist"), "--workpath", str(Path(tmp) / "work"),
             str(ROOT / "packaging" / "voicestudio.spec")],
            check=True, env=env, cwd=ROOT,
        )  # fmt: skip
        lib = appdir / "usr" / "lib"
        lib.mkdir(parents=True)
        shutil.move(str(Path(tmp) / "dist" / "voicestudio"), lib / "voicestudio")
    (appdir / "AppRun").write_text(APPRUN, encoding="utf-8")
    (appdir / "AppRun").chmod(0o755)
    (appdir / "voicestudio.desktop").write_text(DESKTOP.format(version=__version__), encoding="utf-8")
    icon = ROOT / "resources" / "voicestudio.svg"
    shutil.copyfile(icon, appdir / "voicestudio.svg")
    (appdir / ".DirIcon").symlink_to("voicestudio.svg")
    share = appdir / "usr" / "share"
    (share / "applications").mkdir(parents=True)
    shutil.copyfile(appdir / "voicestudio.desktop", share / "applications" / "voicestudio.desktop")
    (share / "icons" / "hicolor" / "scalable" / "apps").mkdir(parents=True)
    shutil.copyfile(icon, share / "icons" / "hicolor" / "scalable" / "apps" / "voicestudio.svg")
    image = args.out / f"VoiceStudio-{__version__}-x86_64.AppImage"
    appimage(appdir, image, args.runtime)
    print(f"  stock models: {', '.join(shipped)} (from {paths.models_dir()})")
    return 0


def appimage(appdir: Path, image: Path, runtime: Path) -> None:
    """The AppImage of appdir: the runtime, then the AppDir's SquashFS image; written whole or not at all."""
    squashfs, part = image.with_suffix(".squashfs"), image.with_suffix(".part")
    subprocess.run(
        ["mksquashfs", str(appdir), str(squashfs), "-comp", "zstd", "-Xcompression-level", "15", "-b", "1M",
         "-root-owned", "-noappend", "-quiet", "-no-progress"],
        check=True,
    )  # fmt: skip
    with open(part, "wb") as out:
        out.write(runtime.read_bytes())
        with open(squashfs, "rb") as fs:
            shutil.copyfileobj(fs, out, 1 << 20)
        out.seek(8)  # the AppImage's type 2 mark in the ELF header's padding
        out.write(b"AI\x02")
    squashfs.unlink()
    part.chmod(0o755)
    part.replace(image)
    unpacked = sum(p.stat().st_size for p in appdir.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"bundle: {image.relative_to(ROOT) if image.is_relative_to(ROOT) else image}")
    print(f"  {image.stat().st_size / 2**20:.0f} MiB, {unpacked / 2**20:.0f} MiB unpacked")


if __name__ == "__main__":
    sys.exit(main())
