"""`render`: a project's stale sentences synthesized unattended (a whole book, or one chapter),
saved into the project as they are done, so that a render stopped by a crash, a kill or Ctrl-C
goes on where it was when run again; then, with --out, the project exported."""

from __future__ import annotations

import time
from pathlib import Path

from app.engine.errors import VoiceStudioError

# The project is saved (atomically: the whole file written again) at the end of each chapter,
# and inside one once this long has passed since the last save, or ten times what that save
# took, so that saving a long book costs at most a tenth of its render.
SAVE_EVERY_S = 60.0


def _clock(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {s:02d} s" if minutes else f"{s} s"


def cmd_render(args) -> int:
    from app.core import export, lexicon
    from app.core.project import Project, ProjectFileError, new_take, time_left
    from app.engine import sentences
    from app.profiles.voices import open_engine

    try:
        project = Project.open(args.project)
    except ProjectFileError as exc:
        raise VoiceStudioError(f"{args.project}: {exc}") from None
    user, problem = lexicon.read_user()
    if problem:
        print(f"warning: the user lexicon is not used: {problem}")
    project.user_lexicon = user
    if args.chapter is not None:
        try:
            scope = project.chapter_range(args.chapter)
        except ValueError as exc:
            raise VoiceStudioError(f"{args.project}: {exc}") from None
    else:
        scope = range(len(project.sentences))
    todo = [i for i in project.to_synthesize("stale") if i in scope]
    chapters = project.chapters()
    # The sentences to render a chapter at a time (those before the first heading first).
    opening = range(0, chapters[0][1].start if chapters else len(project.sentences))
    runs = [(title, [i for i in todo if i in within]) for title, within in [("", opening), *chapters]]
    print(
        f"{Path(args.project).name}: {len(scope) - len(todo)} of {len(scope)} sentences up to date"
        + (f" in chapter {args.chapter} ({chapters[args.chapter - 1][0]})" if args.chapter is not None else "")
        + f"; rendering {len(todo)}",
        flush=True,
    )
    entries = project.pronunciations()
    total_chars, done_chars = sum(len(project.sentences[i].text) for i in todo), 0
    done, started, saved_at, save_s, unsaved = 0, time.monotonic(), time.monotonic(), 0.0, 0

    def save() -> None:
        nonlocal saved_at, save_s, unsaved
        t0 = time.monotonic()
        project.save()
        saved_at, save_s, unsaved = time.monotonic(), time.monotonic() - t0, 0

    engines: dict = {}  # a voice's engine, kept for the chapters after
    try:
        for title, run in runs:
            if not run:
                continue
            for voice, settings, params, items in project.synthesis_groups(run):
                if voice not in engines:
                    engines[voice] = open_engine(voice, device=args.device, threads=args.threads)
                for index, text in items:
                    etake = sentences.speak(engines[voice], text, entries, **params)
                    take = new_take(text, voice, settings, entries, etake.audio, etake.sample_rate, etake.timings)
                    project.add_take(index, take)
                    done, unsaved, done_chars = done + 1, unsaved + 1, done_chars + max(len(text), 1)
                    left = time_left(done_chars, total_chars, time.monotonic() - started)
                    print(
                        f"[{done}/{len(todo)}] sentence {index + 1}: {take.duration_s:.1f} s of audio"
                        + (f"; about {_clock(left)} left" if left is not None and done < len(todo) else ""),
                        flush=True,
                    )
                    if time.monotonic() - saved_at >= max(SAVE_EVERY_S, 10 * save_s):
                        save()
            save()
            if title:
                print(f"saved: chapter '{title}' is rendered", flush=True)
    except KeyboardInterrupt:
        if unsaved:
            save()
        print(f"stopped: {done} sentence(s) rendered and saved; run the same command to go on")
        return 130
    finally:
        for engine in engines.values():
            engine.close()
    if done:
        print(f"rendered {done} sentence(s) in {_clock(time.monotonic() - started)}; saved {project.path.name}")
    if args.out is not None:
        try:
            report = export.export_project(
                args.out, project, list(scope), gap_s=args.gap, loudness=args.loudness, subtype=args.format,
                book=export.book_info(args.title or "", args.author or "", args.cover),
            )  # fmt: skip
        except export.ExportError as exc:
            raise VoiceStudioError(str(exc)) from None
        print(f"exported {report.path}: {report.duration_s:.1f} s, {report.lufs:.1f} LUFS")
    return 0
