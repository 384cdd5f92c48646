// Attention: over a key/value cache (a token model's prompt and its steps one at a time), over a
// whole sequence, and with relative positions (Transformer-XL's, as espnet computes them).
#include <cmath>

#include "graph.h"

namespace vs {

ggml_tensor * cached_attention(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                               ggml_tensor * k_cache, ggml_tensor * v_cache, int64_t pos, int64_t n_head,
                               ggml_tensor * mask, float scale, ggml_tensor ** scores) {
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
    if (scores) {
        *scores = kq;
    }
    return ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3)), C, n);
}

ggml_tensor * indexed_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                ggml_tensor * k_cache, ggml_tensor * v_cache, ggml_tensor * k_at, ggml_tensor * v_at,
                                int64_t n_kv, int64_t n_head, ggml_tensor * mask, float scale, ggml_tensor ** scores) {
    const int64_t C = q->ne[0], d = C / n_head, n_ctx = v_cache->ne[0];
    const size_t  es_k = ggml_element_size(k_cache), es_v = ggml_element_size(v_cache);
    GGML_ASSERT(q->ne[1] == 1 && n_kv <= n_ctx && v->nb[0] == (size_t) ggml_element_size(v));
    // The reads below are views of the writes, so that they follow them.
    ggml_tensor * kw = ggml_set_rows(ctx, k_cache, k, k_at);
    ggml_tensor * vw = ggml_set_rows(ctx, ggml_view_2d(ctx, v_cache, 1, n_ctx * C, es_v, 0),
                                     ggml_view_2d(ctx, v, 1, C, v->nb[0], 0), v_at);
    ggml_tensor * K  = ggml_view_3d(ctx, kw, d, n_kv, n_head, k_cache->nb[1], d * es_k, 0);            // [d, n_kv, h]
    ggml_tensor * V  = ggml_view_3d(ctx, vw, n_kv, d, n_head, v_cache->nb[1], d * v_cache->nb[1], 0);  // [n_kv, d, h]
    ggml_tensor * Q =
        ggml_view_3d(ctx, q, d, 1, n_head, d * ggml_element_size(q), d * ggml_element_size(q), 0);  // [d, 1, h]
    ggml_tensor * kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, K, Q), mask, scale, 0.0f);          // [n_kv, 1, h]
    if (scores) {
        *scores = kq;
    }
    return ggml_reshape_2d(ctx, ggml_mul_mat(ctx, V, kq), C, 1);  // [d, 1, h]: [C, 1]
}

namespace {

// [C, T] -> [d, T, h]: a head's features, then time, then heads; contiguous, so that the CPU's
// tiled matmul kernels take it.
ggml_tensor * heads(ggml_context * ctx, ggml_tensor * x, int64_t n_head, int64_t n_seq = 1) {
    const int64_t C = x->ne[0], T = x->ne[1] / n_seq;
    return ggml_cont(
        ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, ggml_cont(ctx, x), C / n_head, n_head, T, n_seq), 0, 2, 1, 3));
}

// The weights kq [T_k, T_q, h] applied to v [C, T_k]: [C, T_q].
ggml_tensor * weighted_values(ggml_context * ctx, ggml_tensor * kq, ggml_tensor * v, int64_t n_head) {
    const int64_t C = v->ne[0], T = v->ne[1];
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, ggml_cont(ctx, v), C / n_head, n_head, T),
                                                   1, 2, 0, 3));  // [T_k, d, h]
    ggml_tensor * o  = ggml_mul_mat(ctx, vt, kq);                 // [d, T_q, h]
    return ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3)), C, kq->ne[1]);
}

}  // namespace

ggml_tensor * self_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int64_t n_head,
                             float scale, bool flash, int64_t n_seq) {
    if (flash) {  // ggml's fused kernel: keys and values in F16, the scores never stored
        ggml_tensor * K = ggml_cast(ctx, heads(ctx, k, n_head, n_seq), GGML_TYPE_F16);
        ggml_tensor * V = ggml_cast(ctx, heads(ctx, v, n_head, n_seq), GGML_TYPE_F16);
        ggml_tensor * r = ggml_flash_attn_ext(ctx, heads(ctx, q, n_head, n_seq), K, V, nullptr, scale, 0.0f, 0.0f);
        return ggml_reshape_2d(ctx, r, q->ne[0], q->ne[1]);  // [d, h, T_q, n_seq]: already [C, T_q]
    }
    GGML_ASSERT(n_seq == 1);
    ggml_tensor * kq = ggml_mul_mat(ctx, heads(ctx, k, n_head), heads(ctx, q, n_head));  // [T_k, T_q, h]
    return weighted_values(ctx, ggml_soft_max_ext(ctx, kq, nullptr, scale, 0.0f), v, n_head);
}

ggml_tensor * rel_pos_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * p,
                                ggml_tensor * bias_u, ggml_tensor * bias_v, int64_t n_head) {
    const int64_t C = q->ne[0], T = q->ne[1], d = C / n_head;
    ggml_tensor * qu = ggml_add(ctx, q, bias_u);
    ggml_tensor * qv = ggml_add(ctx, q, bias_v);
    ggml_tensor * ac = ggml_mul_mat(ctx, heads(ctx, k, n_head), heads(ctx, qu, n_head));  // [T, T, h]
    ggml_tensor * bd = ggml_mul_mat(ctx, heads(ctx, p, n_head), heads(ctx, qv, n_head));  // [2T - 1, T, h]
    // The shift: query i's score for key j is column j + T - 1 - i of its row (relative position
    // i - j), a view whose rows step one value less than bd's.
    bd               = ggml_view_3d(ctx, bd, T, T, n_head, bd->nb[1] - ggml_element_size(bd), bd->nb[2],
                                    (size_t) (T - 1) * ggml_element_size(bd));
    ggml_tensor * kq = ggml_add(ctx, ac, ggml_cont(ctx, bd));
    return weighted_values(ctx, ggml_soft_max_ext(ctx, kq, nullptr, 1.0f / std::sqrt((float) d), 0.0f), v, n_head);
}

}  // namespace vs
