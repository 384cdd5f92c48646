// S3Gen's speaker encoder (CAMPPlus, 3D-Speaker): 16 kHz audio to an x-vector. Kaldi's log-mel
// filterbank (its mean over time taken off), a 2-D convolutional head (FCM) over frequency and
// time, a TDNN, three densely connected blocks of context-aware (CAM) layers each followed by a
// transition, statistics pooling (mean and standard deviation over time) and a dense layer.
// Batch norms are folded by the converter: into the convolution before them, or kept as a scale
// and shift where a ReLU stands between.
#include <cfloat>
#include <cmath>

#include "../../graph/graph.h"
#include "chatterbox.h"

namespace vs::chatterbox {

xvector_hparams read_xvector_hparams(const vs_model & m) {
    xvector_hparams   h;
    const std::string k = "chatterbox.xvec.";
    h.sample_rate       = m.u32_in(k + "sample_rate", 1000, 192000);
    h.frame             = m.u32_in(k + "frame", 16, 8192);
    h.hop               = m.u32_in(k + "hop", 1, 8192);
    h.n_fft             = m.u32_in(k + "n_fft", 16, 16384);
    h.n_mels            = m.u32_in(k + "n_mels", 8, 1024);
    h.channels          = m.u32_in(k + "head_channels", 1, 1024);
    h.init_channels     = m.u32_in(k + "init_channels", 1, 8192);
    h.growth            = m.u32_in(k + "growth", 1, 1024);
    h.bn_channels       = m.u32_in(k + "bn_channels", 1, 8192);
    h.seg_len           = m.u32_in(k + "seg_len", 1, 100000);
    h.embedding         = m.u32_in(k + "embedding", 1, 8192);
    h.preemphasis       = m.f32_in(k + "preemphasis", 0.0f, 1.0f);
    for (int32_t v : m.i32_array_in(k + "block_layers", 1, 8, 1, 256)) {
        h.block_layers.push_back(v);
    }
    for (int32_t v : m.i32_array_in(k + "block_dilations", h.block_layers.size(), h.block_layers.size(), 1, 64)) {
        h.block_dilations.push_back(v);
    }
    if (h.n_fft < h.frame || h.n_mels % 8 || h.n_fft % 2) {
        m.bad("metadata 'chatterbox.xvec.*' describes no speaker encoder this engine runs");
    }
    return h;
}

namespace {

// The channels of each dense block's input, and after its transition.
std::vector<std::pair<int64_t, int64_t>> block_channels(const xvector_hparams & h) {
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t                                  c = h.init_channels;
    for (int64_t n : h.block_layers) {
        out.push_back({ c, (c + n * h.growth) / 2 });
        c = (c + n * h.growth) / 2;
    }
    return out;
}

}  // namespace

std::vector<tensor_spec> xvector_layout(const xvector_hparams & h) {
    const int64_t            M = h.channels, G = h.growth, B = h.bn_channels;
    std::vector<tensor_spec> s;
    auto                     conv2d = [&](const std::string & p, int64_t in, int64_t k) {
        s.push_back({ p + ".weight", { k, k, in, M }, false });
        s.push_back({ p + ".bias", { 1, 1, M, 1 }, false });
    };
    auto bn = [&](const std::string & p, int64_t c) {
        s.push_back({ p + ".scale", { c, 1, 1, 1 }, false });
        s.push_back({ p + ".shift", { c, 1, 1, 1 }, false });
    };
    conv2d("xvec.head.conv1", 1, 3);
    for (int l : { 1, 2 }) {
        for (int b : { 0, 1 }) {
            const std::string p = "xvec.head.layer" + std::to_string(l) + "." + std::to_string(b) + ".";
            conv2d(p + "conv1", M, 3);
            conv2d(p + "conv2", M, 3);
            if (b == 0) {
                conv2d(p + "shortcut", M, 1);
            }
        }
    }
    conv2d("xvec.head.conv2", M, 3);
    const int64_t head_out = M * (h.n_mels / 8);
    s.push_back({ "xvec.tdnn.weight", { head_out, 5, h.init_channels, 1 }, false });
    s.push_back({ "xvec.tdnn.bias", { h.init_channels, 1, 1, 1 }, false });
    const auto chans = block_channels(h);
    for (size_t i = 0; i < h.block_layers.size(); ++i) {
        const std::string b = "xvec.block" + std::to_string(i + 1) + ".";
        for (int64_t j = 0; j < h.block_layers[i]; ++j) {
            const std::string p  = b + std::to_string(j) + ".";
            const int64_t     in = chans[i].first + j * G;
            bn(p + "bn1", in);
            s.push_back({ p + "linear1.weight", { in, B, 1, 1 }, false });
            s.push_back({ p + "linear1.bias", { B, 1, 1, 1 }, false });
            s.push_back({ p + "local.weight", { B, 3, G, 1 }, false });
            s.push_back({ p + "cam1.weight", { B, B / 2, 1, 1 }, false });
            s.push_back({ p + "cam1.bias", { B / 2, 1, 1, 1 }, false });
            s.push_back({ p + "cam2.weight", { B / 2, G, 1, 1 }, false });
            s.push_back({ p + "cam2.bias", { G, 1, 1, 1 }, false });
        }
        const int64_t full = chans[i].first + h.block_layers[i] * G;
        bn("xvec.transit" + std::to_string(i + 1) + ".bn", full);
        s.push_back({ "xvec.transit" + std::to_string(i + 1) + ".weight", { full, chans[i].second, 1, 1 }, false });
    }
    bn("xvec.out_bn", chans.back().second);
    s.push_back({ "xvec.dense.weight", { 2 * chans.back().second, h.embedding, 1, 1 }, false });
    s.push_back({ "xvec.dense.bias", { h.embedding, 1, 1, 1 }, false });
    s.push_back({ "xvec.dft", { h.n_fft, 2 * (h.n_fft / 2 + 1), 1, 1 }, false });
    s.push_back({ "xvec.mel", { h.n_fft / 2 + 1, h.n_mels, 1, 1 }, false });
    s.push_back({ "xvec.window", { h.frame, 1, 1, 1 }, false });
    return s;
}

namespace {

// Kaldi's fbank (torchaudio.compliance.kaldi.fbank's defaults: 25 ms frames every 10 ms that fit
// whole, each frame's mean taken off, pre-emphasis, Povey's window, zero-padded to n_fft, power,
// mel banks, natural log floored at float's epsilon), then its mean over time taken off:
// [frames, n_mels] row-major.
std::vector<float> fbank(vs_context & c, const xvector_hparams & h, const float * audio, int64_t L) {
    const int64_t            N = h.n_fft, W = h.frame, F = 1 + (L - W) / h.hop;
    const std::vector<float> window = host_floats(c.model->tensor("xvec.window"));
    std::vector<float>       frames((size_t) (N * F), 0.0f);
    std::vector<double>      x((size_t) W);
    for (int64_t f = 0; f < F; ++f) {
        double mean = 0.0;
        for (int64_t n = 0; n < W; ++n) {
            x[(size_t) n] = audio[f * h.hop + n];
            mean += x[(size_t) n];
        }
        mean /= (double) W;
        float * row = frames.data() + f * N;
        for (int64_t n = W - 1; n >= 0; --n) {
            const float v  = (float) (x[(size_t) n] - mean);
            const float pv = (float) (x[(size_t) std::max<int64_t>(n - 1, 0)] - mean);
            row[n]         = (v - h.preemphasis * pv) * window[(size_t) n];
        }
    }
    std::vector<float> out = mel_energies(c, VS_STAGE_MEL, frames, "xvec.dft", "xvec.mel");
    for (float & v : out) {
        v = std::log(std::max(v, FLT_EPSILON));
    }
    for (int64_t m = 0; m < h.n_mels; ++m) {
        double mean = 0.0;
        for (int64_t f = 0; f < F; ++f) {
            mean += out[(size_t) (f * h.n_mels + m)];
        }
        mean /= (double) F;
        for (int64_t f = 0; f < F; ++f) {
            out[(size_t) (f * h.n_mels + m)] -= (float) mean;
        }
    }
    return out;
}

ggml_tensor * scale_shift_relu(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & p) {
    return ggml_relu(g, ggml_add(g, ggml_mul(g, x, c.w(p + ".scale")), c.w(p + ".shift")));
}

// A 3x3 (or 1x1) convolution of the head, its batch norm folded in: x [T, F, IC] -> [T, F', OC],
// strided over frequency.
ggml_tensor * head_conv(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & p, int stride) {
    ggml_tensor * w   = c.w(p + ".weight");
    const int     pad = (int) w->ne[0] / 2;
    return ggml_add(g, ggml_conv_2d(g, w, x, 1, stride, pad, pad, 1, 1), c.w(p + ".bias"));
}

}  // namespace

std::vector<float> xvector_embed(vs_context & c, const xvector_hparams & h, const float * audio, int64_t L,
                                 const vs_synth_params & p) {
    if (L < h.frame + 4 * h.hop) {
        throw error(VS_ERR_INVALID_ARG, "the recording is too short for the speaker encoder: at least " +
                                            std::to_string(h.frame + 4 * h.hop) + " samples");
    }
    std::vector<float> feats;
    c.timed_stage(VS_STAGE_MEL, 0, p, [&] { feats = fbank(c, h, audio, L); });
    const int64_t      T = (int64_t) feats.size() / h.n_mels, T2 = (T - 1) / 2 + 1;  // after the TDNN's stride
    std::vector<float> xt((size_t) (T * h.n_mels));  // [n_mels][T]: time along a row, as the head reads it
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t m = 0; m < h.n_mels; ++m) {
            xt[(size_t) (m * T + t)] = feats[(size_t) (t * h.n_mels + m)];
        }
    }
    // The CAM layers' context: each frame's mean over all frames plus over its segment of seg_len
    // (the last one shorter), as one matrix [T2, S]; and the segments back to frames [S, T2].
    const int64_t      S = (T2 + h.seg_len - 1) / h.seg_len;
    std::vector<float> pool((size_t) (T2 * S)), spread((size_t) (S * T2), 0.0f);
    for (int64_t s = 0; s < S; ++s) {
        const int64_t n = std::min(h.seg_len, T2 - s * h.seg_len);
        for (int64_t t = 0; t < T2; ++t) {
            const bool in                = t / h.seg_len == s;
            pool[(size_t) (s * T2 + t)]  = 1.0f / (float) T2 + (in ? 1.0f / (float) n : 0.0f);
            spread[(size_t) (t * S + s)] = in ? 1.0f : 0.0f;
        }
    }
    std::vector<float> out((size_t) h.embedding);
    c.timed_stage(VS_STAGE_SPEAKER, 0, p, [&] {
        int64_t layers = 0;
        for (int64_t n : h.block_layers) {
            layers += n;
        }
        auto           gb = c.new_graph((size_t) (layers * 48 + 256));
        ggml_context * g  = gb.ctx.get();
        ggml_tensor *  x  = ggml_new_tensor_4d(g, GGML_TYPE_F32, T, h.n_mels, 1, 1);
        ggml_tensor *  pl = ggml_new_tensor_2d(g, GGML_TYPE_F32, T2, S);
        ggml_tensor *  sp = ggml_new_tensor_2d(g, GGML_TYPE_F32, S, T2);
        for (ggml_tensor * in : { x, pl, sp }) {
            ggml_set_input(in);
        }
        // FCM: residual blocks of 2-D convolutions, frequency strided by 2 three times.
        ggml_tensor * y = ggml_relu(g, head_conv(c, g, x, "xvec.head.conv1", 1));
        for (int l : { 1, 2 }) {
            for (int b : { 0, 1 }) {
                const std::string q      = "xvec.head.layer" + std::to_string(l) + "." + std::to_string(b) + ".";
                const int         stride = b == 0 ? 2 : 1;
                ggml_tensor *     r      = ggml_relu(g, head_conv(c, g, y, q + "conv1", stride));
                r                        = head_conv(c, g, r, q + "conv2", 1);
                y = ggml_relu(g, ggml_add(g, r, b == 0 ? head_conv(c, g, y, q + "shortcut", stride) : y));
            }
        }
        y = named(ggml_relu(g, head_conv(c, g, y, "xvec.head.conv2", 2)), "xvec_head");      // [T, n_mels / 8, M]
        y = ggml_cont(g, ggml_transpose(g, ggml_reshape_2d(g, y, T, y->ne[1] * y->ne[2])));  // [M n_mels / 8, T]
        const graph_options o = c.graph_opts();
        y = ggml_relu(g, conv1d_strided(o, g, y, c.w("xvec.tdnn.weight"), c.w("xvec.tdnn.bias"), 2, 2));  // [C, T2]
        for (size_t i = 0; i < h.block_layers.size(); ++i) {
            const std::string b = "xvec.block" + std::to_string(i + 1) + ".";
            const int         d = (int) h.block_dilations[i];
            for (int64_t j = 0; j < h.block_layers[i]; ++j) {
                const std::string q = b + std::to_string(j) + ".";
                ggml_tensor *     z = scale_shift_relu(c, g, y, q + "bn1");
                z = ggml_relu(g, ggml_add(g, ggml_mul_mat(g, c.w(q + "linear1.weight"), z), c.w(q + "linear1.bias")));
                ggml_tensor * local = conv1d(o, g, z, c.w(q + "local.weight"), nullptr, d, d);  // [G, T2]
                // The gate: a small MLP over the context (mean over all frames plus over the frame's
                // segment), computed a segment at a time, then spread back to the frames.
                ggml_tensor * ctx = ggml_mul_mat(g, ggml_cont(g, ggml_transpose(g, z)), pl);  // [B, S]
                ctx = ggml_relu(g, ggml_add(g, ggml_mul_mat(g, c.w(q + "cam1.weight"), ctx), c.w(q + "cam1.bias")));
                ctx = ggml_sigmoid(g, ggml_add(g, ggml_mul_mat(g, c.w(q + "cam2.weight"), ctx), c.w(q + "cam2.bias")));
                ggml_tensor * gate = ggml_mul_mat(g, ggml_cont(g, ggml_transpose(g, ctx)), sp);  // [G, T2]
                y                  = ggml_concat(g, y, ggml_mul(g, local, gate), 0);
            }
            const std::string t = "xvec.transit" + std::to_string(i + 1);
            y = named(ggml_mul_mat(g, c.w(t + ".weight"), scale_shift_relu(c, g, y, t + ".bn")), "xvec_block", (int) i);
        }
        y = scale_shift_relu(c, g, y, "xvec.out_bn");  // [C, T2]
        // Statistics pooling: the mean and the (unbiased) standard deviation over time.
        ggml_tensor * yt    = ggml_cont(g, ggml_transpose(g, y));  // [T2, C]
        ggml_tensor * mean  = ggml_mean(g, yt);                    // [1, C]
        ggml_tensor * dev   = ggml_sub(g, yt, mean);
        ggml_tensor * sd    = ggml_sqrt(g, ggml_scale(g, ggml_sum_rows(g, ggml_sqr(g, dev)), 1.0f / (float) (T2 - 1)));
        ggml_tensor * stats = ggml_reshape_2d(g, ggml_concat(g, mean, sd, 1), 2 * y->ne[0], 1);  // [mean; sd]
        ggml_tensor * e = named(ggml_add(g, ggml_mul_mat(g, c.w("xvec.dense.weight"), stats), c.w("xvec.dense.bias")),
                                "xvec_embedding");
        ggml_set_output(e);
        ggml_build_forward_expand(gb.gf, e);
        c.alloc(VS_STAGE_SPEAKER, gb.gf);
        c.set_input(x, xt.data());
        c.set_input(pl, pool.data());
        c.set_input(sp, spread.data());
        c.compute(gb.gf);
        ggml_backend_tensor_get(e, out.data(), 0, ggml_nbytes(e));
    });
    c.set_output("xvec_fbank", std::move(feats), T, h.n_mels);
    return out;
}

}  // namespace vs::chatterbox
