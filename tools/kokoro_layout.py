"""Write native/src/models/kokoro/layout.inc: every tensor of Kokoro-82M as the engine reads
it (name, ggml shape, whether it may be stored in a reduced type), which the engine checks a
model file against when it loads one.

    python tools/kokoro_layout.py [KOKORO_GGUF]

The shapes are read from a GGUF that this repository's converter wrote with F16 weights
(``main.py models install kokoro``, the default): its F16 tensors are the ones that a
reduced install may store as F16 or Q8_0; every other tensor stays F32. The style packs
(``voice.*``) are checked by the engine from the file's own list of voices.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "native" / "src" / "models" / "kokoro" / "layout.inc"


def main() -> int:
    import gguf

    from app.models import manager as models

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else models.kokoro_path()
    reader = gguf.GGUFReader(str(path))
    types = {t.tensor_type for t in reader.tensors}
    if gguf.GGMLQuantizationType.F16 not in types or gguf.GGMLQuantizationType.Q8_0 in types:
        print(f"{path}: not an F16 install (main.py models install kokoro --weights f16)", file=sys.stderr)
        return 1
    lines = [
        "// Kokoro-82M's tensors as the engine reads them: name, ggml shape, and whether a reduced",
        "// install may store it as F16 or Q8_0. Written by tools/kokoro_layout.py; do not edit.",
    ]
    for t in sorted(reader.tensors, key=lambda t: t.name):
        if t.name.startswith("voice."):
            continue
        ne = [int(n) for n in t.shape] + [1] * (4 - len(t.shape))
        reducible = "true" if t.tensor_type == gguf.GGMLQuantizationType.F16 else "false"
        lines.append(f'{{ "{t.name}", {{ {", ".join(map(str, ne))} }}, {reducible} }},')
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{OUT.relative_to(ROOT)}: {len(lines) - 2} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
