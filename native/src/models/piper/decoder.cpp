// Piper's HiFi-GAN decoder as ggml graphs, in tiles with exact seams.
#include "cpu/kernels.h"
#include "piper.h"

namespace vs::piper {

std::vector<float> piper_voice::run_decoder(vs_context & c, const std::vector<float> & z, const packing & pk) {
    if (fused_decoder(c)) {
        return run_decoder_fused(c, z, pk);
    }
    const int64_t  F  = pk.total;
    auto           gb = c.new_graph();
    ggml_context * g  = gb.ctx.get();
    host_inputs    in;
    // Packed, each rate has its mask: 1 on the sentences' samples, 0 in the gaps and margins.
    auto mask_at = [&](int64_t rate, int64_t before, int64_t after) {
        return pk.packed() ? in.add(g, 1, before + F * rate + after, pk.mask(rate, before, after)) : nullptr;
    };

    ggml_tensor * z_in = ggml_new_tensor_2d(g, GGML_TYPE_F32, hp_.inter, F);
    ggml_set_name(z_in, "z");
    ggml_set_input(z_in);
    ggml_tensor * x     = conv1d(c.graph_opts(), g, z_in, c.w("dec.conv_pre.weight"), c.w("dec.conv_pre.bias"), 1,
                                 hp_.dec_kernel_pre / 2);
    x                   = masked(g, x, mask_at(1, 0, 0));
    const int n_kernels = (int) hp_.res_kernels.size();
    // Each stage keeps its signal between zero margins, so the residual blocks read their
    // padded input as views and add their output back in place: no per-convolution pad.
    const int64_t margin = std::max<int64_t>(widest_resblock_padding(), hp_.dec_kernel_post / 2);
    int64_t       T      = F;
    for (size_t i = 0; i < hp_.ups_rates.size(); ++i) {
        const std::string u = "dec.ups." + std::to_string(i) + ".";
        const int         s = hp_.ups_rates[i];
        T *= s;
        int64_t after = margin;  // frames past the signal that dilated convolutions read
        for (int j = 0; j < n_kernels; ++j) {
            for (int cv = 0; cv < hp_.res_convs; ++cv) {
                const int k = hp_.res_kernels[j], d = hp_.res_dilations[j * hp_.res_convs + cv];
                after = std::max<int64_t>(after, conv1d_frames_needed(T, k, d) - same_padding(k, d) - T);
            }
        }
        x = ggml_leaky_relu(g, x, 0.1f, false);
        if (c.cpu_kernels) {                          // the fold of the taps, the bias and the margins in one pass
            ggml_tensor * w     = c.w(u + "weight");  // [IC, OC, K]
            ggml_tensor * edged = i == 0 ? pad_time(g, x, 1, 1) : x;
            ggml_tensor * cols  = ggml_mul_mat(g, ggml_reshape_2d(g, w, w->ne[0], w->ne[1] * w->ne[2]), edged);
            const int     pad   = (hp_.ups_kernels[i] - s) / 2;
            x = cpu::transpose_fold(g, cols, c.w(u + "bias"), s, pad, (edged->ne[1] - 2) * s + w->ne[2] - s - 2 * pad,
                                    margin, after);
        } else {
            x = i == 0 ? conv_transpose1d(g, x, c.w(u + "weight"), c.w(u + "bias"), s, (hp_.ups_kernels[i] - s) / 2,
                                          margin, after)
                       : conv_transpose1d_zero_edges(g, x, c.w(u + "weight"), c.w(u + "bias"), s,
                                                     (hp_.ups_kernels[i] - s) / 2, margin, after);
        }
        // x: [C, margin + T + after]
        GGML_ASSERT(x->ne[1] == margin + T + after);
        ggml_tensor * mask  = mask_at(T / F, margin, after);
        x                   = masked(g, x, mask);
        ggml_tensor * inner = mask ? ggml_view_2d(g, mask, 1, T, mask->nb[1], margin * mask->nb[1]) : nullptr;
        const size_t  fb    = x->nb[1];
        ggml_tensor * xs    = nullptr;
        for (int j = 0; j < n_kernels; ++j) {
            const std::string r  = "dec.resblocks." + std::to_string(i * n_kernels + j) + ".convs.";
            ggml_tensor *     rb = x;
            for (int cv = 0; cv < hp_.res_convs; ++cv) {
                const int         d = hp_.res_dilations[j * hp_.res_convs + cv];
                const std::string w = r + std::to_string(cv) + ".";
                // On the CPU, the engine's kernel: LeakyReLU, convolution, bias, mask and the
                // residual add in one pass.
                ggml_tensor * scales = nullptr;
                ggml_tensor * packed = nullptr;
                if (c.cpu_kernels && cpu::residual_conv_fits(rb->ne[0])) {
                    packed = c.cpu_packed_conv_int16(w + "weight", scales);
                    packed = packed ? packed : c.cpu_packed_conv(w + "weight");
                }
                if (packed) {
                    cpu::residual_conv_params p;
                    p.begin    = margin;
                    p.frames   = T;
                    p.pad      = same_padding(hp_.res_kernels[j], d);
                    p.dilation = d;
                    p.slope    = 0.1f;
                    rb         = cpu::residual_conv(g, rb, packed, scales, c.w(w + "bias"), inner, p);
                    continue;
                }
                ggml_tensor * y = conv1d_window(c.graph_opts(), g, ggml_leaky_relu(g, rb, 0.1f, false),
                                                margin - same_padding(hp_.res_kernels[j], d), T, c.w(w + "weight"),
                                                c.w(w + "bias"), d);  // [C, T]
                y               = masked(g, y, inner);
                // rb += y over the signal frames; the margins stay zero.
                rb = rb == x ? ggml_acc(g, rb, y, fb, ggml_nbytes(rb), ggml_nbytes(rb), margin * fb)
                             : ggml_acc_inplace(g, rb, y, fb, ggml_nbytes(rb), ggml_nbytes(rb), margin * fb);
            }
            xs = xs ? ggml_add(g, xs, rb) : rb;
        }
        x = ggml_scale(g, xs, 1.0f / (float) n_kernels);
        if (i + 1 < hp_.ups_rates.size()) {
            // The signal frames between a zero frame on each side, contiguous.
            x = ggml_view_2d(g, x, x->ne[0], T + 2, fb, (margin - 1) * fb);
        }
    }
    ggml_tensor * w_post = c.w("dec.conv_post.weight");  // [C, K, 1]
    if (c.cpu_kernels && w_post->type == GGML_TYPE_F32 && w_post->ne[2] == 1) {
        x = cpu::conv_head(g, x, w_post, margin - hp_.dec_kernel_post / 2, T, 0.01f);  // [1, N]
    } else {
        x = conv1d_window(c.graph_opts(), g, ggml_leaky_relu(g, x, 0.01f, false), margin - hp_.dec_kernel_post / 2, T,
                          w_post, nullptr, 1);
        x = ggml_tanh(g, x);  // [1, N]
    }
    ggml_set_name(x, "audio");
    ggml_set_output(x);
    ggml_build_forward_expand(gb.gf, x);

    c.alloc(VS_STAGE_DECODER, gb.gf);
    ggml_backend_tensor_set(z_in, z.data(), 0, ggml_nbytes(z_in));
    in.set();
    c.compute(gb.gf);
    std::vector<float> audio(ggml_nelements(x));
    ggml_backend_tensor_get(x, audio.data(), 0, ggml_nbytes(x));
    return audio;
}

// The frames each output frame of the decoder depends on, on either side: the kernel
// radius of every layer, in latent frames at that layer's rate, summed (residual branches
// run side by side: the widest counts), plus one for rounding.
int64_t piper_voice::decoder_halo_frames() const {
    double radius = (double) hp_.dec_kernel_pre / 2;  // conv_pre, at the frame rate
    double rate   = 1.0;                              // samples per frame at this layer
    int    widest = 0;
    for (size_t j = 0; j < hp_.res_kernels.size(); ++j) {
        int branch = 0;
        for (int cv = 0; cv < hp_.res_convs; ++cv) {
            const int d = hp_.res_dilations[j * hp_.res_convs + cv];
            branch += same_padding(hp_.res_kernels[j], d);
        }
        widest = std::max(widest, branch);
    }
    for (int s : hp_.ups_rates) {
        radius += 1.0 / rate;  // a transposed conv with K = 2s reads one input step either side
        rate *= s;
        radius += widest / rate;
    }
    radius += (double) hp_.dec_kernel_post / 2 / rate;  // conv_post
    return (int64_t) std::ceil(radius) + 1;
}

std::vector<float> piper_voice::run_decoder_tiled(vs_context & c, const std::vector<float> & z, int64_t F,
                                                  int64_t tile) {
    const int64_t halo = decoder_halo_frames();
    tile               = std::max<int64_t>(tile, 4 * halo);  // tiles much smaller than their halo waste work
    if (F <= tile) {
        return run_decoder(c, z, packing({ F }, 0));
    }
    const int64_t      hop = decoder_hop();
    std::vector<float> audio;
    audio.reserve((size_t) (F * hop));
    for (int64_t f0 = 0; f0 < F; f0 += tile) {
        c.check_abort();
        const int64_t      f1 = std::min(F, f0 + tile);
        const int64_t      a = std::max<int64_t>(0, f0 - halo), b = std::min(F, f1 + halo);
        std::vector<float> part(z.begin() + a * hp_.inter, z.begin() + b * hp_.inter);
        std::vector<float> out = run_decoder(c, part, packing({ b - a }, 0));
        // Keep the frames this tile owns; its halo was computed only to feed them.
        audio.insert(audio.end(), out.begin() + (f0 - a) * hop, out.begin() + (f1 - a) * hop);
    }
    return audio;
}

int64_t piper_voice::token_gap() const {
    int64_t gap = hp_.ffn_kernel / 2;
    for (int i = 0, d = 1; i < hp_.dp_layers; ++i, d *= hp_.dp_kernel) {
        gap = std::max<int64_t>(gap, same_padding(hp_.dp_kernel, d));
    }
    return std::max<int64_t>(gap, 1);
}

int64_t piper_voice::flow_gap() const {
    int64_t gap = 1;
    for (int i = 0, d = 1; i < hp_.wn_layers; ++i, d *= hp_.wn_dilation_rate) {
        gap = std::max<int64_t>(gap, same_padding(hp_.wn_kernel, d));
    }
    return gap;
}

// Each upsampling's transposed convolution holds all its taps [OC * K] at the rate before it,
// and its output OC channels at its own rate (F32).
int64_t piper_voice::decoder_frame_bytes(const vs_context & c) const {
    int64_t most = 0, rate = 1;
    for (size_t i = 0; i < hp_.ups_rates.size(); ++i) {
        const ggml_tensor * w = c.w("dec.ups." + std::to_string(i) + ".weight");  // [IC, OC, K]
        most                  = std::max(most, w->ne[1] * w->ne[2] * rate);
        rate *= hp_.ups_rates[i];
        most = std::max(most, w->ne[1] * rate);
    }
    return most * (int64_t) sizeof(float);
}

// On a device whose ops take smaller tensors (see vs_context::limits), as many
// frames as keep the largest within that, margins included.
int64_t piper_voice::decoder_tile(const vs_context & c) const {
    if (!c.device_graphs) {
        return DEFAULT_DECODER_TILE;
    }
    const int64_t fit =
        (int64_t) std::min<size_t>(c.limits.max_tensor_bytes / (size_t) decoder_frame_bytes(c), 1 << 20);
    return std::clamp<int64_t>(fit - 2 * decoder_gap() - 1, 64, DEVICE_DECODER_TILE);
}

int64_t piper_voice::widest_resblock_padding() const {
    int64_t widest = 0;
    for (size_t j = 0; j < hp_.res_kernels.size(); ++j) {
        for (int cv = 0; cv < hp_.res_convs; ++cv) {
            widest =
                std::max<int64_t>(widest, same_padding(hp_.res_kernels[j], hp_.res_dilations[j * hp_.res_convs + cv]));
        }
    }
    return widest;
}

int64_t piper_voice::decoder_hop() const {
    int64_t hop = 1;
    for (int s : hp_.ups_rates) {
        hop *= s;
    }
    return hop;
}

int64_t piper_voice::decoder_gap() const {
    const int64_t widest = widest_resblock_padding();
    // A transposed convolution reads one input frame either side: at least one frame.
    int64_t gap = std::max(1, hp_.dec_kernel_pre / 2), rate = 1;
    for (int s : hp_.ups_rates) {
        rate *= s;
        gap = std::max(gap, (widest + rate - 1) / rate);
    }
    return std::max<int64_t>(gap, (hp_.dec_kernel_post / 2 + rate - 1) / rate);
}

}  // namespace vs::piper
