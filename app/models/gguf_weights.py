"""Writing a converter's tensors to GGUF in the weight type the user chose."""

from __future__ import annotations

import numpy as np

WEIGHT_TYPES = ("f32", "f16", "q8_0")


def add_weight(writer, name: str, data: np.ndarray, weights: str, *, reduce: bool) -> None:
    """Add ``data`` as F32, or, where ``reduce`` (a matrix that feeds mul_mat), as the chosen type
    (also "q4_0", which only Chatterbox's token model is written in).

    Q8_0 and Q4_0 need rows of whole 32-value blocks; other rows fall back to F16."""
    import gguf

    quant = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}.get(weights)
    if weights == "f32" or not reduce:
        writer.add_tensor(name, data)
    elif quant is not None and data.shape[-1] % gguf.GGML_QUANT_SIZES[quant][0] == 0:
        writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
    else:
        writer.add_tensor(name, data.astype(np.float16))
