"""Smoke test of the Linux app (its AppImage) as a user meets it: copied into a fresh folder made
read-only, run with a bare environment (no venv, no checkout on any path, a new home whose
data, config and cache folders are the only writable ones, an empty temporary folder), offscreen.
It prints the version, lists devices and voices, synthesizes a sentence with each family
installed (the bundle's stock Piper voice, installed on its first start, and Kokoro where this
machine has it installed: copied into the new home as a user's install would be), exports a
WAV of each, starts the studio to a shown window (the median of --runs warm starts), and
checks that nothing was written outside the new home's folders (the AppImage's first start
extracts it into the cache folder; a start from its FUSE mount, where this machine can mount one,
leaves no mount folder behind). Prints the AppImage's size and the start time; exits non-zero on
any failure. Run by ``make bundle-test``; with --device, on that device (``make bundle-cuda-test``
gives the CUDA app cuda0, which must be listed among the devices).

    python3 packaging/smoke_test.py [build/bundle/VoiceStudio-<version>-x86_64.AppImage] [--runs 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = "The bundle speaks this sentence to prove that it works."


def run(cmd: list[str], env: dict, cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def wav_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as w:
        if w.getnframes() == 0:
            raise SystemExit(f"{path.name} holds no audio")
        return w.getnframes() / w.getframerate()


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


def tiny_appimage(runtime: Path, folder: Path, name: str, says: str) -> Path:
    """An AppImage of the runtime and an AppDir whose AppRun prints `says` and its arguments."""
    appdir = folder / f"{name}.AppDir"
    appdir.mkdir()
    (appdir / "AppRun").write_text(f'#!/bin/sh\necho "{says} $*"\nexit "${{STATUS:-0}}"\n')
    (appdir / "AppRun").chmod(0o755)
    squashfs = folder / f"{name}.squashfs"
    subprocess.run(["mksquashfs", str(appdir), str(squashfs), "-root-owned", "-noappend", "-quiet", "-no-progress"],
                   check=True)  # fmt: skip
    image = folder / f"{name}.AppImage"
    image.write_bytes(runtime.read_bytes() + squashfs.read_bytes())
    image.chmod(0o755)
    return image


def runtime_checks(runtime: Path) -> None:
    """The runtime on tiny images: arguments and exit status passed, an upgrade's copy replacing
    the old one, a copy left half made by a start that was killed removed, a damaged image refused."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(base / "home"), "TMPDIR": str(base)}
        cache = base / "home" / ".cache" / "voicestudio" / "appimage"
        one = tiny_appimage(runtime, base, "one", "first")
        assert run([str(one), "a b", "c"], env, base).strip() == "first a b c"
        (copy_one,) = list(cache.iterdir())
        for mount in ("0", "1"):  # the app's exit status, from the copy and from a FUSE mount
            ended = subprocess.run([str(one)], env=dict(env, STATUS="3", APPIMAGE_MOUNT=mount), capture_output=True)
            assert ended.returncode == 3, ended
        dead = cache / f"{copy_one.name}x.part-999999999"  # no such process
        dead.mkdir()
        time.sleep(1.1)  # SquashFS's time stamps are in seconds: the next image is another
        two = tiny_appimage(runtime, base, "two", "second")
        assert run([str(two)], env, base).strip() == "second"
        left = sorted(p.name for p in cache.iterdir())
        assert len(left) == 1 and left[0] != copy_one.name, left
        damaged = base / "damaged.AppImage"
        damaged.write_bytes(two.read_bytes()[: len(runtime.read_bytes()) + 64])
        damaged.chmod(0o755)
        result = subprocess.run([str(damaged)], env=env, cwd=base, capture_output=True, text=True)
        assert result.returncode == 127 and "no readable SquashFS image" in result.stderr, result
    print("runtime: arguments, exit status, an upgrade's copy, a killed start's half copy, a damaged image: as due")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("archive", nargs="?", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runtime", type=Path, default=ROOT / "build" / "bundle" / "runtime")
    ap.add_argument("--device", default="cpu", help="the device to synthesize on")
    args = ap.parse_args()
    runtime_checks(args.runtime)
    archive = args.archive or max((ROOT / "build" / "bundle").glob("VoiceStudio-*.AppImage"), key=os.path.getmtime)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        app, home, scratch, work = base / "app", base / "home", base / "tmp", base / "work"
        for d in (app, home, scratch, work):
            d.mkdir()
        apprun = app / archive.name
        shutil.copyfile(archive, apprun)
        apprun.chmod(0o755)
        subprocess.run(["chmod", "-R", "a-w", str(app)], check=True)
        work.chmod(0o555)  # the working folder too: nothing is written where the app is started
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "TMPDIR": str(scratch),
            "QT_QPA_PLATFORM": "offscreen",
            "LANG": "C.UTF-8",
        }
        try:
            return smoke(apprun, env, home, scratch, work, archive, args.runs, args.device)
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(app), str(work)], check=False)


def smoke(apprun: Path, env: dict, home: Path, scratch: Path, work: Path, archive: Path, runs: int, device: str) -> int:
    t0 = time.perf_counter()
    print(run([str(apprun), "--version"], env, work).strip())
    first = (time.perf_counter() - t0) * 1000
    print(f"  the first start, which extracts the AppImage into the cache folder: {first:.0f} ms")
    (copy,) = (home / ".cache" / "voicestudio" / "appimage").iterdir()
    inside = copy / "usr" / "lib" / "voicestudio" / "_internal"
    for part in (
        "libportaudio.so.2",
        "espeakng_loader/libespeak-ng.so.1",
        "PySide6/Qt/plugins/platforms/libqxcb.so",
        "PySide6/Qt/plugins/platforms/libqoffscreen.so",
        "libxcb-icccm.so.4",
        "models/piper-joe.gguf",
        *(
            ("libggml-cuda.so", "libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*")
            if device.startswith("cuda")
            else ()
        ),
    ):
        if not any(p.is_file() for p in inside.glob(part)):
            raise SystemExit(f"the AppImage holds no {part}")
    mounted = subprocess.run([str(apprun), "--version"], env=dict(env, APPIMAGE_MOUNT="1"), cwd=work, text=True,
                             capture_output=True, timeout=120)  # fmt: skip
    if mounted.returncode != 0 or "Voice Studio" not in mounted.stdout:
        raise SystemExit(f"APPIMAGE_MOUNT=1: exit {mounted.returncode}\n{mounted.stdout}\n{mounted.stderr}")
    how = "extracted copy: FUSE could not mount it here" if "FUSE could not" in mounted.stderr else "FUSE mount"
    print(f"  APPIMAGE_MOUNT=1 ran it from its {how}")
    t0 = time.perf_counter()
    devices = run([str(apprun), "devices"], env, work)
    first = (time.perf_counter() - t0) * 1000
    print(f"devices (the first command, which installs the bundle's stock voices: {first:.0f} ms):")
    print("  " + devices.strip().replace("\n", "\n  "))
    if not any(line.split()[:1] == [device] for line in devices.splitlines()):
        raise SystemExit(f"{device} is not among the devices")
    families = ["piper:joe"]
    kokoro = Path(os.environ.get("VOICESTUDIO_DATA_DIR", Path.home() / ".local" / "share" / "voicestudio")) / "models"
    if (kokoro / "kokoro.gguf").is_file() and (kokoro / "kokoro.json").is_file():
        models = home / ".local" / "share" / "voicestudio" / "models"
        for name in ("kokoro.gguf", "kokoro.json"):
            shutil.copyfile(kokoro / name, models / name)
        families.append("kokoro:jf_alpha")
    voices = run([str(apprun), "voices"], env, work)
    for voice in families:
        if voice not in voices:
            raise SystemExit(f"{voice} is not among the voices:\n{voices}")
    print(f"voices: {len(voices.strip().splitlines())} lines, {', '.join(families)} installed")
    exports = home / "exports"
    exports.mkdir()
    for voice in families:
        out = exports / (voice.replace(":", "-") + ".wav")
        t0 = time.perf_counter()
        run(
            [str(apprun), "synth", "--voice", voice, "--device", device, "--text", SENTENCE, "--out", str(out)],
            env,
            work,
        )
        ms = (time.perf_counter() - t0) * 1000
        print(f"synth {voice} on {device}: {wav_seconds(out):.2f} s of audio in {ms:.0f} ms (process start included)")
    times = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        run([str(apprun), "--quit-when-shown"], env, work)
        if i:  # the first one warms the page cache
            times.append((time.perf_counter() - t0) * 1000)
    size = archive.stat().st_size / 2**20
    spread = f"{min(times):.0f}-{max(times):.0f}"
    print(f"studio start to a shown window, warm: median {statistics.median(times):.0f} ms of {runs} ({spread})")
    print(f"bundle: {size:.0f} MiB ({archive.name})")
    stray = sorted(str(p.relative_to(scratch)) for p in files_under(scratch))
    if stray:
        raise SystemExit(f"files left in the temporary folder: {stray[:10]}")
    allowed = [home / ".local" / "share" / "voicestudio", home / ".config" / "voicestudio", home / ".cache", exports]
    outside = [p for p in files_under(home) if p.is_file() and not any(p.is_relative_to(a) for a in allowed)]
    if outside:
        raise SystemExit(f"files written outside the data, config and cache folders: {sorted(map(str, outside))[:10]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
