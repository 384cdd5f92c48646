"""The reference implementation's token model timed on the weights of tools/chatterbox/weights.py:
Turbo: T3.inference_turbo's loop (repetition penalty, then the most likely token, so that both
runs make the same tokens) for a fixed number of speech tokens; Multilingual (--variant
multilingual): T3.inference itself (guidance as a batch of two, its alignment guard), its draw
replaced by the most likely token, on golden_multilingual.npz's inputs, for at most that many.
Run in the reference environment (tools/chatterbox/README.md) by tools/chatterbox/bench_t3.py;
prints one JSON line.

    /tmp/cbref/bin/python -m tools.chatterbox.reference_t3 --weights DIR --threads 2 --tokens 200
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from tools.chatterbox.golden import inputs
from tools.chatterbox.layout import t3_turbo


def synchronize(device: str) -> None:
    """Wait for the device's queued work, so that a clock read after it counts that work."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--device", default="cpu", help="torch's device: cpu or cuda")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--variant", choices=["turbo", "multilingual"], default="turbo")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.variant == "multilingual":
        print(json.dumps(multilingual(args)))
        return
    from chatterbox.models.t3.modules.cond_enc import T3Cond

    t3 = t3_turbo()
    t3.load_state_dict(load_file(args.weights / "turbo" / "t3_turbo_v1.safetensors"))
    del t3.tfmr.wte
    dev = args.device
    t3.eval().to(dev)
    x = inputs(t3.hp)
    penalty = RepetitionPenaltyLogitsProcessor(1.2)
    text = torch.from_numpy(x["text_tokens"]).long()[None].to(dev)
    best = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        cond = T3Cond(
            speaker_emb=torch.from_numpy(x["speaker_emb"])[None],
            cond_prompt_speech_tokens=torch.from_numpy(x["prompt_tokens"]).long()[None],
            emotion_adv=0.5 * torch.ones(1, 1, 1),
        ).to(device=dev)
        start = t3.hp.start_speech_token * torch.ones_like(text[:, :1])
        embeds, _ = t3.prepare_input_embeds(t3_cond=cond, text_tokens=text, speech_tokens=start, cfg_weight=0.0)
        out = t3.tfmr(inputs_embeds=embeds, use_cache=True)
        past = out.past_key_values
        token = penalty(start, t3.speech_head(out[0][:, -1])).argmax(-1, keepdim=True)
        synchronize(dev)
        prefill_ms = (time.perf_counter() - t0) * 1000
        generated = [token]
        while len(generated) < args.tokens:
            out = t3.tfmr(inputs_embeds=t3.speech_emb(token), past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = penalty(torch.cat(generated, 1), t3.speech_head(out[0][:, -1])).argmax(-1, keepdim=True)
            generated.append(token)
        synchronize(dev)
        total_ms = (time.perf_counter() - t0) * 1000
        if best is None or total_ms < best["total_ms"]:
            best = {"prefill_ms": prefill_ms, "total_ms": total_ms, "tokens": len(generated)}
    print(json.dumps(best))


def multilingual(args) -> dict:
    from chatterbox.models.t3.modules.cond_enc import T3Cond
    from tools.chatterbox.golden import OUT_MULTILINGUAL
    from tools.chatterbox.layout import t3_multilingual

    t3 = t3_multilingual()
    t3.load_state_dict(load_file(args.weights / "multilingual" / "t3_mtl23ls_v2.safetensors"))
    dev = args.device
    t3.eval().to(dev)
    hp = t3.hp
    with np.load(OUT_MULTILINGUAL) as z:
        x = {k: z["mtl_" + k] for k in ("speaker_emb", "prompt_tokens", "text_tokens", "exaggeration", "cfg_weight")}
    text = torch.from_numpy(x["text_tokens"]).long()[None].repeat(2, 1).to(dev)  # as ChatterboxMultilingualTTS.generate
    text = torch.nn.functional.pad(text, (1, 0), value=hp.start_text_token)
    text = torch.nn.functional.pad(text, (0, 1), value=hp.stop_text_token)
    multinomial = torch.multinomial
    torch.multinomial = lambda probs, num_samples: probs.argmax(-1, keepdim=True)
    best = None
    try:
        for _ in range(args.runs):
            t0 = time.perf_counter()
            cond = T3Cond(
                speaker_emb=torch.from_numpy(x["speaker_emb"])[None],
                cond_prompt_speech_tokens=torch.from_numpy(x["prompt_tokens"]).long()[None],
                emotion_adv=float(x["exaggeration"]) * torch.ones(1, 1, 1),
            ).to(device=dev)
            sampling = {"temperature": 0.8, "repetition_penalty": 2.0, "min_p": 0.05, "top_p": 1.0}
            tokens = t3.inference(
                t3_cond=cond,
                text_tokens=text,
                max_new_tokens=args.tokens,
                cfg_weight=float(x["cfg_weight"]),
                **sampling,
            )
            synchronize(dev)
            total_ms = (time.perf_counter() - t0) * 1000
            if best is None or total_ms < best["total_ms"]:
                best = {"total_ms": total_ms, "tokens": int(tokens.shape[-1])}
    finally:
        torch.multinomial = multinomial
    return best


if __name__ == "__main__":
    main()
