// Piper voices: VITS (text encoder with relative-position attention, stochastic
// duration predictor, residual-coupling flow, HiFi-GAN decoder).
//
// Each stage is its own graph. Durations are rounded on the host between the
// duration and flow stages (the frame count decides the later graphs' shapes);
// everything else is ggml ops on the context's device. Off the CPU a batch's sentences
// share each stage's graph (packing).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "../vs-context.h"
#include "../vs-cuda.h"
#include "../vs-graph.h"

namespace vs {

namespace {

// Padding that keeps a dilated convolution's length (PyTorch's "same" for odd kernels).
constexpr int same_padding(int kernel, int dilation) {
    return (kernel * dilation - dilation) / 2;
}

// Latent frames the decoder takes at once (about 3 s of audio at 22 kHz); longer chunks
// are decoded in tiles with exact seams, which bounds the decoder's memory. Off the CPU,
// where each tile's kernels cost their launches more than their memory, about 47 s.
constexpr int64_t DEFAULT_DECODER_TILE = 256;
constexpr int64_t DEVICE_DECODER_TILE  = 4096;

// Phonemes of a chunk: a longer sentence is split (split_long), so that its encoder's
// attention ([T, T] a head) and every stage stay the size of a sentence of half a minute.
constexpr size_t MAX_PHONEMES = 500;

// Off the CPU a batch's sentences share each stage's graphs (see packing), up to this many
// tokens (slots included) a graph.
constexpr int64_t PACK_TOKENS = 8192;

// Sentences laid end to end along time with at least `gap` frames between neighbours, so
// that a batch runs as one graph. Every convolution of a packed graph reads its input
// masked (zero outside the sentences) and each gap is at least as wide as that
// convolution's padding, so a sentence sees the zeros it sees alone. With `slots`, each
// sentence starts a slot of the longest one's length plus the gap: [C, total] is then
// [C, slot, n], which the encoder's attention takes as a batch. One sentence is laid out
// as itself: no gaps, no masks. `bucketed` rounds the slot (or the total) up to its
// shape_bucket, so that graphs kept by their shapes serve other sentences too: the frames
// added at the end are masked as gaps are.
// Standard normal noise (defined below).
void gaussian_fill(uint64_t key, float * out, size_t n, float scale, int n_threads);

// n values of noise stream `key` at float `at` of a tensor.
struct noise_span {
    uint64_t key = 0;
    int64_t  at = 0, n = 0;
};

struct packing {
    std::vector<int64_t> start, len;
    int64_t              total = 0, slot = 0;

    packing(const std::vector<int64_t> & lens, int64_t gap, bool slots = false, bool bucketed = false) : len(lens) {
        const int64_t longest = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
        slot                  = lens.size() > 1 ? longest + gap : longest;
        slot                  = bucketed && slots ? shape_bucket(slot) : slot;
        for (size_t i = 0; i < lens.size(); ++i) {
            start.push_back(slots ? (int64_t) i * slot : i == 0 ? 0 : total + gap);
            total = slots ? (int64_t) (i + 1) * slot : start.back() + lens[i];
        }
        total = bucketed && !slots ? shape_bucket(total) : total;
    }
    // Whether any frame lies outside the sentences (then graphs mask).
    bool packed() const { return start.size() > 1 || (!start.empty() && total > len[0]); }

    // 1 on the sentences' samples (`rate` a frame) and 0 in the gaps, after `before` and
    // followed by `after` zeros.
    std::vector<float> mask(int64_t rate = 1, int64_t before = 0, int64_t after = 0) const {
        std::vector<float> m((size_t) (before + total * rate + after), 0.0f);
        for (size_t i = 0; i < start.size(); ++i) {
            std::fill_n(m.begin() + before + start[i] * rate, len[i] * rate, 1.0f);
        }
        return m;
    }

    // Slots only: [slot, slot, 1, n] added to the attention scores of slot i: 0 for the
    // keys of its sentence, -inf for the rest.
    std::vector<float> key_mask() const {
        std::vector<float> m((size_t) (slot * slot) * start.size(), -INFINITY);
        for (size_t i = 0; i < start.size(); ++i) {
            for (int64_t q = 0; q < slot; ++q) {
                std::fill_n(m.begin() + ((int64_t) i * slot + q) * slot, len[i], 0.0f);
            }
        }
        return m;
    }

    // Sentence i's columns of a packed [C, total] activation.
    std::vector<float> slice(const std::vector<float> & x, int64_t C, size_t i) const {
        return std::vector<float>(x.begin() + start[i] * C, x.begin() + (start[i] + len[i]) * C);
    }
};

// Inputs of a graph under construction whose values are known now and set after allocation.
struct host_inputs {
    std::vector<std::pair<ggml_tensor *, std::vector<float>>> pending;

    ggml_tensor * add(ggml_context * g, int64_t ne0, int64_t ne1, std::vector<float> values, int64_t ne2 = 1,
                      int64_t ne3 = 1) {
        ggml_tensor * t = ggml_new_tensor_4d(g, GGML_TYPE_F32, ne0, ne1, ne2, ne3);
        ggml_set_input(t);
        pending.emplace_back(t, std::move(values));
        return t;
    }
    void set() const {
        for (const auto & [t, v] : pending) {
            ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
        }
    }
};

// An input of a stage graph, set after allocation (set_input).
ggml_tensor * new_input(ggml_context * g, ggml_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                        int64_t ne3 = 1) {
    ggml_tensor * t = ggml_new_tensor_4d(g, type, ne0, ne1, ne2, ne3);
    ggml_set_input(t);
    return t;
}

template <typename T>
void set_input(vs_context & c, ggml_tensor * t, const std::vector<T> & values) {
    GGML_ASSERT(values.size() * sizeof(T) == ggml_nbytes(t));
    c.set_input(t, values.data());
}

template <typename T>
std::vector<T> get_output(const ggml_tensor * t) {
    std::vector<T> out((size_t) ggml_nelements(t));
    ggml_backend_tensor_get(t, out.data(), 0, ggml_nbytes(t));
    return out;
}

// x with the frames outside the sentences zeroed (x itself where nothing is packed).
ggml_tensor * masked(ggml_context * g, ggml_tensor * x, ggml_tensor * mask) {
    return mask ? ggml_mul(g, x, mask) : x;
}

struct piper_hparams {
    int                         sample_rate;
    int                         hidden, inter, n_heads, n_layers, window, ffn_kernel;
    std::vector<int32_t>        ups_rates, ups_kernels, res_kernels, res_dilations;
    int                         res_convs;
    int                         dec_kernel_pre, dec_kernel_post;
    std::vector<int32_t>        flow_ids;
    int                         wn_layers, wn_kernel, wn_dilation_rate;
    std::vector<int32_t>        dp_flow_ids;
    int                         dp_layers, dp_kernel, dp_bins;
    float                       dp_tail_bound;
    float                       noise_scale, length_scale, noise_w;
    std::string                 espeak_voice;
    std::map<char32_t, int32_t> phoneme_ids;
};

// The hyperparameters, each checked against what the graphs below can build (any value
// outside would divide by zero, assert in ggml, or ask for a graph the size of the file's
// whim): VS_ERR_FORMAT naming the key otherwise.
piper_hparams read_hparams(const vs_model & m) {
    piper_hparams     h;
    const std::string p = "piper.";
    h.sample_rate       = m.u32_in(p + "sample_rate", 1000, 384000);
    h.hidden            = m.u32_in(p + "hidden_channels", 1, 4096);
    h.inter             = m.u32_in(p + "inter_channels", 2, 4096);
    h.n_heads           = m.u32_in(p + "n_heads", 1, 64);
    h.n_layers          = m.u32_in(p + "n_layers", 1, 64);
    h.window            = m.u32_in(p + "window_size", 1, 256);
    h.ffn_kernel        = m.u32_in(p + "ffn_kernel", 1, 31);
    h.ups_rates         = m.i32_array_in(p + "dec_upsample_rates", 1, 8, 1, 64);
    h.ups_kernels       = m.i32_array_in(p + "dec_upsample_kernels", 1, 8, 2, 128);
    h.res_kernels       = m.i32_array_in(p + "dec_resblock_kernels", 1, 8, 1, 31);
    h.res_convs         = m.u32_in(p + "dec_resblock_convs", 1, 8);
    h.res_dilations     = m.i32_array_in(p + "dec_resblock_dilations", 1, 64, 1, 64);
    h.dec_kernel_pre    = (int) m.tensor("dec.conv_pre.weight")->ne[1];
    h.dec_kernel_post   = (int) m.tensor("dec.conv_post.weight")->ne[1];
    h.flow_ids          = m.i32_array_in(p + "flow_ids", 1, 16, 0, 63);
    h.wn_layers         = m.u32_in(p + "flow_wn_layers", 1, 64);
    h.wn_kernel         = m.u32_in(p + "flow_wn_kernel", 1, 31);
    h.wn_dilation_rate  = m.u32_in(p + "flow_wn_dilation_rate", 1, 8);
    h.dp_flow_ids       = m.i32_array_in(p + "dp_flow_ids", 1, 16, 1, 63);
    h.dp_layers         = m.u32_in(p + "dp_layers", 1, 16);
    h.dp_kernel         = m.u32_in(p + "dp_kernel", 1, 31);
    h.dp_bins           = m.u32_in(p + "dp_num_bins", 1, 64);
    h.dp_tail_bound     = m.f32_in(p + "dp_tail_bound", 1e-3f, 1e3f);
    h.noise_scale       = m.f32_in(p + "noise_scale", 0.0f, 10.0f);
    h.length_scale      = m.f32_in(p + "length_scale", 0.05f, 20.0f);
    h.noise_w           = m.f32_in(p + "noise_w", 0.0f, 10.0f);
    auto it             = m.strings.find(p + "espeak_voice");
    h.espeak_voice      = it == m.strings.end() ? "en-us" : it->second;

    if (h.hidden % h.n_heads != 0) {
        m.bad("metadata 'piper.n_heads' (" + std::to_string(h.n_heads) + ") does not divide 'piper.hidden_channels' (" +
              std::to_string(h.hidden) + ")");
    }
    if (h.inter % 2 != 0) {
        m.bad("metadata 'piper.inter_channels' (" + std::to_string(h.inter) + ") is odd; the flow halves it");
    }
    if (h.ups_kernels.size() != h.ups_rates.size()) {
        m.bad("metadata 'piper.dec_upsample_kernels' and 'piper.dec_upsample_rates' differ in length");
    }
    int64_t hop = 1;
    for (size_t i = 0; i < h.ups_rates.size(); ++i) {
        if (h.ups_kernels[i] != 2 * h.ups_rates[i]) {  // conv_transpose1d's overlap-add of two halves
            m.bad("metadata 'piper.dec_upsample_kernels'[" + std::to_string(i) + "] is " +
                  std::to_string(h.ups_kernels[i]) + "; this engine runs kernels of twice the rate (" +
                  std::to_string(2 * h.ups_rates[i]) + ")");
        }
        hop *= h.ups_rates[i];
    }
    if (hop > 4096) {
        m.bad("metadata 'piper.dec_upsample_rates' upsample " + std::to_string(hop) + " times; at most 4096");
    }
    if (h.res_dilations.size() != h.res_kernels.size() * (size_t) h.res_convs) {
        m.bad("metadata 'piper.dec_resblock_dilations' has " + std::to_string(h.res_dilations.size()) +
              " values, not one for each of 'piper.dec_resblock_convs' convolutions of each kernel");
    }
    const std::pair<const char *, int> odd[] = { { "ffn_kernel", h.ffn_kernel },
                                                 { "flow_wn_kernel", h.wn_kernel },
                                                 { "dp_kernel", h.dp_kernel },
                                                 { "dec.conv_pre.weight's kernel", h.dec_kernel_pre },
                                                 { "dec.conv_post.weight's kernel", h.dec_kernel_post } };
    for (const auto & [what, k] : odd) {
        if (k % 2 == 0 || k > 31) {
            m.bad(std::string(what) + " is " + std::to_string(k) + "; this engine runs odd kernels up to 31");
        }
    }
    for (int k : h.res_kernels) {
        if (k % 2 == 0) {
            m.bad("metadata 'piper.dec_resblock_kernels' holds " + std::to_string(k) +
                  "; this engine runs odd kernels");
        }
    }
    // Dilations grow by the rate (the kernel, in the duration predictor) a layer: bounded so
    // that a padding stays within a few thousand frames.
    if (std::pow((double) h.wn_dilation_rate, h.wn_layers - 1) > 4096 ||
        std::pow((double) h.dp_kernel, h.dp_layers - 1) > 4096) {
        m.bad("metadata 'piper.flow_wn_dilation_rate' or 'piper.dp_kernel' gives dilations past 4096");
    }

    auto phonemes = m.str_array(p + "phonemes");
    auto ids      = m.i32_array(p + "phoneme_ids");
    if (phonemes.size() != ids.size()) {
        m.bad("metadata 'piper.phonemes' and 'piper.phoneme_ids' differ in length");
    }
    const int64_t n_vocab = m.tensor("enc_p.emb.weight")->ne[1];
    for (size_t i = 0; i < phonemes.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            m.bad("metadata 'piper.phoneme_ids'[" + std::to_string(i) + "] is " + std::to_string(ids[i]) +
                  "; the embedding has " + std::to_string(n_vocab) + " rows");
        }
        auto cps = utf8_decode(phonemes[i]);
        if (cps.size() == 1) {
            h.phoneme_ids[cps[0]] = ids[i];
        }
    }
    for (char32_t special : { U'^', U'$', U'_', U' ' }) {
        if (!h.phoneme_ids.count(special)) {
            m.bad("metadata 'piper.phonemes' lacks BOS, EOS, pad or space ('^', '$', '_', ' ')");
        }
    }
    return h;
}

// Every tensor the graphs read, in the shape the hyperparameters give it (ggml's ne order:
// a convolution [IC, K, OC], a transposed one [IC, OC, K]); the text encoder's and the
// duration predictor's stay F32, as the converter writes them.
std::vector<tensor_spec> piper_layout(const vs_model & m, const piper_hparams & h) {
    const int64_t            H = h.hidden, I = h.inter, V = m.tensor("enc_p.emb.weight")->ne[1];
    const int64_t            FF = m.tensor("enc_p.encoder.ffn_layers.0.conv_1.bias")->ne[0];
    const int64_t            DP = m.tensor("dp.pre.bias")->ne[0];
    const int64_t            C0 = m.tensor("dec.conv_pre.bias")->ne[0];
    std::vector<tensor_spec> s;
    auto                     add = [&](const std::string & name, std::array<int64_t, 4> ne, bool reducible = false) {
        s.push_back({ name, ne, reducible });
    };
    auto conv = [&](const std::string & name, int64_t ic, int64_t k, int64_t oc, bool reducible, bool bias = true) {
        add(name + ".weight", { ic, k, oc, 1 }, reducible && ic * k * oc >= 64);
        if (bias) {
            add(name + ".bias", { oc, 1, 1, 1 });
        }
    };
    add("enc_p.emb.weight", { H, V, 1, 1 });
    for (int l = 0; l < h.n_layers; ++l) {
        const std::string a = "enc_p.encoder.attn_layers." + std::to_string(l) + ".";
        for (const char * qkvo : { "conv_q", "conv_k", "conv_v", "conv_o" }) {
            conv(a + qkvo, H, 1, H, false);
        }
        add(a + "emb_rel_k", { H / h.n_heads, 2 * h.window + 1, 1, 1 });
        add(a + "emb_rel_v", { H / h.n_heads, 2 * h.window + 1, 1, 1 });
        const std::string f = "enc_p.encoder.ffn_layers." + std::to_string(l) + ".";
        conv(f + "conv_1", H, h.ffn_kernel, FF, false);
        conv(f + "conv_2", FF, h.ffn_kernel, H, false);
        for (const char * norm : { "norm_layers_1.", "norm_layers_2." }) {
            add("enc_p.encoder." + std::string(norm) + std::to_string(l) + ".gamma", { H, 1, 1, 1 });
            add("enc_p.encoder." + std::string(norm) + std::to_string(l) + ".beta", { H, 1, 1, 1 });
        }
    }
    conv("enc_p.proj", H, 1, 2 * I, false);
    auto dds = [&](const std::string & prefix) {
        for (int l = 0; l < h.dp_layers; ++l) {
            const std::string n = std::to_string(l);
            add(prefix + "convs_sep." + n + ".weight", { DP, h.dp_kernel, 1, 1 });
            add(prefix + "convs_sep." + n + ".bias", { DP, 1, 1, 1 });
            conv(prefix + "convs_1x1." + n, DP, 1, DP, false);
            for (const char * norm : { "norms_1.", "norms_2." }) {
                add(prefix + norm + n + ".gamma", { DP, 1, 1, 1 });
                add(prefix + norm + n + ".beta", { DP, 1, 1, 1 });
            }
        }
    };
    conv("dp.pre", H, 1, DP, false);
    conv("dp.proj", DP, 1, DP, false);
    dds("dp.convs.");
    add("dp.flows.0.m", { 1, 2, 1, 1 });
    add("dp.flows.0.exp_neg_logs", { 1, 2, 1, 1 });
    for (int id : h.dp_flow_ids) {
        const std::string f = "dp.flows." + std::to_string(id) + ".";
        conv(f + "pre", 1, 1, DP, false);
        dds(f + "convs.");
        conv(f + "proj", DP, 1, 3 * h.dp_bins - 1, false);
    }
    for (int id : h.flow_ids) {
        const std::string f = "flow.flows." + std::to_string(id) + ".";
        conv(f + "pre", I / 2, 1, H, true);
        for (int l = 0; l < h.wn_layers; ++l) {
            const std::string n = std::to_string(l);
            conv(f + "enc.in_layers." + n, H, h.wn_kernel, 2 * H, true);
            conv(f + "enc.res_skip_layers." + n, H, 1, l + 1 < h.wn_layers ? 2 * H : H, true);
        }
        conv(f + "post", H, 1, I / 2, true);
    }
    conv("dec.conv_pre", I, h.dec_kernel_pre, C0, true);
    int64_t C = C0;
    for (size_t i = 0; i < h.ups_rates.size(); ++i) {
        if (C % 2 != 0) {
            m.bad("the decoder's channels (" + std::to_string(C0) + ") cannot be halved at each upsampling");
        }
        const std::string u = "dec.ups." + std::to_string(i) + ".";
        add(u + "weight", { C, C / 2, h.ups_kernels[i], 1 }, true);
        add(u + "bias", { C / 2, 1, 1, 1 });
        C /= 2;
        for (size_t j = 0; j < h.res_kernels.size(); ++j) {
            const std::string r = "dec.resblocks." + std::to_string(i * h.res_kernels.size() + j) + ".convs.";
            for (int cv = 0; cv < h.res_convs; ++cv) {
                conv(r + std::to_string(cv), C, h.res_kernels[j], C, true);
            }
        }
    }
    conv("dec.conv_post", C, h.dec_kernel_post, 1, true, false);
    return s;
}

// Host-side constants of the spline: cumulative sum, difference, end-point masks.
struct spline_consts {
    ggml_tensor * cumsum;  // [bins, bins+1]: out[j] = sum_{k<j} in[k]
    ggml_tensor * diff;    // [bins+1, bins]: out[k] = in[k+1] - in[k]
    ggml_tensor * ends;    // [bins+1]: 1 at both ends
    ggml_tensor * last;    // [bins+1]: 1 at the last knot
};

class piper_voice final : public voice {
  public:
    explicit piper_voice(vs_model & model) : hp_(read_hparams(model)) {}

    std::vector<std::vector<int32_t>> ids_from_text(vs_context & ctx, const std::string & text,
                                                    int & skipped) override {
        if (!ctx.phonemizer) {
            throw error(VS_ERR_PHONEMIZER, "this context has no espeak-ng; pass phonemes instead of text");
        }
        std::vector<std::vector<int32_t>> out;
        for (const auto & s : ctx.phonemizer->phonemize(text, hp_.espeak_voice)) {
            add_chunks(s.ipa, skipped, out);
        }
        return out;
    }

    std::vector<std::vector<int32_t>> ids_from_phonemes(const std::string & ipa, int & skipped) override {
        std::vector<std::vector<int32_t>> out;
        for (const auto & line : split_lines(ipa)) {
            add_chunks(line, skipped, out);
        }
        return out;
    }

    // Off the CPU, voice::prewarm_lengths: the kept graphs of several rounded shapes, and the
    // GEMMs of the decoder in the engine's CUDA kernels (fused_decoder) for every length.
    std::vector<std::string> prewarm_phonemes(const vs_context & ctx) const override {
        return ctx.device_graphs ? prewarm_lengths() : voice::prewarm_phonemes(ctx);
    }

    std::string phonemize(vs_context & ctx, const std::string & text) override {
        if (!ctx.phonemizer) {
            throw error(VS_ERR_PHONEMIZER, "this context has no espeak-ng");
        }
        std::string out;
        for (const auto & s : ctx.phonemizer->phonemize(text, hp_.espeak_voice)) {
            out += (out.empty() ? "" : "\n") + s.ipa;
        }
        return out;
    }

    std::vector<float> synthesize(vs_context & ctx, const std::vector<int32_t> & ids, const vs_synth_params & p,
                                  int chunk) override {
        return synthesize_batch(ctx, { ids }, p, chunk)[0];
    }
    std::vector<std::vector<float>> synthesize_batch(vs_context & ctx, const std::vector<std::vector<int32_t>> & ids,
                                                     const vs_synth_params & p, int first_chunk) override;

  private:
    piper_hparams hp_;

    // A sentence's chunks of at most MAX_PHONEMES phonemes (split_long), each as ids.
    void add_chunks(const std::string & ipa, int & skipped, std::vector<std::vector<int32_t>> & out) const {
        const auto pieces = split_long(
            utf8_decode(ipa), MAX_PHONEMES, [](char32_t c) { return c == U',' || c == U';' || c == U':'; },
            [](char32_t c) { return c == U' '; });
        for (const auto & piece : pieces) {
            auto ids = to_ids(piece, skipped);
            if (!ids.empty()) {
                out.push_back(std::move(ids));
            }
        }
    }

    // BOS, pad, then each phoneme followed by pad, then EOS (piper-phonemize's layout).
    std::vector<int32_t> to_ids(const std::vector<char32_t> & ipa, int & skipped) const {
        std::vector<int32_t> ids;
        const int32_t        pad = hp_.phoneme_ids.at(U'_');
        for (char32_t c : ipa) {
            if (c == U'\r' || c == U'\n') {
                continue;
            }
            auto it = hp_.phoneme_ids.find(c);
            if (it == hp_.phoneme_ids.end()) {
                ++skipped;
                continue;
            }
            ids.push_back(it->second);
            ids.push_back(pad);
        }
        bool speakable = false;
        for (size_t i = 0; i < ids.size(); i += 2) {
            speakable |= ids[i] != hp_.phoneme_ids.at(U' ');
        }
        if (!speakable) {
            return {};
        }
        ids.insert(ids.begin(), { hp_.phoneme_ids.at(U'^'), pad });
        ids.push_back(hp_.phoneme_ids.at(U'$'));
        return ids;
    }

    // One sentence's state through the stages.
    struct job {
        std::vector<int32_t> ids;
        uint64_t             key;  // its noise's streams, from the seed and its phonemes alone
        std::vector<float>   logw, z, audio;
        std::vector<float>   m_p, logs_p;  // the call's last sentence only (named outputs)
        std::vector<int32_t> frame_to_token;
    };
    // Jobs [first, last) through every stage, in shared graphs where they are packed.
    void run_group(vs_context & c, std::vector<job> & jobs, size_t first, size_t last, const vs_synth_params & p,
                   int first_chunk);
    void decode(vs_context & c, std::vector<job> & jobs, size_t first, size_t last, int64_t tile);

    // Gaps between packed sentences: the widest padding of any convolution over tokens,
    // over latent frames in the flow, and in the decoder (in latent frames, at every rate).
    int64_t token_gap() const;
    int64_t flow_gap() const;
    int64_t decoder_gap() const;
    int64_t widest_resblock_padding() const;  // of the decoder's residual convolutions
    int64_t decoder_hop() const;              // samples per latent frame

    ggml_tensor * attention(vs_context & c, ggml_context * g, ggml_tensor * x, int il, int64_t n,
                            ggml_tensor * kq_mask) const;
    ggml_tensor * dds_conv(vs_context & c, ggml_context * g, ggml_tensor * x, ggml_tensor * cond,
                           const std::string & prefix, ggml_tensor * mask) const;
    ggml_tensor * spline_inverse(ggml_context * g, ggml_tensor * x, ggml_tensor * h, const spline_consts & k) const;
    // The spline's constant matrices, on c's device (made once).
    spline_consts spline_constants(vs_context & c) const;
    ggml_tensor * wavenet(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & prefix,
                          ggml_tensor * mask) const;

    // Each stage over packed sentences (pk); activations [C, pk.total].
    void run_encoder(vs_context & c, const std::vector<int32_t> & ids, const packing & pk, std::vector<float> & hidden,
                     std::vector<float> & m_p, std::vector<float> & logs_p);
    std::vector<float> run_duration(vs_context & c, const std::vector<float> & hidden, const packing & pk,
                                    const std::vector<float> & noise);
    // frame_to_token: each packed frame's packed token (T of them); pk packs the frames.
    std::vector<float> run_flow(vs_context & c, const std::vector<float> & m_p, const std::vector<float> & logs_p,
                                const std::vector<int32_t> & frame_to_token, const std::vector<noise_span> & noise,
                                float noise_scale, int64_t T, const packing & pk);
    std::vector<float> run_decoder(vs_context & c, const std::vector<float> & z, const packing & pk);
    // The same with the residual blocks in the engine's CUDA kernels (vs::cuda::leaky_stack),
    // where fused_decoder(c) says they apply.
    std::vector<float> run_decoder_fused(vs_context & c, const std::vector<float> & z, const packing & pk);
    bool               fused_decoder(const vs_context & c) const;
    mutable int        fused_ = -1;  // fused_decoder's answer, asked once (a voice has one context)
    // The decoder over one sentence's [0, F) in tiles of at most `tile` frames plus a halo on each side.
    std::vector<float> run_decoder_tiled(vs_context & c, const std::vector<float> & z, int64_t F, int64_t tile);
    int64_t            decoder_halo_frames() const;
    // Bytes of the decoder's largest tensor per latent frame (see decoder_tile).
    int64_t decoder_frame_bytes(const vs_context & c) const;
    // Latent frames the decoder takes at once on c's device.
    int64_t decoder_tile(const vs_context & c) const;
};

// Rows of `rel` ([2T-1, T, H]: query i, relative offset m - (T-1)) placed at absolute
// key positions ([T, T, H]) with the pad-and-reshape skew of the reference.
ggml_tensor * relative_to_absolute(ggml_context * g, ggml_tensor * rel) {
    const int64_t T = rel->ne[1], H = rel->ne[2];
    ggml_tensor * x = ggml_pad_ext(g, rel, 0, 1, 0, 0, 0, 0, 0, 0);  // [2T, T, H]
    x               = ggml_reshape_2d(g, x, 2 * T * T, H);
    x               = ggml_pad_ext(g, x, 0, (int) (T - 1), 0, 0, 0, 0, 0, 0);
    x               = ggml_reshape_3d(g, x, 2 * T - 1, T + 1, H);
    x               = ggml_view_3d(g, x, T, T, H, x->nb[1], x->nb[2], (T - 1) * ggml_element_size(x));
    return ggml_cont(g, x);
}

// Inverse of the above for attention weights: [T, T, H] -> [2T-1, T, H].
ggml_tensor * absolute_to_relative(ggml_context * g, ggml_tensor * abs) {
    const int64_t T = abs->ne[1], H = abs->ne[2];
    ggml_tensor * x = ggml_pad_ext(g, abs, 0, (int) (T - 1), 0, 0, 0, 0, 0, 0);  // [2T-1, T, H]
    x               = ggml_reshape_2d(g, x, (2 * T - 1) * T, H);
    x               = ggml_pad_ext(g, x, (int) T, 0, 0, 0, 0, 0, 0, 0);  // [2T*T, H]
    x               = ggml_reshape_3d(g, x, 2 * T, T, H);
    x               = ggml_view_3d(g, x, 2 * T - 1, T, H, x->nb[1], x->nb[2], ggml_element_size(x));
    return ggml_cont(g, x);
}

// Relative embeddings [d, 2w+1] widened (zeros) or cut to the 2T-1 offsets of a sequence.
ggml_tensor * relative_embeddings(ggml_context * g, ggml_tensor * emb, int window, int64_t T) {
    const int64_t d   = emb->ne[0];
    ggml_tensor * e   = ggml_reshape_2d(g, emb, d, emb->ne[1]);
    const int64_t pad = (T - 1) - window;
    if (pad > 0) {
        return ggml_pad_ext(g, e, 0, 0, (int) pad, (int) pad, 0, 0, 0, 0);
    }
    return ggml_cont(g, ggml_view_2d(g, e, d, 2 * T - 1, e->nb[1], (size_t) (-pad) * e->nb[1]));
}

// Over n sentences in slots (x [C, S * n], see packing; kq_mask [S, S, 1, n]) or one (n = 1,
// no mask): each slot is a batch item of the attention.
ggml_tensor * piper_voice::attention(vs_context & c, ggml_context * g, ggml_tensor * x, int il, int64_t n,
                                     ggml_tensor * kq_mask) const {
    const std::string pre = "enc_p.encoder.attn_layers." + std::to_string(il) + ".";
    const int64_t     S = x->ne[1] / n, H = hp_.n_heads, d = hp_.hidden / hp_.n_heads;

    ggml_tensor * q = conv1d(c.graph_opts(), g, x, c.w(pre + "conv_q.weight"), c.w(pre + "conv_q.bias"), 1, 0);
    ggml_tensor * k = conv1d(c.graph_opts(), g, x, c.w(pre + "conv_k.weight"), c.w(pre + "conv_k.bias"), 1, 0);
    ggml_tensor * v = conv1d(c.graph_opts(), g, x, c.w(pre + "conv_v.weight"), c.w(pre + "conv_v.bias"), 1, 0);
    q               = ggml_scale(g, q, 1.0f / std::sqrt((float) d));

    q = ggml_cont(g, ggml_permute(g, ggml_reshape_4d(g, q, d, H, S, n), 0, 2, 1, 3));  // [d, S, H, n]
    k = ggml_cont(g, ggml_permute(g, ggml_reshape_4d(g, k, d, H, S, n), 0, 2, 1, 3));  // [d, S, H, n]
    v = ggml_cont(g, ggml_permute(g, ggml_reshape_4d(g, v, d, H, S, n), 1, 2, 0, 3));  // [S, d, H, n]

    ggml_tensor * scores = ggml_mul_mat(g, k, q);  // [Sk, Sq, H, n]
    ggml_tensor * rel_k  = relative_embeddings(g, c.w(pre + "emb_rel_k"), hp_.window, S);
    // q as one matrix: a matmul broadcasting its 2-D src0 over both outer axes is not
    // every backend's (Vulkan's takes none over the fourth).
    ggml_tensor * rel =
        ggml_reshape_3d(g, ggml_mul_mat(g, rel_k, ggml_reshape_2d(g, q, d, S * H * n)), 2 * S - 1, S, H * n);
    scores             = ggml_add(g, scores, ggml_reshape_4d(g, relative_to_absolute(g, rel), S, S, H, n));
    ggml_tensor * attn = ggml_soft_max_ext(g, scores, kq_mask, 1.0f, 0.0f);
    ggml_set_name(attn, ("attn_weights." + std::to_string(il)).c_str());

    ggml_tensor * out   = ggml_mul_mat(g, v, attn);  // [d, Sq, H, n]
    ggml_tensor * rel_v = relative_embeddings(g, c.w(pre + "emb_rel_v"), hp_.window, S);
    rel_v               = ggml_cont(g, ggml_transpose(g, rel_v));  // [2S-1, d]
    ggml_tensor * a_rel = absolute_to_relative(g, ggml_reshape_3d(g, attn, S, S, H * n));
    out                 = ggml_add(g, out, ggml_reshape_4d(g, ggml_mul_mat(g, rel_v, a_rel), d, S, H, n));
    out = ggml_reshape_2d(g, ggml_cont(g, ggml_permute(g, out, 0, 2, 1, 3)), hp_.hidden, S * n);  // [C, S * n]
    return conv1d(c.graph_opts(), g, out, c.w(pre + "conv_o.weight"), c.w(pre + "conv_o.bias"), 1, 0);
}

void piper_voice::run_encoder(vs_context & c, const std::vector<int32_t> & ids, const packing & pk,
                              std::vector<float> & hidden, std::vector<float> & m_p, std::vector<float> & logs_p) {
    const int64_t T = (int64_t) ids.size(), n = (int64_t) pk.start.size();
    GGML_ASSERT(pk.slot * n == T);
    const bool        packed = pk.packed();
    const std::string key = "encoder " + std::to_string(n) + "x" + std::to_string(pk.slot) + (packed ? " packed" : "");
    vs::stage_graph & sg  = c.stage_graph(VS_STAGE_ENCODER, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * tokens = new_input(g, GGML_TYPE_I32, T);
        ggml_set_name(tokens, "tokens");
        ggml_tensor * mask    = packed ? new_input(g, GGML_TYPE_F32, 1, T) : nullptr;
        ggml_tensor * kq_mask = packed ? new_input(g, GGML_TYPE_F32, pk.slot, pk.slot, 1, n) : nullptr;

        ggml_tensor * x = ggml_get_rows(g, c.w("enc_p.emb.weight"), tokens);  // [C, T]
        x               = ggml_scale(g, x, std::sqrt((float) hp_.hidden));
        const int pad   = hp_.ffn_kernel / 2;
        for (int il = 0; il < hp_.n_layers; ++il) {
            const std::string l = std::to_string(il);
            x                   = layer_norm(g, ggml_add(g, x, attention(c, g, x, il, n, kq_mask)),
                                              c.w("enc_p.encoder.norm_layers_1." + l + ".gamma"),
                                              c.w("enc_p.encoder.norm_layers_1." + l + ".beta"), 1e-5f);
            const std::string f = "enc_p.encoder.ffn_layers." + l + ".";
            ggml_tensor *     y =
                conv1d(c.graph_opts(), g, masked(g, x, mask), c.w(f + "conv_1.weight"), c.w(f + "conv_1.bias"), 1, pad);
            y = conv1d(c.graph_opts(), g, masked(g, ggml_relu(g, y), mask), c.w(f + "conv_2.weight"),
                        c.w(f + "conv_2.bias"), 1, pad);
            x = layer_norm(g, ggml_add(g, x, y), c.w("enc_p.encoder.norm_layers_2." + l + ".gamma"),
                            c.w("enc_p.encoder.norm_layers_2." + l + ".beta"), 1e-5f);
        }
        ggml_set_name(x, "enc_hidden");
        ggml_set_output(x);
        ggml_tensor * stats =
            conv1d(c.graph_opts(), g, x, c.w("enc_p.proj.weight"), c.w("enc_p.proj.bias"), 1, 0);  // [2*inter, T]
        ggml_tensor * m    = channels(g, stats, 0, hp_.inter);
        ggml_tensor * logs = channels(g, stats, hp_.inter, hp_.inter);
        ggml_set_name(m, "m_p");
        ggml_set_name(logs, "logs_p");
        ggml_set_output(m);
        ggml_set_output(logs);
        ggml_build_forward_expand(gf, x);
        ggml_build_forward_expand(gf, m);
        ggml_build_forward_expand(gf, logs);
        return std::vector<ggml_tensor *>{ tokens, mask, kq_mask, x, m, logs };
    });
    set_input(c, sg.t[0], ids);
    if (packed) {
        set_input(c, sg.t[1], pk.mask());
        set_input(c, sg.t[2], pk.key_mask());
    }
    c.compute(sg);
    hidden = get_output<float>(sg.t[3]);
    m_p    = get_output<float>(sg.t[4]);
    logs_p = get_output<float>(sg.t[5]);
}

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

ggml_tensor * piper_voice::wavenet(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & prefix,
                                   ggml_tensor * mask) const {
    ggml_tensor * out      = nullptr;
    int           dilation = 1;
    for (int i = 0; i < hp_.wn_layers; ++i, dilation *= hp_.wn_dilation_rate) {
        const std::string l   = std::to_string(i);
        const int         pad = (hp_.wn_kernel * dilation - dilation) / 2;
        ggml_tensor * x_in = conv1d(c.graph_opts(), g, masked(g, x, mask), c.w(prefix + "in_layers." + l + ".weight"),
                                    c.w(prefix + "in_layers." + l + ".bias"), dilation, pad);  // [2H, T]
        // The gate: tanh of the first half times the sigmoid of the second, each over all of
        // x_in (unary ops take contiguous inputs) and multiplied as views.
        const size_t  half = hp_.hidden * x_in->nb[0];
        ggml_tensor * acts =
            ggml_mul(g, ggml_view_2d(g, ggml_tanh(g, x_in), hp_.hidden, x_in->ne[1], x_in->nb[1], 0),
                     ggml_view_2d(g, ggml_sigmoid(g, x_in), hp_.hidden, x_in->ne[1], x_in->nb[1], half));
        ggml_tensor * rs = conv1d(c.graph_opts(), g, acts, c.w(prefix + "res_skip_layers." + l + ".weight"),
                                  c.w(prefix + "res_skip_layers." + l + ".bias"), 1, 0);
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

// The decoder's residual blocks in the engine's CUDA kernels: on a CUDA device, with every
// residual convolution's weights F16 or F32 (F32 ones are read as F16 copies made once:
// vs_context::weight_as) and its biases F32 on it.
bool piper_voice::fused_decoder(const vs_context & c) const {
    if (fused_ >= 0) {
        return fused_ == 1;
    }
    bool ok = c.cuda_device >= 0 && hp_.res_kernels.size() > 1;
    for (size_t i = 0; ok && i < hp_.ups_rates.size() * hp_.res_kernels.size(); ++i) {
        const int K = hp_.res_kernels[i % hp_.res_kernels.size()];
        for (int cv = 0; ok && cv < hp_.res_convs; ++cv) {
            const std::string   w  = "dec.resblocks." + std::to_string(i) + ".convs." + std::to_string(cv) + ".";
            const ggml_tensor * wt = c.w(w + "weight");
            const ggml_tensor * bt = c.w(w + "bias");
            ok = (wt->type == GGML_TYPE_F16 || wt->type == GGML_TYPE_F32) && bt->type == GGML_TYPE_F32 &&
                 ggml_is_contiguous(wt) && wt->buffer && !ggml_backend_buffer_is_host(wt->buffer) && bt->buffer &&
                 !ggml_backend_buffer_is_host(bt->buffer) && wt->ne[1] == K && wt->ne[0] == wt->ne[2] &&
                 vs::cuda::snake_supported(wt->ne[0], K);
        }
    }
    fused_ = ok ? 1 : 0;
    return ok;
}

// As run_decoder, each upsampling stage's residual blocks in the engine's CUDA kernels
// between graphs: conv_pre (masked) and the first upsampling; each later upsampling; the
// output. They hand activations over in the device scratch:
//   mask[i]  stage i's frames: 1 on the sentences, 0 in the gaps (packed batches only)
//   x, r, s  a stage's upsampled input, a block's copy, and the blocks' mean
//   work     leaky_stack's own
// The blocks leave the gaps holding what their convolutions spill; each graph masks what it
// reads.
std::vector<float> piper_voice::run_decoder_fused(vs_context & c, const std::vector<float> & z, const packing & pk) {
    const int     dev      = c.cuda_device;
    const int64_t F        = pk.total;
    const size_t  n_stages = hp_.ups_rates.size(), n_res = hp_.res_kernels.size();
    auto          dils = [&](size_t j) { return &hp_.res_dilations[j * (size_t) hp_.res_convs]; };

    // The scratch, sized for every stage's channels and frames (with room for the frames
    // each kernel size's GEMMs write).
    vs::scratch_layout   scratch;
    std::vector<int64_t> Cs, Ts;
    std::vector<size_t>  mask_at;
    size_t               stage_bytes = 0, work_bytes = 0;
    for (size_t i = 0; i < n_stages; ++i) {
        const std::string u = "dec.ups." + std::to_string(i) + ".";
        Cs.push_back(c.w(u + "weight")->ne[1]);
        Ts.push_back((i == 0 ? F : Ts.back()) * hp_.ups_rates[i]);
        int64_t frames = Ts[i];
        for (size_t j = 0; j < n_res; ++j) {
            frames     = std::max(frames, vs::cuda::snake_frames(Ts[i], hp_.res_kernels[j], dils(j), hp_.res_convs));
            work_bytes = std::max(
                work_bytes, vs::cuda::leaky_scratch_bytes(Cs[i], Ts[i], hp_.res_kernels[j], dils(j), hp_.res_convs));
        }
        stage_bytes = std::max(stage_bytes, sizeof(float) * (size_t) (Cs[i] * frames));
        mask_at.push_back(pk.packed() ? scratch.reserve(sizeof(float) * (size_t) Ts[i]) : 0);
    }
    const size_t x_at = scratch.reserve(stage_bytes), r_at = scratch.reserve(stage_bytes),
                 s_at     = scratch.reserve(stage_bytes);
    const size_t work_at  = scratch.reserve(work_bytes);
    const size_t lmask_at = pk.packed() ? scratch.reserve(sizeof(float) * (size_t) F) : 0;  // the latent frames'
    // The output layer in a kernel of its own where it takes the last stage's channels.
    const ggml_tensor * post = c.w("dec.conv_post.weight");
    const bool post_kernel   = (post->type == GGML_TYPE_F32 || post->type == GGML_TYPE_F16) && post->ne[2] == 1 &&
                             post->ne[0] == Cs.back() &&
                             vs::cuda::leaky_conv_tanh_supported(Cs.back(), hp_.dec_kernel_post);
    const size_t audio_at = post_kernel ? scratch.reserve(sizeof(float) * (size_t) Ts.back()) : 0;
    auto * const base     = static_cast<uint8_t *>(c.device_scratch(scratch.bytes));
    auto         ptr      = [&](size_t at) { return reinterpret_cast<float *>(base + at); };

    float *            result = nullptr;  // the last stage's mean, in the scratch
    std::vector<float> audio;
    for (size_t i = 0; i <= n_stages; ++i) {
        // Graph i: the previous stage's result (conv_pre's output first), masked, then the
        // next upsampling into x (or, after the last stage, the output).
        auto           gb = c.new_graph();
        ggml_context * g  = gb.ctx.get();
        host_inputs    in;
        // The latent frames' mask goes up once (graph 0) and stays in the scratch; stage i's,
        // each latent frame's value repeated at its rate, is made there by graph i, where
        // the graph, the kernels and the next graph read it.
        auto stage_mask   = [&](size_t k) { return pk.packed() ? c.scratch_tensor(g, mask_at[k], 1, Ts[k]) : nullptr; };
        ggml_tensor *z_in = nullptr, *x, *latent_mask = nullptr;
        if (i == 0) {
            z_in = ggml_new_tensor_2d(g, GGML_TYPE_F32, hp_.inter, F);
            ggml_set_input(z_in);
            if (pk.packed()) {
                latent_mask = ggml_cpy(g, in.add(g, 1, F, pk.mask()), c.scratch_tensor(g, lmask_at, 1, F));
            }
            x = masked(g,
                       conv1d(c.graph_opts(), g, z_in, c.w("dec.conv_pre.weight"), c.w("dec.conv_pre.bias"), 1,
                              hp_.dec_kernel_pre / 2),
                       latent_mask);
        } else {
            latent_mask = pk.packed() ? c.scratch_tensor(g, lmask_at, 1, F) : nullptr;
            x           = masked(g,
                                 c.scratch_tensor(g, (size_t) (reinterpret_cast<uint8_t *>(result) - base), Cs[i - 1], Ts[i - 1]),
                                 stage_mask(i - 1));
        }
        ggml_tensor * out = nullptr;
        if (i < n_stages) {
            const std::string u = "dec.ups." + std::to_string(i) + ".";
            const int         s = hp_.ups_rates[i];
            x = conv_transpose1d(g, ggml_leaky_relu(g, x, 0.1f, false), c.w(u + "weight"), c.w(u + "bias"), s,
                                 (hp_.ups_kernels[i] - s) / 2);
            GGML_ASSERT(x->ne[0] == Cs[i] && x->ne[1] == Ts[i]);
            ggml_tensor * mask = nullptr;
            if (latent_mask) {
                const int64_t rate = Ts[i] / F;
                mask = ggml_cpy(g, ggml_reshape_2d(g, ggml_repeat_4d(g, latent_mask, rate, F, 1, 1), 1, Ts[i]),
                                stage_mask(i));
            }
            ggml_build_forward_expand(gb.gf, ggml_cpy(g, masked(g, x, mask), c.scratch_tensor(g, x_at, Cs[i], Ts[i])));
        } else {
            out = ggml_tanh(g, conv1d(c.graph_opts(), g, ggml_leaky_relu(g, x, 0.01f, false),
                                      c.w("dec.conv_post.weight"), nullptr, 1,
                                      hp_.dec_kernel_post / 2));  // [1, N]
            ggml_set_name(out, "audio");
            ggml_set_output(out);
            ggml_build_forward_expand(gb.gf, out);
        }
        c.alloc(VS_STAGE_DECODER, gb.gf);
        if (z_in) {
            ggml_backend_tensor_set(z_in, z.data(), 0, ggml_nbytes(z_in));
        }
        in.set();
        c.compute(gb.gf);
        if (out) {
            audio.resize((size_t) ggml_nelements(out));
            ggml_backend_tensor_get(out, audio.data(), 0, ggml_nbytes(out));
            return audio;
        }

        // Stage i's residual blocks: the first in s, the middle ones in r, the last in x
        // itself; s becomes their mean.
        const auto    t0 = std::chrono::steady_clock::now();
        const int64_t C = Cs[i], T = Ts[i], n = C * T;
        const float * frames_mask = pk.packed() ? ptr(mask_at[i]) : nullptr;
        for (size_t j = 0; j < n_res; ++j) {
            const bool last = j + 1 == n_res;
            float *    buf  = last ? ptr(x_at) : j == 0 ? ptr(s_at) : ptr(r_at);
            if (!last) {
                vs::cuda::copy(dev, buf, ptr(x_at), sizeof(float) * (size_t) n);
            }
            std::vector<vs::cuda::leaky_conv> cv((size_t) hp_.res_convs);
            for (int k = 0; k < hp_.res_convs; ++k) {
                const std::string w =
                    "dec.resblocks." + std::to_string(i * n_res + j) + ".convs." + std::to_string(k) + ".";
                cv[(size_t) k].w        = c.weight_as(w + "weight", GGML_TYPE_F16)->data;
                cv[(size_t) k].bias     = static_cast<const float *>(c.w(w + "bias")->data);
                cv[(size_t) k].dilation = dils(j)[k];
            }
            vs::cuda::leaky_stack(dev, c.blas(), buf, C, T, hp_.res_kernels[j], cv.data(), hp_.res_convs, 0.1f,
                                  frames_mask, ptr(work_at));
            if (j > 0) {
                vs::cuda::accumulate(dev, ptr(s_at), buf, n, last ? 1.0f / (float) n_res : 1.0f);
            }
        }
        result = ptr(s_at);
        if (post_kernel && i + 1 == n_stages) {
            // The output: LeakyReLU, the mask, conv_post and tanh in one kernel, weights F32.
            const ggml_tensor * w32 = c.weight_as("dec.conv_post.weight", GGML_TYPE_F32);
            vs::cuda::leaky_conv_tanh(dev, result, C, T, hp_.dec_kernel_post, 0.01f, frames_mask,
                                      static_cast<const float *>(w32->data), ptr(audio_at));
            audio.resize((size_t) T);
            vs::cuda::download(dev, audio.data(), ptr(audio_at), sizeof(float) * (size_t) T);
            c.profile_op("residual blocks (engine's CUDA kernels)", vs::ms_since(t0));
            return audio;
        }
        vs::cuda::synchronize(dev);
        c.profile_op("residual blocks (engine's CUDA kernels)", vs::ms_since(t0));
        c.check_abort();
    }
    return audio;
}

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
        x = i == 0 ? conv_transpose1d(g, x, c.w(u + "weight"), c.w(u + "bias"), s, (hp_.ups_kernels[i] - s) / 2, margin,
                                      after)
                   : conv_transpose1d_zero_edges(g, x, c.w(u + "weight"), c.w(u + "bias"), s,
                                                 (hp_.ups_kernels[i] - s) / 2, margin, after);
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
                ggml_tensor *     y = conv1d_window(c.graph_opts(), g, ggml_leaky_relu(g, rb, 0.1f, false),
                                                    margin - same_padding(hp_.res_kernels[j], d), T, c.w(w + "weight"),
                                                    c.w(w + "bias"), d);  // [C, T]
                y                   = masked(g, y, inner);
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
    x = conv1d_window(c.graph_opts(), g, ggml_leaky_relu(g, x, 0.01f, false), margin - hp_.dec_kernel_post / 2, T,
                      c.w("dec.conv_post.weight"), nullptr, 1);
    x = ggml_tanh(g, x);  // [1, N]
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

// Standard normal noise, n values of stream `key` (gaussian_pair: each depends on nothing
// else), so long runs are drawn on several threads, a CUDA device draws them where the
// graph reads them (vs::cuda::gaussian), and a stage that scales its noise by zero draws
// none, changing nothing after it.
void gaussian_fill(uint64_t key, float * out, size_t n, float scale, int n_threads) {
    auto pairs = [&](size_t p0, size_t p1) {
        for (size_t p = p0; p < p1; ++p) {
            float a = 0.0f, b = 0.0f;
            gaussian_pair(key, p, scale, a, b);
            out[2 * p] = a;
            if (2 * p + 1 < n) {
                out[2 * p + 1] = b;
            }
        }
    };
    const size_t n_pairs = (n + 1) / 2;
    const size_t parts   = std::min<size_t>((size_t) std::max(1, n_threads), n_pairs / 16384 + 1);
    if (parts <= 1) {
        pairs(0, n_pairs);
        return;
    }
    std::vector<std::thread> workers;
    const size_t             per = (n_pairs + parts - 1) / parts;
    for (size_t k = 1; k < parts; ++k) {
        workers.emplace_back(pairs, std::min(n_pairs, k * per), std::min(n_pairs, (k + 1) * per));
    }
    pairs(0, std::min(n_pairs, per));
    for (auto & w : workers) {
        w.join();
    }
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

std::vector<std::vector<float>> piper_voice::synthesize_batch(vs_context &                              c,
                                                              const std::vector<std::vector<int32_t>> & ids,
                                                              const vs_synth_params & p, int first_chunk) {
    std::vector<job> jobs(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        jobs[i].ids = ids[i];
        // A sentence's noise depends on the seed and its phonemes, not on where it stands:
        // the same sentence sounds the same alone, in a longer text or in another batch.
        uint64_t key = mix64(p.seed * 0x9E3779B97F4A7C15ull);
        for (int32_t id : ids[i]) {
            key = mix64(key ^ (uint32_t) id);
        }
        jobs[i].key = key;
    }
    // Off the CPU, where a stage costs its kernel launches more than its arithmetic, the
    // sentences share graphs (packing, a slot of the longest one's length each); on the CPU
    // each has its own.
    const int64_t gap = token_gap();
    for (size_t first = 0; first < jobs.size();) {
        size_t  last    = first + 1;
        int64_t longest = (int64_t) jobs[first].ids.size();
        while (c.device_graphs && last < jobs.size()) {
            const int64_t l = std::max(longest, (int64_t) jobs[last].ids.size());
            if ((int64_t) (last + 1 - first) * (l + gap) > PACK_TOKENS) {
                break;
            }
            longest = l;
            ++last;
        }
        run_group(c, jobs, first, last, p, first_chunk);
        first = last;
    }

    std::vector<std::vector<float>> audio;
    for (auto & j : jobs) {
        c.timings.n_phoneme_ids += (int32_t) j.ids.size();
        c.timings.n_frames += (int32_t) j.frame_to_token.size();
        audio.push_back(std::move(j.audio));
    }
    // The named intermediates are the last chunk's.
    job &         j = jobs.back();
    const int64_t T = (int64_t) j.ids.size(), F = (int64_t) j.frame_to_token.size();
    c.set_output("m_p", std::move(j.m_p), T, hp_.inter);
    c.set_output("logs_p", std::move(j.logs_p), T, hp_.inter);
    c.set_output("logw", std::move(j.logw), T, 1);
    c.set_output("z", std::move(j.z), F, hp_.inter);
    return audio;
}

void piper_voice::run_group(vs_context & c, std::vector<job> & jobs, size_t first, size_t last,
                            const vs_synth_params & p, int first_chunk) {
    const float  noise_scale  = p.noise_scale < 0 ? hp_.noise_scale : p.noise_scale;
    const float  length_scale = p.length_scale <= 0 ? hp_.length_scale : p.length_scale;
    const float  noise_w      = p.noise_w < 0 ? hp_.noise_w : p.noise_w;
    const size_t n            = last - first;
    auto         stage        = [&](int id, auto && fn) { c.timed_stage(id, first_chunk + (int) first, p, fn); };

    std::vector<int64_t> lens;
    for (size_t i = first; i < last; ++i) {
        lens.push_back((int64_t) jobs[i].ids.size());
    }
    // Where graphs are kept by their shapes (on CUDA), lengths are rounded up so that other
    // sentences of about the same lengths run the same graphs.
    const bool           bucketed = c.rounds_shapes();
    const packing        tok(lens, token_gap(), true, bucketed);
    std::vector<int32_t> ids((size_t) tok.total, hp_.phoneme_ids.at(U'_'));  // the gaps' tokens are masked
    for (size_t i = 0; i < n; ++i) {
        std::copy(jobs[first + i].ids.begin(), jobs[first + i].ids.end(), ids.begin() + tok.start[i]);
    }

    std::vector<float> hidden, m_p, logs_p;
    stage(VS_STAGE_ENCODER, [&] { run_encoder(c, ids, tok, hidden, m_p, logs_p); });
    stage(VS_STAGE_DURATION, [&] {
        std::vector<float> noise((size_t) (2 * tok.total), 0.0f);  // [T, 2]: a row a channel
        for (size_t i = 0; noise_w != 0.0f && i < n; ++i) {
            for (int64_t ch = 0; ch < 2; ++ch) {
                gaussian_fill(mix64(jobs[first + i].key ^ (uint64_t) (1 + ch)),
                              noise.data() + ch * tok.total + tok.start[i], (size_t) tok.len[i], noise_w, 1);
            }
        }
        const std::vector<float> logw = run_duration(c, hidden, tok, noise);
        for (size_t i = 0; i < n; ++i) {
            job & j = jobs[first + i];
            j.logw  = tok.slice(logw, 1, i);
            for (int64_t t = 0; t < tok.len[i]; ++t) {
                const int frames = (int) std::ceil(std::exp(j.logw[t]) * length_scale);
                for (int k = 0; k < frames; ++k) {
                    j.frame_to_token.push_back((int32_t) t);
                }
            }
            if (j.frame_to_token.empty()) {
                j.frame_to_token.push_back(0);  // the reference clamps the length to one frame
            }
        }
    });
    stage(VS_STAGE_FLOW, [&] {
        const int64_t        C = hp_.inter;
        std::vector<int64_t> frames_of;
        for (size_t i = first; i < last; ++i) {
            frames_of.push_back((int64_t) jobs[i].frame_to_token.size());
        }
        const packing           frm(frames_of, flow_gap(), false, bucketed);
        std::vector<int32_t>    frame_to_token((size_t) frm.total, 0);  // gap frames are masked
        std::vector<noise_span> eps;
        for (size_t i = 0; i < n; ++i) {
            const job & j = jobs[first + i];
            for (int64_t f = 0; f < frm.len[i]; ++f) {
                frame_to_token[frm.start[i] + f] = (int32_t) tok.start[i] + j.frame_to_token[f];
            }
            if (noise_scale != 0.0f) {  // else z is the means: no noise to draw
                eps.push_back({ mix64(j.key ^ 3u), frm.start[i] * C, C * frm.len[i] });
            }
        }
        const std::vector<float> z = run_flow(c, m_p, logs_p, frame_to_token, eps, noise_scale, tok.total, frm);
        for (size_t i = 0; i < n; ++i) {
            jobs[first + i].z = frm.slice(z, C, i);
        }
    });
    if (last == jobs.size()) {  // the named intermediates are the last chunk's
        jobs.back().m_p    = tok.slice(m_p, hp_.inter, n - 1);
        jobs.back().logs_p = tok.slice(logs_p, hp_.inter, n - 1);
    }
    const int64_t tile = p.decoder_tile_frames != 0 ? p.decoder_tile_frames : decoder_tile(c);
    stage(VS_STAGE_DECODER, [&] { decode(c, jobs, first, last, tile); });
}

// Sentences that fit a tile share one (packed); a longer one goes alone, in tiles.
void piper_voice::decode(vs_context & c, std::vector<job> & jobs, size_t first, size_t last, int64_t tile) {
    const int64_t C = hp_.inter, gap = decoder_gap(), hop = decoder_hop();
    auto          frames = [&](size_t i) { return (int64_t) jobs[i].frame_to_token.size(); };
    for (size_t a = first; a < last;) {
        c.check_abort();
        if (tile >= 0 && frames(a) > tile) {
            jobs[a].audio = run_decoder_tiled(c, jobs[a].z, frames(a), tile);
            ++a;
            continue;
        }
        size_t  b     = a + 1;
        int64_t total = frames(a);
        while (b < last && (tile < 0 || total + gap + frames(b) <= tile)) {
            total += gap + frames(b++);
        }
        std::vector<int64_t> lens;
        for (size_t i = a; i < b; ++i) {
            lens.push_back(frames(i));
        }
        const packing      pk(lens, gap);
        std::vector<float> z((size_t) (C * pk.total), 0.0f);
        for (size_t i = a; i < b; ++i) {
            std::copy(jobs[i].z.begin(), jobs[i].z.end(), z.begin() + pk.start[i - a] * C);
        }
        const std::vector<float> audio = run_decoder(c, z, pk);
        for (size_t i = a; i < b; ++i) {
            jobs[i].audio.assign(audio.begin() + pk.start[i - a] * hop,
                                 audio.begin() + (pk.start[i - a] + pk.len[i - a]) * hop);
        }
        a = b;
    }
}

}  // namespace

void piper_validate(const vs_model & model) {
    check_tensors(model, piper_layout(model, read_hparams(model)));
}

std::unique_ptr<voice> make_piper_voice(vs_model & model) {
    return std::make_unique<piper_voice>(model);
}

}  // namespace vs
