// Convolutions as ggml graphs: im2col views on the CPU, ggml's im2col or batched GEMMs over
// an input's phases off it, transposed convolutions as one matmul and an overlap-add.
#include <ggml-alloc.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "graph.h"

namespace vs {

namespace {

// Largest im2col matrix (as F32) one convolution's mul_mat takes at once: on the CPU the
// converted rows, elsewhere the matrix itself.
constexpr size_t MAX_IM2COL_BYTES     = 64u << 20;
constexpr size_t MAX_IM2COL_BYTES_DEV = 512u << 20;

// A view whose rows overlap: row i starts `row_stride` bytes after row i - 1 but is
// `row_len` elements long. Over a [C, T] activation with row_len = C * K and
// row_stride = C it is the im2col matrix of a dilation-1 convolution, for free.
// ggml_view_* sizes a view as if its rows were disjoint, so the view is made one
// row tall and then given its real height; its extent is checked here instead.
ggml_tensor * overlapping_rows(ggml_context * ctx, ggml_tensor * x, int64_t row_len, int64_t n_rows, size_t row_stride,
                               int64_t n_mats, size_t mat_stride, size_t offset) {
    ggml_tensor * v = ggml_view_3d(ctx, x, row_len, 1, n_mats, row_stride, mat_stride, offset);
    v->ne[1]        = n_rows;
    v->nb[3]        = v->nb[2] * v->ne[2];
    GGML_ASSERT(offset + ggml_nbytes(v) <= ggml_nbytes(x));
    return v;
}

// Off the CPU, the im2col matrix of a convolution over x [IC, IH] (contiguous), made by
// ggml's im2col op: x is read as a one-channel image IC wide and IH tall and the kernel as
// IC wide and K tall, so each output row holds tap-major, channel-minor values — the
// layout of w [IC, K, OC]. Strides and dilations are the op's own (no phase split), and
// the matrix is written in F16 when the weights are F16, so the mul_mat converts nothing.
ggml_tensor * im2col(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, int stride, int dilation) {
    const int64_t   IC = w->ne[0], K = w->ne[1];
    ggml_tensor *   kernel = ggml_reshape_4d(ctx, w, IC, K, 1, w->ne[2]);  // only its shape is read
    ggml_tensor *   image  = ggml_reshape_4d(ctx, x, IC, x->ne[1], 1, 1);
    const ggml_type type   = w->type == GGML_TYPE_F16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    ggml_tensor *   cols   = ggml_im2col(ctx, kernel, image, 1, stride, 0, 0, 1, dilation, true, type);
    return ggml_reshape_2d(ctx, cols, IC * K, cols->ne[2]);  // [IC * K, T_out]
}

// The window matrix of a convolution as a view into its input, which holds x [C, S, d]
// (F16): frame s of dilation phase q (input frame s * d + q) at column s of matrix q. Output
// frame t = q + d * (r + K * j) reads frames r + K * j .. r + K * j + K - 1 of phase q: K * C
// values in a row, so matrix (r, q) of the view, column j, is that window, and rows K * C
// apart are disjoint. The view is [K * C, J, K, d], its matrices overlapping.
ggml_tensor * phase_windows(ggml_context * ctx, ggml_tensor * x, int64_t K, int64_t J) {
    const int64_t C = x->ne[0], S = x->ne[1], d = x->ne[2];
    const size_t  es = ggml_element_size(x);
    GGML_ASSERT(ggml_is_contiguous(x) && S >= J * K + K - 1);
    ggml_tensor * v = ggml_view_4d(ctx, x, K * C, 1, 1, 1, K * C * es, C * es, S * C * es, 0);
    v->ne[1]        = J;
    v->ne[2]        = K;
    v->ne[3]        = d;
    GGML_ASSERT(ggml_nbytes(v) <= ggml_nbytes(x));
    return v;
}

// The convolution's GEMMs over phases [C, S, d] (the weights' type, J windows of K frames a phase), to
// [OC, T_out] in time order.
ggml_tensor * phases_gemm(ggml_context * ctx, ggml_tensor * phases, int64_t J, int64_t T_out, ggml_tensor * w,
                          ggml_tensor * b) {
    const int64_t C = w->ne[0], K = w->ne[1], OC = w->ne[2], d = phases->ne[2];
    // One matmul a window phase and dilation phase (K * d of them, one batched GEMM).
    ggml_tensor * y = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, w, K * C, OC), phase_windows(ctx, phases, K, J));
    ggml_mul_mat_set_prec(y, GGML_PREC_F32);  // [OC, J, K, d], written as F32 by the GEMM itself
    // Time order (t = q + d * (r + K * j)): the bias add (or a copy) writes it.
    ggml_tensor * yt = ggml_permute(ctx, y, 0, 3, 2, 1);  // [OC, d, K, J] view
    yt               = b ? ggml_add(ctx, yt, b) : ggml_cont(ctx, yt);
    yt               = ggml_reshape_2d(ctx, yt, OC, d * K * J);
    return d * K * J == T_out ? yt : ggml_view_2d(ctx, yt, OC, T_out, yt->nb[1], 0);
}

}  // namespace

int64_t phase_columns(int64_t n, bool fine) {
    int64_t b = 1;
    while (b < n) {
        b *= 2;
    }
    if (!fine || b <= 16) {
        return b;
    }
    const int64_t step = b / 16;  // b / 2 < n <= b: eight steps an octave
    return (n + step - 1) / step * step;
}

ggml_tensor * conv1d_phases(ggml_context * ctx, ggml_tensor * xt, int64_t pad_before, int64_t T_out, ggml_tensor * w,
                            ggml_tensor * b, int dilation, bool fine_columns) {
    const int64_t C = w->ne[0], K = w->ne[1], d = dilation, IC = xt->ne[1];
    GGML_ASSERT(xt->type == GGML_TYPE_F32 && IC <= C && K > 1);
    const int64_t per_phase = (T_out + d - 1) / d;  // outputs of each dilation phase
    const int64_t J         = phase_columns((per_phase + K - 1) / K, fine_columns);
    const int64_t S         = J * K + K - 1;  // input frames of each dilation phase
    const int64_t T_in      = d * S;          // padded input frames
    const int64_t T         = std::min(xt->ne[0], T_in - pad_before);
    // Zeros around the input (and in the channels past its IC, which weights padded to
    // C read: channel_padded_weight), then its frames by phase as [C, S, d] F16: padded in
    // [T, C], made F16, then moved by ggml's tiled transposes (a dilation's phases first
    // become [S, d, C], then the whole [C, S * d]).
    ggml_tensor * xv    = ggml_view_2d(ctx, xt, T, IC, xt->nb[1], 0);
    const int     after = (int) (T_in - pad_before - T);
    xv                  = ggml_pad_ext(ctx, xv, (int) pad_before, after, 0, (int) (C - IC), 0, 0, 0, 0);  // [T_in, C]
    if (w->type != GGML_TYPE_F32) {
        xv = ggml_cast(ctx, xv, w->type);
    }
    if (d > 1) {
        xv = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, xv, d, S, C), 1, 0, 2, 3));  // [S, d, C]
        xv = ggml_reshape_2d(ctx, xv, S * d, C);
    }
    ggml_tensor * phases = ggml_reshape_3d(ctx, ggml_cont(ctx, ggml_transpose(ctx, xv)), C, S, d);
    return phases_gemm(ctx, phases, J, T_out, w, b);
}

ggml_tensor * conv1d_phases_ct(ggml_context * ctx, ggml_tensor * x, int64_t pad_before, int64_t T_out, ggml_tensor * w,
                               ggml_tensor * b, bool fine_columns) {
    const int64_t C = w->ne[0], K = w->ne[1], IC = x->ne[0];
    GGML_ASSERT(x->type == GGML_TYPE_F32 && IC <= C && K > 1);
    const int64_t J     = phase_columns((T_out + K - 1) / K, fine_columns);
    const int64_t S     = J * K + K - 1;  // padded input frames
    const int64_t T     = std::min(x->ne[1], S - pad_before);
    const int     after = (int) (S - pad_before - T);
    ggml_tensor * xv    = ggml_view_2d(ctx, x, IC, T, x->nb[1], 0);
    if (IC == C) {
        xv = pad_time(ctx, xv, pad_before, after);  // [C, S]
    } else if (S <= 65535) {                        // both axes in one pad (a GPU's grid has a block row a frame)
        xv = ggml_pad_ext(ctx, xv, 0, (int) (C - IC), (int) pad_before, after, 0, 0, 0, 0);
    } else {
        xv = pad_time(ctx, ggml_pad(ctx, xv, (int) (C - IC), 0, 0, 0), pad_before, after);
    }
    if (w->type != GGML_TYPE_F32) {
        xv = ggml_cast(ctx, xv, w->type);
    }
    return phases_gemm(ctx, ggml_reshape_3d(ctx, xv, C, S, 1), J, T_out, w, b);
}

// Padded as one long row: a GPU pad kernel may launch a block row per frame, and grids

ggml_tensor * conv1d_strided(const graph_options & o, ggml_context * ctx, ggml_tensor * x, ggml_tensor * w,
                             ggml_tensor * b, int stride, int padding) {
    const int64_t IC = w->ne[0], K = w->ne[1], OC = w->ne[2];
    const int64_t T_out = (x->ne[1] + 2 * padding - K) / stride + 1;
    // Frames read: (T_out - 1) * stride + K; pad after up to that.
    const int64_t after = std::max<int64_t>(0, (T_out - 1) * stride + K - x->ne[1] - padding);
    ggml_tensor * xp    = (padding > 0 || after > 0) ? pad_time(ctx, x, padding, after) : x;
    if (!ggml_is_contiguous(xp)) {
        xp = ggml_cont(ctx, xp);
    }
    GGML_ASSERT(xp->ne[0] == IC);
    const size_t  fb   = xp->nb[1];
    ggml_tensor * cols = o.device_is_cpu
                             ? overlapping_rows(ctx, xp, IC * K, T_out, stride * fb, 1, fb * xp->ne[1], 0)
                             : im2col(ctx, ggml_view_2d(ctx, xp, IC, (T_out - 1) * stride + K, fb, 0), w, stride, 1);
    ggml_tensor * y    = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, w, IC * K, OC), cols);  // [OC, T_out]
    return b ? ggml_add(ctx, y, b) : y;
}

bool phases_apply(const graph_options & o, const ggml_tensor * w, int dilation) {
    return !o.device_is_cpu && o.limits.strided_batches && (w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_F32) &&
           w->ne[1] > 1 && (dilation == 1 || o.limits.matmul_4d);
}

namespace {

bool matmul_reads_batch_strides(ggml_backend_t backend, ggml_type type) {
    constexpr int64_t C = 8, K = 3, J = 32, OC = 16;  // J columns: a matrix kernel, not a vector one
    // The windows need J K + K - 1 frames; a backend that reads the K matrices packed reads
    // K K J frames, so x has them all: its wrong answer then comes from inside the buffer,
    // not from past its end (which a driver without robust buffer access may fault on).
    constexpr int64_t S = K * K * J;
    static_assert(S >= J * K + K - 1);
    ggml_init_params ip{ ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    w   = ggml_new_tensor_2d(ctx, type, K * C, OC);
    ggml_tensor *    x   = ggml_new_tensor_3d(ctx, type, C, S, 1);
    ggml_tensor *    y   = ggml_mul_mat(ctx, w, phase_windows(ctx, x, K, J));  // [OC, J, K, 1]
    ggml_cgraph *    gf  = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    bool                  ok  = buf != nullptr;
    std::vector<float>    wf((size_t) (K * C * OC)), xf((size_t) (C * S));
    for (size_t i = 0; i < wf.size(); ++i) {
        wf[i] = (float) ((int) (i % 5) - 2);
    }
    for (size_t i = 0; i < xf.size(); ++i) {
        xf[i] = (float) ((int) (i % 7) - 3);
    }
    if (ok && type == GGML_TYPE_F16) {
        std::vector<ggml_fp16_t> wh(wf.size()), xh(xf.size());
        ggml_fp32_to_fp16_row(wf.data(), wh.data(), (int64_t) wf.size());
        ggml_fp32_to_fp16_row(xf.data(), xh.data(), (int64_t) xf.size());
        ggml_backend_tensor_set(w, wh.data(), 0, ggml_nbytes(w));
        ggml_backend_tensor_set(x, xh.data(), 0, ggml_nbytes(x));
    } else if (ok) {
        ggml_backend_tensor_set(w, wf.data(), 0, ggml_nbytes(w));
        ggml_backend_tensor_set(x, xf.data(), 0, ggml_nbytes(x));
    }
    if (ok) {
        ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
    }
    if (ok) {
        std::vector<float> yv((size_t) (OC * J * K));
        ggml_backend_tensor_get(y, yv.data(), 0, ggml_nbytes(y));
        for (int64_t r = 0; r < K && ok; ++r) {
            for (int64_t j = 0; j < J && ok; ++j) {
                const float * win = xf.data() + (r + K * j) * C;  // window j of tap phase r
                for (int64_t oc = 0; oc < OC && ok; ++oc) {
                    double want = 0.0;
                    for (int64_t i = 0; i < K * C; ++i) {
                        want += (double) wf[(size_t) (oc * K * C + i)] * win[i];
                    }
                    ok = std::fabs(yv[(size_t) ((r * J + j) * OC + oc)] - want) < 0.5;
                }
            }
        }
    }
    if (buf) {
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    return ok;
}

}  // namespace

bool matmul_reads_batch_strides(ggml_backend_t backend) {
    return matmul_reads_batch_strides(backend, GGML_TYPE_F16) && matmul_reads_batch_strides(backend, GGML_TYPE_F32);
}

int64_t conv1d_frames_needed(int64_t T_out, int64_t K, int dilation) {
    if (dilation == 1) {
        return T_out + K - 1;
    }
    const int64_t phases_len = (T_out + dilation - 1) / dilation;  // outputs per phase
    return (phases_len + K - 1) * dilation;
}

ggml_tensor * conv1d_window(const graph_options & o, ggml_context * ctx, ggml_tensor * xp, int64_t start, int64_t T_out,
                            ggml_tensor * w, ggml_tensor * b, int dilation) {
    const int64_t IC = w->ne[0], K = w->ne[1], OC = w->ne[2];
    GGML_ASSERT(xp->ne[0] == IC && ggml_is_contiguous(xp));
    GGML_ASSERT(start + conv1d_frames_needed(T_out, K, dilation) <= xp->ne[1]);
    const size_t fb = xp->nb[1];  // bytes per frame
    if (w->type == GGML_TYPE_F32 && o.device_is_cpu) {
        // F32 weights on the CPU: ggml's tiled F32 GEMM needs a contiguous src1, so one
        // mul_mat per tap over a shifted view, summed.
        ggml_tensor * y = nullptr;
        for (int64_t k = 0; k < K; ++k) {
            ggml_tensor * wk  = ggml_view_2d(ctx, w, IC, OC, w->nb[2], k * w->nb[1]);
            ggml_tensor * tap = ggml_view_2d(ctx, xp, IC, T_out, fb, (start + k * dilation) * fb);
            ggml_tensor * yk  = ggml_mul_mat(ctx, wk, tap);  // [OC, T_out]
            y                 = y ? ggml_add(ctx, y, yk) : yk;
        }
        return b ? ggml_add(ctx, y, b) : y;
    }
    // Other weight types convert src1 row by row anyway, so overlapping rows cost
    // nothing extra: one mul_mat with the taps folded into the contraction. That
    // conversion (or, off the CPU, the materialized im2col) holds K times the input,
    // so long outputs go in tiles of time.
    const size_t limit = std::min(o.device_is_cpu ? MAX_IM2COL_BYTES : MAX_IM2COL_BYTES_DEV, o.limits.max_tensor_bytes);
    const int64_t tile = std::max<int64_t>(64, (int64_t) (limit / (IC * K * sizeof(float))) / dilation) * dilation;
    if (T_out > tile) {
        ggml_tensor * y = nullptr;
        for (int64_t t0 = 0; t0 < T_out; t0 += tile) {
            const int64_t n    = std::min(tile, T_out - t0);
            ggml_tensor * part = conv1d_window(o, ctx, xp, start + t0, n, w, b, dilation);
            y = y ? ggml_acc_inplace(ctx, y, part, y->nb[1], ggml_nbytes(y), ggml_nbytes(y), t0 * y->nb[1])
                  : pad_time(ctx, part, 0, T_out - n);
        }
        return y;
    }
    ggml_tensor * w2 = ggml_reshape_2d(ctx, w, IC * K, OC);
    if (!o.device_is_cpu && K == 1) {  // the input is its own im2col matrix
        ggml_tensor * y = ggml_mul_mat(ctx, w2, ggml_view_2d(ctx, xp, IC, T_out, fb, start * fb));
        return b ? ggml_add(ctx, y, b) : y;
    }
    if (!o.device_is_cpu) {
        ggml_tensor * x = ggml_view_2d(ctx, xp, IC, T_out + (K - 1) * dilation, fb, start * fb);
        ggml_tensor * y = ggml_mul_mat(ctx, w2, im2col(ctx, x, w, 1, dilation));  // [OC, T_out]
        return b ? ggml_add(ctx, y, b) : y;
    }
    if (dilation == 1) {
        ggml_tensor * cols = overlapping_rows(ctx, xp, IC * K, T_out, fb, 1, fb * xp->ne[1], start * fb);
        ggml_tensor * y    = ggml_mul_mat(ctx, w2, cols);  // [OC, T_out]
        return b ? ggml_add(ctx, y, b) : y;
    }
    // Dilated: split time into `dilation` phases (frames t with t % d == r). Within a
    // phase the taps are adjacent frames, so each phase is a dilation-1 convolution.
    const int64_t d = dilation, S = conv1d_frames_needed(T_out, K, dilation) / d, So = S - K + 1;
    ggml_tensor * phases = ggml_view_3d(ctx, xp, IC, d, S, fb, fb * d, start * fb);  // [IC, d, S]
    phases               = ggml_cont(ctx, ggml_permute(ctx, phases, 0, 2, 1, 3));    // [IC, S, d]
    ggml_tensor * cols   = overlapping_rows(ctx, phases, IC * K, So, phases->nb[1], d, phases->nb[2], 0);
    ggml_tensor * y      = ggml_permute(ctx, ggml_mul_mat(ctx, w2, cols), 0, 2, 1, 3);  // [OC, d, So] view
    // Back to time order: the bias add (or a copy) writes frames t = s * d + r in sequence.
    y = b ? ggml_add(ctx, y, b) : ggml_cont(ctx, y);
    y = ggml_reshape_2d(ctx, y, OC, d * So);
    return d * So == T_out ? y : ggml_view_2d(ctx, y, OC, T_out, y->nb[1], 0);
}

ggml_tensor * conv1d(const graph_options & o, ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b,
                     int dilation, int padding) {
    const int64_t K = w->ne[1], T_out = x->ne[1] + 2 * padding - dilation * (K - 1);
    const int64_t need  = conv1d_frames_needed(T_out, K, dilation);
    const int64_t after = need - x->ne[1] - padding;  // >= padding; the extra frames feed dropped outputs
    ggml_tensor * xp    = (padding > 0 || after > 0) ? pad_time(ctx, x, padding, after) : x;
    return conv1d_window(o, ctx, xp, 0, T_out, w, b, dilation);
}

ggml_tensor * conv1d_depthwise(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation,
                               int padding) {
    const int64_t C = w->ne[0], K = w->ne[1], T = x->ne[1];
    ggml_tensor * xp      = pad_time(ctx, x, padding, padding);  // [C, T + 2p]
    const int64_t out_len = T + 2 * padding - dilation * (K - 1);
    ggml_tensor * y       = nullptr;
    for (int64_t k = 0; k < K; ++k) {
        ggml_tensor * tap  = ggml_view_2d(ctx, xp, C, out_len, xp->nb[1], k * dilation * xp->nb[1]);
        ggml_tensor * wk   = ggml_view_1d(ctx, w, C, k * w->nb[1]);
        ggml_tensor * term = ggml_mul(ctx, tap, wk);
        y                  = y ? ggml_add(ctx, y, term) : term;
    }
    return b ? ggml_add(ctx, y, b) : y;
}

ggml_tensor * conv_transpose1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int stride,
                               int padding, int64_t zeros_before, int64_t zeros_after) {
    return conv_transpose1d_zero_edges(ctx, pad_time(ctx, x, 1, 1), w, b, stride, padding, zeros_before, zeros_after);
}

ggml_tensor * conv_transpose1d_zero_edges(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b,
                                          int stride, int padding, int64_t zeros_before, int64_t zeros_after) {
    const int64_t IC = w->ne[0], OC = w->ne[1], K = w->ne[2], T = x->ne[1] - 2, s = stride;
    GGML_ASSERT(K == 2 * s && padding <= s && T > 0);
    // Every tap of every output channel at once: cols[oc + OC*k, j] = sum_ic w[ic, oc, k] x[ic, j],
    // column j holding input step j - 1 (columns 0 and T + 1 are the zero steps).
    ggml_tensor * cols = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, w, IC, OC * K), x);  // [OC*K, T+2]
    // Input step t writes taps k < s to frames t*s + k and taps k >= s to (t+1)*s + (k - s), so
    // the block of s frames j*s .. j*s + s - 1 (j = 0 .. T) is the first half of step j plus the
    // second half of step j - 1: two views of cols one column apart, added in one pass. The
    // zero steps stand in for step -1 (block 0) and step T (block T).
    const size_t  es     = ggml_element_size(cols);
    const size_t  fb     = OC * es;  // bytes per frame
    ggml_tensor * first  = ggml_view_3d(ctx, cols, OC, s, T + 1, fb, cols->nb[1], cols->nb[1]);
    ggml_tensor * second = ggml_view_3d(ctx, cols, OC, s, T + 1, fb, cols->nb[1], s * fb);
    ggml_tensor * y      = ggml_add(ctx, first, second);  // [OC, s, T+1], contiguous
    if (b) {
        y = ggml_add(ctx, y, b);
    }
    // Output frame u is full frame u + padding.
    const int64_t T_out = T * s + K - s - 2 * padding;
    y                   = ggml_view_2d(ctx, ggml_reshape_2d(ctx, y, OC, s * (T + 1)), OC, T_out, fb, padding * fb);
    return zeros_before > 0 || zeros_after > 0 ? pad_time(ctx, y, zeros_before, zeros_after) : y;
}

ggml_tensor * conv_transpose1d_any(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int stride,
                                   int padding, int64_t K) {
    const int64_t IC = w->ne[0], OC = w->ne[1], s = stride, G = w->ne[2] / s, T = x->ne[1];
    GGML_ASSERT(w->ne[2] % s == 0 && K <= w->ne[2] && K > w->ne[2] - s && x->ne[0] == IC);
    // Every tap of every output channel at once, G - 1 zero steps before and after:
    // cols[oc + OC*k, j] = sum_ic w[ic, oc, k] x[ic, j - (G - 1)].
    ggml_tensor * xp   = G > 1 ? pad_time(ctx, x, G - 1, G - 1) : x;
    ggml_tensor * cols = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, w, IC, OC * s * G), xp);  // [OC*s*G, T+2G-2]
    // Step t writes tap group g (taps g*s .. g*s + s - 1) to block t + g of s frames, so block j
    // sums group g of step j - g over g: G views of cols, each shifted by a column.
    const size_t  fb = OC * ggml_element_size(cols);  // bytes per frame
    ggml_tensor * y  = nullptr;
    for (int64_t g = 0; g < G; ++g) {
        ggml_tensor * v =
            ggml_view_3d(ctx, cols, OC, s, T + G - 1, fb, cols->nb[1], g * s * fb + (G - 1 - g) * cols->nb[1]);
        y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
    }
    if (b) {
        y = ggml_add(ctx, y, b);
    }
    const int64_t T_out = (T - 1) * s + K - 2 * padding;  // output frame u is full frame u + padding
    return ggml_view_2d(ctx, ggml_reshape_2d(ctx, y, OC, s * (T + G - 1)), OC, T_out, fb, padding * fb);
}

}  // namespace vs
