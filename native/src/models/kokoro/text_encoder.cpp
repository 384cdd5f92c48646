// Kokoro-82M's text encoder: embedding, convolutions and a bi-LSTM.
#include "kokoro.h"

namespace vs::kokoro {

void kokoro_voice::run_text_encoder(vs_context & c, std::vector<kokoro_job> & jobs) const {
    // Every job's convolutions as one: their tokens side by side in segments of L frames (see
    // token_segments), zeroed outside each job's tokens after every layer (a mask), so that
    // each job's convolutions read the zeros they read alone. Where the LSTM is one kernel
    // call, its projections graph computes them itself (lstm_graph_input): one graph, and
    // they stay on the device.
    const int64_t       B     = (int64_t) jobs.size();
    const ggml_tensor * w_ih  = model_.tensor(TEXT + "lstm.weight_ih");
    int64_t             T_max = 0, pad = 0;
    for (const auto & j : jobs) {
        T_max = std::max(T_max, (int64_t) j.tokens.size());
    }
    for (int i = 0; i < 3; ++i) {
        pad = std::max(pad, (model_.tensor(TEXT + "cnn." + std::to_string(i) + ".0.weight")->ne[1] - 1) / 2);
    }
    std::string   key      = "text_encoder";
    const int64_t L        = token_segments(c, jobs, pad, key);
    const bool    masked   = B > 1 || c.rounds_shapes();  // else L is the job's own length
    const bool    in_graph = c.fused_lstm(c.w(TEXT + "lstm.weight_hh"), w_ih->ne[1] / 4) && T_max <= LSTM_CHUNK_FUSED;
    // The convolutions; their ids, mask (or null) and output appended to t.
    auto convs_of = [&](ggml_context * g, ggml_cgraph * gf, std::vector<ggml_tensor *> & t) {
        ggml_tensor * ids = ggml_new_tensor_1d(g, GGML_TYPE_I32, B * L);
        ggml_set_input(ids);
        ggml_tensor * mask = masked ? input_2d(g, 1, B * L, "mask") : nullptr;
        auto          mk   = [&](ggml_tensor * x) { return mask ? ggml_mul(g, x, mask) : x; };
        ggml_tensor * x    = mk(ggml_get_rows(g, c.w(TEXT + "embedding.weight"), ids));  // [512, B L]
        for (int i = 0; i < 3; ++i) {
            const std::string l = TEXT + "cnn." + std::to_string(i) + ".";
            ggml_tensor *     w = c.w(l + "0.weight");
            x                   = conv1d(c.graph_opts(), g, x, w, c.w(l + "0.bias"), 1, (int) (w->ne[1] - 1) / 2);
            x                   = layer_norm(g, x, c.w(l + "1.gamma"), c.w(l + "1.beta"), 1e-5f);
            x                   = named(mk(ggml_leaky_relu(g, x, 0.2f, false)), "text_enc_cnn", i);  // [512, B L]
        }
        ggml_set_output(x);
        ggml_build_forward_expand(gf, x);
        t.insert(t.end(), { ids, mask, x });
    };
    auto fill = [&](const std::vector<ggml_tensor *> & t) {
        std::vector<int32_t> ids((size_t) (B * L), 0);
        std::vector<float>   mask((size_t) (B * L), 0.0f);
        for (int64_t b = 0; b < B; ++b) {
            const std::vector<int32_t> & tok = jobs[(size_t) b].tokens;
            std::copy(tok.begin(), tok.end(), ids.begin() + b * L);
            std::fill_n(mask.begin() + b * L, tok.size(), 1.0f);
        }
        set_input(c, t[0], ids.data());
        if (t[1]) {
            set_input(c, t[1], mask.data());
        }
    };
    std::vector<act>         convs;
    std::vector<const act *> xs;
    lstm_graph_input         gin;
    if (in_graph) {
        gin.key = key;
        gin.lay_out(std::vector<int64_t>((size_t) B, L));
        for (const auto & j : jobs) {
            convs.push_back({ {}, w_ih->ne[0], (int64_t) j.tokens.size() });  // their shapes
        }
        gin.build = [&](ggml_context * g, ggml_cgraph * gf, std::vector<ggml_tensor *> & t) {
            convs_of(g, gf, t);
            return lstm_graph_input::join(g, { t[2] });
        };
        gin.fill = fill;
    } else {
        vs::stage_graph & sg = c.stage_graph(VS_STAGE_TEXT_ENCODER, key, [&](ggml_context * g, ggml_cgraph * gf) {
            std::vector<ggml_tensor *> t;
            convs_of(g, gf, t);
            return t;
        });
        fill(sg.t);
        c.compute(sg);
        const act x = read_act(sg.t[2]);
        for (int64_t b = 0; b < B; ++b) {
            convs.push_back(unpack_host(x, L, b, (int64_t) jobs[(size_t) b].tokens.size()));
        }
    }
    for (const auto & x : convs) {
        xs.push_back(&x);
    }
    std::vector<act> t_en =
        run_lstm(c, VS_STAGE_TEXT_ENCODER, TEXT + "lstm", xs, {}, nullptr, in_graph ? &gin : nullptr);
    for (size_t b = 0; b < jobs.size(); ++b) {
        jobs[b].t_en = std::move(t_en[b]);
    }
}

}  // namespace vs::kokoro
