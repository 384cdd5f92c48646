"""The official Chatterbox checkpoints' layout, read off the reference implementation's own modules.

Needs torch and the reference package (``chatterbox-tts``), which the project does not use; run
it in a separate environment (tools/chatterbox/README.md):

    /tmp/cbref/bin/python -m tools.chatterbox.layout

Writes tests/data/chatterbox/layout.json: for each official file, each tensor of the state dict
the reference loads it into (``load_state_dict(..., strict=True)``), in order: its name, shape,
dtype and the mean and standard deviation of the module's own initialisation under a fixed seed.
tools/chatterbox/weights.py draws weights from it without torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "chatterbox" / "layout.json"


def t3_turbo():
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules.t3_config import T3Config

    # The hyperparameters ChatterboxTurboTTS.from_local sets.
    hp = T3Config(text_tokens_dict_size=50276)
    hp.llama_config_name = "GPT2_medium"
    hp.speech_tokens_dict_size = 6563
    hp.input_pos_emb = None
    hp.speech_cond_prompt_len = 375
    hp.use_perceiver_resampler = False
    hp.emotion_adv = False
    return T3(hp)


def t3_multilingual():
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules.t3_config import T3Config

    return T3(T3Config.multilingual())  # as ChatterboxMultilingualTTS.from_local


def voice_encoder():
    from chatterbox.models.voice_encoder import VoiceEncoder

    return VoiceEncoder()


def s3gen_meanflow():
    from chatterbox.models.s3gen import S3Gen

    return S3Gen(meanflow=True)


def s3gen():
    from chatterbox.models.s3gen import S3Gen

    return S3Gen()  # the 10-step decoder with guidance (Multilingual's)


FILES = {
    "turbo/t3_turbo_v1.safetensors": t3_turbo,
    "turbo/ve.safetensors": voice_encoder,
    "turbo/s3gen_meanflow.safetensors": s3gen_meanflow,
    "multilingual/t3_mtl23ls_v2.safetensors": t3_multilingual,
    "multilingual/ve.safetensors": voice_encoder,
    "multilingual/s3gen.safetensors": s3gen,
}


def describe(module: torch.nn.Module) -> list[dict]:
    out = []
    for name, t in module.state_dict().items():
        entry = {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        if t.is_floating_point() and t.numel():
            f = t.double()
            entry["mean"] = round(float(f.mean()), 6)
            entry["std"] = round(float(f.std()), 6) if t.numel() > 1 else 0.0
        out.append(entry)
    return out


def main() -> None:
    layout = {}
    for path, make in FILES.items():
        torch.manual_seed(0)
        layout[path] = describe(make())
        print(path, len(layout[path]), "tensors")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # One tensor a line.
    files = [
        json.dumps(path) + ": [\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]"
        for path, entries in layout.items()
    ]
    OUT.write_text("{\n" + ",\n".join(files) + "\n}\n")


if __name__ == "__main__":
    main()
