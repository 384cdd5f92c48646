// Piper's residual-coupling flow, run in reverse (WaveNet layers).
#include "cpu/kernels.h"
#include "piper.h"

namespace vs::piper {

ggml_tensor * piper_voice::wavenet(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & prefix,
                                   ggml_tensor * mask) const {
    ggml_tensor * out      = nullptr;
    int           dilation = 1;
    for (int i = 0; i < hp_.wn_layers; ++i, dilation *= hp_.wn_dilation_rate) {
        const std::string l    = std::to_string(i);
        const int         pad  = (hp_.wn_kernel * dilation - dilation) / 2;
        ggml_tensor *     x_in = c.conv(g, masked(g, x, mask), prefix + "in_layers." + l, dilation, pad);  // [2H, T]
        // The gate: tanh of the first half times the sigmoid of the second; in ggml's ops each
        // over all of x_in (unary ops take contiguous inputs) and multiplied as views.
        const size_t  half = hp_.hidden * x_in->nb[0];
        ggml_tensor * acts =
            c.cpu_kernels
                ? cpu::gate(g, x_in)
                : ggml_mul(g, ggml_view_2d(g, ggml_tanh(g, x_in), hp_.hidden, x_in->ne[1], x_in->nb[1], 0),
                           ggml_view_2d(g, ggml_sigmoid(g, x_in), hp_.hidden, x_in->ne[1], x_in->nb[1], half));
        ggml_tensor * rs = c.conv(g, acts, prefix + "res_skip_layers." + l, 1, 0);
        if (i < hp_.wn_layers - 1) {
            // The residual half and the skip half, read as views.
            x                  = ggml_add(g, x, ggml_view_2d(g, rs, hp_.hidden, rs->ne[1], rs->nb[1], 0));
            ggml_tensor * skip = ggml_view_2d(g, rs, hp_.hidden, rs->ne[1], rs->nb[1], half);
            out                = out ? ggml_add(g, out, skip) : skip;
        } else {
            out = out ? ggml_add(g, out, rs) : rs;
        }
    }
    return out;
}

std::vector<float> piper_voice::run_flow(vs_context & c, const std::vector<float> & m_p,
                                         const std::vector<float> & logs_p, const std::vector<int32_t> & frame_to_token,
                                         const std::vector<noise_span> & noise, float noise_scale, int64_t T,
                                         const packing & pk) {
    const int64_t     F = (int64_t) frame_to_token.size(), C = hp_.inter, half = C / 2;
    const bool        packed = pk.packed();
    const std::string key = "flow " + std::to_string(T) + " " + std::to_string(F) + " " + std::to_string(noise_scale) +
                            (packed ? " packed" : "");
    vs::stage_graph & sg = c.stage_graph(VS_STAGE_FLOW, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * mask    = packed ? new_input(g, GGML_TYPE_F32, 1, F) : nullptr;
        ggml_tensor * m_in    = new_input(g, GGML_TYPE_F32, C, T);
        ggml_tensor * logs_in = new_input(g, GGML_TYPE_F32, C, T);
        ggml_tensor * frames  = new_input(g, GGML_TYPE_I32, F);
        ggml_tensor * eps     = new_input(g, GGML_TYPE_F32, C, F);
        // Length regulation: each token's statistics repeated over its frames.
        ggml_tensor * m    = ggml_get_rows(g, m_in, frames);     // [C, F]
        ggml_tensor * logs = ggml_get_rows(g, logs_in, frames);  // [C, F]
        ggml_tensor * z    = ggml_add(g, m, ggml_mul(g, eps, ggml_scale(g, ggml_exp(g, logs), noise_scale)));
        ggml_set_name(z, "z_p");

        // Each coupling layer runs after a flip of the channels. The flips are not made: z
        // holds the channels in reverse order after an odd number of them, and there a
        // coupling layer reads its input half (the first half of the flipped channels) as
        // z's second half and writes its output half as z's first, with pre's input channels
        // and post's output channels reversed to match.
        bool reversed = false;
        for (auto it = hp_.flow_ids.rbegin(); it != hp_.flow_ids.rend(); ++it) {
            const std::string f = "flow.flows." + std::to_string(*it) + ".";
            reversed            = !reversed;
            const size_t  nb1   = z->nb[1];
            ggml_tensor * lo    = ggml_view_2d(g, z, half, F, nb1, 0);
            ggml_tensor * hi    = ggml_view_2d(g, z, half, F, nb1, half * z->nb[0]);
            ggml_tensor * h     = conv1d(c.graph_opts(), g, ggml_cont(g, reversed ? hi : lo),
                                     reversed ? c.reversed_weight(f + "pre.weight", 0) : c.w(f + "pre.weight"),
                                         c.w(f + "pre.bias"), 1, 0);
            h                   = wavenet(c, g, h, f + "enc.", mask);
            ggml_tensor * mean  = reversed
                                      ? conv1d(c.graph_opts(), g, h, c.reversed_weight(f + "post.weight", 2),
                                               c.reversed_weight(f + "post.bias", 0), 1, 0)
                                      : conv1d(c.graph_opts(), g, h, c.w(f + "post.weight"), c.w(f + "post.bias"), 1, 0);
            z = reversed ? ggml_concat(g, ggml_sub(g, lo, mean), hi, 0) : ggml_concat(g, lo, ggml_sub(g, hi, mean), 0);
        }
        if (reversed) {  // an odd number of coupling layers: the last flip made
            ggml_tensor * rev =
                c.derived_tensor("channels reversed", GGML_TYPE_I32, { C, 1, 1, 1 }, [&](uint8_t * out) {
                    for (int64_t i = 0; i < C; ++i) {
                        reinterpret_cast<int32_t *>(out)[i] = (int32_t) (C - 1 - i);
                    }
                });
            z = flip_channels(g, z, rev);
        }
        ggml_set_name(z, "z");
        ggml_set_output(z);
        ggml_build_forward_expand(gf, z);
        return std::vector<ggml_tensor *>{ mask, m_in, logs_in, frames, eps, z };
    });
    if (packed) {
        set_input(c, sg.t[0], pk.mask());
    }
    set_input(c, sg.t[1], m_p);
    set_input(c, sg.t[2], logs_p);
    set_input(c, sg.t[3], frame_to_token);
    // The noise, zeros elsewhere: on a CUDA device drawn where the graph reads it (on the
    // host it was most of a batch's flow stage).
    ggml_tensor * eps = sg.t[4];
    if (c.cuda_device >= 0 && in_device_memory(c, eps)) {
        vs::cuda::clear(c.cuda_device, eps->data, ggml_nbytes(eps));
        for (const noise_span & sp : noise) {
            vs::cuda::gaussian(c.cuda_device, sp.key, static_cast<float *>(eps->data) + sp.at, sp.n, 1.0f);
        }
    } else {
        std::vector<float> v((size_t) ggml_nelements(eps), 0.0f);
        for (const noise_span & sp : noise) {
            gaussian_fill(sp.key, v.data() + sp.at, (size_t) sp.n, 1.0f, c.n_threads);
        }
        set_input(c, eps, v);
    }
    c.compute(sg);
    return get_output<float>(sg.t[5]);
}

}  // namespace vs::piper
