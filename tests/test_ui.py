"""The first cut of the studio window, offscreen."""

import numpy as np
import pytest

pytest.importorskip("PySide6")

from app.ui.main import StudioWindow  # noqa: E402


@pytest.fixture
def window(qtbot, joe_path):
    w = StudioWindow()
    qtbot.addWidget(w)
    w.device.setCurrentIndex(w.device.findData("cpu"))
    yield w
    w.close()


def test_device_picker_lists_engine_devices(window):
    from app.core.engine import devices

    ids = [window.device.itemData(i) for i in range(window.device.count())]
    assert ids == ["auto"] + [d["id"] for d in devices()]


def test_synthesize_shows_waveform_and_timings(qtbot, window):
    window.editor.setPlainText("Hello from the studio. A second sentence.")
    window.synthesize()
    job = window.job
    with qtbot.waitSignals([job.signals.started, job.signals.finished], order="strict", timeout=60_000):
        pass
    x, y = window.curve.getData()
    assert np.array_equal(y, window.take.audio)
    for stage in ("phonemize", "encoder", "duration", "flow", "decoder"):
        assert stage in window.timings.text()


def test_cancel_leaves_no_take(qtbot, window):
    window.editor.setPlainText(" ".join(["A sentence to cancel."] * 40))
    window.synthesize()
    job = window.job
    window.cancel()
    with qtbot.waitSignal(job.signals.failed, timeout=60_000) as blocker:
        pass
    assert type(blocker.args[0]).__name__ == "CancelledError"
    assert window.take is None
    assert window.job is None
