// Graph builders shared by the architectures. Activations are [C, T]: channels
// fastest (ne0 = C), time along ne1, so 1x1 convolutions are a single mul_mat with
// the weight as src0 (where quantized types live) and layer norms act on ne0.
#pragma once

#include <ggml.h>

namespace vs {

// Conv1d with PyTorch semantics. w: [IC, OC, K] (the converter stores PyTorch's
// [OC, IC, K] tap-major); b: [OC] or null; x: [IC, T] -> [OC, T'].
ggml_tensor * conv1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation, int padding);

// Depthwise conv1d. w: [C, K] (stored transposed by the converter); x: [C, T].
ggml_tensor * conv1d_depthwise(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation,
                               int padding);

// ConvTranspose1d with kernel == 2 * stride. w: [IC, OC, K]; x: [IC, T] -> [OC, T * stride + K - stride - 2p].
ggml_tensor * conv_transpose1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int stride,
                               int padding);

// LayerNorm over channels (ne0).
ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * gamma, ggml_tensor * beta, float eps);

// Rows [first, first + n) of the channel axis, made contiguous.
ggml_tensor * channels(ggml_context * ctx, ggml_tensor * x, int64_t first, int64_t n);

// Channel order reversed (torch.flip over dim 1). rev_idx: I32 [C] holding C-1 .. 0.
ggml_tensor * flip_channels(ggml_context * ctx, ggml_tensor * x, ggml_tensor * rev_idx);

}  // namespace vs
