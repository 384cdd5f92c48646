"""Node traces (EngineDebug.node_trace), which tools/nodes_vs_cpu.py compares between a device and the CPU."""

import numpy as np
import pytest

from app.engine.engine import Engine, EngineDebug
from tools.devkit import node_trace

IPA = "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps."


def traced_piper(tmp_path, name, **debug):
    path = tmp_path / name
    with Engine.open("piper:joe", device="cpu", threads=2, debug=EngineDebug(node_trace=path, **debug)) as engine:
        engine.synthesize(phonemes=IPA, noise_scale=0.0, noise_w=0.0)  # not traced: profiling is off
        engine.set_op_profiling(True)
        take = engine.synthesize(phonemes=IPA, noise_scale=0.0, noise_w=0.0)
        logw = engine.output("logw").reshape(-1)
    return node_trace.read(path), take, logw


def test_a_trace_holds_each_graph_and_the_values_its_nodes_computed(tmp_path, joe_path):
    trace, take, logw = traced_piper(tmp_path, "trace.txt")
    assert trace.device == "cpu"
    # One synthesis: Piper's four stages, each a graph (the first, untraced call left none).
    assert [g.stage for g in trace.graphs] == ["encoder", "duration", "flow", "decoder"]
    duration = trace.graphs[1]
    # Whole graphs: on the CPU each of the decoder's 18 residual convolutions is one node of the
    # engine's own kernels (ggml's CUSTOM op), and the other stages keep a hundred ops or more.
    assert all(len(g.nodes) > 40 for g in trace.graphs) and len(trace.graphs[0].nodes) > 100
    assert sum(n.op == "CUSTOM" for n in trace.graphs[3].nodes) >= 18
    assert all(s < n.id for g in trace.graphs for n in g.nodes for s in n.srcs)  # sources come first
    # The duration predictor's output node holds logw: its statistics and its samples,
    # 64 values evenly spaced (or all of them), as the engine returned it.
    k = min(len(logw), 64)
    want = logw[np.arange(k) * len(logw) // k]
    matches = [n for n in duration.nodes if n.count == len(logw) and np.allclose(n.samples, want, rtol=0, atol=1e-6)]
    assert matches, "no node of the duration graph holds logw"
    node = matches[-1]
    assert node.nonfinite == 0
    assert node.maxabs == pytest.approx(np.abs(logw).max(), rel=1e-6)
    assert node.mean == pytest.approx(logw.mean(), rel=1e-5, abs=1e-6)
    assert node.rms == pytest.approx(np.sqrt(np.mean(logw.astype(np.float64) ** 2)), rel=1e-5)


def test_the_same_graphs_twice_line_up_node_by_node(tmp_path, joe_path):
    # A device's graphs built on the CPU, as tools/nodes_vs_cpu.py's reference does.
    debug = {"device_graphs": True, "device_limits": "64,0,0"}
    a, take_a, _ = traced_piper(tmp_path, "a.txt", **debug)
    b, take_b, _ = traced_piper(tmp_path, "b.txt", **debug)
    assert np.array_equal(take_a.audio, take_b.audio)
    diffs, problems = node_trace.compare(a, b)
    assert problems == []
    assert len(diffs) > 500 and max(d.error for d in diffs) == 0.0
    # The CPU's own graphs are other graphs: the comparison says where they stop lining up.
    own, _, _ = traced_piper(tmp_path, "own.txt", device_graphs=False)
    _, problems = node_trace.compare(own, a)
    assert problems and all("node" in p for p in problems)


def write_trace(path, rows):
    lines = ["D test 64,0,0", "G 0 decoder 4"]
    for i, (op, srcs, values) in enumerate(rows):
        v = np.asarray(values, np.float64)
        stats = f"{len(v)} {int((~np.isfinite(v)).sum())} {np.abs(v[np.isfinite(v)]).max()} 0 0"
        lines.append(f"N {i} {op} n{i} f32 {len(v)},1,1,1 {srcs} {stats} " + " ".join(f"{x:.9g}" for x in v))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return node_trace.read(path)


def test_the_comparison_names_the_node_where_two_runs_part(tmp_path):
    want = write_trace(tmp_path / "want.txt", [
        ("MUL_MAT", "-1,-1", [1.0, 2.0, 4.0]),
        ("ADD", "-1,-1", [2.0, 3.0, 5.0]),
        ("SIN", "1", [0.5, 0.25, 0.125]),
        ("MUL", "2,0", [0.5, 0.5, 0.5]),
    ])  # fmt: skip
    got = write_trace(tmp_path / "got.txt", [
        ("MUL_MAT", "-1,-1", [1.0, 2.0, 4.0001]),  # 2.5e-5 of 4: F16's rounding, say
        ("ADD", "-1,-1", [2.0, 3.0, 5.0001]),
        ("SIN", "1", [0.5, 0.3, 0.125]),  # here: 0.05 of 0.5
        ("MUL", "2,0", [0.5, 0.6, 0.5]),  # inherits it
    ])  # fmt: skip
    diffs, problems = node_trace.compare(got, want)
    assert problems == []
    assert [round(d.error, 6) for d in diffs] == [2.5e-05, 2e-05, 0.1, 0.2]
    # MUL's error is larger, but its source SIN already has half of it: SIN is where they part.
    assert [d.node.op for d in node_trace.introduced(diffs, 1e-2)] == ["SIN"]
    assert node_trace.introduced(diffs, 0.5) == []

    nan = write_trace(tmp_path / "nan.txt", [
        ("MUL_MAT", "-1,-1", [1.0, 2.0, 4.0]),
        ("ADD", "-1,-1", [2.0, float("nan"), 5.0]),
        ("SIN", "1", [0.5, 0.25, 0.125]),
        ("MUL", "2,0", [0.5, 0.5, 0.5]),
    ])  # fmt: skip
    diffs, _ = node_trace.compare(nan, want)
    assert [d.node.op for d in node_trace.introduced(diffs)] == ["ADD"]

    # A backend may run a graph's nodes in another order (ggml's Vulkan backend does): ADD
    # before MUL_MAT here. They pair up by id, their place in the graph as built.
    reordered = tmp_path / "reordered.txt"
    lines = (tmp_path / "got.txt").read_text(encoding="utf-8").splitlines()
    reordered.write_text("\n".join([*lines[:2], lines[3], lines[2], lines[4], lines[5]]) + "\n", encoding="utf-8")
    diffs, problems = node_trace.compare(node_trace.read(reordered), want)
    assert problems == []
    assert [d.node.op for d in node_trace.introduced(diffs, 1e-2)] == ["SIN"]
