// Piper's text encoder: relative-position attention and feed-forward layers.
#include "piper.h"

namespace vs::piper {

ggml_tensor * relative_to_absolute(ggml_context * g, ggml_tensor * rel) {
    const int64_t T = rel->ne[1], H = rel->ne[2];
    ggml_tensor * x = ggml_pad_ext(g, rel, 0, 1, 0, 0, 0, 0, 0, 0);  // [2T, T, H]
    x               = ggml_reshape_2d(g, x, 2 * T * T, H);
    x               = ggml_pad_ext(g, x, 0, (int) (T - 1), 0, 0, 0, 0, 0, 0);
    x               = ggml_reshape_3d(g, x, 2 * T - 1, T + 1, H);
    x               = ggml_view_3d(g, x, T, T, H, x->nb[1], x->nb[2], (T - 1) * ggml_element_size(x));
    return ggml_cont(g, x);
}

ggml_tensor * absolute_to_relative(ggml_context * g, ggml_tensor * abs) {
    const int64_t T = abs->ne[1], H = abs->ne[2];
    ggml_tensor * x = ggml_pad_ext(g, abs, 0, (int) (T - 1), 0, 0, 0, 0, 0, 0);  // [2T-1, T, H]
    x               = ggml_reshape_2d(g, x, (2 * T - 1) * T, H);
    x               = ggml_pad_ext(g, x, (int) T, 0, 0, 0, 0, 0, 0, 0);  // [2T*T, H]
    x               = ggml_reshape_3d(g, x, 2 * T, T, H);
    x               = ggml_view_3d(g, x, 2 * T - 1, T, H, x->nb[1], x->nb[2], ggml_element_size(x));
    return ggml_cont(g, x);
}

ggml_tensor * relative_embeddings(ggml_context * g, ggml_tensor * emb, int window, int64_t T) {
    const int64_t d   = emb->ne[0];
    ggml_tensor * e   = ggml_reshape_2d(g, emb, d, emb->ne[1]);
    const int64_t pad = (T - 1) - window;
    if (pad > 0) {
        return ggml_pad_ext(g, e, 0, 0, (int) pad, (int) pad, 0, 0, 0, 0);
    }
    return ggml_cont(g, ggml_view_2d(g, e, d, 2 * T - 1, e->nb[1], (size_t) (-pad) * e->nb[1]));
}

// Over n sentences in slots (x [C, S * n], see packing; kq_mask [S, S, 1, n]) or one (n = 1,
// no mask): each slot is a batch item of the attention.
ggml_tensor * piper_voice::attention(vs_context & c, ggml_context * g, ggml_tensor * x, int il, int64_t n,
                                     ggml_tensor * kq_mask) const {
    const std::string pre = "enc_p.encoder.attn_layers." + std::to_string(il) + ".";
    const int64_t     S = x->ne[1] / n, H = hp_.n_heads, d = hp_.hidden / hp_.n_heads;

    ggml_tensor * q = c.conv(g, x, pre + "conv_q");
    ggml_tensor * k = c.conv(g, x, pre + "conv_k");
    ggml_tensor * v = c.conv(g, x, pre + "conv_v");
    q               = ggml_scale(g, q, 1.0f / std::sqrt((float) d));

    q = ggml_cont(g, ggml_permute(g, ggml_reshape_4d(g, q, d, H, S, n), 0, 2, 1, 3));  // [d, S, H, n]
    k = ggml_cont(g, ggml_permute(g, ggml_reshape_4d(g, k, d, H, S, n), 0, 2, 1, 3));  // [d, S, H, n]
    v = ggml_cont(g, ggml_permute(g, ggml_reshape_4d(g, v, d, H, S, n), 1, 2, 0, 3));  // [S, d, H, n]

    ggml_tensor * scores = ggml_mul_mat(g, k, q);  // [Sk, Sq, H, n]
    ggml_tensor * rel_k  = relative_embeddings(g, c.w(pre + "emb_rel_k"), hp_.window, S);
    // q as one matrix: a matmul broadcasting its 2-D src0 over both outer axes is not
    // every backend's (Vulkan's takes none over the fourth).
    ggml_tensor * rel =
        ggml_reshape_3d(g, ggml_mul_mat(g, rel_k, ggml_reshape_2d(g, q, d, S * H * n)), 2 * S - 1, S, H * n);
    scores             = ggml_add(g, scores, ggml_reshape_4d(g, relative_to_absolute(g, rel), S, S, H, n));
    ggml_tensor * attn = ggml_soft_max_ext(g, scores, kq_mask, 1.0f, 0.0f);
    ggml_set_name(attn, ("attn_weights." + std::to_string(il)).c_str());

    ggml_tensor * out   = ggml_mul_mat(g, v, attn);  // [d, Sq, H, n]
    ggml_tensor * rel_v = relative_embeddings(g, c.w(pre + "emb_rel_v"), hp_.window, S);
    rel_v               = ggml_cont(g, ggml_transpose(g, rel_v));  // [2S-1, d]
    ggml_tensor * a_rel = absolute_to_relative(g, ggml_reshape_3d(g, attn, S, S, H * n));
    out                 = ggml_add(g, out, ggml_reshape_4d(g, ggml_mul_mat(g, rel_v, a_rel), d, S, H, n));
    out = ggml_reshape_2d(g, ggml_cont(g, ggml_permute(g, out, 0, 2, 1, 3)), hp_.hidden, S * n);  // [C, S * n]
    return c.conv(g, out, pre + "conv_o");
}

void piper_voice::run_encoder(vs_context & c, const std::vector<int32_t> & ids, const packing & pk,
                              std::vector<float> & hidden, std::vector<float> & m_p, std::vector<float> & logs_p) {
    const int64_t T = (int64_t) ids.size(), n = (int64_t) pk.start.size();
    GGML_ASSERT(pk.slot * n == T);
    const bool        packed = pk.packed();
    const std::string key = "encoder " + std::to_string(n) + "x" + std::to_string(pk.slot) + (packed ? " packed" : "");
    vs::stage_graph & sg  = c.stage_graph(VS_STAGE_ENCODER, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * tokens = new_input(g, GGML_TYPE_I32, T);
        ggml_set_name(tokens, "tokens");
        ggml_tensor * mask    = packed ? new_input(g, GGML_TYPE_F32, 1, T) : nullptr;
        ggml_tensor * kq_mask = packed ? new_input(g, GGML_TYPE_F32, pk.slot, pk.slot, 1, n) : nullptr;

        ggml_tensor * x = ggml_get_rows(g, c.w("enc_p.emb.weight"), tokens);  // [C, T]
        x               = ggml_scale(g, x, std::sqrt((float) hp_.hidden));
        const int pad   = hp_.ffn_kernel / 2;
        for (int il = 0; il < hp_.n_layers; ++il) {
            const std::string l = std::to_string(il);
            x                   = layer_norm(g, ggml_add(g, x, attention(c, g, x, il, n, kq_mask)),
                                              c.w("enc_p.encoder.norm_layers_1." + l + ".gamma"),
                                              c.w("enc_p.encoder.norm_layers_1." + l + ".beta"), 1e-5f);
            const std::string f = "enc_p.encoder.ffn_layers." + l + ".";
            ggml_tensor *     y = c.conv(g, masked(g, x, mask), f + "conv_1", 1, pad);
            y                   = c.conv(g, masked(g, ggml_relu(g, y), mask), f + "conv_2", 1, pad);
            x                   = layer_norm(g, ggml_add(g, x, y), c.w("enc_p.encoder.norm_layers_2." + l + ".gamma"),
                                              c.w("enc_p.encoder.norm_layers_2." + l + ".beta"), 1e-5f);
        }
        ggml_set_name(x, "enc_hidden");
        ggml_set_output(x);
        ggml_tensor * stats =
            conv1d(c.graph_opts(), g, x, c.w("enc_p.proj.weight"), c.w("enc_p.proj.bias"), 1, 0);  // [2*inter, T]
        ggml_tensor * m    = channels(g, stats, 0, hp_.inter);
        ggml_tensor * logs = channels(g, stats, hp_.inter, hp_.inter);
        ggml_set_name(m, "m_p");
        ggml_set_name(logs, "logs_p");
        ggml_set_output(m);
        ggml_set_output(logs);
        ggml_build_forward_expand(gf, x);
        ggml_build_forward_expand(gf, m);
        ggml_build_forward_expand(gf, logs);
        return std::vector<ggml_tensor *>{ tokens, mask, kq_mask, x, m, logs };
    });
    set_input(c, sg.t[0], ids);
    if (packed) {
        set_input(c, sg.t[1], pk.mask());
        set_input(c, sg.t[2], pk.key_mask());
    }
    c.compute(sg);
    hidden = get_output<float>(sg.t[3]);
    m_p    = get_output<float>(sg.t[4]);
    logs_p = get_output<float>(sg.t[5]);
}

}  // namespace vs::piper
