"""The native binding (app._engine), its errors raised as app.engine.errors' types."""

from __future__ import annotations

from types import ModuleType

from app.engine.errors import exception_for

_module: ModuleType | None = None


def native_engine() -> ModuleType:
    """The binding, loaded on first use (importing it loads ggml and its backends)."""
    global _module
    if _module is None:
        from app import _engine

        _engine.set_error_factory(exception_for)
        _module = _engine
    return _module
