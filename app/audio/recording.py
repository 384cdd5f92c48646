"""Recording a reference through PortAudio (sounddevice), Qt-free.

    rec = Recorder()              # default input device, 48 kHz mono
    rec.start(); ...; rec.stop()
    rec.level_db, rec.peak_db, rec.clipped   # for a meter, polled by the GUI
    audio = rec.audio()                       # float32

The input callback runs on PortAudio's thread and only appends blocks under a lock.
"""

from __future__ import annotations

import threading

import numpy as np

RATE = 48000
MAX_SECONDS = 120.0  # a reference uses 60 s; recording stops itself a while after
CLIP_LEVEL = 0.999


class RecordingError(RuntimeError):
    pass


class Recorder:
    def __init__(self, device: int | str | None = None, sample_rate: int = RATE):
        self.device = device
        self.sample_rate = sample_rate
        self._lock = threading.Lock()
        self._blocks: list[np.ndarray] = []
        self._n = 0
        self._stream = None
        self.level_db = -120.0  # RMS of the last block
        self.peak_db = -120.0  # highest peak so far
        self.clipped = 0  # samples at full scale so far
        self.overflows = 0

    @property
    def recording(self) -> bool:
        return self._stream is not None

    @property
    def seconds(self) -> float:
        with self._lock:
            return self._n / self.sample_rate

    def _callback(self, indata, frames, _time, status) -> None:
        if status and status.input_overflow:
            self.overflows += 1
        block = indata[:, 0].copy()
        peak = float(np.max(np.abs(block))) if len(block) else 0.0
        rms = float(np.sqrt(np.mean(block.astype(np.float64) ** 2))) if len(block) else 0.0
        with self._lock:
            if self._n >= MAX_SECONDS * self.sample_rate:
                return
            self._blocks.append(block)
            self._n += len(block)
            self.level_db = 20.0 * np.log10(max(rms, 1e-6))
            self.peak_db = max(self.peak_db, 20.0 * np.log10(max(peak, 1e-6)))
            self.clipped += int(np.count_nonzero(np.abs(block) >= CLIP_LEVEL))

    def start(self) -> None:
        import sounddevice as sd

        if self._stream is not None:
            return
        with self._lock:
            self._blocks, self._n = [], 0
            self.level_db, self.peak_db, self.clipped, self.overflows = -120.0, -120.0, 0, 0
        try:
            stream = sd.InputStream(
                samplerate=self.sample_rate, channels=1, dtype="float32", device=self.device, callback=self._callback
            )
            stream.start()
        except (sd.PortAudioError, ValueError) as exc:
            raise RecordingError(f"cannot record from the input device: {exc}") from exc
        self._stream = stream

    def stop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.stop()
            stream.close()

    def audio(self) -> np.ndarray:
        with self._lock:
            return np.concatenate(self._blocks) if self._blocks else np.zeros(0, dtype=np.float32)
