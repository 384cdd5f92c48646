"""Playback through PortAudio (sounddevice), Qt-free.

The audio callback runs on PortAudio's thread and only copies from a buffer that
may keep growing while it plays (``append``), so playback can start while later
sentences are still being synthesized; when it catches up with the end of a
buffer that is not ``final`` it plays silence and waits. The GUI polls
``position_s`` for its play-head.
"""

from __future__ import annotations

import threading

import numpy as np


class PlaybackError(RuntimeError):
    pass


class Player:
    BLOCK = 512

    def __init__(self, device: int | str | None = None):
        self.device = device
        self._lock = threading.Lock()
        self._chunks: list[np.ndarray] = []
        self._buffer = np.zeros(0, dtype=np.float32)
        self._rate = 0
        self._final = True
        self._pos = 0
        self._stop_at: int | None = None
        self._stream = None
        self._paused = False
        self.frames_written = 0

    # -- content --------------------------------------------------------------
    def load(self, audio: np.ndarray, sample_rate: int, *, final: bool = True) -> None:
        """Replace what is played (stops playback)."""
        self.stop()
        with self._lock:
            self._buffer = np.ascontiguousarray(audio, dtype=np.float32)
            self._rate, self._final, self._pos = int(sample_rate), final, 0

    def append(self, audio: np.ndarray, *, final: bool = False) -> None:
        """More audio at the end, e.g. the next sentence as it is synthesized."""
        with self._lock:
            self._buffer = np.concatenate([self._buffer, np.asarray(audio, dtype=np.float32)])
            self._final = final

    def finish(self) -> None:
        """No more audio will be appended."""
        with self._lock:
            self._final = True

    # -- transport ------------------------------------------------------------
    @property
    def state(self) -> str:
        if self._stream is None or not self._stream.active:
            return "stopped"
        return "paused" if self._paused else "playing"

    @property
    def sample_rate(self) -> int:
        return self._rate

    @property
    def position_s(self) -> float:
        return self._pos / self._rate if self._rate else 0.0

    @property
    def duration_s(self) -> float:
        return len(self._buffer) / self._rate if self._rate else 0.0

    def play(self, start_s: float = 0.0, stop_s: float | None = None) -> None:
        """Play from ``start_s`` to ``stop_s`` (or the end)."""
        import sounddevice

        self.stop()
        if not self._rate:
            raise PlaybackError("nothing to play")
        with self._lock:
            self._pos = max(0, min(int(start_s * self._rate), len(self._buffer)))
            self._stop_at = int(stop_s * self._rate) if stop_s is not None else None
            self._paused = False
        try:
            self._stream = sounddevice.OutputStream(
                samplerate=self._rate,
                channels=1,
                dtype="float32",
                blocksize=self.BLOCK,
                device=self.device,
                callback=self._callback,
            )
            self._stream.start()
        except Exception as exc:  # PortAudio reports a missing or busy device this way
            self._stream = None
            raise PlaybackError(f"cannot open the audio output: {exc}") from exc

    def pause(self) -> None:
        if self._stream is not None:
            self._paused = True

    def resume(self) -> None:
        if self._stream is not None:
            self._paused = False

    def stop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.abort()
            stream.close()

    # -- PortAudio thread -----------------------------------------------------
    def _callback(self, outdata, frames, time_info, status) -> None:
        import sounddevice

        out = outdata[:, 0]
        if self._paused:
            out.fill(0.0)
            return
        with self._lock:
            end = len(self._buffer) if self._stop_at is None else min(self._stop_at, len(self._buffer))
            n = max(0, min(frames, end - self._pos))
            out[:n] = self._buffer[self._pos : self._pos + n]
            out[n:] = 0.0
            self._pos += n
            self.frames_written += n
            done = self._pos >= end and (self._final or self._stop_at is not None and self._pos >= self._stop_at)
        if done:
            raise sounddevice.CallbackStop
