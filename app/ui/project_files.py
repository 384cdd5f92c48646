"""The studio's files: projects opened, saved, autosaved and recovered; scripts imported; takes exported."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from PySide6.QtWidgets import QApplication, QDialog, QFileDialog, QMessageBox

from app.audio.wav import CONTAINERS
from app.core import export as export_mod
from app.core.project import SUFFIX, Project, ProjectFileError, discard_recovery, pending_recoveries
from app.ui.dialogs import ExportDialog

log = logging.getLogger("voicestudio.ui")


class ProjectFilesMixin:
    """Methods of StudioWindow (app/ui/main.py), which has the state they use."""

    # -- files ----------------------------------------------------------------
    def _confirm_discard(self) -> bool:
        if not self.project.dirty or QApplication.platformName() == "offscreen":
            return True
        answer = QMessageBox.question(
            self,
            "Voice Studio",
            "The project has unsaved changes. Save them first?",
            QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    def new_project(self) -> None:
        if self._confirm_discard():
            self.project.close()
            self.set_project(Project("", self.project.voice, dict(self.project.settings)))

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open project", "", f"Voice Studio projects (*{SUFFIX})")
        if path:
            self.open_project(path)

    def open_project(self, path) -> bool:
        if not self._confirm_discard():
            return False
        try:
            project = Project.open(path)
        except ProjectFileError as exc:
            self.show_error(exc)
            return False
        self.project.close()
        self.set_project(project)
        self.settings.add_recent(path)
        self._fill_recent()
        return True

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import script", "", "Scripts and books (*.txt *.md *.epub);;All files (*)"
        )
        if path:
            self.import_script(path)

    def import_script(self, path) -> None:
        """A text, Markdown or EPUB file as the script (a book's headings become its chapters)."""
        if Path(path).suffix.lower() == ".epub":
            from app.core.epub import EpubError, epub_to_script

            try:
                text = epub_to_script(path)
            except EpubError as exc:
                self.show_error(exc)
                return
            self.editor.setPlainText(text)
            self.editor.flush()
            return
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.show_error(RuntimeError(f"{path}: cannot read it as UTF-8 text ({exc})"))
            return
        from app.core.script import canonical_tags, markdown_to_script

        if Path(path).suffix.lower() in (".md", ".markdown"):
            text = markdown_to_script(text)
        self.editor.setPlainText(canonical_tags(text))  # SSML breaks as [pause ...]
        self.editor.flush()

    def save(self) -> bool:
        if self.project.path is None:
            return self.save_as()
        return self._save_to(self.project.path)

    def save_as(self) -> bool:
        path, _ = QFileDialog.getSaveFileName(self, "Save project", "untitled" + SUFFIX, f"*{SUFFIX}")
        if not path:
            return False
        if not path.endswith(SUFFIX):
            path += SUFFIX
        return self._save_to(Path(path))

    def _save_to(self, path: Path) -> bool:
        self.editor.flush()
        try:
            self.project.save(path)
        except (OSError, ProjectFileError) as exc:
            self.show_error(exc)
            return False
        self.settings.add_recent(path)
        self._fill_recent()
        self._title()
        self.statusBar().showMessage(f"saved {path}", 4000)
        return True

    def autosave(self) -> None:
        self.editor.flush()
        if self.project.dirty:
            try:
                self.project.autosave()
            except OSError as exc:
                log.warning("autosave failed: %s", exc)

    def offer_recovery(self) -> None:
        recoveries = pending_recoveries()
        if not recoveries:
            return
        latest = recoveries[0]
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(latest.saved))
        name = latest.original.name if latest.original else "an unsaved project"
        answer = QMessageBox.question(
            self, "Recover work", f"Voice Studio did not close cleanly. Recover {name} as autosaved at {when}?"
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.recover(latest)
        else:
            for r in recoveries:
                discard_recovery(r.id)

    def recover(self, recovery) -> None:
        try:
            project = recovery.load()
        except ProjectFileError as exc:
            self.show_error(exc)
            return
        discard_recovery(recovery.id)
        self.set_project(project)
        self.project.dirty = True
        self._title()

    # -- export ---------------------------------------------------------------
    def export_dialog(self) -> None:
        dialog = ExportDialog(self, self.settings)
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return
        if dialog.options()["gap_s"] != float(self.settings["gap_s"]):
            # The timeline, playback and subtitles space sentences as the export does.
            self.settings["gap_s"] = dialog.options()["gap_s"]
            self._refresh_timeline()
        path, chosen = QFileDialog.getSaveFileName(
            self, "Export", "script.wav", "WAV (*.wav);;FLAC (*.flac);;MP3 (*.mp3);;Opus (*.opus);;Audiobook (*.m4b)"
        )
        if path:
            if Path(path).suffix.lower() not in CONTAINERS:  # the chosen filter's extension
                path += "." + chosen.split("*.")[-1].rstrip(")") if "*." in chosen else ".wav"
            self.export(path, **dialog.options())

    def export(self, path, *, scope="all", subtype="pcm16", out_rate=None, gap_s=0.3, loudness=None, book=None):
        """Write the whole script, the selected sentence, or the timeline selection as one file
        (WAV, FLAC, MP3, Opus or M4B, by its name); or (scope "chapters") the whole script as a
        file per chapter beside ``path`` ("<name> 01 <title>.<ext>"; what comes before the first
        heading is 00), returning their reports."""
        self.editor.flush()
        if scope == "chapters":
            return self._export_chapters(
                Path(path), subtype=subtype, out_rate=out_rate, gap_s=gap_s, loudness=loudness, book=book
            )
        options = {"out_rate": out_rate, "subtype": subtype, "loudness": loudness}
        try:
            if scope == "selection" and self.timeline.selection() is not None:
                start, end = self.timeline.selection()
                rate = self.timeline.rate
                clip = self.timeline.audio[int(start * rate) : int(end * rate)]
                report = export_mod.export_audio(path, [clip], rate, book=_book_info(book or {}), **options)
            else:  # the script's pauses between the takes, its headings as an audiobook's chapters
                indices = None if scope == "all" else self.selected_sentences()
                report = export_mod.export_project(
                    path, self.project, indices, gap_s=gap_s, book=_book_info(book or {}), **options
                )
        except (export_mod.ExportError, OSError) as exc:
            self.show_error(exc)
            return None
        self.statusBar().showMessage(
            f"exported {report.path.name}: {report.duration_s:.1f} s, {report.lufs:.1f} LUFS,"
            f" true peak {report.true_peak_db:.1f} dBTP",
            8000,
        )
        return report

    def _export_chapters(self, path: Path, *, gap_s, book, **options) -> list | None:
        placed = self.project.takes_audio()
        if not placed:
            self.show_error(export_mod.ExportError("nothing to export: no sentence has a take yet"))
            return None
        indices = [i for i, _ in placed]
        marks = self.project.chapter_marks(indices)
        opening = not marks or marks[0][0] > 0  # sentences before the first heading: file 00
        if opening:
            marks.insert(0, (0, (book or {}).get("title") or "Beginning"))
        rate = placed[0][1].sample_rate
        reports = []
        try:
            info = _book_info(book or {})  # the cover read once, for every chapter's file
        except (export_mod.ExportError, OSError) as exc:
            self.show_error(exc)
            return None
        for n, (first, title) in enumerate(marks):
            last = marks[n + 1][0] if n + 1 < len(marks) else len(placed)
            name = f"{path.stem} {n if opening else n + 1:02d} {_file_title(title)}{path.suffix}"
            clips = [export_mod.resample(t.audio, t.sample_rate, rate) for _, t in placed[first:last]]
            try:
                reports.append(
                    export_mod.export_audio(
                        path.with_name(name),
                        clips,
                        rate,
                        silences=self.project.silences(indices[first:last], gap_s),
                        chapters=[(0, title)],
                        book=info,
                        **options,
                    )  # fmt: skip
                )
            except (export_mod.ExportError, OSError) as exc:
                self.show_error(exc)
                return None
        self.statusBar().showMessage(f"exported {len(reports)} chapters beside {path.name}", 8000)
        return reports

    def export_subtitles_dialog(self) -> None:
        path, chosen = QFileDialog.getSaveFileName(
            self, "Export subtitles", "script.srt", "SubRip (*.srt);;WebVTT (*.vtt)"
        )
        if path:
            if Path(path).suffix.lower() not in (".srt", ".vtt"):
                path += ".vtt" if "vtt" in chosen else ".srt"
            self.export_subtitles(path)

    def export_subtitles(self, path) -> Path | None:
        """A cue for each sentence with a take, timed as the timeline and the export place it."""
        from app.core.subtitles import cues, write_subtitles

        self.editor.flush()
        try:
            written = write_subtitles(path, cues(self.project, gap_s=float(self.settings["gap_s"])))
        except (ValueError, OSError) as exc:
            self.show_error(exc)
            return None
        self.statusBar().showMessage(f"exported {written.name}", 8000)
        return written

    def selected_sentences(self) -> list[int]:
        """Sentences the editor's selection touches; the current one when nothing is selected."""
        self.editor.flush()
        cursor = self.editor.textCursor()
        if not cursor.hasSelection():
            index = self.editor.current_sentence()
            return [index] if index >= 0 else []
        first = self.project.sentence_at(cursor.selectionStart())
        last = self.project.sentence_at(max(cursor.selectionStart(), cursor.selectionEnd() - 1))
        return list(range(first, last + 1)) if first >= 0 else []


def _file_title(title: str) -> str:
    """A chapter's title as part of a file name: letters, digits, spaces and - _ . alone."""
    safe = re.sub(r"[^\w\s.-]", "", title, flags=re.UNICODE)
    return re.sub(r"\s+", " ", safe).strip(" .")[:60] or "chapter"


def _book_info(book: dict):
    """The export dialog's title, author and cover as export_mod.book_info reads them."""
    return export_mod.book_info(book.get("title", ""), book.get("author", ""), book.get("cover"))
