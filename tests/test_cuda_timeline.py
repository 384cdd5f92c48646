"""tools/cuda_timeline.py's accounting of a CUPTI timeline: each stage's window, the GPU's
busy time in it (overlapping kernels counted once), its kernels by name and the host's time
in CUDA calls."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "cuda_timeline.py"


@pytest.fixture(scope="module")
def timeline():
    spec = importlib.util.spec_from_file_location("cuda_timeline", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def event(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_each_stage_gets_the_gpu_time_and_cuda_calls_inside_its_window(timeline):
    events = [
        # One call of two stages: bert ends at 40 us, the generator at 100.
        event("user_annotation", "call 0", 0, 100),
        event("user_annotation", "end bert 0", 40, 0),
        event("user_annotation", "end generator 0", 100, 0),
        # Two kernels overlapping (20 us busy), then a kernel and a copy in the generator's.
        event("kernel", "a", 10, 10),
        event("kernel", "b", 15, 15),
        event("kernel", "c", 50, 10),
        event("gpu_memcpy", "Memcpy HtoD", 70, 20),
        event("cuda_runtime", "cudaLaunchKernel", 5, 3),
        event("cuda_runtime", "cudaLaunchKernel", 8, 2),
        event("cuda_runtime", "cudaStreamSynchronize", 45, 10),
        # A batch call: a stage with one kernel running past its end (counted up to it).
        event("user_annotation", "batch", 200, 50),
        event("user_annotation", "end bert 0", 250, 0),
        event("kernel", "d", 240, 30),
        event("cpu_op", "not a GPU event", 200, 50),
    ]
    table = timeline.summarize(events)
    bert, gen = table["one a call"]["bert"], table["one a call"]["generator"]
    assert bert["wall"] == pytest.approx(0.040) and bert["busy"] == pytest.approx(0.020)
    assert bert["calls"] == {"cudaLaunchKernel": [2, pytest.approx(0.005)]}
    assert gen["wall"] == pytest.approx(0.060) and gen["busy"] == pytest.approx(0.030)
    assert gen["in_calls"] == pytest.approx(0.010)
    # Kernels by name (a launch belongs to the window it starts in; copies are not kernels).
    assert bert["kernels"] == {"a": [1, pytest.approx(0.010)], "b": [1, pytest.approx(0.015)]}
    assert gen["kernels"] == {"c": [1, pytest.approx(0.010)]}
    assert table["batch"]["bert"]["wall"] == pytest.approx(0.050)
    assert table["batch"]["bert"]["busy"] == pytest.approx(0.010)
