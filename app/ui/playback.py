"""The studio's playback: takes, clips, the timeline's selection and A/B, the play-head."""

from __future__ import annotations

import numpy as np

from app.core import export as export_mod
from app.core import words


class PlaybackMixin:
    """Methods of StudioWindow (app/ui/main.py), which has the state they use."""

    # -- playback -------------------------------------------------------------
    def _play_clip(self, audio: np.ndarray, rate: int) -> None:
        """A clip that is not the timeline (a preview, an A/B pair)."""
        try:
            self.player.load(audio, rate)
            self.player.play()
        except Exception as exc:
            self.show_error(exc)
            return
        self._playhead_timer.start()
        self._playing_timeline = False

    def play_pause(self) -> None:
        state = self.player.state
        if state == "playing":
            self.player.pause()
        elif state == "paused":
            self.player.resume()
        else:
            self.play_from(0.0)

    def play_from(self, seconds: float, stop_s: float | None = None) -> None:
        if self._timeline_timer.isActive():
            self._refresh_timeline()  # takes that arrived since the last redraw
        audio, rate = self.timeline.audio, self.timeline.rate
        if not rate:
            self.statusBar().showMessage("nothing to play yet: synthesize a sentence first", 4000)
            return
        self._stream_follow = self.busy()
        try:
            self.player.load(audio, rate, final=not self._stream_follow)
            self.player.play(seconds, stop_s)
        except Exception as exc:
            self.show_error(exc)
            return
        self._playhead_timer.start()
        self._playing_timeline = True

    def play_selection(self) -> None:
        selection = self.timeline.selection()
        if selection is not None:
            self.play_from(*selection)

    def play_from_cursor(self) -> None:
        seconds = self.timeline_cursor
        if seconds is None:
            index = self.editor.current_sentence()
            seg = next((s for s in self.timeline.segments if s.index == index), None)
            seconds = seg.start_s if seg else 0.0
        self.play_from(seconds)

    def play_ab(self, a: int, b: int) -> None:
        index = self.editor.current_sentence()
        takes = self.project.sentences[index].takes
        ta, tb = takes[a], takes[b]
        clips = [ta.audio, export_mod.resample(tb.audio, tb.sample_rate, ta.sample_rate)]
        audio = export_mod.render(clips, ta.sample_rate, gap_s=0.6)
        self._play_clip(audio, ta.sample_rate)
        self.statusBar().showMessage(f"A: take {a + 1}, then B: take {b + 1}", 5000)

    def _follow_stream(self, index: int) -> None:
        """While playing a timeline that is still being synthesized, append sentences that land at its end."""
        if not self._stream_follow or self.player.state == "stopped" or not self.player.duration_s:
            return
        placed = [i for i, s in enumerate(self.project.sentences) if s.take is not None]
        if len(placed) < 2 or placed[-1] != index:
            return  # not the new end of the timeline: it shows up the next time playback starts
        take, rate = self.project.sentences[index].take, self.player.sample_rate
        silences = self.project.silences(placed[-2:], float(self.settings["gap_s"]))  # a pause tag's too
        gap = np.zeros(silences.samples(silences.between[0], rate), dtype=np.float32)
        self.player.append(np.concatenate([gap, export_mod.resample(take.audio, take.sample_rate, rate)]))

    def stop(self) -> None:
        self.player.stop()
        self._playhead_timer.stop()
        self.timeline.set_playhead(None)
        self.editor.highlight(None)

    def _tick(self) -> None:
        if self.player.state == "stopped":
            self._playhead_timer.stop()
            self.timeline.set_playhead(None)
            self.editor.highlight(None)
            return
        self.timeline.set_playhead(self.player.position_s)
        if getattr(self, "_playing_timeline", False):
            self.editor.highlight(self.word_playing(self.player.position_s))

    def word_playing(self, seconds: float) -> tuple[int, int] | None:
        """The script's character span of the word the timeline has at ``seconds`` (from its
        take's word timings), or None."""
        for seg in self.timeline.segments:
            if seg.start_s <= seconds < seg.end_s and seg.index < len(self.project.sentences):
                sentence = self.project.sentences[seg.index]
                if seg.take is not sentence.take:
                    return None
                span = words.word_at(seg.take.timings, sentence.text, seg.take.duration_s, seconds - seg.start_s)
                return None if span is None else (sentence.start + span[0], sentence.start + span[1])
        return None
