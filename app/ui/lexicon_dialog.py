"""The pronunciations dialog: the project's lexicon and the user's (app.core.lexicon), each a
table of words and pronunciations, with import and export of lexicon files (plain or PLS) and
a preview of the selected entry in the project's voice."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core import lexicon
from app.profiles.voices import phoneme_symbols


def unknown_symbols(pronunciation: str, symbols: frozenset[str] | None) -> str:
    """The symbols of an /IPA/ pronunciation the voice has no phoneme for, in order, or ""."""
    if symbols is None or not lexicon.is_ipa(pronunciation.strip()):
        return ""
    return "".join(dict.fromkeys(c for c in pronunciation.strip()[1:-1] if c not in symbols))


class LexiconTable(QWidget):
    def __init__(
        self,
        entries: dict[str, str],
        preview: Callable[[str, str], None],
        symbols: frozenset[str] | None = None,
        voice: str = "",
        parent=None,
    ):
        super().__init__(parent)
        self.symbols, self.voice = symbols, voice  # the project voice's phonemes, to check IPA against
        self.table = QTableWidget(0, 2)
        self.table.setHorizontalHeaderLabels(["Word", "Pronunciation (/IPA/ or a respelling)"])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        for word, pron in sorted(entries.items(), key=lambda e: e[0].lower()):
            self.add(word, pron)
        buttons = QHBoxLayout()
        for label, slot in (
            ("Add", lambda: self.add("", "")),
            ("Remove", self.remove),
            ("Preview", lambda: self._preview(preview)),
            ("Import…", self.import_dialog),
            ("Export…", self.export_dialog),
        ):
            button = QPushButton(label)
            button.clicked.connect(slot)
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addLayout(buttons)
        self.table.itemChanged.connect(self._check)
        for row in range(self.table.rowCount()):
            self._check(self.table.item(row, 1))

    def _check(self, item: QTableWidgetItem | None) -> None:
        """As a pronunciation is typed: IPA symbols the voice has no phoneme for are named, and
        the cell is marked (the engine would skip them)."""
        if item is None or item.column() != 1:
            return
        unknown = unknown_symbols(item.text(), self.symbols)
        self.table.blockSignals(True)
        item.setBackground(QColor("#fee2e2") if unknown else QColor(0, 0, 0, 0))
        item.setToolTip(f"not among {self.voice}'s phonemes: {' '.join(unknown)}" if unknown else "")
        self.table.blockSignals(False)

    def add(self, word: str, pron: str) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        self.table.setItem(row, 0, QTableWidgetItem(word))
        self.table.setItem(row, 1, QTableWidgetItem(pron))

    def remove(self) -> None:
        for row in sorted({i.row() for i in self.table.selectedIndexes()}, reverse=True):
            self.table.removeRow(row)

    def entries(self) -> dict[str, str]:
        """The table's entries, each checked (LexiconError names the first bad one); empty rows skipped."""
        out: dict[str, str] = {}
        for row in range(self.table.rowCount()):
            word, pron = (self.table.item(row, c).text() if self.table.item(row, c) else "" for c in (0, 1))
            if word.strip() or pron.strip():
                word, pron = lexicon.check_entry(word, pron)
                out[word] = pron
        return out

    def _preview(self, preview: Callable[[str, str], None]) -> None:
        row = self.table.currentRow()
        if row < 0:
            return
        try:
            word, pron = lexicon.check_entry(self.table.item(row, 0).text(), self.table.item(row, 1).text())
        except (lexicon.LexiconError, AttributeError) as exc:
            QMessageBox.warning(self, "Preview", str(exc))
            return
        preview(word, pron)

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a lexicon", "", "Lexicons (*.txt *.tsv *.pls *.xml);;All files (*)"
        )
        if path:
            self.import_file(path)

    def import_file(self, path) -> None:
        try:
            entries = lexicon.read(path)
        except lexicon.LexiconError as exc:
            QMessageBox.warning(self, "Import", str(exc))
            return
        have = {self.table.item(r, 0).text(): r for r in range(self.table.rowCount()) if self.table.item(r, 0)}
        for word, pron in entries.items():  # a word already here takes the file's pronunciation
            if word in have:
                self.table.item(have[word], 1).setText(pron)
            else:
                self.add(word, pron)

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the lexicon", "lexicon.txt", "Lexicon (*.txt)")
        if path:
            try:
                lexicon.write(path, self.entries())
            except (lexicon.LexiconError, OSError) as exc:
                QMessageBox.warning(self, "Export", str(exc))


class LexiconDialog(QDialog):
    def __init__(
        self,
        parent,
        project: dict[str, str],
        user: dict[str, str],
        preview: Callable[[str, str], None],
        voice: str = "",
    ):
        super().__init__(parent)
        self.setWindowTitle("Pronunciations")
        self.resize(640, 420)
        symbols = phoneme_symbols(voice) if voice else None
        self.project = LexiconTable(project, preview, symbols, voice)
        self.user = LexiconTable(user, preview, symbols, voice)
        tabs = QTabWidget()
        tabs.addTab(self.project, "This project")
        tabs.addTab(self.user, "All projects (yours)")
        note = QLabel(
            "A word written in lower case matches it in any case. /IPA/ is read as phonemes (Piper, "
            "Kokoro); anything else replaces the word in the text. The project's entries win over yours. "
            '"record (noun)" and "record (verb)" apply where the word before tells: a noun after the, '
            "my, this, of…; a verb after to, will, don't, I, we…"
        )
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addWidget(tabs)
        layout.addWidget(buttons)

    def accept(self) -> None:
        try:
            self.project.entries(), self.user.entries()
        except lexicon.LexiconError as exc:  # stays open: nothing typed is lost
            QMessageBox.warning(self, "Pronunciations", str(exc))
            return
        super().accept()
