// The engine's own CPU kernels, where ggml's ops make several passes over long signals (or
// compute what is thrown away): convolutions fused with what surrounds them (HiFi-GAN's
// residual stacks with LeakyReLU, bias, mask and residual add; Kokoro's with AdaIN and Snake;
// plain ones), an upsampling's fold, HiFi-GAN's output head, AdaIN's statistics, WaveNet's
// gate, GELU and Mish, and self-attention over whole sequences. Each has kernels for AVX-512, AVX2 with FMA and the
// build's own vectors (NEON on ARM), chosen at run time.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace vs::cpu {

// Convolutions in 16-bit integers, where the CPU's integer multiply-adds of pairs (pmaddwd)
// outrun its float FMAs: each tile of input frames is quantized with one scale (its largest
// magnitude to int16_activation_max), each output channel's weights with one (their largest to
// int16_weight_max), and 32-bit sums go into float every int16_flush_pairs pairs of input
// channels, which no sum can overflow: int16_flush_pairs * 2 * 8191 * 2047 < 2^31.
constexpr int int16_activation_max = 8191;
constexpr int int16_weight_max     = 2047;
constexpr int int16_flush_pairs    = 32;

// Whether this CPU's kernels (at vector_floats()) have the integer convolutions (x86's AVX2 and
// AVX-512 do).
bool int16_convs();

// ggml's [IC, K, OC] conv weight (F32, IC even) into the integer kernels' order: blocks of
// `block` output channels (0: twice vector_floats()), each block's [K][IC / 2][block][2]
// contiguous; scales[oc] is what output channel oc's integers are multiplied by.
void pack_conv_weight_int16(const float * w, int64_t IC, int64_t K, int64_t OC, int16_t * out, float * scales,
                            int64_t block = 0);

// Those scales alone.
void conv_weight_int16_scales(const float * w, int64_t IC, int64_t K, int64_t OC, float * scales);

// A convolution's packed weights: F32 (pack_conv_weight), or int16 with their scales
// (pack_conv_weight_int16).
struct packed_weight {
    const float *   f32    = nullptr;
    const int16_t * int16  = nullptr;
    const float *   scales = nullptr;
};

// What one fused residual convolution computes on x [C, L] (C fastest): for the frames
// t in [begin, begin + T),
//   out[:, t] = x[:, t] + mask[t - begin] * (b + sum_k W_k leaky(x[:, t - pad + k * dilation]))
// and out[:, t] = x[:, t] elsewhere. W is packed by pack_conv_weight.
struct residual_conv_params {
    int64_t begin    = 0;
    int64_t frames   = 0;
    int64_t pad      = 0;  // frames before t that tap 0 reads
    int     dilation = 1;
    float   slope    = 0.1f;  // LeakyReLU's negative slope

    bool operator<(const residual_conv_params & o) const;
};

// The widest vector this CPU's kernels use, in floats (16 with AVX-512, 8 with AVX2 and FMA,
// else 4), chosen once at run time; VOICESTUDIO_CPU_VECTOR_FLOATS=4|8|16 narrows it.
int vector_floats();

// Whether the fused kernel takes a convolution of `channels` channels in and out.
bool residual_conv_fits(int64_t channels);

// x [C, L] F32 contiguous; w_packed [OC, IC, K] F32 (ggml order: OC fastest), or I16 with
// w_scales F32 [OC] (the integer kernels; else null); b [OC] or null; mask [1, frames] F32 or
// null. A new [C, L] tensor, computed by all of the graph's threads.
ggml_tensor * residual_conv(ggml_context * g, ggml_tensor * x, ggml_tensor * w_packed, ggml_tensor * w_scales,
                            ggml_tensor * b, ggml_tensor * mask, const residual_conv_params & p);

// ggml's [IC, K, OC] conv weight (F32) into the kernels' order: blocks of `block` output
// channels (0: twice vector_floats(), what the kernels take), each block's [K][IC][block]
// contiguous (the weights a block of outputs reads, in the order it reads them).
void pack_conv_weight(const float * w, int64_t IC, int64_t K, int64_t OC, float * out, int64_t block = 0);

// The kernel itself on plain arrays (the op's body, and what the op test compares): frames
// of tiles ith, ith + nth, ... of p.frames; every thread also copies its share of the frames
// outside them. `width`: the vector width whose kernel runs (4, 8 or 16, at most
// vector_floats(); 0: vector_floats()); C must be a multiple of twice it.
void residual_conv_run(const float * x, int64_t C, int64_t L, const packed_weight & w, int64_t K, const float * b,
                       const float * mask, float * out, const residual_conv_params & p, int ith, int nth,
                       int width = 0);

// A Snake-activated convolution as Kokoro's generator runs its residual blocks on x [C, T]:
//   out = residual + b + conv(snake(x)), snake(x) = (u + sin^2 u) / alpha, u = x * scale + shift
// per channel (scale = AdaIN's a times alpha, shift = its b times alpha, inv_alpha = 1 / alpha,
// each [C]), the activated input padded with zeros by dilation * (K - 1) / 2 on each side, so
// that [OC, T] comes out; residual [OC, T] or null. w_packed: F32 [OC, IC, K], or I16 with
// w_scales F32 [OC] (the integer kernels).
ggml_tensor * snake_conv(ggml_context * g, ggml_tensor * x, ggml_tensor * scale, ggml_tensor * shift,
                         ggml_tensor * inv_alpha, ggml_tensor * w_packed, ggml_tensor * w_scales, ggml_tensor * b,
                         ggml_tensor * residual, int dilation);

// A plain convolution of x [C, T] (C any number; F32), "same" zero padding of dilation * (K - 1)
// / 2 on each side, plus b: [OC, T] (OC a multiple of twice vector_floats()).
ggml_tensor * conv(ggml_context * g, ggml_tensor * x, ggml_tensor * w_packed, ggml_tensor * b, int dilation);

// The kernel on plain arrays, as residual_conv_run.
void conv_run(const float * x, int64_t C, int64_t T, const float * w_packed, int64_t K, int64_t OC, const float * b,
              float * out, int dilation, int ith, int nth, int width = 0);

// Whether snake_conv takes `channels` in and `out_channels` out.
bool snake_conv_fits(int64_t channels, int64_t out_channels);

// The kernel on plain arrays, as residual_conv_run.
void snake_conv_run(const float * x, int64_t C, int64_t T, const float * scale, const float * shift,
                    const float * inv_alpha, const packed_weight & w, int64_t K, int64_t OC, const float * b,
                    const float * residual, float * out, int dilation, int ith, int nth, int width = 0);

// Each channel's mean and variance over time of x [C, T] (C a multiple of vector_floats()):
// [C, 2], the means then the variances (the mean squared deviation from the mean).
ggml_tensor * channel_stats(ggml_context * g, ggml_tensor * x);

// The kernel on plain arrays: channels [c0, c1) of x into out [2 * C].
void channel_stats_run(const float * x, int64_t C, int64_t T, int64_t c0, int64_t c1, float * out, int width = 0);

// The second half of a transposed convolution with K = 2s (conv_transpose1d_zero_edges): from
// cols [OC * 2s, T + 2] (column j every tap of input step j - 1, a zero step at each end), the
// output frames u = 0 .. T_out - 1 (full frame u + padding, a sum of two steps' taps) plus the
// bias, between zeros_before and zeros_after zero frames: [OC, zeros_before + T_out +
// zeros_after], one pass where ggml's ops took an add, a bias add and a pad.
ggml_tensor * transpose_fold(ggml_context * g, ggml_tensor * cols, ggml_tensor * b, int stride, int padding,
                             int64_t T_out, int64_t zeros_before, int64_t zeros_after);

// HiFi-GAN's output head on the frames of x [C, L] from `first`: tanh of a convolution of
// LeakyReLU(x, slope) to one channel with w [C, K, 1] (F32), no bias: [1, T]. One pass over x
// where ggml's ops took a LeakyReLU, a matrix-vector product and an add per tap, and a tanh.
ggml_tensor * conv_head(ggml_context * g, ggml_tensor * x, ggml_tensor * w, int64_t first, int64_t T, float slope);

// WaveNet's gate on x [2H, T]: tanh of the first H channels times the sigmoid of the last H,
// [H, T] (exp to about an ulp; tanh and the sigmoid from it to about 1e-7).
ggml_tensor * gate(ggml_context * g, ggml_tensor * x);

// The gate's kernel on plain arrays: frames ith * ceil(T / nth) on. `width` as for
// residual_conv_run.
void gate_run(const float * x, int64_t H, int64_t T, float * out, int ith, int nth, int width = 0);

// Self-attention over whole sequences, F32 throughout: q, k, v [C, L] (C = n_head heads of
// C / n_head features; L = n_seq sequences of equal length side by side, each attending over
// itself), softmax(scale q k^T) v per head and sequence: [C, L], as ggml's flash attention of
// the same heads gives it reshaped. Where a head's features are 2, 4 or 8 vectors
// (attention_fits).
struct attention_params {
    int64_t n_head, n_seq;
    float   scale;

    bool operator<(const attention_params & o) const {
        return n_head != o.n_head ? n_head < o.n_head : n_seq != o.n_seq ? n_seq < o.n_seq : scale < o.scale;
    }
};

bool          attention_fits(int64_t head_dim);
ggml_tensor * attention(ggml_context * g, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int64_t n_head,
                        float scale, int64_t n_seq = 1);

// Its kernel on plain arrays: tasks (a sequence's head's block of query rows) ith, ith + nth, ...;
// false where it does not take a head of d features. `width` as for residual_conv_run.
bool attention_run(const float * q, const float * k, const float * v, int64_t C, int64_t d, int64_t T, int64_t n_seq,
                   float scale, float * out, int ith, int nth, int width = 0);

// Elementwise activations in vectors, where ggml's CPU ops take the C library's functions a value
// at a time (or several passes): GELU with erf, x (1 + erf(x / sqrt 2)) / 2 (erf within 1.5e-7),
// and Mish, x tanh(softplus(x)) (one exp a value, within about 1e-6 of x).
enum class unary_op { gelu_erf, mish };

// The activation of x of any shape (F32, contiguous).
ggml_tensor * unary(ggml_context * g, ggml_tensor * x, unary_op op);

// Its kernel on plain arrays: thread ith of nth takes its share of the n values. `width` as for
// residual_conv_run.
void unary_run(unary_op op, const float * x, int64_t n, float * out, int ith, int nth, int width = 0);

}  // namespace vs::cpu
