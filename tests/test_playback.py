"""Playback through real PortAudio into a PulseAudio null sink (see conftest.null_sink)."""

import time

import numpy as np
import pytest

from app.audio.playback import PlaybackError, Player


def tone(seconds, rate=22050, freq=440.0):
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def wait_for(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_played_audio_reaches_the_sink(null_sink):
    player = Player()
    player.load(tone(1.0), 22050)
    recorded = null_sink(1.3, player.play)
    assert wait_for(lambda: player.state == "stopped")
    player.stop()
    assert player.frames_written == 22050
    loud = np.abs(recorded) > 0.1
    assert loud.sum() > 0.6 * 22050  # most of the second of tone came out


def test_streaming_plays_audio_appended_while_playing(null_sink):
    player = Player()
    player.load(tone(0.3), 22050, final=False)

    def play_then_append():
        player.play()
        time.sleep(0.2)  # the next sentence arrives while the first is playing
        player.append(tone(0.5, freq=660.0), final=True)

    recorded = null_sink(1.2, play_then_append)
    assert wait_for(lambda: player.state == "stopped")
    player.stop()
    assert player.frames_written == int(0.3 * 22050) + int(0.5 * 22050)
    assert (np.abs(recorded) > 0.1).sum() > 0.5 * (0.3 + 0.5) * 22050


def test_play_selection_pause_and_stop(null_sink):
    player = Player()
    player.load(tone(2.0), 22050)
    player.play(0.5, 0.8)
    assert wait_for(lambda: player.state == "stopped")
    assert player.frames_written == int(0.8 * 22050) - int(0.5 * 22050)
    player.play(0.0)
    player.pause()
    assert player.state == "paused"
    time.sleep(0.2)
    paused_at = player.frames_written
    time.sleep(0.2)
    assert player.frames_written == paused_at
    player.resume()
    assert wait_for(lambda: player.frames_written > paused_at)
    player.stop()
    assert player.state == "stopped"


def test_nothing_loaded_or_no_device():
    with pytest.raises(PlaybackError, match="nothing"):
        Player().play()
    player = Player(device="no such device")
    player.load(tone(0.1), 22050)
    with pytest.raises(PlaybackError, match="audio output"):
        player.play()
