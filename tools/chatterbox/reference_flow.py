"""The reference implementation's S3Gen flow (S3Token2Wav.flow_inference: the conformer encoder
and Turbo's two mean-flow steps, or Multilingual's ten guided ones with --variant multilingual)
timed on the weights of tools/chatterbox/weights.py, on the speech tokens and voice
tools/chatterbox/bench_flow.py saves. Run in the reference environment by bench_flow.py; prints
one JSON line.
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
    ap.add_argument("--device", default="cpu", help="torch's device: cpu or cuda")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variant", choices=["turbo", "multilingual"], default="turbo")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from chatterbox.models.s3gen import S3Gen

    turbo = args.variant == "turbo"
    s3 = S3Gen(meanflow=turbo)
    name = "s3gen_meanflow.safetensors" if turbo else "s3gen.safetensors"
    s3.load_state_dict(load_file(args.weights / args.variant / name))
    s3.eval().to(args.device)
    z = np.load(args.weights / "bench_flow.npz")
    dev = args.device
    ref = {
        "prompt_token": torch.from_numpy(z["prompt_tokens"]).long()[None].to(dev),
        "prompt_token_len": torch.tensor([z["prompt_tokens"].size]).to(dev),
        "prompt_feat": torch.from_numpy(z["prompt_mel"].T.copy())[None].to(dev),
        "prompt_feat_len": None,
        "embedding": torch.from_numpy(z["xvector"])[None].to(dev),
    }
    tokens = torch.from_numpy(z["tokens"]).long()[None].to(dev)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        mel = s3.flow_inference(tokens, ref_dict=dict(ref), finalize=True)
        synchronize(dev)
        times.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({"ms": min(times), "frames": int(mel.shape[-1])}))


if __name__ == "__main__":
    main()
