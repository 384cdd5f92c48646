#include "vs-graph.h"

namespace vs {

ggml_tensor * conv1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation, int padding) {
    const int64_t IC = w->ne[0], OC = w->ne[1], K = w->ne[2];
    ggml_tensor * xp      = padding > 0 ? ggml_pad_ext(ctx, x, 0, 0, padding, padding, 0, 0, 0, 0) : x;
    const int64_t out_len = xp->ne[1] - dilation * (K - 1);
    // One mul_mat per tap over a shifted view of the input: no im2col, no transposes,
    // and the weight stays src0 so that it may be quantized.
    ggml_tensor * y = nullptr;
    for (int64_t k = 0; k < K; ++k) {
        ggml_tensor * wk  = ggml_view_2d(ctx, w, IC, OC, w->nb[1], k * w->nb[2]);
        ggml_tensor * tap = ggml_view_2d(ctx, xp, IC, out_len, xp->nb[1], k * dilation * xp->nb[1]);
        ggml_tensor * yk  = ggml_mul_mat(ctx, wk, tap);  // [OC, T']
        y                 = y ? ggml_add(ctx, y, yk) : yk;
    }
    return b ? ggml_add(ctx, y, b) : y;
}

ggml_tensor * conv1d_depthwise(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int dilation,
                               int padding) {
    const int64_t C = w->ne[0], K = w->ne[1], T = x->ne[1];
    ggml_tensor * xp      = ggml_pad_ext(ctx, x, 0, 0, padding, padding, 0, 0, 0, 0);  // [C, T + 2p]
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
                               int padding) {
    const int64_t IC = w->ne[0], OC = w->ne[1], K = w->ne[2], T = x->ne[1];
    GGML_ASSERT(K == 2 * stride);
    // Every tap of every output channel at once: cols[oc + OC*k, t] = sum_ic w[ic, oc, k] x[ic, t].
    ggml_tensor * cols = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, w, IC, OC * K), x);  // [OC*K, T]
    // Input step t writes taps k < s at t*s + k and taps k >= s at (t+1)*s + (k - s):
    // two non-overlapping halves, each a contiguous run of s frames per step.
    const size_t  es      = ggml_element_size(cols);
    ggml_tensor * first   = ggml_view_3d(ctx, cols, OC, stride, T, OC * es, cols->nb[1], 0);
    ggml_tensor * second  = ggml_view_3d(ctx, cols, OC, stride, T, OC * es, cols->nb[1], OC * stride * es);
    first                 = ggml_reshape_2d(ctx, ggml_cont(ctx, first), OC, stride * T);
    second                = ggml_reshape_2d(ctx, ggml_cont(ctx, second), OC, stride * T);
    ggml_tensor * full    = ggml_add(ctx, ggml_pad_ext(ctx, first, 0, 0, 0, stride, 0, 0, 0, 0),
                                     ggml_pad_ext(ctx, second, 0, 0, stride, 0, 0, 0, 0, 0));  // [OC, (T+1)*s]
    const int64_t out_len = (T + 1) * stride - 2 * padding;
    ggml_tensor * y       = ggml_view_2d(ctx, full, OC, out_len, full->nb[1], padding * full->nb[1]);
    return b ? ggml_add(ctx, y, b) : ggml_cont(ctx, y);
}

ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * gamma, ggml_tensor * beta, float eps) {
    return ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, x, eps), gamma), beta);
}

ggml_tensor * channels(ggml_context * ctx, ggml_tensor * x, int64_t first, int64_t n) {
    return ggml_cont(ctx, ggml_view_2d(ctx, x, n, x->ne[1], x->nb[1], first * ggml_element_size(x)));
}

ggml_tensor * flip_channels(ggml_context * ctx, ggml_tensor * x, ggml_tensor * rev_idx) {
    ggml_tensor * xt = ggml_cont(ctx, ggml_transpose(ctx, x));  // [T, C]: channels become rows
    return ggml_cont(ctx, ggml_transpose(ctx, ggml_get_rows(ctx, xt, rev_idx)));
}

}  // namespace vs
