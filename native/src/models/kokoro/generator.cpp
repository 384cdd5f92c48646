// Kokoro-82M's generator as ggml graphs: harmonic source, its STFT, upsampling, Snake blocks, iSTFT.
#include "kokoro.h"

namespace vs::kokoro {

ggml_tensor * atan_all(ggml_context * g, ggml_tensor * z) {
    z = ggml_clamp(g, z, -1e18f, 1e18f);
    for (int i = 0; i < 2; ++i) {
        ggml_tensor * den =
            ggml_scale_bias(g, ggml_sqrt(g, ggml_scale_bias(g, ggml_sqr(g, z), 1.0f, 1.0f)), 1.0f, 1.0f);
        z = ggml_div(g, z, den);
    }
    ggml_tensor * z2  = ggml_sqr(g, z);
    ggml_tensor * acc = ggml_scale_bias(g, z2, -1.0f / 11.0f, 1.0f / 9.0f);
    for (int k : { 7, 5, 3 }) {
        acc = ggml_scale_bias(g, ggml_mul(g, acc, z2), -1.0f, 1.0f / (float) k);
    }
    acc = ggml_scale_bias(g, ggml_mul(g, acc, z2), -1.0f, 1.0f);
    return ggml_scale(g, ggml_mul(g, acc, z), 4.0f);
}

std::vector<float> harmonic_cycles(const std::vector<float> & f0, float sample_rate) {
    const size_t       F2 = f0.size();
    std::vector<float> out(F2 * N_HARMONICS);
    for (int k = 0; k < N_HARMONICS; ++k) {
        float sum = 0.0f;
        for (size_t t = 0; t < F2; ++t) {
            float r = f0[t] * (float) (k + 1) / sample_rate;
            sum += r - std::floor(r);
            out[(size_t) k * F2 + t] = sum;
        }
    }
    return out;
}

ggml_tensor * stft_basis(vs_context & c, const vs_model & model) {
    const int64_t bins = N_FFT / 2 + 1;
    return c.derived_tensor("kokoro.stft_basis", GGML_TYPE_F32, { N_FFT, 2 * bins, 1, 1 }, [&](uint8_t * out) {
        const float * wv = (const float *) model.tensor(GEN + "stft.window")->data;
        auto *        bv = reinterpret_cast<float *>(out);
        for (int64_t k = 0; k < bins; ++k) {
            for (int t = 0; t < N_FFT; ++t) {
                const double a    = 2.0 * M_PI * (double) (k * t) / N_FFT;
                bv[k * N_FFT + t] = (float) (wv[t] * std::cos(a));
                // The DC and Nyquist bins' imaginary parts are rounding noise in the reference's
                // STFT (below 1e-6), whose sign sets their phase to 0 or +-pi, and its noise
                // convolutions were trained on those phases: DC's is +0 there (phase +pi where
                // the real part is negative); Nyquist's mostly has the real part's sign (-pi
                // where it is negative), given here as a 1e-6 multiple of the real part.
                bv[(bins + k) * N_FFT + t] = k == 0           ? 0.0f
                                             : 2 * k == N_FFT ? (float) (1e-6 * wv[t] * std::cos(a))
                                                              : (float) (-wv[t] * std::sin(a));
            }
        }
    });
}

std::vector<float> istft_head_gain(const vs_model & model) {
    const float *      wsv = (const float *) model.tensor(GEN + "stft.istft.stft.window_sum")->data;
    std::vector<float> gv(N_FFT / 2);
    for (int j = 0; j < N_FFT / 2; ++j) {
        const float w  = wsv[N_FFT / 2 + j];
        gv[(size_t) j] = w > 1.1754944e-38f ? 4.0f / w : 4.0f;
    }
    return gv;
}

ggml_tensor * istft_gain(vs_context & c, const vs_model & model) {
    return c.derived_tensor("kokoro.istft_gain", GGML_TYPE_F32, { N_FFT / 2, 1, 1, 1 }, [&](uint8_t * out) {
        const std::vector<float> gv = istft_head_gain(model);
        std::copy(gv.begin(), gv.end(), reinterpret_cast<float *>(out));
    });
}

ggml_tensor * overlap_add(ggml_context * g, ggml_tensor * cols) {
    const int64_t n_frames = cols->ne[1];
    const int64_t raw_len  = (n_frames - 1) * HOP + N_FFT;
    ggml_tensor * wav      = nullptr;
    for (int q = 0; q < N_FFT / HOP; ++q) {
        ggml_tensor * part = ggml_cont(g, ggml_view_2d(g, cols, HOP, n_frames, cols->nb[1], q * HOP * sizeof(float)));
        part               = ggml_reshape_1d(g, part, HOP * n_frames);
        if (!wav) {
            wav = ggml_pad_ext(g, part, q * HOP, (int) (raw_len - HOP * n_frames - q * HOP), 0, 0, 0, 0, 0, 0);
        } else {
            wav = ggml_acc(g, wav, part, wav->nb[1], wav->nb[2], wav->nb[3], q * HOP * sizeof(float));
        }
    }
    return wav;
}

ggml_tensor * har_of(ggml_context * g, ggml_tensor * frames) {
    const int64_t bins = N_FFT / 2 + 1;
    ggml_tensor * re   = channels(g, frames, 0, bins);
    ggml_tensor * im   = channels(g, frames, bins, bins);
    ggml_tensor * mag  = ggml_sqrt(g, ggml_add(g, ggml_sqr(g, re), ggml_sqr(g, im)));
    ggml_tensor * at   = atan_all(g, ggml_div(g, im, re));
    // re < 0: - pi if im < 0, else + pi (atan2's: a zero imaginary part, the DC and Nyquist
    // bins', gives + pi, as the reference's FFT and atan2 give; its noise convolutions were
    // trained on that).
    ggml_tensor * quad =
        ggml_mul(g, step_above_zero(g, ggml_neg(g, re)),
                 ggml_scale_bias(g, step_above_zero(g, ggml_neg(g, im)), -2.0f * (float) M_PI, (float) M_PI));
    return ggml_concat(g, mag, ggml_add(g, at, quad), 0);
}

// Stage i's noise convolution of the harmonics [22, n_frames] to its rate.
ggml_tensor * kokoro_voice::gen_noise_conv(vs_context & c, ggml_context * g, ggml_tensor * har, size_t i) const {
    const std::string n  = std::to_string(i);
    ggml_tensor *     nw = c.w(GEN + "noise_convs." + n + ".weight");
    ggml_tensor *     nb = c.w(GEN + "noise_convs." + n + ".bias");
    if (i + 1 == hp_.gen_rates.size()) {
        return named(conv1d(c.graph_opts(), g, har, nw, nb, 1, 0), "gen_noise", (int) i);
    }
    int stride = 1;
    for (size_t j = i + 1; j < hp_.gen_rates.size(); ++j) {
        stride *= hp_.gen_rates[j];
    }
    return named(conv1d_strided(c.graph_opts(), g, har, nw, nb, stride, (stride + 1) / 2), "gen_noise", (int) i);
}

// Stage i's upsampling of x: LeakyReLU, the transposed convolution and, on the last stage,
// a reflection pad of one frame on the left (frame 1 repeated before frame 0).
ggml_tensor * kokoro_voice::gen_upsample(vs_context & c, ggml_context * g, ggml_tensor * x, size_t i) const {
    const std::string n = std::to_string(i);
    const int         r = hp_.gen_rates[i];
    x                   = ggml_leaky_relu(g, x, 0.1f, false);
    x                   = conv_transpose1d(g, x, c.w(GEN + "ups." + n + ".weight"), c.w(GEN + "ups." + n + ".bias"), r,
                                           (hp_.gen_kernels[i] - r) / 2);
    if (i + 1 == hp_.gen_rates.size()) {
        ggml_tensor * f1 = ggml_view_2d(g, x, x->ne[0], 1, x->nb[1], x->nb[1]);
        x                = ggml_concat(g, ggml_cont(g, f1), x, 1);
    }
    return named(x, "gen_ups", (int) i);  // [C_i, frames at stage i's rate]
}

// The generator's last steps but the overlap-add: conv_post to magnitude and phase, each
// frame's N_FFT samples from the synthesis basis -> [N_FFT, n_frames]. With `mask`
// [1, n_frames], the frames it zeroes add nothing to the audio. `fine_columns`: conv_post's
// GEMM rounded as a batch's (phase_columns).
ggml_tensor * kokoro_voice::gen_frames(vs_context & c, ggml_context * g, ggml_tensor * x, ggml_tensor * mask,
                                       bool fine_columns) const {
    const int64_t bins   = N_FFT / 2 + 1;
    x                    = ggml_leaky_relu(g, x, 0.01f, false);
    ggml_tensor * w_post = c.w(GEN + "conv_post.weight");
    ggml_tensor * b_post = c.w(GEN + "conv_post.bias");
    x = phases_apply(c.graph_opts(), w_post, 1) ? conv1d_phases_ct(g, x, 3, x->ne[1], w_post, b_post, fine_columns)
                                                : conv1d(c.graph_opts(), g, x, w_post, b_post, 1, 3);  // [22, n_frames]
    named(x, "conv_post");
    ggml_tensor * spec  = named(ggml_exp(g, channels(g, x, 0, bins)), "istft_magnitude");  // [11, n_frames]
    ggml_tensor * phase = named(ggml_sin(g, channels(g, x, bins, bins)), "istft_phase");   // [11, n_frames]
    ggml_tensor * cplx =
        ggml_concat(g, ggml_mul(g, spec, ggml_cos(g, phase)), ggml_mul(g, spec, ggml_sin(g, phase)), 0);
    if (mask) {
        cplx = ggml_mul(g, cplx, mask);
    }
    return named(ggml_mul_mat(g, c.w(GEN + "stft.istft.stft.inverse_basis"), cplx),
                 "istft_frames");  // [N_FFT, n_frames]
}

// The generator's last steps -> audio [L] (gen_frames, then the overlap-add).
ggml_tensor * kokoro_voice::gen_output(vs_context & c, ggml_context * g, ggml_tensor * x, int64_t L,
                                       ggml_tensor * mask) const {
    ggml_tensor * wav = overlap_add(g, gen_frames(c, g, x, mask, false));
    // The export scales by 4, dividing its first N_FFT samples by one frame's squared
    // window (a constant it traced); then drops N_FFT / 2 samples at each end.
    ggml_tensor * head = ggml_mul(g, ggml_view_1d(g, wav, N_FFT / 2, N_FFT / 2 * sizeof(float)), istft_gain(c, model_));
    ggml_tensor * body = ggml_scale(g, ggml_view_1d(g, wav, L - N_FFT / 2, N_FFT * sizeof(float)), 4.0f);
    ggml_tensor * audio = named(ggml_concat(g, head, body, 0), "audio");  // [L]
    ggml_set_output(audio);
    return audio;
}

std::vector<float> kokoro_voice::run_generator(vs_context & c, const act & xin, const std::vector<float> & f0,
                                               const std::vector<float> & style, act & har_out) const {
    auto           gb   = c.new_graph(16384);
    ggml_context * g    = gb.ctx.get();
    ggml_tensor *  x_in = input_2d(g, xin.C, xin.T, "x");
    ggml_tensor *  x    = x_in;
    gen_source     src(c, model_, g, (int64_t) f0.size());
    cond           k = make_cond(g, src.n_frames);
    use_style_table(c, g, k, GEN);
    for (size_t i = 0; i < hp_.gen_rates.size(); ++i) {
        ggml_tensor * xs = gen_noise_conv(c, g, src.har, i);
        xs = named(snake_res_block(c, g, xs, k, GEN + "noise_res." + std::to_string(i) + ".", noise_kernel(i)),
                   "gen_noise_res", (int) i);
        x  = named(ggml_add(g, gen_upsample(c, g, x, i), xs), "gen_stage_in", (int) i);
        ggml_tensor * sum = nullptr;
        for (size_t j = 0; j < hp_.res_kernels.size(); ++j) {
            ggml_tensor * y = snake_res_block(c, g, x, k, res_prefix(i, j), hp_.res_kernels[j]);
            sum             = sum ? ggml_add(g, sum, y) : y;
        }
        x = named(ggml_scale(g, sum, 1.0f / (float) hp_.res_kernels.size()), "gen_stage_out", (int) i);
    }
    ggml_tensor * audio = gen_output(c, g, x, src.L);
    ggml_build_forward_expand(gb.gf, src.har);
    ggml_build_forward_expand(gb.gf, audio);
    c.alloc(VS_STAGE_GENERATOR, gb.gf);

    set_input(c, x_in, xin.v.data());
    src.fill(c, f0, (float) hp_.sample_rate);
    fill_cond(c, k, style.data());
    c.compute(gb.gf);
    har_out = read_act(src.har);
    return read_act(audio).v;
}

std::string kokoro_voice::res_prefix(size_t stage, size_t j) const {
    return GEN + "resblocks." + std::to_string(stage * hp_.res_kernels.size() + j) + ".";
}

// The residual stacks of the generator's stages on a CUDA device, each in the engine's
// kernels (vs::cuda::snake_stack); where any of their weights is not F16 on the device, or
// the AdaINs have no style table, the ggml graph. Asked once (a voice has one context).
bool kokoro_voice::fused_generator(vs_context & c) const {
    if (fused_ < 0) {
        fused_ = fused_generator_applies(c) ? 1 : 0;
    }
    return fused_ == 1;
}

bool kokoro_voice::fused_generator_applies(vs_context & c) const {
    if (c.cuda_device < 0 || !style_table_for(c, GEN) || hp_.res_kernels.size() < 2 || hp_.res_dilations.size() != 3) {
        return false;
    }
    auto on_device = [&](const std::string & name, ggml_type type) {
        const ggml_tensor * t = c.w(name);
        return t->type == type && t->buffer && !ggml_backend_buffer_is_host(t->buffer) && ggml_is_contiguous(t);
    };
    for (size_t i = 0; i < hp_.gen_rates.size(); ++i) {
        std::vector<std::pair<std::string, int>> blocks = { { GEN + "noise_res." + std::to_string(i) + ".",
                                                              noise_kernel(i) } };
        for (size_t j = 0; j < hp_.res_kernels.size(); ++j) {
            blocks.emplace_back(res_prefix(i, j), hp_.res_kernels[j]);
        }
        for (const auto & [pre, K] : blocks) {
            for (int n = 0; n < 3; ++n) {
                for (const char * conv : { "convs1.", "convs2." }) {
                    const std::string   w  = pre + conv + std::to_string(n);
                    const ggml_tensor * wt = c.w(w + ".weight");
                    if (!on_device(w + ".weight", GGML_TYPE_F16) || !on_device(w + ".bias", GGML_TYPE_F32) ||
                        wt->ne[1] != K || wt->ne[0] != wt->ne[2] || !vs::cuda::snake_supported(wt->ne[0], K)) {
                        return false;
                    }
                }
                for (const char * alpha : { "alpha1.", "alpha2." }) {
                    if (!on_device(pre + alpha + std::to_string(n), GGML_TYPE_F32)) {
                        return false;
                    }
                }
            }
        }
    }
    return true;
}

std::vector<int64_t> kokoro_voice::gen_stage_frames(int64_t F2) const {
    std::vector<int64_t> T;
    int64_t              n = F2;
    for (size_t i = 0; i < hp_.gen_rates.size(); ++i) {
        const int r = hp_.gen_rates[i], K = hp_.gen_kernels[i];
        n = (n - 1) * r - 2 * ((K - r) / 2) + K + (i + 1 == hp_.gen_rates.size() ? 1 : 0);
        T.push_back(n);
    }
    return T;
}

int64_t kokoro_voice::gen_bucket(int64_t F2, std::vector<int64_t> & total) const {
    const std::array<int, 6>   dil = res_dilations();
    const std::vector<int64_t> T   = gen_stage_frames(F2);
    total.clear();
    for (size_t i = 0; i < T.size(); ++i) {
        std::vector<int> Ks = hp_.res_kernels;
        Ks.push_back(noise_kernel(i));
        total.push_back(vs::cuda::snake_bucket(T[i], Ks.data(), (int) Ks.size(), dil.data(), 6));
    }
    auto fits = [&](int64_t n) {
        const std::vector<int64_t> Tn = gen_stage_frames(n);
        for (size_t i = 0; i < Tn.size(); ++i) {
            if (Tn[i] > total[i]) {
                return false;
            }
        }
        return true;
    };
    int64_t n = F2;
    for (int64_t step = std::max<int64_t>(1, F2); step > 0; step /= 2) {
        while (fits(n + step)) {
            n += step;
        }
    }
    return n;
}

std::string address(const void * p) {
    char s[32];
    std::snprintf(s, sizeof(s), "%p", p);
    return s;
}

ggml_tensor * frame_mask(ggml_context * g, ggml_tensor * lens, int at, int64_t n) {
    ggml_tensor * len = ggml_view_1d(g, lens, 1, (size_t) at * sizeof(float));
    ggml_tensor * pos = ggml_arange(g, 0.5f, (float) n + 0.5f, 1.0f);  // the frames' middles
    return ggml_reshape_2d(g, step_above_zero(g, ggml_neg(g, ggml_sub(g, pos, len))), 1, n);
}

}  // namespace vs::kokoro
