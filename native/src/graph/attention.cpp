// Attention over a key/value cache: a token model's prompt and its steps one at a time.
#include "graph.h"

namespace vs {

ggml_tensor * cached_attention(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                               ggml_tensor * k_cache, ggml_tensor * v_cache, int64_t pos, int64_t n_head,
                               ggml_tensor * mask, float scale) {
    const int64_t C = q->ne[0], n = q->ne[1], d = C / n_head, n_kv = pos + n;
    const size_t  es_k = ggml_element_size(k_cache), es_v = ggml_element_size(v_cache);
    // This call's keys and values into the caches, before the reads below.
    ggml_build_forward_expand(gf,
                              ggml_cpy(ctx, k, ggml_view_2d(ctx, k_cache, C, n, k_cache->nb[1], pos * k_cache->nb[1])));
    ggml_build_forward_expand(
        gf, ggml_cpy(ctx, ggml_transpose(ctx, v), ggml_view_2d(ctx, v_cache, n, C, v_cache->nb[1], pos * es_v)));
    ggml_tensor * K = ggml_view_3d(ctx, k_cache, d, n_kv, n_head, k_cache->nb[1], d * es_k, 0);  // [d, n_kv, h]
    ggml_tensor * V =
        ggml_view_3d(ctx, v_cache, n_kv, d, n_head, v_cache->nb[1], d * v_cache->nb[1], 0);  // [n_kv, d, h]
    ggml_tensor * Q = ggml_permute(ctx, ggml_view_3d(ctx, q, d, n_head, n, d * ggml_element_size(q), q->nb[1], 0), 0, 2,
                                   1, 3);                                                   // [d, n, h]
    ggml_tensor * kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, K, Q), mask, scale, 0.0f);  // [n_kv, n, h]
    ggml_tensor * o  = ggml_mul_mat(ctx, V, kq);                                            // [d, n, h]
    return ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3)), C, n);
}

}  // namespace vs
