// Kokoro-82M's PL-BERT (ALBERT) and its projection to the duration encoder's input.
#include "kokoro.h"

namespace vs::kokoro {

// ---------------------------------------------------------------- stages

void kokoro_voice::run_bert(vs_context & c, std::vector<kokoro_job> & jobs) const {
    // Off the CPU (where a stage's cost is its kernel launches), jobs share a graph: their
    // tokens concatenated, attention kept within each job by a block-diagonal mask, up to
    // BERT_BATCH_TOKENS tokens (the scores are quadratic in them). On the CPU, a job a graph.
    const bool on_cpu = !c.device_graphs;
    for (size_t first = 0; first < jobs.size();) {
        size_t  last  = first + 1;
        int64_t total = (int64_t) jobs[first].tokens.size();
        while (!on_cpu && last < jobs.size() && total + (int64_t) jobs[last].tokens.size() <= BERT_BATCH_TOKENS) {
            total += (int64_t) jobs[last++].tokens.size();
        }
        run_bert_group(c, jobs, first, last);
        first = last;
    }
}

void kokoro_voice::qkv_weights(vs_context & c, ggml_tensor *& w, ggml_tensor *& b) const {
    const char *       parts[3] = { "query", "key", "value" };
    const ggml_tensor *ws[3], *bs[3];
    for (int i = 0; i < 3; ++i) {
        ws[i] = model_.tensor(LAYER + "attention." + parts[i] + ".weight");
        bs[i] = model_.tensor(LAYER + "attention." + parts[i] + ".bias");
        if (ws[i]->type != ws[0]->type || !ggml_are_same_shape(ws[i], ws[0]) || bs[i]->type != GGML_TYPE_F32) {
            w = b = nullptr;
            return;
        }
    }
    const int64_t in = ws[0]->ne[0], out = ws[0]->ne[1];
    w = c.derived_tensor(LAYER + "attention.qkv.weight", ws[0]->type, { in, 3 * out, 1, 1 }, [&](uint8_t * dst) {
        for (const ggml_tensor * t : ws) {
            std::memcpy(dst, t->data, ggml_nbytes(t));
            dst += ggml_nbytes(t);
        }
    });
    b = c.derived_tensor(LAYER + "attention.qkv.bias", GGML_TYPE_F32, { 3 * out, 1, 1, 1 }, [&](uint8_t * dst) {
        for (const ggml_tensor * t : bs) {
            std::memcpy(dst, t->data, ggml_nbytes(t));
            dst += ggml_nbytes(t);
        }
    });
}

void kokoro_voice::run_bert_group(vs_context & c, std::vector<kokoro_job> & jobs, size_t first, size_t last) const {
    std::vector<int32_t> ids, pos;
    std::vector<float>   styles;
    for (size_t b = first; b < last; ++b) {
        const auto & t = jobs[b].tokens;
        ids.insert(ids.end(), t.begin(), t.end());
        for (size_t i = 0; i < t.size(); ++i) {
            pos.push_back((int32_t) i);
            const float * s = jobs[b].style.data() + STYLE_DIM;  // the prosody half
            styles.insert(styles.end(), s, s + STYLE_DIM);
        }
    }
    const int64_t T = (int64_t) ids.size(), Hd = hp_.bert_hidden, nh = Hd / BERT_HEAD_DIM;
    // Where graphs are kept by their shapes (on CUDA), the tokens are rounded up to
    // shape_bucket's lengths: the added ones, padding tokens each attending only to itself,
    // change no job's tokens (BERT mixes tokens only in its masked attention).
    const int64_t Tg     = c.rounds_shapes() ? shape_bucket(T) : T;
    const bool    masked = last - first > 1 || Tg > T;
    ids.resize((size_t) Tg, 0);
    pos.resize((size_t) Tg, 0);
    styles.resize((size_t) (Tg * STYLE_DIM), 0.0f);
    // On a CUDA device, more than one job: the attention job by job, each padded to the
    // longest's La tokens (the scores B La^2, not T^2 with most of them masked): the
    // projections' columns gathered into [3 Hd, La, B], the outputs gathered back.
    const int64_t B  = (int64_t) (last - first);
    int64_t       La = 0;
    for (size_t b = first; b < last; ++b) {
        La = std::max<int64_t>(La, (int64_t) jobs[b].tokens.size());
    }
    La                       = c.rounds_shapes() ? shape_bucket(La) : La;
    const bool        by_job = B > 1 && c.cuda_device >= 0;
    const std::string key    = "bert " + std::to_string(Tg) + (masked ? " masked" : "") +
                            (by_job ? " by job " + std::to_string(B) + "x" + std::to_string(La) : "");
    vs::stage_graph & sg = c.stage_graph(VS_STAGE_BERT, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * idt = ggml_new_tensor_1d(g, GGML_TYPE_I32, Tg);
        ggml_tensor * pst = ggml_new_tensor_1d(g, GGML_TYPE_I32, Tg);
        ggml_tensor * sty = input_2d(g, STYLE_DIM, Tg, "styles");  // each token's job's style
        ggml_tensor * msk = nullptr, *gather = nullptr, *scatter = nullptr;
        if (by_job) {  // the keys past each job's tokens masked; its columns' places and back
            msk = ggml_new_tensor_4d(g, GGML_TYPE_F32, La, La, 1, B);
            ggml_set_input(msk);
            gather  = ggml_new_tensor_1d(g, GGML_TYPE_I32, La * B);
            scatter = ggml_new_tensor_1d(g, GGML_TYPE_I32, Tg);
            ggml_set_input(gather);
            ggml_set_input(scatter);
        } else if (masked) {
            msk = input_2d(g, Tg, Tg, "mask");
        }
        ggml_set_input(idt);
        ggml_set_input(pst);

        ggml_tensor * typ = c.w(BERT + "embeddings.token_type_embeddings.weight");
        ggml_tensor * x   = ggml_get_rows(g, c.w(BERT + "embeddings.word_embeddings.weight"), idt);  // [128, T]
        x                 = ggml_add(g, x, ggml_get_rows(g, c.w(BERT + "embeddings.position_embeddings.weight"), pst));
        x                 = ggml_add(g, x, ggml_view_1d(g, typ, typ->ne[0], 0));
        x = layer_norm(g, x, c.w(BERT + "embeddings.LayerNorm.weight"), c.w(BERT + "embeddings.LayerNorm.bias"),
                       1e-12f);
        x = named(linear(c, g, x, BERT + "embedding_hidden_mapping_in"), "bert_embd");  // [768, T]

        // Off the CPU, the query, key and value projections as one matmul (their weights
        // concatenated once).
        ggml_tensor *qkv_w = nullptr, *qkv_b = nullptr;
        if (c.device_graphs) {
            qkv_weights(c, qkv_w, qkv_b);
        }
        const graph_options gelu_on{ ggml_backend_dev_type(c.dev) == GGML_BACKEND_DEVICE_TYPE_CPU, c.limits };
        for (int il = 0; il < hp_.n_bert_layers; ++il) {
            // q, k, v [d, h, S, n]: n groups of S tokens attending within their group (by job:
            // a job's columns gathered; else all tokens, masked as `msk` says).
            const int64_t S = by_job ? La : Tg, n = by_job ? B : 1;
            ggml_tensor * q, *k, *v;
            if (qkv_w) {
                ggml_tensor * qkv = ggml_add(g, ggml_mul_mat(g, qkv_w, x), qkv_b);  // [3 * Hd, T]
                if (by_job) {
                    qkv = ggml_get_rows(g, qkv, gather);  // [3 * Hd, La * B]
                }
                auto part = [&](int i) {
                    return ggml_view_4d(g, qkv, BERT_HEAD_DIM, nh, S, n, BERT_HEAD_DIM * sizeof(float), qkv->nb[1],
                                        S * qkv->nb[1], i * Hd * sizeof(float));
                };
                q = part(0);
                k = part(1);
                v = part(2);
            } else {
                q = ggml_reshape_4d(g, linear(c, g, x, LAYER + "attention.query"), BERT_HEAD_DIM, nh, S, n);
                k = ggml_reshape_4d(g, linear(c, g, x, LAYER + "attention.key"), BERT_HEAD_DIM, nh, S, n);
                v = ggml_reshape_4d(g, linear(c, g, x, LAYER + "attention.value"), BERT_HEAD_DIM, nh, S, n);
            }
            q                = ggml_permute(g, q, 0, 2, 1, 3);                // [d, S, h, n]
            k                = ggml_permute(g, k, 0, 2, 1, 3);                // [d, S, h, n]
            v                = ggml_cont(g, ggml_permute(g, v, 1, 2, 0, 3));  // [S, d, h, n]
            ggml_tensor * kq = ggml_mul_mat(g, k, q);                         // [Sk, Sq, h, n]
            kq = named(ggml_soft_max_ext(g, kq, msk, 1.0f / std::sqrt((float) BERT_HEAD_DIM), 0.0f), "bert_kq", il);
            ggml_tensor * o = ggml_mul_mat(g, v, kq);  // [d, Sq, h, n]
            o               = ggml_reshape_2d(g, ggml_cont(g, ggml_permute(g, o, 0, 2, 1, 3)), Hd, S * n);
            if (by_job) {
                o = ggml_get_rows(g, o, scatter);  // [Hd, Tg]
            }
            o = named(linear(c, g, o, LAYER + "attention.dense"), "bert_attn_out", il);  // [Hd, Tg]
            x = named(layer_norm(g, ggml_add(g, x, o), c.w(LAYER + "attention.LayerNorm.weight"),
                                 c.w(LAYER + "attention.LayerNorm.bias"), 1e-12f),
                      "bert_attn_norm", il);
            // FFN with the tanh GELU ("gelu_new").
            ggml_tensor * f = gelu_tanh(gelu_on, g, linear(c, g, x, LAYER + "ffn"));
            f               = named(linear(c, g, f, LAYER + "ffn_output"), "bert_ffn_out", il);
            x               = named(layer_norm(g, ggml_add(g, x, f), c.w(LAYER + "full_layer_layer_norm.weight"),
                                               c.w(LAYER + "full_layer_layer_norm.bias"), 1e-12f),
                                    "bert_layer", il);  // [768, Tg]
        }
        x                = named(linear(c, g, x, "bert_encoder"), "bert");  // [512, T]
        ggml_tensor * xs = named(ggml_concat(g, x, sty, 0), "d_in");        // [640, T]
        ggml_set_output(x);
        ggml_set_output(xs);
        ggml_build_forward_expand(gf, x);
        ggml_build_forward_expand(gf, xs);
        return std::vector<ggml_tensor *>{ idt, pst, sty, msk, x, xs, gather, scatter };
    });
    set_input(c, sg.t[0], ids.data());
    set_input(c, sg.t[1], pos.data());
    set_input(c, sg.t[2], styles.data());
    if (by_job) {  // job b's token l at column b La + l; a padding column reads its job's first
        std::vector<float>   m((size_t) (La * La * B), -INFINITY);
        std::vector<int32_t> ga((size_t) (La * B)), sc((size_t) Tg, 0);
        int64_t              t0 = 0;
        for (int64_t b = 0; b < B; ++b) {
            const int64_t n = (int64_t) jobs[first + (size_t) b].tokens.size();
            for (int64_t q = 0; q < La; ++q) {
                std::fill_n(m.begin() + (b * La + q) * La, n, 0.0f);
                ga[(size_t) (b * La + q)] = (int32_t) (t0 + (q < n ? q : 0));
            }
            for (int64_t l = 0; l < n; ++l) {
                sc[(size_t) (t0 + l)] = (int32_t) (b * La + l);
            }
            t0 += n;
        }
        set_input(c, sg.t[3], m.data());
        set_input(c, sg.t[6], ga.data());
        set_input(c, sg.t[7], sc.data());
    } else if (masked) {  // each job's tokens attend to that job's; each added token to itself
        std::vector<float> m((size_t) (Tg * Tg), -INFINITY);
        int64_t            t0 = 0;
        for (size_t b = first; b < last; ++b) {
            const int64_t n = (int64_t) jobs[b].tokens.size();
            for (int64_t q = t0; q < t0 + n; ++q) {
                std::fill_n(m.begin() + q * Tg + t0, n, 0.0f);
            }
            t0 += n;
        }
        for (int64_t q = T; q < Tg; ++q) {
            m[(size_t) (q * Tg + q)] = 0.0f;
        }
        set_input(c, sg.t[3], m.data());
    }
    c.compute(sg);
    const act d_en = read_act(sg.t[4]), d_in = read_act(sg.t[5]);
    int64_t   t0 = 0;
    for (size_t b = first; b < last; ++b) {
        const int64_t n     = (int64_t) jobs[b].tokens.size();
        auto          slice = [&](const act & a) {
            act out;
            out.C = a.C;
            out.T = n;
            out.v.assign(a.v.begin() + t0 * a.C, a.v.begin() + (t0 + n) * a.C);
            return out;
        };
        jobs[b].d_en = slice(d_en);
        jobs[b].d_in = slice(d_in);
        t0 += n;
    }
}

}  // namespace vs::kokoro
