// Piper voices: VITS (text encoder with relative-position attention, stochastic
// duration predictor, residual-coupling flow, HiFi-GAN decoder).
//
// Each stage is its own graph. Durations are rounded on the host between the
// duration and flow stages (the frame count decides the later graphs' shapes);
// everything else is ggml ops on the context's device. Off the CPU a batch's sentences
// share each stage's graph (packing).
//
// This folder: encoder.cpp, duration.cpp, flow.cpp, decoder.cpp (ggml graphs) and
// decoder_fused.cpp (its residual blocks in the engine's CUDA kernels), and voice.cpp (the
// hyperparameters, the noise, a batch's way through the stages). This header holds what they share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "../../graph/graph.h"
#include "../../vs-context.h"
#include "../../vs-cuda.h"

namespace vs::piper {

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
// n values of noise stream `key` at float `at` of a tensor.
struct noise_span {
    uint64_t key = 0;
    int64_t  at = 0, n = 0;
};

// Sentences laid end to end along time with at least `gap` frames between neighbours, so
// that a batch runs as one graph. Every convolution of a packed graph reads its input
// masked (zero outside the sentences) and each gap is at least as wide as that
// convolution's padding, so a sentence sees the zeros it sees alone. With `slots`, each
// sentence starts a slot of the longest one's length plus the gap: [C, total] is then
// [C, slot, n], which the encoder's attention takes as a batch. One sentence is laid out
// as itself: no gaps, no masks. `bucketed` rounds the slot (or the total) up to its
// shape_bucket, so that graphs kept by their shapes serve other sentences too: the frames
// added at the end are masked as gaps are.
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
// Host-side constants of the spline: cumulative sum, difference, end-point masks.
struct spline_consts {
    ggml_tensor * cumsum;  // [bins, bins+1]: out[j] = sum_{k<j} in[k]
    ggml_tensor * diff;    // [bins+1, bins]: out[k] = in[k+1] - in[k]
    ggml_tensor * ends;    // [bins+1]: 1 at both ends
    ggml_tensor * last;    // [bins+1]: 1 at the last knot
};

// An input of a stage graph, set after allocation (set_input).
ggml_tensor * new_input(ggml_context * g, ggml_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                        int64_t ne3 = 1);

// x with the frames outside the sentences zeroed (x itself where nothing is packed).
ggml_tensor * masked(ggml_context * g, ggml_tensor * x, ggml_tensor * mask);

// The hyperparameters, each checked against what the graphs below can build (any value
// outside would divide by zero, assert in ggml, or ask for a graph the size of the file's
// whim): VS_ERR_FORMAT naming the key otherwise.
piper_hparams read_hparams(const vs_model & m);

// Every tensor the graphs read, in the shape the hyperparameters give it (ggml's ne order:
// a convolution [IC, K, OC], a transposed one [IC, OC, K]); the text encoder's and the
// duration predictor's stay F32, as the converter writes them.
std::vector<tensor_spec> piper_layout(const vs_model & m, const piper_hparams & h);

// Standard normal noise, n values of stream `key` (gaussian_pair: each depends on nothing
// else), so long runs are drawn on several threads, a CUDA device draws them where the
// graph reads them (vs::cuda::gaussian), and a stage that scales its noise by zero draws
// none, changing nothing after it.
void gaussian_fill(uint64_t key, float * out, size_t n, float scale, int n_threads);

// Rows of `rel` ([2T-1, T, H]: query i, relative offset m - (T-1)) placed at absolute
// key positions ([T, T, H]) with the pad-and-reshape skew of the reference.
ggml_tensor * relative_to_absolute(ggml_context * g, ggml_tensor * rel);

// Inverse of the above for attention weights: [T, T, H] -> [2T-1, T, H].
ggml_tensor * absolute_to_relative(ggml_context * g, ggml_tensor * abs);

// Relative embeddings [d, 2w+1] widened (zeros) or cut to the 2T-1 offsets of a sequence.
ggml_tensor * relative_embeddings(ggml_context * g, ggml_tensor * emb, int window, int64_t T);

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

}  // namespace vs::piper
