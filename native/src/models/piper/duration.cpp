// Piper's stochastic duration predictor, run in reverse (a rational-quadratic spline's inverse).
#include "piper.h"

namespace vs::piper {

ggml_tensor * piper_voice::dds_conv(vs_context & c, ggml_context * g, ggml_tensor * x, ggml_tensor * cond,
                                    const std::string & prefix, ggml_tensor * mask) const {
    if (cond) {
        x = ggml_add(g, x, cond);
    }
    int dilation = 1;
    for (int i = 0; i < hp_.dp_layers; ++i, dilation *= hp_.dp_kernel) {
        const std::string l   = std::to_string(i);
        const int         pad = (hp_.dp_kernel * dilation - dilation) / 2;
        ggml_tensor *     y   = conv1d_depthwise(g, masked(g, x, mask), c.w(prefix + "convs_sep." + l + ".weight"),
                                                 c.w(prefix + "convs_sep." + l + ".bias"), dilation, pad);
        y                     = ggml_gelu_erf(g, layer_norm(g, y, c.w(prefix + "norms_1." + l + ".gamma"),
                                                            c.w(prefix + "norms_1." + l + ".beta"), 1e-5f));
        y                     = conv1d(c.graph_opts(), g, y, c.w(prefix + "convs_1x1." + l + ".weight"),
                                       c.w(prefix + "convs_1x1." + l + ".bias"), 1, 0);
        y                     = ggml_gelu_erf(g, layer_norm(g, y, c.w(prefix + "norms_2." + l + ".gamma"),
                                                            c.w(prefix + "norms_2." + l + ".beta"), 1e-5f));
        x                     = ggml_add(g, x, y);
    }
    return x;
}

// Inverse of the piecewise rational-quadratic spline with linear tails
// (Durkan et al. 2019), elementwise over time. x: [1, T]; h: [3*bins-1, T].
ggml_tensor * piper_voice::spline_inverse(ggml_context * g, ggml_tensor * x, ggml_tensor * h,
                                          const spline_consts & k) const {
    const int   bins = hp_.dp_bins;
    const float B = hp_.dp_tail_bound, min_w = 1e-3f, min_h = 1e-3f, min_d = 1e-3f;
    const float inv_sqrt = 1.0f / std::sqrt((float) hp_.hidden);

    auto knots = [&](ggml_tensor * logits, float min_bin) {  // softmax bins -> knot positions [bins+1, T]
        ggml_tensor * p = ggml_soft_max(g, ggml_scale(g, logits, inv_sqrt));
        p               = ggml_scale_bias(g, p, 1.0f - min_bin * bins, min_bin);
        return ggml_scale_bias(g, ggml_mul_mat(g, k.cumsum, p), 2.0f * B, -B);
    };
    ggml_tensor * cumw    = knots(channels(g, h, 0, bins), min_w);
    ggml_tensor * cumh    = knots(channels(g, h, bins, bins), min_h);
    ggml_tensor * widths  = ggml_mul_mat(g, k.diff, cumw);  // [bins, T]
    ggml_tensor * heights = ggml_mul_mat(g, k.diff, cumh);
    // Interior derivatives from the network; both ends fixed at 1 (linear tails).
    ggml_tensor * deriv = ggml_scale_bias(g, ggml_softplus(g, channels(g, h, 2 * bins, bins - 1)), 1.0f, min_d);
    deriv               = ggml_add(g, ggml_pad_ext(g, deriv, 1, 1, 0, 0, 0, 0, 0, 0), k.ends);  // [bins+1, T]
    ggml_tensor * delta = ggml_div(g, heights, widths);

    // Bin of each input: one-hot [bins, T] from "x >= knot" steps (searchsorted).
    ggml_tensor * xc = ggml_clamp(g, x, -B + 1e-4f, B - 1e-4f);
    // searchsorted nudges the last knot up by 1e-6 so that x == B lands in the last bin.
    ggml_tensor * ge =
        step_above_zero(g, ggml_neg(g, ggml_add(g, ggml_sub(g, cumh, xc), ggml_scale(g, k.last, 1e-6f))));
    ggml_tensor * onehot = ggml_neg(g, ggml_mul_mat(g, k.diff, ge));
    auto          pick   = [&](ggml_tensor * v) { return ggml_sum_rows(g, ggml_mul(g, onehot, v)); };  // [1, T]

    ggml_tensor * in_cumw  = pick(channels(g, cumw, 0, bins));
    ggml_tensor * in_cumh  = pick(channels(g, cumh, 0, bins));
    ggml_tensor * in_w     = pick(widths);
    ggml_tensor * in_h     = pick(heights);
    ggml_tensor * in_delta = pick(delta);
    ggml_tensor * in_d0    = pick(channels(g, deriv, 0, bins));
    ggml_tensor * in_d1    = pick(channels(g, deriv, 1, bins));

    ggml_tensor * xm   = ggml_sub(g, xc, in_cumh);
    ggml_tensor * s    = ggml_sub(g, ggml_add(g, in_d0, in_d1), ggml_scale(g, in_delta, 2.0f));
    ggml_tensor * a    = ggml_add(g, ggml_mul(g, xm, s), ggml_mul(g, in_h, ggml_sub(g, in_delta, in_d0)));
    ggml_tensor * b    = ggml_sub(g, ggml_mul(g, in_h, in_d0), ggml_mul(g, xm, s));
    ggml_tensor * cc   = ggml_neg(g, ggml_mul(g, in_delta, xm));
    ggml_tensor * disc = ggml_relu(g, ggml_sub(g, ggml_sqr(g, b), ggml_scale(g, ggml_mul(g, a, cc), 4.0f)));
    ggml_tensor * root = ggml_div(g, ggml_scale(g, cc, 2.0f), ggml_sub(g, ggml_neg(g, b), ggml_sqrt(g, disc)));
    ggml_tensor * y    = ggml_add(g, ggml_mul(g, root, in_w), in_cumw);

    // Identity outside [-B, B].
    ggml_tensor * inside = ggml_mul(g, step_above_zero(g, ggml_scale_bias(g, x, 1.0f, B)),
                                    step_above_zero(g, ggml_scale_bias(g, x, -1.0f, B)));
    return ggml_add(g, x, ggml_mul(g, inside, ggml_sub(g, y, x)));
}

spline_consts piper_voice::spline_constants(vs_context & c) const {
    const int64_t bins = hp_.dp_bins;
    auto f32 = [&](const char * name, int64_t ne0, int64_t ne1, const std::function<float(int64_t, int64_t)> & v) {
        return c.derived_tensor(std::string("spline ") + name, GGML_TYPE_F32, { ne0, ne1, 1, 1 }, [&](uint8_t * out) {
            auto * dst = reinterpret_cast<float *>(out);
            for (int64_t r = 0; r < ne1; ++r) {
                for (int64_t i = 0; i < ne0; ++i) {
                    dst[r * ne0 + i] = v(i, r);
                }
            }
        });
    };
    spline_consts k{};
    k.cumsum = f32("cumsum", bins, bins + 1, [](int64_t i, int64_t j) { return i < j ? 1.0f : 0.0f; });
    k.diff   = f32("diff", bins + 1, bins, [](int64_t j, int64_t i) {
        return j == i ? -1.0f : j == i + 1 ? 1.0f : 0.0f;
    });
    k.ends   = f32("ends", bins + 1, 1, [&](int64_t j, int64_t) { return j == 0 || j == bins ? 1.0f : 0.0f; });
    k.last   = f32("last", bins + 1, 1, [&](int64_t j, int64_t) { return j == bins ? 1.0f : 0.0f; });
    return k;
}

std::vector<float> piper_voice::run_duration(vs_context & c, const std::vector<float> & hidden, const packing & pk,
                                             const std::vector<float> & noise) {
    const int64_t     T      = pk.total;
    const bool        packed = pk.packed();
    const std::string key    = "duration " + std::to_string(T) + (packed ? " packed" : "");
    vs::stage_graph & sg     = c.stage_graph(VS_STAGE_DURATION, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * mask = packed ? new_input(g, GGML_TYPE_F32, 1, T) : nullptr;
        ggml_tensor * x_in = new_input(g, GGML_TYPE_F32, hp_.hidden, T);
        ggml_set_name(x_in, "enc_hidden");
        ggml_tensor * z_in = new_input(g, GGML_TYPE_F32, T, 2);  // noise, one row per channel
        ggml_set_name(z_in, "dp_noise");
        const spline_consts k = spline_constants(c);

        ggml_tensor * cond = conv1d(c.graph_opts(), g, x_in, c.w("dp.pre.weight"), c.w("dp.pre.bias"), 1, 0);
        cond               = dds_conv(c, g, cond, nullptr, "dp.convs.", mask);
        cond               = conv1d(c.graph_opts(), g, cond, c.w("dp.proj.weight"), c.w("dp.proj.bias"), 1, 0);

        // z0, z1: [1, T] each.
        ggml_tensor * z0 = ggml_cont(g, ggml_view_2d(g, z_in, 1, T, ggml_element_size(z_in), 0));
        ggml_tensor * z1 = ggml_cont(g, ggml_view_2d(g, z_in, 1, T, ggml_element_size(z_in), z_in->nb[1]));
        // Reverse order: each ConvFlow, then the Flip that precedes it in the forward list.
        for (auto it = hp_.dp_flow_ids.rbegin(); it != hp_.dp_flow_ids.rend(); ++it) {
            const std::string f = "dp.flows." + std::to_string(*it) + ".";
            ggml_tensor *     h = conv1d(c.graph_opts(), g, z0, c.w(f + "pre.weight"), c.w(f + "pre.bias"), 1, 0);
            h                   = dds_conv(c, g, h, cond, f + "convs.", mask);
            h  = conv1d(c.graph_opts(), g, h, c.w(f + "proj.weight"), c.w(f + "proj.bias"), 1, 0);  // [3*bins-1, T]
            z1 = spline_inverse(g, z1, h, k);
            std::swap(z0, z1);
        }
        // ElementwiseAffine in reverse: (z - m) * exp(-logs), first channel only.
        ggml_tensor * m0   = ggml_view_1d(g, c.w("dp.flows.0.m"), 1, 0);
        ggml_tensor * s0   = ggml_view_1d(g, c.w("dp.flows.0.exp_neg_logs"), 1, 0);
        ggml_tensor * logw = ggml_mul(g, ggml_sub(g, z0, m0), s0);
        ggml_set_name(logw, "logw");
        ggml_set_output(logw);
        ggml_build_forward_expand(gf, logw);
        return std::vector<ggml_tensor *>{ mask, x_in, z_in, logw };
    });
    if (packed) {
        set_input(c, sg.t[0], pk.mask());
    }
    set_input(c, sg.t[1], hidden);
    set_input(c, sg.t[2], noise);
    c.compute(sg);
    return get_output<float>(sg.t[3]);
}

}  // namespace vs::piper
