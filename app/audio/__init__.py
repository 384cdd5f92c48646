"""Audio: playback and recording through PortAudio, WAV files, and analysis with NumPy. No Qt."""
