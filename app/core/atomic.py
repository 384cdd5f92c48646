"""Atomic file writes: a file appears complete under its name or not at all.

What already stands at the target is respected: a symbolic link's target is replaced, not
the link; a device, FIFO or socket (``/dev/stdout``, a named pipe) is written through, as a
shell redirection would, never renamed over; a directory is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(target: Path | str) -> Iterator[Path]:
    """Yield a temporary path; on success it becomes ``target`` (renamed over a regular file
    or none, copied into a device or FIFO)."""
    target = Path(target)
    real = Path(os.path.realpath(target))  # through any links: the file they name is replaced
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "it is a folder, not a file", str(target))
    if mode is not None and not stat.S_ISREG(mode):
        with _written_through(real) as tmp:
            yield tmp
        return
    real.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".part", dir=real.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, real)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _written_through(device: Path) -> Iterator[Path]:
    """A temporary file (in the temp folder) copied into ``device`` once complete."""
    folder = Path(tempfile.mkdtemp(prefix="voicestudio-"))
    tmp = folder / device.name
    try:
        yield tmp
        with open(tmp, "rb") as src, open(device, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_bytes_atomic(target: Path | str, data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)
