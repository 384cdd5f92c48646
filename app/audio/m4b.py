"""Audiobooks: M4B files (AAC in an MPEG-4 container) with chapter marks, a title, an author and
a cover, written atomically. The audio is encoded with FFmpeg's AAC encoder through PyAV; the
cover goes in with mutagen."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path

# The rates AAC-LC takes; audio at another rate is written at the lowest above it.
AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
MAX_COVER_BYTES = 16 << 20


@dataclass(frozen=True)
class BookInfo:
    title: str = ""
    author: str = ""
    cover: bytes | None = None  # a JPEG or PNG image


def cover_format(data: bytes) -> str:
    """ "jpeg" or "png" by the image's first bytes; ValueError for anything else."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    raise ValueError("a cover is a JPEG or PNG image")


def write_m4b(
    path: Path | str,
    audio: np.ndarray,
    sample_rate: int,
    *,
    chapters: list[tuple[float, str]],
    info: BookInfo | None = None,
    bit_rate: int = 64000,
) -> Path:
    """Mono ``audio`` (at one of AAC_RATES) as an M4B; ``chapters``: each one's start in seconds
    and its title, in order (the first at 0), each ending where the next starts."""
    import av
    import mutagen.mp4

    info = info or BookInfo()
    if sample_rate not in AAC_RATES:
        raise ValueError(f"AAC takes {', '.join(map(str, AAC_RATES))} Hz, not {sample_rate}")
    starts = [round(start * 1000) for start, _ in chapters]
    if starts and (starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False))):
        raise ValueError("chapters start at 0 s and in order, each after the one before")
    if info.cover is not None:
        kind = cover_format(info.cover)
        if len(info.cover) > MAX_COVER_BYTES:
            raise ValueError(f"the cover is larger than {MAX_COVER_BYTES >> 20} MiB")
    samples = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    total_ms = round(len(samples) / sample_rate * 1000)
    with atomic_path(path) as tmp:
        with av.open(str(tmp), "w", format="ipod") as out:
            stream = out.add_stream("aac", rate=sample_rate, layout="mono")
            stream.bit_rate = bit_rate
            for key, value in (("title", info.title), ("album", info.title), ("artist", info.author)):
                if value:
                    out.metadata[key] = value
            ends = starts[1:] + [max(total_ms, starts[-1] + 1 if starts else 1)]
            out.set_chapters(
                [
                    {"id": i + 1, "start": a, "end": b, "time_base": Fraction(1, 1000), "metadata": {"title": title}}
                    for i, (a, b, (_, title)) in enumerate(zip(starts, ends, chapters, strict=True))
                ]
            )
            frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
            frame.sample_rate = sample_rate
            for packet in stream.encode(frame):
                out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        if info.cover is not None:
            tags = mutagen.mp4.MP4(str(tmp))
            image = mutagen.mp4.MP4Cover.FORMAT_JPEG if kind == "jpeg" else mutagen.mp4.MP4Cover.FORMAT_PNG
            tags["covr"] = [mutagen.mp4.MP4Cover(info.cover, imageformat=image)]
            tags.save()
    return Path(path)
