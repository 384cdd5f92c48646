"""Subtitles of a project's timeline: one cue per sentence that has a take, timed as the
timeline (and so the export) places it, pauses included; written as SubRip (.srt) or WebVTT
(.vtt), atomically. Where a take has word timings (app.core.words), its WebVTT cue marks the
time of each word after the first (WebVTT's inner timestamps: players highlight the words)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.core.atomic import write_bytes_atomic
from app.core.script import shown
from app.core.words import take_words


@dataclass(frozen=True)
class Cue:
    start_s: float
    end_s: float
    text: str
    timed: str = ""  # the text with WebVTT timestamps before its words, where they are known


def cues(project, *, gap_s: float = 0.3) -> list[Cue]:
    """A cue for each sentence with a take, at its place on the timeline (project.timeline)."""
    from app.core.project import timeline

    _, _, segments = timeline(project, gap_s=gap_s)
    out = []
    for seg in segments:
        text = project.sentences[seg.index].text
        pieces, at = [], 0
        for k, (a, b, start, _) in enumerate(take_words(seg.take.timings, text, seg.take.duration_s)):
            stamp = f"<{_clock(seg.start_s + start, '.')}>" if k else ""
            pieces += [text[at:a], stamp, text[a:b]]
            at = b
        timed = " ".join(("".join(pieces) + text[at:]).split()) if pieces else ""
        out.append(Cue(seg.start_s, seg.end_s, " ".join(shown(text).split()), timed))
    return out


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
    blocks = [
        f"{_clock(c.start_s, '.')} --> {_clock(c.end_s, '.')}\n{(c.timed or c.text).replace('-->', '→')}\n"
        for c in items
    ]
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
