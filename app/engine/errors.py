"""Exceptions raised by the engine and the model manager, keyed by engine status code."""

from __future__ import annotations


class VoiceStudioError(Exception):
    """Base of every error Voice Studio reports to a user."""


class InvalidArgumentError(VoiceStudioError, ValueError):
    pass


class ModelFileError(VoiceStudioError):
    """A model file is missing, unreadable, damaged, or of another architecture."""


class DeviceError(VoiceStudioError):
    pass


class NothingToSpeakError(VoiceStudioError, ValueError):
    pass


class CancelledError(VoiceStudioError):
    pass


class ComputeError(VoiceStudioError):
    pass


class PhonemizerError(VoiceStudioError):
    pass


_BY_CODE = {
    -1: InvalidArgumentError,
    -2: ModelFileError,
    -3: ModelFileError,
    -4: DeviceError,
    -5: NothingToSpeakError,
    -6: CancelledError,
    -7: ComputeError,
    -8: PhonemizerError,
}


def exception_for(code: int) -> type[VoiceStudioError]:
    return _BY_CODE.get(code, VoiceStudioError)
