"""Node traces (EngineDebug.node_trace): read them, and find where two runs of the same graphs part ways.

A context opened with ``EngineDebug(node_trace=<file>)`` writes, while op profiling is on,
one line per graph and one per node it computes, in the order the backend ran them: the
node's id (its place in the graph as built), op, shape, sources (ids of other nodes of its
graph, -1 for inputs and weights), statistics over its values and 64 of them evenly
spaced. Two traces of the same graphs (a device's, and the CPU's building that device's
graphs through ``EngineDebug(device_graphs=True)``) then compare node by node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Node:
    id: int
    op: str
    name: str
    type: str
    shape: tuple[int, ...]
    srcs: list[int]
    count: int = 0  # values summarized (0: not F32/F16, or not contiguous)
    nonfinite: int = 0
    maxabs: float = 0.0
    mean: float = 0.0
    rms: float = 0.0
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))


@dataclass
class Graph:
    index: int
    stage: str
    nodes: list[Node] = field(default_factory=list)


@dataclass
class Trace:
    device: str = ""
    limits: str = ""  # as EngineDebug.device_limits takes it
    graphs: list[Graph] = field(default_factory=list)


def read(path: Path) -> Trace:
    """The last context's trace in ``path`` (each context opened with the variable rewrites it)."""
    trace = Trace()
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "D":
            trace.device, trace.limits = rest.split()
        elif kind == "G":
            index, stage, _ = rest.split()
            trace.graphs.append(Graph(int(index), stage))
        elif kind == "N":
            f = rest.split()
            node = Node(
                id=int(f[0]),
                op=f[1],
                name=f[2],
                type=f[3],
                shape=tuple(int(n) for n in f[4].split(",")),
                srcs=[] if f[5] == "-" else [int(s) for s in f[5].split(",")],
                count=int(f[6]),
            )
            if node.count:
                node.nonfinite = int(f[7])
                node.maxabs, node.mean, node.rms = (float(v) for v in f[8:11])
                node.samples = np.array([float(v) for v in f[11:]], np.float64)
            trace.graphs[-1].nodes.append(node)
    return trace


@dataclass
class Difference:
    graph: Graph
    node: Node
    error: float  # largest sample difference against the reference's largest value
    src_error: float  # the largest error among its sources (0 for none)


def compare(got: Trace, want: Trace) -> tuple[list[Difference], list[str]]:
    """Each node's error against the reference, and what did not line up.

    Graphs pair up in order and nodes by id (their place in the graph as built: a backend
    may run them in another order). A node's error is the largest difference of its
    samples, largest values, means or RMS over the reference node's largest value
    (infinite where the two hold different numbers of values that are not finite). A graph
    whose nodes differ (op or shape) is compared up to the first such node.
    """
    diffs: list[Difference] = []
    problems: list[str] = []
    if len(got.graphs) != len(want.graphs):
        problems.append(f"{len(got.graphs)} graphs against {len(want.graphs)}")
    for g, w in zip(got.graphs, want.graphs, strict=False):
        if g.stage != w.stage:
            problems.append(f"graph {g.index}: stage {g.stage} against {w.stage}")
            break
        reference = {n.id: n for n in w.nodes}
        errors: dict[int, float] = {}
        for a in g.nodes:  # in the order they ran: sources first
            b = reference.get(a.id)
            if b is None or (a.op, a.shape) != (b.op, b.shape):
                other = f"{b.op}{list(b.shape)}" if b else "nothing"
                problems.append(f"graph {g.index} ({g.stage}): node {a.id} is {a.op}{list(a.shape)}, {other}")
                break
            src_error = max((errors.get(s, 0.0) for s in a.srcs if s >= 0), default=0.0)
            if not a.count or not b.count or len(a.samples) != len(b.samples):
                errors[a.id] = src_error  # nothing to compare: pass its sources' error on
                continue
            if a.nonfinite != b.nonfinite:
                error = float("inf")
            else:
                scale = max(b.maxabs, 1e-30)
                ok = np.isfinite(a.samples) & np.isfinite(b.samples)
                error = float(np.abs(a.samples[ok] - b.samples[ok]).max(initial=0.0) / scale)
                # Over every value, not only the samples: the largest, the mean and the RMS.
                error = max(
                    error, abs(a.maxabs - b.maxabs) / scale, abs(a.mean - b.mean) / scale, abs(a.rms - b.rms) / scale
                )
            errors[a.id] = error
            diffs.append(Difference(g, a, error, src_error))
        else:
            if len(g.nodes) != len(w.nodes):
                problems.append(f"graph {g.index} ({g.stage}): {len(g.nodes)} nodes against {len(w.nodes)}")
    return diffs, problems


def introduced(diffs: list[Difference], threshold: float = 1e-2) -> list[Difference]:
    """Nodes whose error is above ``threshold`` while each of their sources' is at most a
    tenth of it: where the two runs part ways, largest first."""
    found = [d for d in diffs if d.error > threshold and d.src_error * 10 <= d.error]
    return sorted(found, key=lambda d: -d.error)
