"""Build the engine for NVIDIA GPUs, for the CUDA app: ggml of the pinned ggml-python's source
with its portable CPU backend (AVX2 and FMA, as the CPU app's) and its CUDA backend, and the
engine's binding (app/_engine) built against it, with the engine's own CUDA kernels. Needs
NVIDIA's CUDA toolkit with cuBLAS. Writes OUT/ggml (ggml installed), OUT/app (the binding) and
OUT/lib (the CUDA runtime libraries both link against: cudart, cuBLAS, cuBLASLt, and the C++
runtime they were built with, which may be newer than the one the CPU app carries; never the
driver's libcuda, which belongs to the user's system). Run by ``make bundle-cuda``.

    python packaging/build_cuda.py --sdist ggml_python-<version>.tar.gz --ggml-options "<the Makefile's
        GGML_PORTABLE>" --out build/cuda [--archs "75-virtual;80-virtual;86-real;89-real;90-real;120-real"] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Machine code for the GPUs of the last generations (Ampere's workstation cards, Ada, Hopper,
# Blackwell's workstation cards), and PTX that the driver compiles on the first start for the
# others from Turing on (CUDA 13 supports nothing older).
ARCHS = "75-virtual;80-virtual;86-real;89-real;90-real;120-real"

# ggml's CUDA backend, beside the portable CPU build that --ggml-options gives (the Makefile's
# GGML_PORTABLE, as the CPU app ships it).
CUDA_OPTIONS = ["-DGGML_CUDA=ON", "-DGGML_CUDA_GRAPHS=ON", "-DGGML_CUDA_NCCL=OFF"]

# The CUDA runtime's libraries that the app carries, and the C++ runtime of the compiler that
# built the engine (backward compatible with what the rest of the app was built against); the
# driver (libcuda, libnvidia-*) is the system's own and never shipped.
SHIPPED = re.compile(r"lib(cudart|cublas|cublasLt)\.so\.\d+|libstdc\+\+\.so\.6|libgcc_s\.so\.1")


def cmake(*args: str) -> None:
    """CMake, and Ninja, from the Python environment where it has them, else from PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    subprocess.run([shutil.which("cmake", path=path) or "cmake", *args], check=True, env=dict(os.environ, PATH=path))


def cache_value(build: Path, name: str) -> str | None:
    for line in (build / "CMakeCache.txt").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        if key.split(":")[0] == name:
            return value
    return None


def runtime_libraries(binaries: list[Path], search: list[str]) -> dict[str, Path]:
    """The CUDA runtime's libraries that the binaries need, by the names they ask for."""
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join([*search, os.environ.get("LD_LIBRARY_PATH", "")]))
    found: dict[str, Path] = {}
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, env=env).stdout
        for line in out.splitlines():
            name, _, where = line.strip().partition(" => ")
            if not SHIPPED.fullmatch(name):
                continue
            if where.startswith("not found"):
                raise SystemExit(f"{binary.name} needs {name}, which is not in {search}")
            found[name] = Path(where.split(" (")[0]).resolve()
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, required=True, help="the pinned ggml-python's source archive")
    ap.add_argument("--ggml-options", required=True, help="ggml's CMake options for its CPU build (GGML_PORTABLE)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "cuda")
    ap.add_argument("--archs", default=os.environ.get("CUDA_ARCHS") or ARCHS, help="CMAKE_CUDA_ARCHITECTURES")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if not shutil.which("nvcc"):
        raise SystemExit("the CUDA app needs NVIDIA's CUDA toolkit: nvcc is not on PATH")
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    arch = f"-DCMAKE_CUDA_ARCHITECTURES={args.archs}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        with tarfile.open(args.sdist) as archive:
            archive.extractall(src, filter="data")
        (ggml_src,) = src.glob("*/vendor/ggml")
        build = Path(tmp) / "ggml"
        cmake("-S", str(ggml_src), "-B", str(build), "-G", "Ninja", *args.ggml_options.split(), *CUDA_OPTIONS, arch,
              f"-DCMAKE_INSTALL_PREFIX={out / 'ggml'}")  # fmt: skip
        cmake("--build", str(build), "-j", str(args.jobs))
        cmake("--install", str(build))
    (config,) = (out / "ggml").glob("lib*/cmake/ggml")
    engine = out / "engine-build"
    cmake("-S", str(ROOT / "native"), "-B", str(engine), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", arch,
          f"-DPython_EXECUTABLE={sys.executable}", f"-Dggml_DIR={config}", "-DVS_BUILD_TESTS=OFF",
          f"-DVS_PYTHON_OUTPUT_DIR={out / 'app'}")  # fmt: skip
    cmake("--build", str(engine), "-j", str(args.jobs))
    (binding,) = (out / "app").glob("_engine*")
    backend = [p for p in (out / "ggml").glob("lib*/libggml-cuda.so*") if not p.is_symlink()]
    if len(backend) != 1:
        raise SystemExit(f"ggml's CUDA backend was not built: {backend}")
    ggml_cuda = backend[0]
    search = [str(Path(v).parent) for k in ("CUDA_cudart_LIBRARY", "CUDA_cublas_LIBRARY", "CUDA_cublasLt_LIBRARY")
              if (v := cache_value(engine, k))]  # fmt: skip
    lib = out / "lib"
    lib.mkdir()
    for name, path in sorted(runtime_libraries([binding, ggml_cuda], search).items()):
        shutil.copyfile(path, lib / name)
        print(f"  {name} ({path.stat().st_size / 2**20:.0f} MiB) from {path.parent}")
    missing = {"libcudart", "libcublas", "libcublasLt"} - {n.split(".so")[0] for n in os.listdir(lib)}
    if missing:
        raise SystemExit(f"the CUDA runtime's {', '.join(sorted(missing))} not found beside the toolkit")
    print(f"CUDA engine for {args.archs}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
