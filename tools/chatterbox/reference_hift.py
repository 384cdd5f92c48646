"""The reference implementation's vocoder (S3Gen's HiFTGenerator.inference) timed on the weights
of tools/chatterbox/weights.py, on a log-mel of `--frames` frames (50 a second). Run in the
reference environment by tools/chatterbox/bench_hift.py; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from tools.chatterbox.reference_t3 import synchronize


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--device", default="cpu", help="torch's device: cpu or cuda")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from chatterbox.models.s3gen import S3Gen

    hift = S3Gen(meanflow=True).mel2wav
    state = load_file(args.weights / "turbo" / "s3gen_meanflow.safetensors")
    hift.load_state_dict({k[len("mel2wav.") :]: v for k, v in state.items() if k.startswith("mel2wav.")})
    hift.eval().to(args.device)
    mel = torch.from_numpy(np.load(args.weights / "bench_mel.npy"))[None].to(args.device)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        wav, _ = hift.inference(speech_feat=mel)
        synchronize(args.device)
        times.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({"ms": min(times), "samples": int(wav.shape[-1])}))


if __name__ == "__main__":
    main()
