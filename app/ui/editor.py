"""The script editor: plain text whose sentences show their state.

Each sentence is underlined by its state (no take yet: dotted grey; current take
up to date: green; stale: orange wave; locked: grey background; the underline red
where the take left symbols out: core.project.lost_symbols) and the sentence under
the cursor is tinted; while the timeline plays, the word being said is marked. Pause
tags (app.core.script) are shown in violet, a malformed one with a red wave, and
``tag_problems`` names what is wrong with each.
Text changes reach the project after a short pause so that typing and pasting a
chapter stay responsive; undo/redo are the editor's.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QTextEdit

from app.core.project import Project, lost_symbols
from app.core.script import say_as_tags

STYLES = {
    "none": (QTextCharFormat.UnderlineStyle.DotLine, "#9ca3af"),
    "fresh": (QTextCharFormat.UnderlineStyle.SingleUnderline, "#16a34a"),
    "stale": (QTextCharFormat.UnderlineStyle.WaveUnderline, "#ea580c"),
}
LOST = "#dc2626"  # the take left out symbols (core.project.lost_symbols)
WORD = "#fde68a"  # the word being played


class ScriptEditor(QPlainTextEdit):
    script_changed = Signal(str)  # after the typing pause
    current_sentence_changed = Signal(int)
    tag_problems = Signal(list)  # after the typing pause: "line N: 'tag': what is wrong" for each malformed tag

    DEBOUNCE_MS = 250

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setPlaceholderText("Type or paste a script. Sentences become takes; a blank line starts a paragraph.")
        self.project: Project | None = None
        self._current = -1
        self._word: tuple[int, int] | None = None  # the word being played (highlight)
        self._debounce = QTimer(self, singleShot=True, interval=self.DEBOUNCE_MS)
        self._debounce.timeout.connect(self.flush)
        self.textChanged.connect(self._debounce.start)
        self.cursorPositionChanged.connect(self._cursor_moved)
        self.verticalScrollBar().valueChanged.connect(self.refresh)

    def set_project(self, project: Project) -> None:
        self.project = project
        self.blockSignals(True)
        self.setPlainText(project.script)
        self.blockSignals(False)
        self._current = -1
        self.refresh()

    def flush(self) -> None:
        """Hand pending edits to the project now (also called before any job starts)."""
        self._debounce.stop()
        if self.project is not None and self.toPlainText() != self.project.script:
            self.project.set_script(self.toPlainText())
            self.script_changed.emit(self.project.script)
            self.tag_problems.emit(self.problems())
            self.refresh()
            self._cursor_moved()

    def problems(self) -> list[str]:
        """What is wrong with each malformed pause tag of the project's script, with its line."""
        if self.project is None:
            return []
        script = self.project.script
        found = [(t.start, t.end, t.problem) for t in self.project.script_tags() if t.problem]
        found += [(t.start, t.end, t.problem) for t in say_as_tags(script) if t.problem]
        return [
            f"line {script.count(chr(10), 0, a) + 1}: {script[a:b]!r}: {problem}" for a, b, problem in sorted(found)
        ]

    def current_sentence(self) -> int:
        self.flush()
        if self.project is None or not self.project.sentences:
            return -1
        return self.project.sentence_at(self.textCursor().position())

    def select_sentence(self, index: int) -> None:
        if self.project is None or not 0 <= index < len(self.project.sentences):
            return
        cursor = self.textCursor()
        cursor.setPosition(self.project.sentences[index].start)
        self.setTextCursor(cursor)
        self.ensureCursorVisible()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        self.refresh()

    def _visible_sentences(self) -> range:
        """Sentences on screen (and a screen's worth around them): only those are decorated."""
        project = self.project
        if not project.sentences:
            return range(0)
        viewport = self.viewport().rect()
        first = self.cursorForPosition(viewport.topLeft()).position()
        last = self.cursorForPosition(viewport.bottomRight()).position()
        span = max(last - first, 2000)
        lo = project.sentence_at(max(0, first - span))
        hi = project.sentence_at(last + span)
        return range(lo, hi + 1)

    def refresh(self) -> None:
        """Repaint the sentence states of the visible part of the script."""
        if self.project is None or self._debounce.isActive():
            return
        selections = []
        project = self.project
        for i in self._visible_sentences():
            sentence = project.sentences[i]
            fmt = QTextCharFormat()
            if sentence.take is None:
                state = "none"
            else:
                state = "stale" if project.is_stale(i) else "fresh"
            style, colour = STYLES[state]
            if sentence.take is not None and lost_symbols(sentence.take):
                colour = LOST
            fmt.setUnderlineStyle(style)
            fmt.setUnderlineColor(QColor(colour))
            if sentence.locked:
                fmt.setBackground(QColor("#e5e7eb"))
            if i == self._current:
                fmt.setBackground(QColor("#dbeafe"))
            selections.append(self._selection(sentence.start, sentence.end, fmt))
        for tag in [*project.script_tags(), *say_as_tags(project.script)]:
            fmt = QTextCharFormat()
            fmt.setForeground(QColor("#6d28d9"))
            fmt.setBackground(QColor("#ede9fe"))
            if tag.problem:
                fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
                fmt.setUnderlineColor(QColor("#dc2626"))
            selections.append(self._selection(tag.start, tag.end, fmt))
        if self._word is not None:
            fmt = QTextCharFormat()
            fmt.setBackground(QColor(WORD))
            selections.append(self._selection(*self._word, fmt))
        self.setExtraSelections(selections)

    def highlight(self, span: tuple[int, int] | None) -> None:
        """Mark the word being played (a character span of the script), or none."""
        if span != self._word:
            self._word = span
            self.refresh()

    def _selection(self, start: int, end: int, fmt: QTextCharFormat) -> QTextEdit.ExtraSelection:
        selection = QTextEdit.ExtraSelection()
        selection.format = fmt
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        return selection

    def _cursor_moved(self) -> None:
        if self.project is None or self._debounce.isActive() or not self.project.sentences:
            return
        index = self.project.sentence_at(self.textCursor().position())
        if index != self._current:
            self._current = index
            self.refresh()
            self.current_sentence_changed.emit(index)
