// Kokoro-82M's duration encoder and predictor: frames per token.
#include "kokoro.h"

namespace vs::kokoro {

// Every job in the same graphs: the recurrences, the steps between them and the projection.
void kokoro_voice::run_duration(vs_context & c, std::vector<kokoro_job> & jobs, float speed) const {
    // The steps between recurrences are frame by frame: every job's in one graph, their
    // tokens side by side in segments of L frames (token_segments; the frames past a job's
    // tokens, zeros in, are dropped).
    const int64_t B = (int64_t) jobs.size();
    std::string   shapes;
    const int64_t L = token_segments(c, jobs, 0, shapes);
    // Each job's frames of a recurrence's output into its segment of graph input x [C, B L].
    auto set_lstm_input = [&](lstm_device_out & o, std::vector<act> & hs, ggml_tensor * x) {
        std::vector<lstm_dest> dests;
        for (int64_t b = 0; b < B; ++b) {
            dests.push_back({ (size_t) b, x, b * L, L });
        }
        set_from_lstm(c, o, hs, dests);
    };
    // Job b's frames of a graph's output [C, B L].
    auto job_frames = [&](ggml_tensor * y, const std::vector<act> & hs) {
        const act a = read_act(y);
        for (int64_t b = 0; b < B; ++b) {
            jobs[(size_t) b].d = unpack_host(a, L, b, hs[(size_t) b].T);
        }
    };
    // AdaLayerNorm (module `norm`) of x [C, B L], each segment's affine from its job's
    // style, then the style appended to each frame: d [C + 128, L, B]. Its x, styles, ones
    // and d appended to t.
    auto styled_ops = [&](ggml_context * g, ggml_cgraph * gf, const std::string & norm, int64_t C,
                          std::vector<ggml_tensor *> & t) {
        ggml_tensor * x = lstm_input_2d(g, C, B * L, "x");
        cond          k = make_cond(g, 1, B);
        // [2C, 1, B]: a matrix-vector product a job, the products of its sentence alone.
        ggml_tensor * h = linear(c, g, ggml_reshape_3d(g, k.s, k.s->ne[0], 1, B), norm);
        ggml_tensor * scale =
            ggml_scale_bias(g, ggml_cont(g, ggml_view_3d(g, h, C, 1, B, h->nb[1], h->nb[2], 0)), 1.0f, 1.0f);
        ggml_tensor * shift = ggml_view_3d(g, h, C, 1, B, h->nb[1], h->nb[2], C * ggml_element_size(h));
        ggml_tensor * n     = ggml_reshape_3d(g, ggml_norm(g, x, 1e-5f), C, L, B);
        ggml_tensor * y     = named(ggml_add(g, ggml_mul(g, n, scale), shift), "dur_ada_norm");  // [C, L, B]
        ggml_tensor * s     = ggml_repeat_4d(g, ggml_reshape_3d(g, k.s, k.s->ne[0], 1, B), k.s->ne[0], L, B, 1);
        ggml_tensor * d = named(ggml_concat(g, y, s, 0), "dur_enc");  // [C + 128, L, B] (an output, not a view of one)
        ggml_set_output(d);
        ggml_build_forward_expand(gf, d);
        t.insert(t.end(), { x, k.s, k.ones, d });
    };
    std::vector<float> styles;  // each job's prosody half
    for (const auto & j : jobs) {
        styles.insert(styles.end(), j.style.begin() + STYLE_DIM, j.style.begin() + 2 * STYLE_DIM);
    }
    // That of hs in a graph of its own -> jobs[b].d.
    auto styled = [&](std::vector<act> hs, lstm_device_out o, const std::string & norm) {
        const int64_t     C = hs[0].C;
        vs::stage_graph & sg =
            c.stage_graph(VS_STAGE_DURATION, "duration " + norm + shapes, [&](ggml_context * g, ggml_cgraph * gf) {
                std::vector<ggml_tensor *> t;
                styled_ops(g, gf, norm, C, t);
                return t;
            });
        fill_cond(c, sg.t[1], sg.t[2], styles.data());
        set_lstm_input(o, hs, sg.t[0]);
        c.compute(sg);
        job_frames(sg.t[3], hs);
    };
    auto inputs = [&]() {
        std::vector<const act *> xs;
        for (const auto & j : jobs) {
            xs.push_back(&j.d);
        }
        return xs;
    };
    // Where a recurrence's output stays on the device, the next one's projections graph
    // computes the AdaLayerNorm between them itself (styled_input): one graph, and d stays
    // on the device, but for the last layer's read back (the prosody's input).
    ggml_tensor * d_out        = nullptr;  // that graph's d
    auto          styled_input = [&](std::vector<act> & hs, lstm_device_out & o, const std::string & norm) {
        lstm_graph_input gin;
        gin.key = norm + shapes;
        gin.lay_out(std::vector<int64_t>((size_t) B, L));
        const int64_t C = hs[0].C;
        gin.build       = [&, C](ggml_context * g, ggml_cgraph * gf, std::vector<ggml_tensor *> & t) {
            styled_ops(g, gf, norm, C, t);
            return lstm_graph_input::join(g, { ggml_reshape_2d(g, t[3], t[3]->ne[0], B * L) });
        };
        gin.fill = [&](const std::vector<ggml_tensor *> & t) {
            fill_cond(c, t[1], t[2], styles.data());
            set_lstm_input(o, hs, t[0]);
            d_out = t[3];
        };
        return gin;
    };
    for (auto & j : jobs) {
        j.d = j.d_in;
    }
    const std::string base = PRED + "text_encoder.lstms.";
    lstm_device_out   o;
    std::vector<act>  hs = run_lstm(c, VS_STAGE_DURATION, base + "0", inputs(), {}, &o);
    for (int l = 0; l < 3; ++l) {
        const std::string norm   = base + std::to_string(2 * l + 1) + ".fc";
        const std::string next   = l < 2 ? base + std::to_string(2 * l + 2) : PRED + "lstm";
        const int64_t     H_next = model_.tensor(next + ".weight_ih")->ne[1] / 4;
        if (o.out && c.fused_lstm(c.w(next + ".weight_hh"), H_next)) {
            std::vector<act> shapes_in;  // d's shapes: the recurrence's output and the style
            for (const act & h : hs) {
                shapes_in.push_back({ {}, h.C + STYLE_DIM, h.T });
            }
            std::vector<const act *> ins;
            for (const act & a : shapes_in) {
                ins.push_back(&a);
            }
            const lstm_graph_input gin = styled_input(hs, o, norm);
            lstm_device_out        o2;
            std::vector<act>       hs2 = run_lstm(c, VS_STAGE_DURATION, next, ins, {}, &o2, &gin);
            if (l == 2) {  // d, read back from that graph
                job_frames(d_out, hs);
            }
            hs = std::move(hs2);
            o  = o2;
        } else {
            styled(std::move(hs), o, norm);
            o  = {};
            hs = run_lstm(c, VS_STAGE_DURATION, next, inputs(), {}, &o);
        }
    }
    vs::stage_graph & sg = c.stage_graph(
        VS_STAGE_DURATION, "duration projection" + shapes + " " + std::to_string(speed),
        [&](ggml_context * g, ggml_cgraph * gf) {
            ggml_tensor * x = lstm_input_2d(g, hs[0].C, B * L, "x");
            ggml_tensor * lg =
                named(linear(c, g, x, PRED + "duration_proj.linear_layer"), "duration_logits");  // [50, B L]
            ggml_tensor * du =
                named(ggml_scale(g, ggml_sum_rows(g, ggml_sigmoid(g, lg)), 1.0f / speed), "durations");  // [1, B L]
            for (ggml_tensor * y : { lg, du }) {
                ggml_set_output(y);
                ggml_build_forward_expand(gf, y);
            }
            return std::vector<ggml_tensor *>{ x, lg, du };
        });
    set_lstm_input(o, hs, sg.t[0]);
    c.compute(sg);
    const act lg = read_act(sg.t[1]), du = read_act(sg.t[2]);
    for (int64_t b = 0; b < B; ++b) {
        jobs[(size_t) b].logits = unpack_host(lg, L, b, hs[(size_t) b].T).v;
        jobs[(size_t) b].dur    = unpack_host(du, L, b, hs[(size_t) b].T).v;
    }
}

}  // namespace vs::kokoro
