// Graph builders shared by the architectures. Activations are [C, T]: channels
// fastest (ne0 = C), time along ne1, so 1x1 convolutions are a single mul_mat with
// the weight as src0 (where quantized types live) and layer norms act on ne0.
#pragma once

#include <ggml-backend.h>
#include <ggml.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vs {

// What a device's ops take where that is less than ggml's ops express (probed when a
// context opens): graphs built for it stay within it.
struct device_limits {
    size_t max_tensor_bytes = SIZE_MAX;  // the largest tensor an op takes (im2col tiles)
    bool   matmul_4d        = true;      // a matmul of a 2-D src0 over src1 [., ., n2, n3 > 1]
    // A matmul reads src1's matrices at its nb[2] even where each one's rows are packed
    // (conv1d_phases' windows). ggml's Vulkan backend reads them one after another there.
    bool strided_batches = true;
    // ggml's out_prod (sums over src0's second axis), F32, over a third axis: statistics over
    // time of [C, T] activations without a transpose. ggml's Vulkan backend has none.
    bool out_prod = true;
};

// The device a graph is built for, which the builders below that depend on it take first.
struct graph_options {
    // The graph runs on the CPU backend (true) or on another device (false). The CPU's mul_mat
    // accepts a src1 whose rows overlap (an im2col matrix for free); other backends copy src1
    // with strided 2-D copies that need disjoint rows, so there ggml's im2col op builds the
    // matrix (in F16 for F16 weights).
    bool          device_is_cpu = true;
    device_limits limits;
};

// Whether `backend`'s matmul reads such windows right, with F16 and with F32 operands: small
// matmuls computed there (small integers, so any summation is exact) against the host.
bool matmul_reads_batch_strides(ggml_backend_t backend);

// Names an intermediate tensor (llama.cpp's cb(cur, "name", il)): "name", or "name-il" for
// layer il, so that node traces and dumps show what it is. Returns t. Name only a new node:
// an input or a weight passed through unchanged would take the name too.
inline ggml_tensor * named(ggml_tensor * t, const char * name, int il = -1) {
    if (il < 0) {
        ggml_set_name(t, name);
    } else {
        ggml_format_name(t, "%s-%d", name, il);
    }
    return t;
}

// Conv1d with PyTorch semantics. w: [IC, K, OC] (PyTorch's [OC, IC, K] with the
// taps moved inside each output row, so a row is one im2col column's weights);
// b: [OC] or null; x: [IC, T] -> [OC, T'].
ggml_tensor * conv1d(const graph_options & o, ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b,
                     int dilation, int padding);

// The same convolution read from an already padded input: output frame t sums
// xp[start + t + k * dilation] over taps k. xp must hold conv1d_frames_needed()
// frames from `start` (the extra frames only feed outputs that are dropped).
// Returns a contiguous [OC, T_out].
ggml_tensor * conv1d_window(const graph_options & o, ggml_context * ctx, ggml_tensor * xp, int64_t start, int64_t T_out,
                            ggml_tensor * w, ggml_tensor * b, int dilation);

int64_t conv1d_frames_needed(int64_t T_out, int64_t K, int dilation);

// Conv1d of xt [T, IC] (time along ne0, F32) -> [OC, T_out] without an im2col matrix, for
// F16 or F32 weights off the CPU (phases_apply): one batched GEMM whose operands are views of
// the input. The input, zero-padded (pad_before frames before it and as many after as the
// output needs), is copied (to F16 for F16 weights) with its frames grouped by dilation phase q. Output frame
// t = q + d * (r + K * j) then reads K adjacent frames of phase q, so each (window phase r,
// dilation phase q) pair is a matrix whose columns j are disjoint windows of K * IC values:
// a GEMM with the taps inside the contraction. Its [OC, J, K, d] result goes back to time
// order in the bias add. Returns a contiguous [OC, T_out]. w [C, K, OC] may have more input
// channels than xt (C < IC + 8, the extra ones' weights zero: channel_padded_weight): the
// copy holds zeros there. J is phase_columns(n, fine_columns).
ggml_tensor * conv1d_phases(ggml_context * ctx, ggml_tensor * xt, int64_t pad_before, int64_t T_out, ggml_tensor * w,
                            ggml_tensor * b, int dilation, bool fine_columns = false);

// The same, undilated, from x [IC, T] (channels along ne0, F32): the padded input (made F16
// for F16 weights; zeros in the weights' input channels past IC) is itself the one phase,
// so no transpose.
ggml_tensor * conv1d_phases_ct(ggml_context * ctx, ggml_tensor * x, int64_t pad_before, int64_t T_out, ggml_tensor * w,
                               ggml_tensor * b, bool fine_columns = false);

// conv1d_phases' columns for n windows a phase: n rounded up to a power of two, or with
// `fine` to eight steps an octave. The first call of each GEMM shape is slow (cuBLAS picks
// its kernel then), and the windows follow the sentence's length; rounded to powers
// of two, a sentence's convolutions see a few shapes, which the prewarm's sentences of
// several lengths have called (kokoro_voice::prewarm_phonemes). A batch packed along time
// runs shapes of its own anyway, and there a power of two can nearly double a GEMM; eight
// steps an octave waste at most an eighth. The extra columns read zeros and their outputs
// are dropped.
int64_t phase_columns(int64_t n, bool fine = false);

// Whether conv1d_phases takes these weights and dilation on graphs for o's device (F16 or
// F32, off the CPU, K > 1; dilated where the device's matmuls take its [., ., K, d] batches).
bool phases_apply(const graph_options & o, const ggml_tensor * w, int dilation);

// Depthwise conv1d. w: [C, K] (stored transposed by the converter); x: [C, T].
ggml_tensor * conv1d_depthwise(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation,
                               int padding);

// ConvTranspose1d with kernel == 2 * stride. w: [IC, OC, K]; x: [IC, T] -> [OC, T * stride + K - stride - 2p],
// preceded by `zeros_before` and followed by `zeros_after` frames of zeros (margins for later convolutions).
ggml_tensor * conv_transpose1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int stride,
                               int padding, int64_t zeros_before = 0, int64_t zeros_after = 0);

// The same from x: [IC, T + 2] whose first and last steps are already zero (a view that
// reaches one frame into zero margins on each side).
ggml_tensor * conv_transpose1d_zero_edges(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b,
                                          int stride, int padding, int64_t zeros_before, int64_t zeros_after);

// ConvTranspose1d of any kernel: w [IC, OC, K'] holds PyTorch's K taps ([IC, OC, K]) then zeros
// up to K' = a multiple of the stride (K' - stride < K); x [IC, T] -> [OC, (T - 1) * stride + K - 2p],
// a view of a contiguous tensor.
ggml_tensor * conv_transpose1d_any(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int stride,
                                   int padding, int64_t K);

// Convolution with a stride: x [IC, T] -> [OC, (T + 2p - K) / stride + 1]; w [IC, K, OC].
ggml_tensor * conv1d_strided(const graph_options & o, ggml_context * ctx, ggml_tensor * x, ggml_tensor * w,
                             ggml_tensor * b, int stride, int padding);

// Zero frames before and after a [C, T] activation.
ggml_tensor * pad_time(ggml_context * ctx, ggml_tensor * x, int64_t before, int64_t after);

// LayerNorm over channels (ne0).
ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * gamma, ggml_tensor * beta, float eps);

// The tanh form of GELU (GPT-2's and ALBERT's "gelu_new"). Off the CPU ggml's op (exact there);
// the CPU's op reads a table of F16 inputs, so there it is built from SiLU.
ggml_tensor * gelu_tanh(const graph_options & o, ggml_context * ctx, ggml_tensor * x);

// Rows [first, first + n) of the channel axis, made contiguous.
ggml_tensor * channels(ggml_context * ctx, ggml_tensor * x, int64_t first, int64_t n);

// Channel order reversed (torch.flip over dim 1). rev_idx: I32 [C] holding C-1 .. 0.
ggml_tensor * flip_channels(ggml_context * ctx, ggml_tensor * x, ggml_tensor * rev_idx);

// 1 where x > 0, else 0 (0 at x = +-0 as well), the same on every backend: ggml's step is
// x > 0 on the CPU and CUDA but x >= 0 in its Vulkan shader, and Kokoro's STFT phase asks it
// of exact zeros (the DC bin's imaginary part) in every frame.
ggml_tensor * step_above_zero(ggml_context * ctx, ggml_tensor * x);

// The parts joined along `dim` by pairwise concatenation (log n copies of each element
// rather than n): how a recurrence's steps become one tensor.
ggml_tensor * concat_all(ggml_context * ctx, std::vector<ggml_tensor *> parts, int dim);

// Causal self-attention of n new positions from position `pos` over a key/value cache holding the
// earlier ones: q, k, v [C, n] (n_head heads of C / n_head; views with any row stride);
// k_cache [C, n_ctx], a row a position; v_cache [n_ctx, C], transposed so that the weighted sum
// is one matmul. The copies of k and v into the caches at `pos` go into gf before the reads.
// mask: [pos + n, n] (0, or -inf where a query may not look), or null to attend to all of them.
// Returns [C, n]; `scores`, where given, gets the attention weights [pos + n, n, n_head].
ggml_tensor * cached_attention(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                               ggml_tensor * k_cache, ggml_tensor * v_cache, int64_t pos, int64_t n_head,
                               ggml_tensor * mask, float scale, ggml_tensor ** scores = nullptr);

// One new position's attention over a cache whose write is a graph input, so that one graph
// serves every position: q, k, v [C, 1] (views with any row stride); k written at row k_at[0]
// of k_cache [C, n_ctx] and v's element i at v_at[i] of v_cache [n_ctx, C] seen flat (the
// position's column: i * n_ctx + pos), both I64 (ggml_set_rows). The query attends to the first
// n_kv positions, mask [n_kv, 1] (0, or -inf past the position; null where n_kv is the
// position's own count). Returns [C, 1]; `scores`, where given, gets the weights [n_kv, 1, n_head].
ggml_tensor * indexed_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                ggml_tensor * k_cache, ggml_tensor * v_cache, ggml_tensor * k_at, ggml_tensor * v_at,
                                int64_t n_kv, int64_t n_head, ggml_tensor * mask, float scale,
                                ggml_tensor ** scores = nullptr);

// Self-attention over a whole sequence: q [C, T_q], k and v [C, T_k] (n_head heads of C / n_head),
// no mask. Returns [C, T_q]. With `flash`, ggml's fused attention with keys and values in F16
// (about 1e-3 of the scores' precision given up; on two CPU cores a third faster at 1000 frames);
// with it, n_seq sequences of equal length side by side in time, each attending to itself.
ggml_tensor * self_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int64_t n_head,
                             float scale, bool flash = false, int64_t n_seq = 1);

// Self-attention with relative positions (Transformer-XL's, espnet's RelPositionMultiHeadedAttention):
// scores (q + bias_u) . k + rel_shift((q + bias_v) . p) over sqrt(d), where p [C, 2T - 1] holds the
// projected encodings of relative positions T - 1 down to 1 - T; q, k, v [C, T]; bias_u, bias_v
// [C]. Returns [C, T].
ggml_tensor * rel_pos_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * p,
                                ggml_tensor * bias_u, ggml_tensor * bias_v, int64_t n_head);

// n rounded up to one of eight lengths an octave (a multiple of 16 below 256, of 32 below
// 512, ...): at most 1/8 more, and few enough shapes that graphs kept by their shapes
// (vs_context::stage_graph) recur.
int64_t shape_bucket(int64_t n);

}  // namespace vs
