// HiFT, S3Gen's vocoder (HiFTNet: a neural source filter and an iSTFTNet): an F0 predictor over the
// mel, a sine source from that F0 (harmonics, noise), the mel upsampled through transposed
// convolutions with the source's STFT fused in at each rate, Snake residual blocks, and an
// inverse STFT of the predicted magnitude and phase. Mel [80, T] at 50 Hz -> 24 kHz audio.
#include <cmath>
#include <thread>

#include "../../cpu/kernels.h"
#include "../../graph/graph.h"
#include "../../vs-cuda.h"
#include "chatterbox.h"
#include "nsf.h"

namespace vs::chatterbox {

hift_hparams read_hift_hparams(const vs_model & m) {
    hift_hparams      h;
    const std::string k = "chatterbox.hift.";
    h.n_mels            = m.u32_in(k + "n_mels", 1, 512);
    h.channels          = m.u32_in(k + "channels", 8, 4096);
    h.n_fft             = m.u32_in(k + "n_fft", 2, 1024);
    h.hop               = m.u32_in(k + "hop", 1, 1024);
    h.harmonics         = m.u32_in(k + "harmonics", 0, 64);
    h.f0_layers         = m.u32_in(k + "f0_layers", 1, 16);
    h.sample_rate       = m.u32_in(k + "sample_rate", 1000, 384000);
    h.nsf_alpha         = m.f32_in(k + "nsf_alpha", 0.0f, 10.0f);
    h.nsf_sigma         = m.f32_in(k + "nsf_sigma", 0.0f, 10.0f);
    h.voiced_threshold  = m.f32_in(k + "voiced_threshold", 0.0f, 1e4f);
    h.lrelu_slope       = m.f32_in(k + "lrelu_slope", 0.0f, 1.0f);
    h.audio_limit       = m.f32_in(k + "audio_limit", 0.0f, 100.0f);
    for (int32_t r : m.i32_array_in(k + "upsample_rates", 1, 8, 1, 64)) {
        h.rates.push_back(r);
    }
    for (int32_t r : m.i32_array_in(k + "upsample_kernels", h.rates.size(), h.rates.size(), 1, 256)) {
        h.kernels.push_back(r);
    }
    for (int32_t r : m.i32_array_in(k + "resblock_kernels", 1, 8, 1, 64)) {
        h.res_kernels.push_back(r);
    }
    for (int32_t r : m.i32_array_in(k + "resblock_dilations", 1, 8, 1, 64)) {
        h.dilations.push_back(r);
    }
    for (int32_t r : m.i32_array_in(k + "source_resblock_kernels", h.rates.size(), h.rates.size(), 1, 64)) {
        h.source_kernels.push_back(r);
    }
    if (h.channels >> h.rates.size() < 1 || h.n_fft % h.hop || h.n_fft % 2) {
        m.bad("metadata 'chatterbox.hift.*' describes no vocoder this engine runs");
    }
    return h;
}

int64_t hift_samples_per_frame(const hift_hparams & h) {
    int64_t n = h.hop;
    for (int64_t r : h.rates) {
        n *= r;
    }
    return n;
}

std::vector<int64_t> hift_source_strides(const hift_hparams & h) {
    std::vector<int64_t> downs(h.rates.size());
    int64_t              down = 1;
    for (size_t i = h.rates.size(); i-- > 0;) {
        downs[i] = down;
        down *= h.rates[i];
    }
    return downs;
}

std::vector<tensor_spec> hift_layout(const hift_hparams & h) {
    const int64_t            C = h.channels, M = h.n_mels, bins = h.n_fft / 2 + 1, U = (int64_t) h.rates.size();
    std::vector<tensor_spec> s = {
        { "hift.conv_pre.weight", { M, 7, C, 1 }, false },
        { "hift.conv_pre.bias", { C, 1, 1, 1 }, false },
        { "hift.m_source.l_linear.weight", { h.harmonics + 1, 1, 1, 1 }, false },
        { "hift.m_source.l_linear.bias", { 1, 1, 1, 1 }, false },
        { "hift.f0.classifier.weight", { C, 1, 1, 1 }, false },
        { "hift.f0.classifier.bias", { 1, 1, 1, 1 }, false },
        { "hift.stft", { h.n_fft, 2 * bins, 1, 1 }, false },
        { "hift.istft", { 2 * bins, 1, h.n_fft, 1 }, false },
    };
    for (int64_t l = 0; l < h.f0_layers; ++l) {
        const std::string p = "hift.f0.condnet." + std::to_string(l) + ".";
        s.push_back({ p + "weight", { l == 0 ? M : C, 3, C, 1 }, false });
        s.push_back({ p + "bias", { C, 1, 1, 1 }, false });
    }
    auto resblock = [&](const std::string & p, int64_t ch, int64_t k) {
        for (size_t j = 0; j < h.dilations.size(); ++j) {
            for (const char * half : { "1.", "2." }) {
                const std::string q = p + "convs" + half + std::to_string(j) + ".";
                s.push_back({ q + "weight", { ch, k, ch, 1 }, false });
                s.push_back({ q + "bias", { ch, 1, 1, 1 }, false });
                const std::string a = p + "activations" + half + std::to_string(j) + ".";
                s.push_back({ a + "alpha", { ch, 1, 1, 1 }, false });
                s.push_back({ a + "inv_alpha", { ch, 1, 1, 1 }, false });
            }
        }
    };
    const std::vector<int64_t> downs = hift_source_strides(h);
    for (int64_t i = 0; i < U; ++i) {
        const int64_t     in = C >> i, out = C >> (i + 1), r = h.rates[(size_t) i];
        const int64_t     taps = (h.kernels[(size_t) i] + r - 1) / r * r;
        const std::string n    = std::to_string(i);
        s.push_back({ "hift.ups." + n + ".weight", { in, out, taps, 1 }, false });
        s.push_back({ "hift.ups." + n + ".bias", { out, 1, 1, 1 }, false });
        const int64_t d = downs[(size_t) i];
        s.push_back({ "hift.source_downs." + n + ".weight", { 2 * bins, d == 1 ? 1 : 2 * d, out, 1 }, false });
        s.push_back({ "hift.source_downs." + n + ".bias", { out, 1, 1, 1 }, false });
        resblock("hift.source_resblocks." + n + ".", out, h.source_kernels[(size_t) i]);
        for (size_t j = 0; j < h.res_kernels.size(); ++j) {
            resblock("hift.resblocks." + std::to_string(i * (int64_t) h.res_kernels.size() + (int64_t) j) + ".", out,
                     h.res_kernels[j]);
        }
    }
    s.push_back({ "hift.conv_post.weight", { C >> U, 7, 2 * bins, 1 }, false });
    s.push_back({ "hift.conv_post.bias", { 2 * bins, 1, 1, 1 }, false });
    return s;
}

namespace {

// Snake: x + sin^2(alpha x) / alpha, alpha per channel.
ggml_tensor * snake(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & p) {
    ggml_tensor * s = ggml_sqr(g, ggml_sin(g, ggml_mul(g, x, c.w(p + "alpha"))));
    return ggml_add(g, x, ggml_mul(g, s, c.w(p + "inv_alpha")));
}

// On the CPU, a Snake and the convolution after it (its bias, and `residual`) in the engine's
// kernel: Snake(x) = (u + sin^2 u) * inv_alpha with u = alpha x, as the kernel takes it with no
// shift; null where the kernel does not take these shapes or weights.
ggml_tensor * snake_conv_cpu(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & act,
                             const std::string & conv, int dilation, ggml_tensor * residual) {
    ggml_tensor * scales = nullptr;
    ggml_tensor * w      = c.cpu_packed_conv_int16(conv + ".weight", scales);
    if (!w && c.cpu_kernels) {
        w = c.cpu_packed_conv(conv + ".weight");
    }
    ggml_tensor *alpha = c.w(act + "alpha"), *inv = c.w(act + "inv_alpha");
    if (!w || !cpu::snake_conv_fits(x->ne[0], w->ne[0]) || alpha->type != GGML_TYPE_F32 || inv->type != GGML_TYPE_F32) {
        return nullptr;
    }
    return cpu::snake_conv(g, ggml_is_contiguous(x) ? x : ggml_cont(g, x), alpha, ggml_scale(g, alpha, 0.0f), inv, w,
                           scales, c.w(conv + ".bias"), residual, dilation);
}

// HiFi-GAN's residual block with Snake activations: per dilation d, x += conv(snake(conv_d(snake(x)))).
ggml_tensor * resblock(vs_context & c, ggml_context * g, ggml_tensor * x, const hift_hparams & h, const std::string & p,
                       int64_t k) {
    const graph_options o = c.graph_opts();
    for (size_t j = 0; j < h.dilations.size(); ++j) {
        const std::string n  = std::to_string(j);
        const int         d  = (int) h.dilations[j];
        const std::string a1 = p + "activations1." + n + ".", a2 = p + "activations2." + n + ".";
        const std::string c1 = p + "convs1." + n, c2 = p + "convs2." + n;
        if (ggml_tensor * y = snake_conv_cpu(c, g, x, a1, c1, d, nullptr)) {
            x = ggml_is_contiguous(x) ? x : ggml_cont(g, x);
            x = snake_conv_cpu(c, g, y, a2, c2, 1, x);
            GGML_ASSERT(x);  // the second convolution is the first's shape
            continue;
        }
        ggml_tensor * xt = snake(c, g, x, a1);
        xt               = conv1d(o, g, xt, c.w(c1 + ".weight"), c.w(c1 + ".bias"), d, (int) (k * d - d) / 2);
        xt               = snake(c, g, xt, a2);
        xt               = conv1d(o, g, xt, c.w(c2 + ".weight"), c.w(c2 + ".bias"), 1, (int) (k - 1) / 2);
        x                = ggml_add(g, x, xt);
    }
    return x;
}

}  // namespace

std::vector<float> hift_f0(vs_context & c, const hift_hparams & h, const float * mel, int64_t T) {
    auto           gb = c.new_graph((size_t) (h.f0_layers * 16 + 32));
    ggml_context * g  = gb.ctx.get();
    ggml_tensor *  x  = ggml_new_tensor_2d(g, GGML_TYPE_F32, h.n_mels, T);
    ggml_set_input(x);
    ggml_tensor * y = x;
    for (int64_t l = 0; l < h.f0_layers; ++l) {
        const std::string p = "hift.f0.condnet." + std::to_string(l) + ".";
        y                   = ggml_elu(g, conv1d(c.graph_opts(), g, y, c.w(p + "weight"), c.w(p + "bias"), 1, 1));
    }
    ggml_tensor * f0 = named(
        ggml_abs(g, ggml_add(g, ggml_mul_mat(g, c.w("hift.f0.classifier.weight"), y), c.w("hift.f0.classifier.bias"))),
        "hift_f0");  // [1, T]
    ggml_set_output(f0);
    ggml_build_forward_expand(gb.gf, f0);
    c.alloc(VS_STAGE_GENERATOR, gb.gf);
    c.set_input(x, mel);
    c.compute(gb.gf);
    std::vector<float> out((size_t) T);
    ggml_backend_tensor_get(f0, out.data(), 0, ggml_nbytes(f0));
    return out;
}

std::vector<float> hift_source(vs_context & c, const hift_hparams & h, const std::vector<float> & f0, float noise_scale,
                               uint64_t seed, source_state * state) {
    const int64_t per = hift_samples_per_frame(h), T = (int64_t) f0.size(), H = h.harmonics + 1;
    GGML_ASSERT(H <= NSF_MAX_HARMONICS);
    nsf_params p;
    p.n                        = (int) H;
    p.per                      = per;
    p.sample_rate              = (float) h.sample_rate;
    p.alpha                    = h.nsf_alpha;
    p.sigma                    = h.nsf_sigma;
    p.threshold                = h.voiced_threshold;
    p.noise_scale              = noise_scale;
    p.bias                     = host_floats(c.model->tensor("hift.m_source.l_linear.bias"))[0];
    p.seed                     = seed;
    p.first                    = state ? state->samples : 0;
    const std::vector<float> w = host_floats(c.model->tensor("hift.m_source.l_linear.weight"));
    for (int64_t i = 0; i < H; ++i) {
        p.weight[i] = w[(size_t) i];
        // The harmonics' phases: the fundamental's none, the others' uniform in [-pi, pi) from
        // the seed (none without noise).
        if (noise_scale > 0.0f && i > 0) {
            const double u =
                (double) (mix64(seed ^ mix64(0x5eed0000u + (uint64_t) i)) >> 11) * (1.0 / 9007199254740992.0);
            p.phase[i] = (float) ((2.0 * u - 1.0) * M_PI);
        }
    }
    // Each frame's cycles before its first sample, so that frames are made apart.
    std::vector<double> start((size_t) ((T + 1) * H));
    for (int64_t i = 0; i < H; ++i) {
        start[(size_t) i] = state && !state->cycles.empty() ? state->cycles[(size_t) i] : 0.0;
    }
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < H; ++i) {
            const float inc                   = f0[(size_t) t] * (float) (i + 1) / p.sample_rate;
            start[(size_t) ((t + 1) * H + i)] = start[(size_t) (t * H + i)] + (double) per * (double) inc;
        }
    }
    std::vector<float> src((size_t) (T * per));
    if (T > 0 && c.cuda_device >= 0) {
        vs::cuda::nsf_source(c.cuda_device, p, f0.data(), start.data(), T, src.data());
    } else if (T > 0) {
        auto frames = [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) {
                for (int64_t k = 0; k < per; ++k) {
                    src[(size_t) (t * per + k)] = nsf_sample(p, f0[(size_t) t], &start[(size_t) (t * H)], t, k);
                }
            }
        };
        const int64_t parts = std::min<int64_t>(std::max(1, c.n_threads), (T + 7) / 8), step = (T + parts - 1) / parts;
        std::vector<std::thread> workers;
        for (int64_t k = 1; k < parts; ++k) {
            workers.emplace_back(frames, std::min(T, k * step), std::min(T, (k + 1) * step));
        }
        frames(0, std::min(T, step));
        for (std::thread & th : workers) {
            th.join();
        }
    }
    if (state) {
        state->cycles.assign(start.end() - H, start.end());
        state->samples += T * per;
    }
    return src;
}

std::vector<float> hift_vocode(vs_context & c, const hift_hparams & h, const float * mel, int64_t T,
                               const std::vector<float> & source) {
    const int64_t per = hift_samples_per_frame(h), L = T * per, N = h.n_fft, hop = h.hop, bins = N / 2 + 1;
    const int64_t F = L / hop + 1;  // STFT frames of the source (centred)
    // The source's frames, reflected at both ends, as torch.stft(center=True) pads them.
    const std::vector<float> frames = reflected_frames(source.data(), L, N, hop, N / 2, F);
    // The iSTFT's window envelope: 1 / the sum of the squared window over the frames at each
    // output sample (after the n_fft / 2 samples torch.istft drops).
    std::vector<float> inv_env((size_t) L);
    {
        std::vector<double> env((size_t) ((F - 1) * hop + N), 0.0);
        for (int64_t f = 0; f < F; ++f) {
            for (int64_t n = 0; n < N; ++n) {
                const double wv = 0.5 - 0.5 * std::cos(2.0 * M_PI * (double) n / (double) N);
                env[(size_t) (f * hop + n)] += wv * wv;
            }
        }
        for (int64_t j = 0; j < L; ++j) {
            inv_env[(size_t) j] = (float) (1.0 / env[(size_t) (j + N / 2)]);
        }
    }

    const size_t   U  = h.rates.size();
    auto           gb = c.new_graph(16384);
    ggml_context * g  = gb.ctx.get();
    ggml_tensor *  xm = ggml_new_tensor_2d(g, GGML_TYPE_F32, h.n_mels, T);
    ggml_tensor *  xf = ggml_new_tensor_2d(g, GGML_TYPE_F32, N, F);
    ggml_tensor *  ev = ggml_new_tensor_2d(g, GGML_TYPE_F32, 1, L);
    ggml_set_input(xm);
    ggml_set_input(xf);
    ggml_set_input(ev);
    const graph_options        o     = c.graph_opts();
    ggml_tensor *              spec  = named(ggml_mul_mat(g, c.w("hift.stft"), xf), "hift_source_stft");  // [2 bins, F]
    ggml_tensor *              x     = conv1d(o, g, xm, c.w("hift.conv_pre.weight"), c.w("hift.conv_pre.bias"), 1, 3);
    const std::vector<int64_t> downs = hift_source_strides(h);
    for (size_t i = 0; i < U; ++i) {
        const std::string n = std::to_string(i);
        const int64_t     r = h.rates[i], k = h.kernels[i];
        x = conv_transpose1d_any(g, ggml_leaky_relu(g, x, h.lrelu_slope, false), c.w("hift.ups." + n + ".weight"),
                                 c.w("hift.ups." + n + ".bias"), (int) r, (int) (k - r) / 2, k);
        if (i + 1 == U) {  // ReflectionPad1d((1, 0))
            x = ggml_concat(g, ggml_view_2d(g, x, x->ne[0], 1, x->nb[1], x->nb[1]), x, 1);
        } else {
            x = ggml_cont(g, x);
        }
        const int64_t d  = downs[i];
        ggml_tensor * si = d == 1 ? conv1d(o, g, spec, c.w("hift.source_downs." + n + ".weight"),
                                           c.w("hift.source_downs." + n + ".bias"), 1, 0)
                                  : conv1d_strided(o, g, spec, c.w("hift.source_downs." + n + ".weight"),
                                                   c.w("hift.source_downs." + n + ".bias"), (int) d, (int) d / 2);
        si               = resblock(c, g, si, h, "hift.source_resblocks." + n + ".", h.source_kernels[i]);
        x                = named(ggml_add(g, x, si), "hift_fused", (int) i);
        ggml_tensor * xs = nullptr;
        for (size_t j = 0; j < h.res_kernels.size(); ++j) {
            ggml_tensor * y = resblock(
                c, g, x, h, "hift.resblocks." + std::to_string(i * h.res_kernels.size() + j) + ".", h.res_kernels[j]);
            xs = xs ? ggml_add(g, xs, y) : y;
        }
        x = named(ggml_scale(g, xs, 1.0f / (float) h.res_kernels.size()), "hift_stage", (int) i);
    }
    x = ggml_leaky_relu(g, x, 0.01f, false);  // F.leaky_relu's default slope
    x = named(conv1d(o, g, x, c.w("hift.conv_post.weight"), c.w("hift.conv_post.bias"), 1, 3),
              "hift_post");  // [2 bins, F]
    ggml_tensor * mag =
        ggml_clamp(g, ggml_exp(g, ggml_cont(g, ggml_view_2d(g, x, bins, F, x->nb[1], 0))), 0.0f, 100.0f);
    ggml_tensor * ph = ggml_sin(g, ggml_cont(g, ggml_view_2d(g, x, bins, F, x->nb[1], bins * sizeof(float))));
    ggml_tensor * re = ggml_mul(g, mag, ggml_cos(g, ph));
    ggml_tensor * im = ggml_mul(g, mag, ggml_sin(g, ph));
    ggml_tensor * y  = conv_transpose1d_any(g, ggml_concat(g, re, im, 0), c.w("hift.istft"), nullptr, (int) hop, 0, N);
    y                = ggml_view_2d(g, y, 1, L, y->nb[1], (N / 2) * y->nb[1]);  // torch.istft(center=True)
    y                = named(ggml_clamp(g, ggml_mul(g, y, ev), -h.audio_limit, h.audio_limit), "hift_audio");  // [1, L]
    ggml_set_output(y);
    ggml_build_forward_expand(gb.gf, y);
    c.alloc(VS_STAGE_GENERATOR, gb.gf);
    c.set_input(xm, mel);
    c.set_input(xf, frames.data());
    c.set_input(ev, inv_env.data());
    c.compute(gb.gf);
    std::vector<float> out((size_t) L);
    ggml_backend_tensor_get(y, out.data(), 0, ggml_nbytes(y));
    return out;
}

}  // namespace vs::chatterbox
