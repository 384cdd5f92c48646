// Builders of every family: time padding, norms, activations, channel views, concatenation, shape
// buckets.
#include <ggml-alloc.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "graph.h"

namespace vs {

// cap that at 65535.
ggml_tensor * pad_time(ggml_context * ctx, ggml_tensor * x, int64_t before, int64_t after) {
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx, x);
    }
    const int64_t C = x->ne[0], T = x->ne[1];
    ggml_tensor * flat = ggml_reshape_1d(ctx, x, C * T);
    flat               = ggml_pad_ext(ctx, flat, (int) (before * C), (int) (after * C), 0, 0, 0, 0, 0, 0);
    return ggml_reshape_2d(ctx, flat, C, T + before + after);
}

ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * gamma, ggml_tensor * beta, float eps) {
    return ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, x, eps), gamma), beta);
}

ggml_tensor * gelu_tanh(const graph_options & o, ggml_context * ctx, ggml_tensor * x) {
    if (!o.device_is_cpu) {
        return ggml_gelu(ctx, x);
    }
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = c x w, w = 1 + 0.044715 x^2 > 0: silu(2u) / (2 c w),
    // ggml's SiLU being vectorized on the CPU (its tanh calls tanhf a value).
    const float   c = 2.0f * std::sqrt(2.0f / (float) M_PI);
    ggml_tensor * w = ggml_scale_bias(ctx, ggml_sqr(ctx, x), 0.044715f * c, c);  // 2 c w
    return ggml_div(ctx, ggml_silu(ctx, ggml_mul(ctx, x, w)), w);
}

ggml_tensor * channels(ggml_context * ctx, ggml_tensor * x, int64_t first, int64_t n) {
    return ggml_cont(ctx, ggml_view_2d(ctx, x, n, x->ne[1], x->nb[1], first * ggml_element_size(x)));
}

ggml_tensor * flip_channels(ggml_context * ctx, ggml_tensor * x, ggml_tensor * rev_idx) {
    ggml_tensor * xt = ggml_cont(ctx, ggml_transpose(ctx, x));  // [T, C]: channels become rows
    return ggml_cont(ctx, ggml_transpose(ctx, ggml_get_rows(ctx, xt, rev_idx)));
}

ggml_tensor * step_above_zero(ggml_context * ctx, ggml_tensor * x) {
    return ggml_relu(ctx, ggml_sgn(ctx, x));  // sgn is 0 at +-0 on every backend
}

ggml_tensor * concat_all(ggml_context * ctx, std::vector<ggml_tensor *> parts, int dim) {
    while (parts.size() > 1) {
        std::vector<ggml_tensor *> next;
        for (size_t i = 0; i + 1 < parts.size(); i += 2) {
            next.push_back(ggml_concat(ctx, parts[i], parts[i + 1], dim));
        }
        if (parts.size() % 2) {
            next.push_back(parts.back());
        }
        parts.swap(next);
    }
    return parts.empty() ? nullptr : parts[0];
}

int64_t shape_bucket(int64_t n) {
    int64_t p = 1;
    while (p * 2 <= n) {
        p *= 2;
    }
    const int64_t step = std::max<int64_t>(16, p / 8);
    return (n + step - 1) / step * step;
}

}  // namespace vs
