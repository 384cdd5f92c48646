// The CPU kernels as ggml ops, each instruction set's build of them chosen by the CPU it runs on.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>
#include <tuple>

namespace vs::cpu {

#define VS_CPU_DECLARE(isa)                                                                                            \
    namespace isa {                                                                                                    \
    void run(const float * x, int64_t C, int64_t L, const float * wp, const int16_t * wq, const float * ws, int64_t K, \
             const float * b, const float * mask, float * out, const residual_conv_params & p, int ith, int nth);      \
    void gate(const float * x, int64_t H, int64_t T, float * out, int ith, int nth);                                   \
    void unary(unary_op op, const float * x, int64_t n, float * out);                                                  \
    bool attention(const float * q, const float * k, const float * v, int64_t C, int64_t d, int64_t T, int64_t n_seq,  \
                   float scale, float * out, int ith, int nth);                                                        \
    void stats(const float * x, int64_t C, int64_t T, int64_t c0, int64_t c1, float * out);                            \
    void plain_run(const float * x, int64_t C, int64_t T, const float * wp, int64_t K, int64_t OC, const float * b,    \
                   float * out, int d, int ith, int nth);                                                              \
    void fold(const float * cols, int64_t OC, int64_t n, int s, int padding, const float * b, int64_t zeros_before,    \
              int64_t T_out, float * out, int64_t f0, int64_t f1);                                                     \
    void head(const float * x, int64_t C, int64_t first, const float * w, int64_t K, float slope, float * out,         \
              int64_t t0, int64_t t1);                                                                                 \
    void snake_run(const float * x, int64_t C, int64_t T, const float * scale, const float * shift,                    \
                   const float * inv_alpha, const float * wp, const int16_t * wq, const float * ws, int64_t K,         \
                   int64_t OC, const float * b, const float * residual, float * out, int d, int ith, int nth);         \
    }
VS_CPU_DECLARE(generic)
#if defined(__x86_64__) || defined(_M_X64)
VS_CPU_DECLARE(avx2)
VS_CPU_DECLARE(avx512)
#endif

// One instruction set's build of the kernels.
struct isa_kernels {
    decltype(&generic::run)       run;
    decltype(&generic::gate)      gate;
    decltype(&generic::unary)     unary;
    decltype(&generic::attention) attention;
    decltype(&generic::stats)     stats;
    decltype(&generic::plain_run) plain_run;
    decltype(&generic::fold)      fold;
    decltype(&generic::head)      head;
    decltype(&generic::snake_run) snake_run;
};

#define VS_CPU_KERNELS(isa)                                                                                \
    isa_kernels {                                                                                          \
        isa::run, isa::gate, isa::unary, isa::attention, isa::stats, isa::plain_run, isa::fold, isa::head, \
            isa::snake_run                                                                                 \
    }

// The build for vectors of `width` floats (0: vector_floats()).
static const isa_kernels & kernels(int width = 0) {
    static const isa_kernels generic_kernels = VS_CPU_KERNELS(generic);
#if defined(__x86_64__) || defined(_M_X64)
    static const isa_kernels avx2_kernels = VS_CPU_KERNELS(avx2), avx512_kernels = VS_CPU_KERNELS(avx512);
    switch (width ? width : vector_floats()) {
        case 16:
            return avx512_kernels;
        case 8:
            return avx2_kernels;
    }
#endif
    return generic_kernels;
}

bool residual_conv_params::operator<(const residual_conv_params & o) const {
    return std::tie(begin, frames, pad, dilation, slope) < std::tie(o.begin, o.frames, o.pad, o.dilation, o.slope);
}

static int widest_vector_floats() {
#if defined(__x86_64__) || defined(_M_X64)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? 16
           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")       ? 8
                                                                                   : 4;
#else
    return 4;
#endif
}

int vector_floats() {
    // VOICESTUDIO_CPU_VECTOR_FLOATS (4, 8 or 16) narrows the choice, to run a narrower
    // instruction set's kernels on a CPU that has a wider one.
    static const int width = [] {
        const int    widest = widest_vector_floats();
        const char * env    = std::getenv("VOICESTUDIO_CPU_VECTOR_FLOATS");
        const int    asked  = env ? std::atoi(env) : 0;
        return asked == 4 || asked == 8 || asked == 16 ? std::min(asked, widest) : widest;
    }();
    return width;
}

bool residual_conv_fits(int64_t channels) {
    return channels > 0 && channels % (2 * vector_floats()) == 0;
}

void residual_conv_run(const float * x, int64_t C, int64_t L, const packed_weight & w, int64_t K, const float * b,
                       const float * mask, float * out, const residual_conv_params & p, int ith, int nth, int width) {
    const int vw = width ? width : vector_floats();
    GGML_ASSERT(vw <= vector_floats() && C % (2 * vw) == 0);
    GGML_ASSERT(w.int16 ? w.scales && vw >= 8 : w.f32 != nullptr);
    kernels(vw).run(x, C, L, w.f32, w.int16, w.scales, K, b, mask, out, p, ith, nth);
}

void pack_conv_weight(const float * w, int64_t IC, int64_t K, int64_t OC, float * out, int64_t block) {
    block = block ? block : 2 * vector_floats();
    GGML_ASSERT(OC % block == 0);
    for (int64_t oc = 0; oc < OC; ++oc) {
        const int64_t ob = oc / block * block, j = oc % block;
        for (int64_t k = 0; k < K; ++k) {
            for (int64_t ic = 0; ic < IC; ++ic) {
                out[ob * K * IC + (k * IC + ic) * block + j] = w[ic + IC * (k + K * oc)];
            }
        }
    }
}

// A graph node holds a pointer to its parameters: one stable copy of each distinct set, for
// the life of the process (a model has a few dozen).
template <class P>
static const P * interned(const P & p) {
    static std::mutex           mutex;
    static std::set<P>          all;
    std::lock_guard<std::mutex> lock(mutex);
    return &*all.insert(p).first;
}

static const float * data_of(const ggml_tensor * t) {
    return t ? static_cast<const float *>(t->data) : nullptr;
}

// The weights of a kernel's op, src[at] (then their scales, for integers, at src[at + 1]).
static packed_weight packed_of(const ggml_tensor * dst, int at) {
    const ggml_tensor * w = dst->src[at];
    packed_weight       pw;
    if (w->type == GGML_TYPE_I16) {
        pw.int16  = static_cast<const int16_t *>(w->data);
        pw.scales = data_of(dst->src[at + 1]);
    } else {
        pw.f32 = data_of(w);
    }
    return pw;
}

// The sources after a kernel's weights (and their scales) from src[at] on, as the weights' type
// sets where they begin.
static int after_weights(const ggml_tensor * dst, int at) {
    return dst->src[at]->type == GGML_TYPE_I16 ? at + 2 : at + 1;
}

// Checks a kernel's weights: F32, or I16 with F32 scales for each output channel (the first
// axis) where this CPU's kernels have integer convolutions.
static void check_weights(const ggml_tensor * w, const ggml_tensor * scales) {
    if (w->type == GGML_TYPE_I16) {
        GGML_ASSERT(int16_convs() && w->ne[1] % 2 == 0 && scales && scales->type == GGML_TYPE_F32 &&
                    ggml_nelements(scales) == w->ne[0]);
    } else {
        GGML_ASSERT(w->type == GGML_TYPE_F32 && !scales);
    }
}

// Sources: x, the weights (and their scales), the bias, the mask.
static void compute(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto &        p = *static_cast<const residual_conv_params *>(userdata);
    const ggml_tensor * x = dst->src[0];
    const int           b = after_weights(dst, 1);
    residual_conv_run(data_of(x), x->ne[0], x->ne[1], packed_of(dst, 1), dst->src[1]->ne[2], data_of(dst->src[b]),
                      data_of(dst->src[b + 1]), static_cast<float *>(dst->data), p, ith, nth);
}

ggml_tensor * residual_conv(ggml_context * g, ggml_tensor * x, ggml_tensor * w_packed, ggml_tensor * w_scales,
                            ggml_tensor * b, ggml_tensor * mask, const residual_conv_params & p) {
    const int64_t C = x->ne[0], L = x->ne[1], K = w_packed->ne[2];
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x));
    check_weights(w_packed, w_scales);
    GGML_ASSERT(w_packed->ne[0] == C && w_packed->ne[1] == C && residual_conv_fits(C));
    GGML_ASSERT(p.begin - p.pad >= 0 && p.begin - p.pad + p.frames + (K - 1) * p.dilation <= L);
    GGML_ASSERT(p.begin + p.frames <= L);
    GGML_ASSERT(!b || (b->type == GGML_TYPE_F32 && ggml_nelements(b) == C && ggml_is_contiguous(b)));
    GGML_ASSERT(!mask || (mask->type == GGML_TYPE_F32 && ggml_nelements(mask) == p.frames && ggml_is_contiguous(mask)));
    GGML_ASSERT(b || !mask);  // a mask is the argument after the bias
    ggml_tensor * args[5] = { x, w_packed };
    int           n_args  = 2;
    for (ggml_tensor * t : { w_scales, b, mask }) {
        if (t) {
            args[n_args++] = t;
        }
    }
    return ggml_custom_4d(g, GGML_TYPE_F32, C, L, 1, 1, args, n_args, compute, GGML_N_TASKS_MAX,
                          const_cast<residual_conv_params *>(interned(p)));
}

void gate_run(const float * x, int64_t H, int64_t T, float * out, int ith, int nth, int width) {
    GGML_ASSERT(width <= vector_floats());
    kernels(width).gate(x, H, T, out, ith, nth);
}

static void compute_gate(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * x = dst->src[0];
    gate_run(static_cast<const float *>(x->data), dst->ne[0], dst->ne[1], static_cast<float *>(dst->data), ith, nth);
}

ggml_tensor * gate(ggml_context * g, ggml_tensor * x) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && x->ne[0] % 2 == 0 && x->ne[2] == 1);
    ggml_tensor * args[1] = { x };
    return ggml_custom_4d(g, GGML_TYPE_F32, x->ne[0] / 2, x->ne[1], 1, 1, args, 1, compute_gate, GGML_N_TASKS_MAX,
                          nullptr);
}

void unary_run(unary_op op, const float * x, int64_t n, float * out, int ith, int nth, int width) {
    GGML_ASSERT(width <= vector_floats());
    const int64_t per = (n / nth + 63) / 64 * 64, i0 = std::min(n, ith * per);
    const int64_t i1 = ith + 1 == nth ? n : std::min(n, i0 + per);
    if (i0 < i1) {
        kernels(width).unary(op, x + i0, i1 - i0, out + i0);
    }
}

static void compute_unary(ggml_tensor * dst, int ith, int nth, void * op) {
    unary_run((unary_op) (intptr_t) op, static_cast<const float *>(dst->src[0]->data), ggml_nelements(dst),
              static_cast<float *>(dst->data), ith, nth);
}

ggml_tensor * unary(ggml_context * g, ggml_tensor * x, unary_op op) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x));
    ggml_tensor * args[1] = { x };
    return ggml_custom_4d(g, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2], x->ne[3], args, 1, compute_unary,
                          GGML_N_TASKS_MAX, reinterpret_cast<void *>((intptr_t) op));
}

bool attention_fits(int64_t head_dim) {
    const int64_t w = vector_floats();
    return head_dim == 2 * w || head_dim == 4 * w || head_dim == 8 * w;
}

bool attention_run(const float * q, const float * k, const float * v, int64_t C, int64_t d, int64_t T, int64_t n_seq,
                   float scale, float * out, int ith, int nth, int width) {
    GGML_ASSERT(width <= vector_floats());
    return kernels(width).attention(q, k, v, C, d, T, n_seq, scale, out, ith, nth);
}

static void compute_attention(ggml_tensor * dst, int ith, int nth, void * params) {
    const auto &  p = *static_cast<const attention_params *>(params);
    const int64_t C = dst->ne[0];
    attention_run(data_of(dst->src[0]), data_of(dst->src[1]), data_of(dst->src[2]), C, C / p.n_head,
                  dst->ne[1] / p.n_seq, p.n_seq, p.scale, static_cast<float *>(dst->data), ith, nth);
}

ggml_tensor * attention(ggml_context * g, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int64_t n_head,
                        float scale, int64_t n_seq) {
    const int64_t C = q->ne[0], L = q->ne[1];
    for (ggml_tensor * t : { q, k, v }) {
        GGML_ASSERT(t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && t->ne[0] == C && t->ne[1] == L &&
                    ggml_nrows(t) == L);
    }
    GGML_ASSERT(n_head > 0 && C % n_head == 0 && attention_fits(C / n_head) && n_seq > 0 && L % n_seq == 0);
    ggml_tensor * args[3] = { q, k, v };
    return ggml_custom_4d(g, GGML_TYPE_F32, C, L, 1, 1, args, 3, compute_attention, GGML_N_TASKS_MAX,
                          const_cast<attention_params *>(interned(attention_params{ n_head, n_seq, scale })));
}

bool snake_conv_fits(int64_t channels, int64_t out_channels) {
    return channels > 0 && channels % vector_floats() == 0 && out_channels > 0 &&
           out_channels % (2 * vector_floats()) == 0;
}

bool int16_convs() {
    return vector_floats() >= 8;
}

void conv_weight_int16_scales(const float * w, int64_t IC, int64_t K, int64_t OC, float * scales) {
    for (int64_t oc = 0; oc < OC; ++oc) {
        const float * row  = w + IC * K * oc;
        float         amax = 0.0f;
        for (int64_t i = 0; i < IC * K; ++i) {
            amax = std::max(amax, std::fabs(row[i]));
        }
        scales[oc] = amax > 0.0f ? amax / int16_weight_max : 1.0f;
    }
}

void pack_conv_weight_int16(const float * w, int64_t IC, int64_t K, int64_t OC, int16_t * out, float * scales,
                            int64_t block) {
    block = block ? block : 2 * vector_floats();
    GGML_ASSERT(OC % block == 0 && IC % 2 == 0);
    conv_weight_int16_scales(w, IC, K, OC, scales);
    for (int64_t oc = 0; oc < OC; ++oc) {
        const float * row = w + IC * K * oc;
        const int64_t ob = oc / block * block, j = oc % block;
        for (int64_t k = 0; k < K; ++k) {
            for (int64_t ic = 0; ic < IC; ++ic) {
                const float q = std::nearbyint(row[ic + IC * k] / scales[oc]);
                out[ob * K * IC + ((k * IC / 2 + ic / 2) * block + j) * 2 + ic % 2] =
                    (int16_t) std::clamp(q, (float) -int16_weight_max, (float) int16_weight_max);
            }
        }
    }
}

void snake_conv_run(const float * x, int64_t C, int64_t T, const float * scale, const float * shift,
                    const float * inv_alpha, const packed_weight & w, int64_t K, int64_t OC, const float * b,
                    const float * residual, float * out, int dilation, int ith, int nth, int width) {
    const int vw = width ? width : vector_floats();
    GGML_ASSERT(vw <= vector_floats() && C % vw == 0 && OC % (2 * vw) == 0);
    GGML_ASSERT(w.int16 ? w.scales && vw >= 8 && C % 2 == 0 : w.f32 != nullptr);
    kernels(vw).snake_run(x, C, T, scale, shift, inv_alpha, w.f32, w.int16, w.scales, K, OC, b, residual, out, dilation,
                          ith, nth);
}

// Sources: x, scale, shift, inv_alpha, the weights (and their scales), the bias, the residual.
static void compute_snake(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor *x = dst->src[0], *w = dst->src[4];
    const int          b = after_weights(dst, 4);
    snake_conv_run(data_of(x), x->ne[0], x->ne[1], data_of(dst->src[1]), data_of(dst->src[2]), data_of(dst->src[3]),
                   packed_of(dst, 4), w->ne[2], w->ne[0], data_of(dst->src[b]), data_of(dst->src[b + 1]),
                   static_cast<float *>(dst->data), (int) reinterpret_cast<intptr_t>(userdata), ith, nth);
}

ggml_tensor * snake_conv(ggml_context * g, ggml_tensor * x, ggml_tensor * scale, ggml_tensor * shift,
                         ggml_tensor * inv_alpha, ggml_tensor * w_packed, ggml_tensor * w_scales, ggml_tensor * b,
                         ggml_tensor * residual, int dilation) {
    const int64_t C = x->ne[0], T = x->ne[1], OC = w_packed->ne[0];
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && ggml_nrows(x) == T && w_packed->ne[1] == C);
    GGML_ASSERT(snake_conv_fits(C, OC) && b != nullptr && ggml_nelements(b) == OC);
    check_weights(w_packed, w_scales);
    for (ggml_tensor * v : { scale, shift, inv_alpha }) {
        GGML_ASSERT(v->type == GGML_TYPE_F32 && ggml_is_contiguous(v) && ggml_nelements(v) == C);
    }
    GGML_ASSERT(!residual || (residual->type == GGML_TYPE_F32 && ggml_is_contiguous(residual) &&
                              residual->ne[0] == OC && ggml_nelements(residual) == OC * T));
    ggml_tensor * args[8] = { x, scale, shift, inv_alpha, w_packed };
    int           n_args  = 5;
    for (ggml_tensor * t : { w_scales, b, residual }) {
        if (t) {
            args[n_args++] = t;
        }
    }
    return ggml_custom_4d(g, GGML_TYPE_F32, OC, T, 1, 1, args, n_args, compute_snake, GGML_N_TASKS_MAX,
                          reinterpret_cast<void *>((intptr_t) dilation));
}

void channel_stats_run(const float * x, int64_t C, int64_t T, int64_t c0, int64_t c1, float * out, int width) {
    const int w = width ? width : vector_floats();
    GGML_ASSERT(w <= vector_floats() && C % w == 0 && c0 % w == 0 && c1 % w == 0);
    kernels(w).stats(x, C, T, c0, c1, out);
}

static void compute_stats(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * x = dst->src[0];
    const int64_t       C = x->ne[0], w = vector_floats(), per = (C / w + nth - 1) / nth * w;
    const int64_t       c0 = std::min(C, ith * per), c1 = std::min(C, c0 + per);
    if (c0 < c1) {
        channel_stats_run(data_of(x), C, x->ne[1], c0, c1, static_cast<float *>(dst->data));
    }
}

ggml_tensor * channel_stats(ggml_context * g, ggml_tensor * x) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && ggml_nrows(x) == x->ne[1]);
    GGML_ASSERT(x->ne[0] % vector_floats() == 0);
    ggml_tensor * args[1] = { x };
    return ggml_custom_4d(g, GGML_TYPE_F32, x->ne[0], 2, 1, 1, args, 1, compute_stats, GGML_N_TASKS_MAX, nullptr);
}

// The share of n items thread ith of nth takes.
static void share(int64_t n, int ith, int nth, int64_t & begin, int64_t & end) {
    const int64_t per = (n + nth - 1) / nth;
    begin             = std::min(n, ith * per);
    end               = std::min(n, begin + per);
}

struct fold_params {
    int     stride, padding;
    int64_t T_out, zeros_before;
    bool    operator<(const fold_params & o) const {
        return std::tie(stride, padding, T_out, zeros_before) < std::tie(o.stride, o.padding, o.T_out, o.zeros_before);
    }
};

struct head_params {
    int64_t first;
    float   slope;
    bool    operator<(const head_params & o) const { return std::tie(first, slope) < std::tie(o.first, o.slope); }
};

static void compute_fold(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto &        p    = *static_cast<const fold_params *>(userdata);
    const ggml_tensor * cols = dst->src[0];
    int64_t             f0, f1;
    share(dst->ne[1], ith, nth, f0, f1);
    kernels().fold(data_of(cols), dst->ne[0], cols->ne[1], p.stride, p.padding, data_of(dst->src[1]), p.zeros_before,
                   p.T_out, static_cast<float *>(dst->data), f0, f1);
}

ggml_tensor * transpose_fold(ggml_context * g, ggml_tensor * cols, ggml_tensor * b, int stride, int padding,
                             int64_t T_out, int64_t zeros_before, int64_t zeros_after) {
    const int64_t OC = cols->ne[0] / (2 * stride), T = cols->ne[1] - 2;
    GGML_ASSERT(cols->type == GGML_TYPE_F32 && ggml_is_contiguous(cols) && cols->ne[0] == OC * 2 * stride);
    GGML_ASSERT(padding >= 0 && padding + T_out <= stride * (T + 1));
    GGML_ASSERT(!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == OC));
    ggml_tensor * args[2] = { cols, b };
    fold_params   p{ stride, padding, T_out, zeros_before };
    return ggml_custom_4d(g, GGML_TYPE_F32, OC, zeros_before + T_out + zeros_after, 1, 1, args, b ? 2 : 1, compute_fold,
                          GGML_N_TASKS_MAX, const_cast<fold_params *>(interned(p)));
}

static void compute_head(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto &        p = *static_cast<const head_params *>(userdata);
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * w = dst->src[1];
    int64_t             t0, t1;
    share(dst->ne[1], ith, nth, t0, t1);
    kernels().head(data_of(x), x->ne[0], p.first, data_of(w), w->ne[1], p.slope, static_cast<float *>(dst->data), t0,
                   t1);
}

ggml_tensor * conv_head(ggml_context * g, ggml_tensor * x, ggml_tensor * w, int64_t first, int64_t T, float slope) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && ggml_nrows(x) == x->ne[1]);
    GGML_ASSERT(w->type == GGML_TYPE_F32 && ggml_is_contiguous(w) && w->ne[0] == x->ne[0] && w->ne[2] == 1);
    GGML_ASSERT(first >= 0 && first + T + w->ne[1] - 1 <= x->ne[1]);
    ggml_tensor * args[2] = { x, w };
    head_params   p{ first, slope };
    return ggml_custom_4d(g, GGML_TYPE_F32, 1, T, 1, 1, args, 2, compute_head, GGML_N_TASKS_MAX,
                          const_cast<head_params *>(interned(p)));
}

void conv_run(const float * x, int64_t C, int64_t T, const float * w_packed, int64_t K, int64_t OC, const float * b,
              float * out, int dilation, int ith, int nth, int width) {
    const int w = width ? width : vector_floats();
    GGML_ASSERT(w <= vector_floats() && OC % (2 * w) == 0);
    kernels(w).plain_run(x, C, T, w_packed, K, OC, b, out, dilation, ith, nth);
}

static void compute_conv(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor *x = dst->src[0], *w = dst->src[1];
    conv_run(data_of(x), x->ne[0], x->ne[1], data_of(w), w->ne[2], w->ne[0], data_of(dst->src[2]),
             static_cast<float *>(dst->data), (int) reinterpret_cast<intptr_t>(userdata), ith, nth);
}

ggml_tensor * conv(ggml_context * g, ggml_tensor * x, ggml_tensor * w_packed, ggml_tensor * b, int dilation) {
    const int64_t C = x->ne[0], T = x->ne[1], OC = w_packed->ne[0];
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && ggml_nrows(x) == T && w_packed->ne[1] == C);
    GGML_ASSERT(OC % (2 * vector_floats()) == 0);
    GGML_ASSERT(!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == OC));
    ggml_tensor * args[3] = { x, w_packed, b };
    return ggml_custom_4d(g, GGML_TYPE_F32, OC, T, 1, 1, args, b ? 3 : 2, compute_conv, GGML_N_TASKS_MAX,
                          reinterpret_cast<void *>((intptr_t) dilation));
}

}  // namespace vs::cpu
