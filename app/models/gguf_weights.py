"""Writing a converter's tensors to GGUF in the weight type the user chose."""

from __future__ import annotations

import numpy as np

WEIGHT_TYPES = ("f32", "f16", "q8_0")


def add_weight(writer, name: str, data: np.ndarray, weights: str, *, reduce: bool) -> None:
    """Add ``data`` as F32, or, where ``reduce`` (a matrix that feeds mul_mat), as the chosen type.

    Q8_0 needs rows of whole 32-value blocks; other rows fall back to F16."""
    import gguf

    if weights == "f32" or not reduce:
        writer.add_tensor(name, data)
    elif weights == "q8_0" and data.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0] == 0:
        q8 = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
    else:
        writer.add_tensor(name, data.astype(np.float16))
