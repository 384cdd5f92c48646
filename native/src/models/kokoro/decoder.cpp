// Kokoro-82M's decoder: AdaIN residual blocks on the aligned text encoding, F0 and N.
#include "kokoro.h"

namespace vs::kokoro {

void kokoro_voice::run_decoder(vs_context & c, const std::vector<kokoro_job *> & group, bool packs,
                               dec_handoff * handoff) const {
    // Packed (more than one job, or one where graphs are kept by their shapes): the tokens'
    // rows of every job in one table whose row `rows` is zeros, for the gaps' frames to read.
    const int64_t        B = (int64_t) group.size();
    std::vector<int64_t> lens;
    int64_t              rows = 0;
    for (const kokoro_job * j : group) {
        lens.push_back((int64_t) j->frame_to_token.size());
        rows += j->t_en.T;
    }
    const int64_t     L   = packed_length(c, lens, packs);
    const int64_t     R   = packs && c.rounds_shapes() ? shape_bucket(rows + 1) : rows + 1;  // the table's rows
    const int64_t     C   = group[0]->t_en.C;
    const std::string key = B * L > KEPT_MAX_FRAMES ? std::string()
                                                    : "decoder " + std::to_string(B) + "x" + std::to_string(L) + " " +
                                                          std::to_string(R) + (packs ? " packed" : "");
    vs::stage_graph & sg  = c.stage_graph(VS_STAGE_DECODER, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * te = input_2d(g, C, R, "t_en");
        ggml_tensor * fr = ggml_new_tensor_1d(g, GGML_TYPE_I32, B * L);
        ggml_tensor * fi = input_2d(g, 1, 2 * B * L, "f0");
        ggml_tensor * ni = input_2d(g, 1, 2 * B * L, "n");
        cond          k  = make_cond(g, 2 * B * L, B);
        use_style_table(c, g, k, DEC);
        ggml_set_input(fr);
        packing pk, pk2;
        if (packs) {
            pack_cond(g, k, B, L, pk, pk2);
        }

        ggml_tensor * asr = named(ggml_get_rows(g, te, fr), "asr");  // [512, B * L]: each token's frames
        ggml_tensor * f0d =
            named(conv1d_strided(c.graph_opts(), g, fi, c.w(DEC + "F0_conv.weight"), c.w(DEC + "F0_conv.bias"), 2, 1),
                   "f0_down");  // [1, B * L]
        ggml_tensor * nd =
            named(conv1d_strided(c.graph_opts(), g, ni, c.w(DEC + "N_conv.weight"), c.w(DEC + "N_conv.bias"), 2, 1),
                   "n_down");                                                                         // [1, B * L]
        ggml_tensor * x = ggml_concat(g, ggml_concat(g, asr, f0d, 0), nd, 0);                        // [514, B * L]
        x               = named(adain_res_block(c, g, x, k, DEC + "encode.", false), "dec_encode");  // [1024, B * L]
        ggml_tensor * res =
            conv1d(c.graph_opts(), g, asr, c.w(DEC + "asr_res.0.weight"), c.w(DEC + "asr_res.0.bias"), 1, 0);
        // The channels every decode block appends to its input, concatenated once.
        ggml_tensor * tail = ggml_concat(g, ggml_concat(g, res, f0d, 0), nd, 0);  // [66, B * L]
        for (int i = 0; i < 4; ++i) {
            x = ggml_concat(g, x, tail, 0);  // [1090, B * L]
            x = adain_res_block(c, g, x, k, DEC + "decode." + std::to_string(i) + ".", i == 3);
            named(x, "dec_decode", i);  // [1024 (512 after the last), B * L (twice after the last)]
        }
        named(x, "decoder");
        ggml_set_output(x);
        ggml_build_forward_expand(gf, x);
        return std::vector<ggml_tensor *>{ te, fr, fi, ni, k.s, k.ones, pk.mask, pk.inv_len, pk2.mask, pk2.inv_len, x };
    });

    std::vector<float>   tv((size_t) (C * R), 0.0f), f0v((size_t) (2 * B * L), 0.0f), nv(f0v.size(), 0.0f);
    std::vector<int32_t> frv((size_t) (B * L), (int32_t) rows);
    std::vector<float>   styles;
    int64_t              row = 0;
    for (int64_t b = 0; b < B; ++b) {
        const kokoro_job & j = *group[(size_t) b];
        std::copy(j.t_en.v.begin(), j.t_en.v.end(), tv.begin() + row * C);
        for (int64_t f = 0; f < lens[(size_t) b]; ++f) {
            frv[(size_t) (b * L + f)] = (int32_t) (row + j.frame_to_token[(size_t) f]);
        }
        std::copy(j.f0.begin(), j.f0.end(), f0v.begin() + 2 * b * L);
        std::copy(j.n.begin(), j.n.end(), nv.begin() + 2 * b * L);
        styles.insert(styles.end(), j.style.begin(), j.style.begin() + STYLE_DIM);
        row += j.t_en.T;
    }
    set_input(c, sg.t[0], tv.data());
    set_input(c, sg.t[1], frv.data());
    set_input(c, sg.t[2], f0v.data());
    set_input(c, sg.t[3], nv.data());
    fill_cond(c, sg.t[4], sg.t[5], styles.data());
    if (packs) {
        fill_packing(c, sg.t[6], sg.t[7], B, L, lens);
        fill_packing(c, sg.t[8], sg.t[9], B, 2 * L, lens, 2);
    }
    c.compute(sg);
    ggml_tensor * out = sg.t[10];
    if (handoff && in_device_memory(c, out)) {  // each job's frames copied on the device
        const int64_t C_out = out->ne[0];
        const size_t  bytes = sizeof(float) * (size_t) (C_out * handoff->frames);  // the same for every group
        auto *        base  = static_cast<uint8_t *>(c.device_handoff(bytes));
        for (int64_t b = 0; b < B; ++b) {
            kokoro_job & j   = *group[(size_t) b];
            const size_t len = sizeof(float) * (size_t) (C_out * 2 * lens[(size_t) b]);
            GGML_ASSERT(handoff->at + len <= bytes);
            j.dec    = { {}, C_out, 2 * lens[(size_t) b] };
            j.dec_at = (int64_t) handoff->at;
            vs::cuda::copy(c.cuda_device, base + handoff->at,
                           static_cast<const uint8_t *>(out->data) + sizeof(float) * (size_t) (2 * b * L * C_out), len);
            handoff->at += len;
        }
        return;  // the generator's graphs wait for the copies (vs_context::after_engine)
    }
    const act o = read_act(out);
    for (int64_t b = 0; b < B; ++b) {
        group[(size_t) b]->dec = unpack_host(o, 2 * L, b, 2 * lens[(size_t) b]);
    }
}

}  // namespace vs::kokoro
