"""Every named stage of both voices on the CPU against tests/data/golden_stages.npz, recorded
by tools/golden_stages.py: code that moves without meaning to change behaviour must leave
each output as it was (bit-identical on the machine that recorded them; elsewhere ggml may
pick other kernels, which reorder sums: the test runs on a CPU of the recording one's SIMD
extensions, and allows differences of 1e-4 of an output's peak)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import golden_stages  # noqa: E402


def test_every_stage_output_is_what_was_recorded():
    with np.load(golden_stages.GOLDEN) as npz:
        want = {k: npz[k] for k in npz.files if k != "cpu"}
        recorded_on = str(npz["cpu"])
    if recorded_on != golden_stages.cpu_signature():
        # Other SIMD kernels sum in another order, which can move a duration across a frame.
        pytest.skip(f"recorded on a CPU with {recorded_on}; record here with tools/golden_stages.py --write")
    rows = golden_stages.compare(golden_stages.record(), want)
    assert len(rows) == (1 + 4) + (1 + 8)  # each voice's audio and named outputs
    bad = [(key, state, rel) for key, state, rel in rows if state not in ("identical", "differs") or rel > 1e-4]
    assert not bad, bad
