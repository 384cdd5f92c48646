"""The export dialog: what to render, its sample format and rate, gaps, a loudness preset, and an
audiobook's title, author and cover."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
)

from app.core.settings import Settings


class ExportDialog(QDialog):
    SCOPES = {
        "all": "Whole script",
        "chapters": "Whole script, a file per chapter",
        "sentences": "Selected sentences",
        "selection": "Timeline selection",
    }
    FORMATS = {"pcm16": "16-bit PCM", "pcm24": "24-bit PCM", "float": "32-bit float"}
    LOUDNESS = {
        None: "as synthesized",
        "podcast": "Podcast (−16 LUFS)",
        "broadcast": "Broadcast (−23 LUFS)",
        "acx": "Audiobook ACX (−20 dB RMS, ≤ −3 dBTP)",
    }

    def __init__(self, parent, settings: Settings):
        super().__init__(parent)
        self.setWindowTitle("Export")
        self.scope = self._combo(self.SCOPES, "all")
        self.rate = self._combo(
            {None: "voice's rate", 22050: "22050 Hz", 24000: "24000 Hz", 44100: "44100 Hz", 48000: "48000 Hz"}, None
        )
        self.format = self._combo(self.FORMATS, settings["export_format"])
        self.loudness = self._combo(self.LOUDNESS, settings["export_loudness"])
        self.gap = QDoubleSpinBox(minimum=0.0, maximum=5.0, singleStep=0.05, value=float(settings["gap_s"]))
        self.gap.setSuffix(" s")
        form = QFormLayout(self)
        form.addRow("What", self.scope)
        form.addRow("Sample rate", self.rate)
        form.addRow("Sample format (WAV, FLAC)", self.format)
        form.addRow("Silence between sentences", self.gap)
        form.addRow("Loudness", self.loudness)
        # An audiobook's (.m4b) title, author and cover; its chapters are the script's headings.
        self.book_title, self.author, self.cover = QLineEdit(), QLineEdit(), QLineEdit()
        self.cover.setPlaceholderText("a JPEG or PNG image (optional)")
        browse = QPushButton("…")
        browse.clicked.connect(self._browse_cover)
        cover_row = QHBoxLayout()
        cover_row.addWidget(self.cover, 1)
        cover_row.addWidget(browse)
        form.addRow("Audiobook title", self.book_title)
        form.addRow("Author", self.author)
        form.addRow("Cover", cover_row)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    @staticmethod
    def _combo(options: dict, current) -> QComboBox:
        box = QComboBox()
        for value, label in options.items():
            box.addItem(label, value)
        box.setCurrentIndex(max(0, box.findData(current)))
        return box

    def _browse_cover(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Cover image", "", "Images (*.jpg *.jpeg *.png)")
        if path:
            self.cover.setText(path)

    def book(self) -> dict:
        """The audiobook's title, author and cover image path ("" where not given)."""
        return {"title": self.book_title.text().strip(), "author": self.author.text().strip(),
                "cover": str(Path(self.cover.text().strip())) if self.cover.text().strip() else ""}  # fmt: skip

    def options(self) -> dict:
        return {
            "book": self.book(),
            "scope": self.scope.currentData(),
            "out_rate": self.rate.currentData(),
            "subtype": self.format.currentData(),
            "gap_s": self.gap.value(),
            "loudness": self.loudness.currentData(),
        }
