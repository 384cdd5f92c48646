"""The native binding (app._engine), its errors raised as app.engine.errors' types."""

from __future__ import annotations

import os
from types import ModuleType

from app.engine.errors import exception_for

_module: ModuleType | None = None

# ggml's CPU threads meet at a barrier after every op, an OpenMP barrier in the ggml we build.
# libgomp's waiters spin about 300000 rounds before they sleep: on a machine whose cores are busy
# with other programs, a waiter then burns the time slice that the thread it waits for needs, and
# a graph of many small ops slows down many times over. A few thousand rounds keep an idle
# machine's speed and let the waiters yield under load (docs/performance.md, "Under load").
# libgomp reads this once, as it loads; a setting of the user's own is kept.
CPU_SPIN_COUNT = "3000"


def _cpu_waits() -> None:
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = CPU_SPIN_COUNT


def native_engine() -> ModuleType:
    """The binding, loaded on first use (importing it loads ggml and its backends)."""
    global _module
    if _module is None:
        _cpu_waits()
        from app import _engine

        _engine.set_error_factory(exception_for)
        _module = _engine
    return _module
