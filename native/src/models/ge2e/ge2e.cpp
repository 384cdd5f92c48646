// GE2E speaker encoders: mel front end, a 3-layer LSTM over partial utterances of 160 frames, a
// linear layer with ReLU, and the L2-normalized mean of the partials' embeddings. Resemblyzer's
// d-vector model (arch "ge2e"; app/models/convert/ge2e.py) and Chatterbox's voice encoder (its
// tensors under "ve." in a chatterbox model; app/models/convert/chatterbox.py) differ in how they
// pad the STFT, cut the partials and trim silence first, which their metadata says.
#include <algorithm>
#include <cmath>

#include "../../graph/graph.h"
#include "../../vs-context.h"

namespace vs {

namespace {

struct ge2e_hparams {
    std::string prefix;  // of its tensors' names
    int         sample_rate = 16000;
    int64_t     n_fft = 400, hop = 160, n_mels = 40, partial_frames = 160, layers = 3, hidden = 256;
    float       partial_rate = 1.3f, min_coverage = 0.75f;
    // Chatterbox's voice encoder: frames padded by reflection (else zeros), partials cut as its
    // stride_as_partials does (else as Resemblyzer's compute_partial_slices), and silence at
    // either end trimmed first where trim_top_db > 0 (librosa.effects.trim).
    bool  reflect     = false;
    bool  ve_partials = false;
    float trim_top_db = 0.0f;
};

ge2e_hparams read_hparams(const vs_model & m) {
    ge2e_hparams      h;
    const bool        ve = m.arch == "chatterbox";
    const std::string k  = ve ? "chatterbox.ve." : "ge2e.";
    h.prefix             = ve ? "ve." : "";
    h.sample_rate        = ve ? m.u32_in(k + "sample_rate", 1000, 384000) : m.sample_rate;
    h.n_fft              = m.u32_in(k + "n_fft", 2, 8192);
    h.hop                = m.u32_in(k + "hop", 1, 8192);
    h.n_mels             = m.u32_in(k + "n_mels", 1, 512);
    h.partial_frames     = m.u32_in(k + "partial_frames", 1, 4096);
    h.layers             = m.u32_in(k + "layers", 1, 16);
    h.hidden             = m.u32_in(k + "hidden", 1, 4096);
    h.partial_rate       = m.f32_in(k + "partial_rate", 1e-3f, 1e3f);
    h.min_coverage       = m.f32_in(k + "min_coverage", 1e-3f, 1.0f);
    if (m.has(k + "pad")) {
        const std::string pad = m.strings.count(k + "pad") ? m.strings.at(k + "pad") : "";
        if (pad != "zeros" && pad != "reflect") {
            m.bad("metadata '" + k + "pad' is '" + pad + "'; one of zeros, reflect");
        }
        h.reflect = pad == "reflect";
    }
    if (m.has(k + "partials")) {
        const std::string cut = m.strings.count(k + "partials") ? m.strings.at(k + "partials") : "";
        if (cut != "resemblyzer" && cut != "chatterbox") {
            m.bad("metadata '" + k + "partials' is '" + cut + "'; one of resemblyzer, chatterbox");
        }
        h.ve_partials = cut == "chatterbox";
    }
    if (m.has(k + "trim_top_db")) {
        h.trim_top_db = m.f32_in(k + "trim_top_db", 0.0f, 200.0f);
    }
    return h;
}

// Every tensor the encoder reads: the DFT's cosine and sine rows, the mel filters, the
// LSTM's layers and the projection (all F32, as the converter writes them).
std::vector<tensor_spec> ge2e_layout(const vs_model & m, const ge2e_hparams & h) {
    const std::string &      P    = h.prefix;
    const int64_t            bins = h.n_fft / 2 + 1, E = m.tensor(P + "linear.weight")->ne[1];
    std::vector<tensor_spec> s = { { P + "dft", { h.n_fft, 2 * bins, 1, 1 }, false },
                                   { P + "mel", { bins, h.n_mels, 1, 1 }, false } };
    for (int64_t l = 0; l < h.layers; ++l) {
        const std::string p = P + "lstm." + std::to_string(l) + ".";
        s.push_back({ p + "weight_ih", { l == 0 ? h.n_mels : h.hidden, 4 * h.hidden, 1, 1 }, false });
        s.push_back({ p + "weight_hh", { h.hidden, 4 * h.hidden, 1, 1 }, false });
        s.push_back({ p + "bias", { 4 * h.hidden, 1, 1, 1 }, false });
    }
    s.push_back({ P + "linear.weight", { h.hidden, E, 1, 1 }, false });
    s.push_back({ P + "linear.bias", { E, 1, 1, 1 }, false });
    return s;
}

// Chatterbox's voice encoder (get_frame_step and get_num_wins): partials `step` frames apart over
// the mel's n_frames, the last kept where it would cover min_coverage of a partial; the mel
// padded with zero frames to (or cut at) `target` frames.
std::vector<int64_t> ve_partial_starts(const ge2e_hparams & h, int sample_rate, int64_t n_frames, int64_t & target) {
    const int64_t step = (int64_t) std::nearbyint((double) sample_rate / h.partial_rate / (double) h.partial_frames);
    if (step < 1 || step > h.partial_frames) {
        throw error(VS_ERR_FORMAT, "the encoder's partial rate gives a step of " + std::to_string(step) + " frames");
    }
    const int64_t span   = std::max<int64_t>(n_frames - h.partial_frames + step, 0);
    int64_t       n_wins = span / step;
    const int64_t rem    = span % step;
    if (n_wins == 0 || (double) (rem + h.partial_frames - step) / (double) h.partial_frames >= h.min_coverage) {
        ++n_wins;
    }
    target = h.partial_frames + step * (n_wins - 1);
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < n_wins; ++i) {
        starts.push_back(i * step);
    }
    return starts;
}

// librosa.effects.trim(top_db, frame_length=2048, hop_length=512): the RMS of frames of 2048
// samples every 512 (centred, zeros beyond both ends); the samples from the first frame within
// top_db of the loudest to the end of the last one. Empty where none is.
std::pair<size_t, size_t> trimmed_span(const float * x, size_t n, float top_db) {
    const int64_t       frame = 2048, hop = 512, frames = 1 + (int64_t) n / hop;
    std::vector<double> power((size_t) frames, 0.0);
    double              loudest = 0.0;
    for (int64_t f = 0; f < frames; ++f) {
        double sum = 0.0;
        for (int64_t k = 0; k < frame; ++k) {
            const int64_t s = f * hop + k - frame / 2;
            if (s >= 0 && s < (int64_t) n) {
                sum += (double) x[s] * x[s];
            }
        }
        power[(size_t) f] = sum / frame;
        loudest           = std::max(loudest, power[(size_t) f]);
    }
    const double ref   = 10.0 * std::log10(std::max(1e-10, loudest));
    int64_t      first = -1, last = -1;
    for (int64_t f = 0; f < frames; ++f) {
        if (10.0 * std::log10(std::max(1e-10, power[(size_t) f])) - ref > -top_db) {
            first = first < 0 ? f : first;
            last  = f;
        }
    }
    if (first < 0) {
        return { 0, 0 };
    }
    return { (size_t) (first * hop), std::min(n, (size_t) ((last + 1) * hop)) };
}

// First frames of the partial utterances, as Resemblyzer's compute_partial_slices chooses
// them for `n_samples` of audio.
std::vector<int64_t> partial_starts(const ge2e_hparams & h, int sample_rate, size_t n_samples) {
    const int64_t n_frames = (int64_t) std::ceil((double) (n_samples + 1) / (double) h.hop);
    const int64_t step     = (int64_t) std::nearbyint((double) sample_rate / h.partial_rate / (double) h.hop);
    if (step < 1 || step > h.partial_frames) {
        throw error(VS_ERR_FORMAT, "the encoder's partial rate gives a step of " + std::to_string(step) + " frames");
    }
    const int64_t        steps = std::max<int64_t>(1, n_frames - h.partial_frames + step + 1);
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < steps; i += step) {
        starts.push_back(i);
    }
    const double first_sample = (double) (starts.back() * h.hop);
    const double coverage     = ((double) n_samples - first_sample) / (double) (h.partial_frames * h.hop);
    if (coverage < h.min_coverage && starts.size() > 1) {
        starts.pop_back();
    }
    return starts;
}

// Computes the graph ending in `out` with `in` set to `data`; returns `out` on the host.
std::vector<float> run_graph(vs_context & c, int stage, const graph_build & gb, ggml_tensor * in,
                             const std::vector<float> & data, ggml_tensor * out) {
    ggml_set_output(out);
    ggml_build_forward_expand(gb.gf, out);
    c.alloc(stage, gb.gf);
    ggml_backend_tensor_set(in, data.data(), 0, ggml_nbytes(in));
    c.compute(gb.gf);
    std::vector<float> result((size_t) ggml_nelements(out));
    ggml_backend_tensor_get(out, result.data(), 0, ggml_nbytes(out));
    return result;
}

// Mel power spectrogram [n_mels, F] of `wav` (centred frames; zeros beyond both ends, or the
// audio reflected there).
std::vector<float> mel_spectrogram(vs_context & c, const ge2e_hparams & h, const std::vector<float> & wav,
                                   int64_t & n_frames) {
    const int64_t n = (int64_t) wav.size(), pad = h.n_fft / 2;
    n_frames = 1 + n / h.hop;
    std::vector<float> frames((size_t) (h.n_fft * n_frames), 0.0f);
    for (int64_t f = 0; f < n_frames; ++f) {
        for (int64_t k = 0; k < h.n_fft; ++k) {
            int64_t s = f * h.hop + k - pad;
            if (h.reflect) {
                s = s < 0 ? -s : s >= n ? 2 * (n - 1) - s : s;
            }
            if (s >= 0 && s < n) {
                frames[(size_t) (f * h.n_fft + k)] = wav[(size_t) s];
            }
        }
    }
    auto           gb   = c.new_graph(64);
    ggml_context * g    = gb.ctx.get();
    ggml_tensor *  x    = ggml_new_tensor_2d(g, GGML_TYPE_F32, h.n_fft, n_frames);
    ggml_tensor *  dft  = c.w(h.prefix + "dft");  // [n_fft, 2 * bins]: cos, -sin interleaved
    ggml_tensor *  mel  = c.w(h.prefix + "mel");  // [bins, n_mels]
    const int64_t  bins = dft->ne[1] / 2;
    ggml_set_input(x);
    ggml_tensor * spec  = ggml_sqr(g, ggml_mul_mat(g, dft, x));                             // [2 * bins, F]
    ggml_tensor * power = ggml_sum_rows(g, ggml_reshape_3d(g, spec, 2, bins, n_frames));    // [1, bins, F]
    ggml_tensor * out   = ggml_mul_mat(g, mel, ggml_reshape_2d(g, power, bins, n_frames));  // [n_mels, F]
    return run_graph(c, VS_STAGE_MEL, gb, x, frames, out);
}

// On a CUDA device: each layer's input projections as a graph, its recurrence as the
// engine's kernel (vs-cuda.h), the linear layer as a graph. Same result as run_encoder.
std::vector<float> run_encoder_cuda(vs_context & c, const ge2e_hparams & h, const std::vector<float> & x, int64_t B) {
    const int64_t      T = h.partial_frames, H = h.hidden;
    std::vector<float> seq = x, hs;  // [in, B, T]
    for (int64_t l = 0; l < h.layers; ++l) {
        c.check_abort();
        const std::string p    = h.prefix + "lstm." + std::to_string(l) + ".";
        ggml_tensor *     w_ih = c.w(p + "weight_ih"), *w_hh = c.w(p + "weight_hh");
        const int64_t     in = w_ih->ne[0];
        auto              gb = c.new_graph(64);
        ggml_context *    g  = gb.ctx.get();
        ggml_tensor *     xs = ggml_new_tensor_3d(g, GGML_TYPE_F32, in, B, T);
        ggml_set_input(xs);
        // Step-major per partial, as the kernel reads them: [4H, T, B].
        ggml_tensor * xt = ggml_cont(g, ggml_permute(g, xs, 0, 2, 1, 3));
        ggml_tensor * gx = ggml_add(g, ggml_mul_mat(g, w_ih, xt), c.w(p + "bias"));
        ggml_set_output(gx);
        ggml_build_forward_expand(gb.gf, gx);
        c.alloc(VS_STAGE_SPEAKER, gb.gf);
        ggml_backend_tensor_set(xs, seq.data(), 0, ggml_nbytes(xs));
        c.compute(gb.gf);
        std::vector<float> hc((size_t) (H * B), 0.0f), cc((size_t) (H * B), 0.0f), out((size_t) (H * B * T));
        c.lstm(gx, w_hh, H, T, B, 1, hc.data(), cc.data(), out.data());
        seq = std::move(out);  // [H, B, T]
        hs  = std::move(hc);   // the last step's [H, B]
    }
    auto           gb = c.new_graph(64);
    ggml_context * g  = gb.ctx.get();
    ggml_tensor *  hl = ggml_new_tensor_2d(g, GGML_TYPE_F32, H, B);
    ggml_set_input(hl);
    ggml_tensor * e =
        ggml_relu(g, ggml_add(g, ggml_mul_mat(g, c.w(h.prefix + "linear.weight"), hl), c.w(h.prefix + "linear.bias")));
    return run_graph(c, VS_STAGE_SPEAKER, gb, hl, hs, e);
}

// Embeddings [hidden, B] (ReLU'd, not normalized) of B partials x [n_mels, B, T].
std::vector<float> run_encoder(vs_context & c, const ge2e_hparams & h, const std::vector<float> & x, int64_t B) {
    bool fused = true;
    for (int64_t l = 0; l < h.layers; ++l) {
        fused = fused && c.fused_lstm(c.w(h.prefix + "lstm." + std::to_string(l) + ".weight_hh"), h.hidden);
    }
    if (fused) {
        return run_encoder_cuda(c, h, x, B);
    }
    const int64_t  T = h.partial_frames, H = h.hidden;
    auto           gb = c.new_graph((size_t) (h.layers * T * 24 + T * 4 + 64));
    ggml_context * g  = gb.ctx.get();
    ggml_tensor *  xs = ggml_new_tensor_3d(g, GGML_TYPE_F32, h.n_mels, B, T);
    ggml_set_input(xs);

    ggml_tensor * seq = xs;  // [in, B, T]
    ggml_tensor * hs  = nullptr;
    for (int64_t l = 0; l < h.layers; ++l) {
        const std::string p    = h.prefix + "lstm." + std::to_string(l) + ".";
        ggml_tensor *     w_hh = c.w(p + "weight_hh");
        // Input projections of every step at once: [4H, B, T].
        ggml_tensor * gx = ggml_add(g, ggml_mul_mat(g, c.w(p + "weight_ih"), seq), c.w(p + "bias"));
        ggml_tensor * cc = nullptr;
        hs               = nullptr;
        std::vector<ggml_tensor *> steps;
        for (int64_t t = 0; t < T; ++t) {
            ggml_tensor * z = ggml_view_2d(g, gx, 4 * H, B, gx->nb[1], t * gx->nb[2]);
            if (hs) {
                z = ggml_add(g, ggml_mul_mat(g, w_hh, hs), z);
            } else {
                z = ggml_cont(g, z);
            }
            ggml_tensor * sg   = ggml_sigmoid(g, z);
            auto          gate = [&](ggml_tensor * v, int k) {
                return ggml_view_2d(g, v, H, B, v->nb[1], k * H * sizeof(float));
            };
            ggml_tensor * cell = ggml_tanh(g, ggml_cont(g, gate(z, 2)));
            ggml_tensor * in   = ggml_mul(g, gate(sg, 0), cell);
            cc                 = cc ? ggml_add(g, ggml_mul(g, gate(sg, 1), cc), in) : ggml_cont(g, in);
            hs                 = ggml_mul(g, gate(sg, 3), ggml_tanh(g, cc));
            if (l + 1 < h.layers) {
                steps.push_back(ggml_reshape_3d(g, hs, H, B, 1));
            }
        }
        if (l + 1 < h.layers) {
            seq = concat_all(g, std::move(steps), 2);  // the next layer's input, [H, B, T]
        }
    }
    ggml_tensor * e =
        ggml_relu(g, ggml_add(g, ggml_mul_mat(g, c.w(h.prefix + "linear.weight"), hs), c.w(h.prefix + "linear.bias")));
    return run_graph(c, VS_STAGE_SPEAKER, gb, xs, x, e);
}

void normalize(float * v, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        s += (double) v[i] * v[i];
    }
    const double norm = std::sqrt(s);
    for (int64_t i = 0; i < n; ++i) {
        v[i] = norm > 0.0 ? (float) (v[i] / norm) : 0.0f;
    }
}

}  // namespace

void ge2e_validate(const vs_model & model) {
    const ge2e_hparams h = read_hparams(model);
    check_tensors(model, ge2e_layout(model, h));
    const int64_t E = model.tensor(h.prefix + "linear.weight")->ne[1];
    if (E < 1 || E > 4096) {
        model.bad("tensor '" + h.prefix + "linear.weight' makes embeddings of " + std::to_string(E) +
                  " values; at most 4096");
    }
    // The partials' step, in frames (partial_starts, ve_partial_starts), from one partial to a frame.
    const double step =
        std::nearbyint((double) h.sample_rate / h.partial_rate / (double) (h.ve_partials ? h.partial_frames : h.hop));
    if (step < 1 || step > h.partial_frames) {
        model.bad("the speaker encoder's partial rate gives partials " + std::to_string((long long) step) +
                  " frames apart; a partial has " + std::to_string(h.partial_frames));
    }
}

int64_t ge2e_embedding_size(const vs_model & model) {
    return model.tensor(read_hparams(model).prefix + "linear.weight")->ne[1];
}

std::vector<float> ge2e_embed(vs_context & c, const float * samples, size_t n_samples) {
    const ge2e_hparams h = read_hparams(*c.model);
    if (n_samples == 0) {
        throw error(VS_ERR_INVALID_ARG, "no audio to embed");
    }
    for (size_t i = 0; i < n_samples; ++i) {
        if (!std::isfinite(samples[i])) {
            throw error(VS_ERR_INVALID_ARG, "the audio holds a NaN or infinite sample at " + std::to_string(i));
        }
    }
    std::vector<float> wav(samples, samples + n_samples);
    if (h.trim_top_db > 0.0f) {
        const auto [begin, end] = trimmed_span(samples, n_samples, h.trim_top_db);
        wav.assign(samples + begin, samples + end);
    }
    if ((int64_t) wav.size() <= (h.reflect ? h.n_fft / 2 : 0)) {
        throw error(VS_ERR_INVALID_ARG, "the audio is " + std::string(h.trim_top_db > 0.0f ? "silent or " : "") +
                                            "too short for a speaker embedding");
    }
    std::vector<int64_t> starts;
    int64_t              target = 0;
    if (!h.ve_partials) {
        starts = partial_starts(h, h.sample_rate, wav.size());
        // Zeros up to the end of the last partial, as the reference pads.
        const size_t last = (size_t) ((starts.back() + h.partial_frames) * h.hop);
        if (last >= wav.size()) {
            wav.resize(last, 0.0f);
        }
    }
    int64_t            F = 0;
    std::vector<float> mel;
    vs_synth_params    none = vs_synth_default_params();
    c.timed_stage(VS_STAGE_MEL, 0, none, [&] { mel = mel_spectrogram(c, h, wav, F); });
    const int64_t      mel_frames = F;
    std::vector<float> cut;  // the mel padded with zero frames (or cut) to the partials' span
    if (h.ve_partials) {
        starts = ve_partial_starts(h, h.sample_rate, F, target);
        cut.assign(mel.begin(), mel.begin() + std::min(F, target) * h.n_mels);
        cut.resize((size_t) (target * h.n_mels), 0.0f);
    }
    const std::vector<float> & frames = h.ve_partials ? cut : mel;

    const int64_t      B = (int64_t) starts.size(), T = h.partial_frames, M = h.n_mels;
    std::vector<float> x((size_t) (M * B * T));  // [M, B, T]
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < T; ++t) {
            std::copy_n(frames.data() + (starts[b] + t) * M, M, x.data() + (t * B + b) * M);
        }
    }
    std::vector<float> partials;
    c.timed_stage(VS_STAGE_SPEAKER, 0, none, [&] { partials = run_encoder(c, h, x, B); });

    const int64_t      E = (int64_t) partials.size() / B;
    std::vector<float> mean((size_t) E, 0.0f);
    for (int64_t b = 0; b < B; ++b) {
        normalize(partials.data() + b * E, E);
        for (int64_t i = 0; i < E; ++i) {
            mean[(size_t) i] += partials[(size_t) (b * E + i)] / (float) B;
        }
    }
    normalize(mean.data(), E);
    c.set_output("mel", std::move(mel), mel_frames, M);
    c.set_output("partials", std::move(partials), B, E);
    return mean;
}

}  // namespace vs
