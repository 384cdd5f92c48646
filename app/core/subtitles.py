"""Subtitles of a project's timeline: one cue per sentence that has a take, timed as the
timeline (and so the export) places it, pauses included; written as SubRip (.srt) or WebVTT
(.vtt), atomically."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.core.atomic import write_bytes_atomic


@dataclass(frozen=True)
class Cue:
    start_s: float
    end_s: float
    text: str


def cues(project, *, gap_s: float = 0.3) -> list[Cue]:
    """A cue for each sentence with a take, at its place on the timeline (project.timeline)."""
    from app.core.project import timeline

    _, _, segments = timeline(project, gap_s=gap_s)
    return [Cue(s.start_s, s.end_s, " ".join(project.sentences[s.index].text.split())) for s in segments]


def _clock(seconds: float, separator: str) -> str:
    ms = int(round(seconds * 1000.0))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def to_srt(items: list[Cue]) -> str:
    blocks = [
        f"{n}\n{_clock(c.start_s, ',')} --> {_clock(c.end_s, ',')}\n{c.text}\n" for n, c in enumerate(items, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(items: list[Cue]) -> str:
    # A cue's text may not hold "-->"; nor a blank line (sentences have none).
    blocks = [f"{_clock(c.start_s, '.')} --> {_clock(c.end_s, '.')}\n{c.text.replace('-->', '→')}\n" for c in items]
    return "WEBVTT\n\n" + "\n".join(blocks)


def write_subtitles(path: Path | str, items: list[Cue]) -> Path:
    """Write the cues as SubRip or WebVTT by the file's name (.srt, .vtt)."""
    path = Path(path)
    kinds = {".srt": to_srt, ".vtt": to_vtt}
    if path.suffix.lower() not in kinds:
        raise ValueError(f"{path.name}: a subtitle file's name ends in .srt or .vtt")
    if not items:
        raise ValueError("no sentence has a take yet: there is nothing to time")
    write_bytes_atomic(path, kinds[path.suffix.lower()](items).encode("utf-8"))
    return path
