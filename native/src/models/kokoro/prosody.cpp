// Kokoro-82M's prosody predictor: F0 and energy (N) from the aligned duration encoding.
#include "kokoro.h"

namespace vs::kokoro {

void kokoro_voice::run_prosody(vs_context & c, std::vector<kokoro_job> & jobs) const {
    // The shared LSTM over each frame's token's d (the alignment's product, one token a frame).
    std::vector<const act *>                  xs;
    std::vector<const std::vector<int32_t> *> rows;
    for (const kokoro_job & j : jobs) {
        xs.push_back(&j.d);
        rows.push_back(&j.frame_to_token);
    }
    lstm_device_out  kept;
    std::vector<act> shared = run_lstm(c, VS_STAGE_PROSODY, PRED + "shared", xs, rows, &kept);

    // F0 and N: one graph a job, or off the CPU the jobs packed. Where graphs are kept by
    // their shapes, a job alone is packed too (one segment, its frames rounded up to
    // shape_bucket's lengths: the added ones are a gap).
    std::vector<int64_t> frames;
    for (const act & x : shared) {
        frames.push_back(x.T);
    }
    const bool packs = runs_packed(c, jobs.size(), PRED);
    for (auto [first, last] : pack_groups(frames, packs, PACK_GAP, c.limits.max_tensor_bytes)) {
        const int64_t            B = (int64_t) (last - first);
        const int64_t            C = shared[first].C;
        std::vector<int64_t>     lens;
        std::vector<const act *> in;
        for (int64_t b = 0; b < B; ++b) {
            in.push_back(&shared[first + (size_t) b]);
            lens.push_back(in.back()->T);
        }
        const int64_t      L   = packed_length(c, lens, packs);
        const std::string  key = B * L > KEPT_MAX_FRAMES ? std::string()
                                                         : "prosody " + std::to_string(B) + "x" + std::to_string(L) +
                                                              (packs ? " packed" : "");
        vs::stage_graph &  sg  = c.stage_graph(VS_STAGE_PROSODY, key, [&](ggml_context * g, ggml_cgraph * gf) {
            ggml_tensor * xi = lstm_input_2d(g, C, B * L, "x");
            cond          k  = make_cond(g, 2 * B * L, B);
            use_style_table(c, g, k, PRED);
            packing pk, pk2;
            if (packs) {
                pack_cond(g, k, B, L, pk, pk2);
            }
            cond k_up                            = k;  // after block 1's upsampling
            k_up.pack                            = k.pack2;
            std::vector<ggml_tensor *> t         = { xi, k.s, k.ones, pk.mask, pk.inv_len, pk2.mask, pk2.inv_len };
            const char *               branch[2] = { "F0", "N" };
            for (int r = 0; r < 2; ++r) {
                ggml_tensor * y = xi;
                for (int i = 0; i < 3; ++i) {
                    y = adain_res_block(c, g, y, i < 2 ? k : k_up, PRED + branch[r] + "." + std::to_string(i) + ".",
                                          i == 1);
                    named(y, r == 0 ? "f0_block" : "n_block", i);  // [C, (i ? 2 : 1) B L]
                }
                y = named(conv1d(c.graph_opts(), g, y, c.w(PRED + branch[r] + "_proj.weight"),
                                   c.w(PRED + branch[r] + "_proj.bias"), 1, 0),
                            branch[r]);  // [1, 2 B L]
                ggml_set_output(y);
                ggml_build_forward_expand(gf, y);
                t.push_back(y);
            }
            return t;
        });
        std::vector<float> styles;
        for (int64_t b = 0; b < B; ++b) {
            const float * s = jobs[first + (size_t) b].style.data() + STYLE_DIM;
            styles.insert(styles.end(), s, s + STYLE_DIM);
        }
        fill_cond(c, sg.t[1], sg.t[2], styles.data());
        if (packs) {
            fill_packing(c, sg.t[3], sg.t[4], B, L, lens);
            fill_packing(c, sg.t[5], sg.t[6], B, 2 * L, lens, 2);
        }
        std::vector<lstm_dest> dests;
        for (int64_t b = 0; b < B; ++b) {
            dests.push_back({ first + (size_t) b, sg.t[0], b * L, L });
        }
        set_from_lstm(c, kept, shared, dests);
        c.compute(sg);
        const act f0 = read_act(sg.t[7]), n = read_act(sg.t[8]);
        for (int64_t b = 0; b < B; ++b) {
            jobs[first + (size_t) b].f0 = unpack_host(f0, 2 * L, b, 2 * lens[(size_t) b]).v;
            jobs[first + (size_t) b].n  = unpack_host(n, 2 * L, b, 2 * lens[(size_t) b]).v;
        }
    }
}

}  // namespace vs::kokoro
