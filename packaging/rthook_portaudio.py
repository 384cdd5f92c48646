"""PyInstaller runtime hook: sounddevice finds PortAudio by name (ctypes.util.find_library), which
on Linux searches the system's libraries alone; the bundle's own copy is found first."""

import ctypes.util
import os
import sys

_system_find_library = ctypes.util.find_library


def _find_library(name):
    if name == "portaudio":
        for candidate in ("libportaudio.so.2", "libportaudio.so"):
            path = os.path.join(getattr(sys, "_MEIPASS", ""), candidate)
            if os.path.isfile(path):
                return path
    return _system_find_library(name)


ctypes.util.find_library = _find_library
