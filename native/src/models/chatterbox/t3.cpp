// T3, Chatterbox's token model: conditioning (the speaker embedding's projection, the prompt's
// speech tokens), text tokens and speech tokens as one sequence through a GPT-2 backbone with
// a key/value cache, the speech head's logits drawn from one token at a time.
#include <cmath>
#include <cstring>
#include <numeric>

#include "../../graph/graph.h"
#include "chatterbox.h"

namespace vs::chatterbox {

t3_hparams read_t3_hparams(const vs_model & m) {
    t3_hparams h;
    h.variant = m.strings.count("chatterbox.variant") ? m.strings.at("chatterbox.variant") : "";
    if (h.variant != "turbo" && h.variant != "multilingual") {
        m.bad("metadata 'chatterbox.variant' is '" + h.variant + "'; this engine runs: turbo, multilingual");
    }
    h.backbone = m.strings.count("chatterbox.t3.backbone") ? m.strings.at("chatterbox.t3.backbone") : "";
    if (h.backbone != "gpt2" && h.backbone != "llama") {
        m.bad("metadata 'chatterbox.t3.backbone' is '" + h.backbone + "'; this engine runs: gpt2, llama");
    }
    const std::string k  = "chatterbox.t3.";
    h.n_layer            = m.u32_in(k + "n_layer", 1, 256);
    h.n_embd             = m.u32_in(k + "n_embd", 64, 16384);
    h.n_head             = m.u32_in(k + "n_head", 1, 256);
    h.n_positions        = m.u32_in(k + "n_positions", 16, 1 << 20);
    h.text_vocab         = m.u32_in(k + "text_vocab", 2, 1 << 20);
    h.speech_vocab       = m.u32_in(k + "speech_vocab", 2, 1 << 20);
    h.start_speech       = m.u32_in(k + "start_speech", 0, (int) h.speech_vocab - 1);
    h.stop_speech        = m.u32_in(k + "stop_speech", 0, (int) h.speech_vocab - 1);
    h.speaker_embed_size = m.u32_in(k + "speaker_embed_size", 1, 4096);
    h.prompt_tokens      = m.u32_in(k + "prompt_tokens", 0, (int) h.n_positions / 2);
    h.norm_eps           = m.f32_in(k + "norm_eps", 0.0f, 1.0f);
    if (h.n_embd % h.n_head) {
        m.bad("metadata 'chatterbox.t3.n_head' (" + std::to_string(h.n_head) + ") does not divide the width " +
              std::to_string(h.n_embd));
    }
    if (h.llama()) {
        h.ffn               = m.u32_in(k + "ffn", 1, 1 << 17);
        h.text_positions    = m.u32_in(k + "text_positions", 3, 1 << 20);
        h.speech_positions  = m.u32_in(k + "speech_positions", 2, 1 << 20);
        h.start_text        = m.u32_in(k + "start_text", 0, (int) h.text_vocab - 1);
        h.stop_text         = m.u32_in(k + "stop_text", 0, (int) h.text_vocab - 1);
        h.perceiver_queries = m.u32_in(k + "perceiver_queries", 1, 4096);
        h.perceiver_heads   = m.u32_in(k + "perceiver_heads", 1, 256);
        h.rope_base         = m.f32_in(k + "rope_base", 1.0f, 1e9f);
        h.alignment_heads   = m.i32_array_in(k + "alignment_heads", 0, 64, 0, 255);
        if (h.alignment_heads.size() % 2) {
            m.bad("metadata 'chatterbox.t3.alignment_heads' holds (layer, head) pairs");
        }
        for (size_t i = 0; i < h.alignment_heads.size(); i += 2) {
            if (h.alignment_heads[i] >= h.n_layer || h.alignment_heads[i + 1] >= h.n_head) {
                m.bad("metadata 'chatterbox.t3.alignment_heads' names a head the model lacks");
            }
        }
        if (h.n_embd % h.perceiver_heads || (h.n_embd / h.n_head) % 2) {
            m.bad("metadata 'chatterbox.t3.perceiver_heads' or 'n_head' do not divide the width into even heads");
        }
        if (h.prompt_tokens > h.speech_positions) {
            m.bad("metadata 'chatterbox.t3.prompt_tokens' passes the speech positions");
        }
    }
    // The variant's sampling defaults.
    const std::string d = k + "default.";
    if (m.has(d + "temperature")) {
        h.temperature        = m.f32_in(d + "temperature", 0.0f, 10.0f);
        h.top_p              = m.f32_in(d + "top_p", 0.0f, 1.0f);
        h.min_p              = m.f32_in(d + "min_p", 0.0f, 1.0f);
        h.repetition_penalty = m.f32_in(d + "repetition_penalty", 1e-3f, 100.0f);
        h.top_k              = m.u32_in(d + "top_k", 0, 1 << 20);
        h.cfg_weight         = m.f32_in(d + "cfg_weight", 0.0f, 100.0f);
        h.exaggeration       = m.f32_in(d + "exaggeration", 0.0f, 100.0f);
    }
    return h;
}

std::vector<tensor_spec> t3_layout(const t3_hparams & h) {
    const int64_t C = h.n_embd;
    if (h.llama()) {
        const int64_t            F = h.ffn;
        std::vector<tensor_spec> s = {
            { "t3.text_emb", { C, h.text_vocab, 1, 1 }, true },
            { "t3.speech_emb", { C, h.speech_vocab, 1, 1 }, true },
            { "t3.text_pos_emb", { C, h.text_positions, 1, 1 }, true },
            { "t3.speech_pos_emb", { C, h.speech_positions, 1, 1 }, true },
            { "t3.rope_freqs", { C / h.n_head / 2, 1, 1, 1 }, false },
            { "t3.out_norm.weight", { C, 1, 1, 1 }, false },
            { "t3.speech_head.weight", { C, h.speech_vocab, 1, 1 }, true },
            { "t3.spkr_enc.weight", { h.speaker_embed_size, C, 1, 1 }, true },
            { "t3.spkr_enc.bias", { C, 1, 1, 1 }, false },
            { "t3.emotion.weight", { C, 1, 1, 1 }, false },
            { "t3.perceiver.query", { C, h.perceiver_queries, 1, 1 }, false },
            { "t3.perceiver.norm.weight", { C, 1, 1, 1 }, false },
            { "t3.perceiver.norm.bias", { C, 1, 1, 1 }, false },
        };
        for (const char * x : { "q", "k", "v", "out" }) {
            s.push_back({ std::string("t3.perceiver.attn_") + x + ".weight", { C, C, 1, 1 }, true });
            s.push_back({ std::string("t3.perceiver.attn_") + x + ".bias", { C, 1, 1, 1 }, false });
        }
        for (int64_t i = 0; i < h.n_layer; ++i) {
            const std::string p = "t3.blk." + std::to_string(i) + ".";
            s.push_back({ p + "attn_norm.weight", { C, 1, 1, 1 }, false });
            s.push_back({ p + "attn_qkv.weight", { C, 3 * C, 1, 1 }, true });
            s.push_back({ p + "attn_out.weight", { C, C, 1, 1 }, true });
            s.push_back({ p + "ffn_norm.weight", { C, 1, 1, 1 }, false });
            s.push_back({ p + "ffn_gate.weight", { C, F, 1, 1 }, true });
            s.push_back({ p + "ffn_up.weight", { C, F, 1, 1 }, true });
            s.push_back({ p + "ffn_down.weight", { F, C, 1, 1 }, true });
        }
        return s;
    }
    std::vector<tensor_spec> s = {
        { "t3.pos_emb", { C, h.n_positions, 1, 1 }, true },
        { "t3.text_emb", { C, h.text_vocab, 1, 1 }, true },
        { "t3.speech_emb", { C, h.speech_vocab, 1, 1 }, true },
        { "t3.out_norm.weight", { C, 1, 1, 1 }, false },
        { "t3.out_norm.bias", { C, 1, 1, 1 }, false },
        { "t3.speech_head.weight", { C, h.speech_vocab, 1, 1 }, true },
        { "t3.speech_head.bias", { h.speech_vocab, 1, 1, 1 }, false },
        { "t3.spkr_enc.weight", { h.speaker_embed_size, C, 1, 1 }, true },
        { "t3.spkr_enc.bias", { C, 1, 1, 1 }, false },
    };
    for (int64_t i = 0; i < h.n_layer; ++i) {
        const std::string p = "t3.blk." + std::to_string(i) + ".";
        for (const char * norm : { "attn_norm", "ffn_norm" }) {
            s.push_back({ p + norm + ".weight", { C, 1, 1, 1 }, false });
            s.push_back({ p + norm + ".bias", { C, 1, 1, 1 }, false });
        }
        s.push_back({ p + "attn_qkv.weight", { C, 3 * C, 1, 1 }, true });
        s.push_back({ p + "attn_qkv.bias", { 3 * C, 1, 1, 1 }, false });
        s.push_back({ p + "attn_out.weight", { C, C, 1, 1 }, true });
        s.push_back({ p + "attn_out.bias", { C, 1, 1, 1 }, false });
        s.push_back({ p + "ffn_up.weight", { C, 4 * C, 1, 1 }, true });
        s.push_back({ p + "ffn_up.bias", { 4 * C, 1, 1, 1 }, false });
        s.push_back({ p + "ffn_down.weight", { 4 * C, C, 1, 1 }, true });
        s.push_back({ p + "ffn_down.bias", { C, 1, 1, 1 }, false });
    }
    return s;
}

void t3_state::reserve(vs_context & c, int64_t n_ctx, int64_t batch) {
    if (n_ctx <= n_ctx_ && batch <= batch_) {
        return;
    }
    // Grown in steps of 256 positions, so that a run of sentences settles on one cache.
    n_ctx = std::max((n_ctx + 255) / 256 * 256, n_ctx_);
    batch = std::max(batch, batch_);
    cache_buf_.reset();
    cond_key_ = 0;
    k_.clear();
    v_.clear();
    ggml_init_params ip{ ggml_tensor_overhead() * (size_t) (2 * h_.n_layer * batch + 1), nullptr, true };
    cache_ctx_.reset(ggml_init(ip));
    for (int64_t i = 0; i < h_.n_layer * batch; ++i) {
        k_.push_back(ggml_new_tensor_2d(cache_ctx_.get(), GGML_TYPE_F32, h_.n_embd, n_ctx));
        v_.push_back(ggml_new_tensor_2d(cache_ctx_.get(), GGML_TYPE_F32, n_ctx, h_.n_embd));
        ggml_format_name(k_.back(), "t3_cache_k-%d", (int) i);
        ggml_format_name(v_.back(), "t3_cache_v-%d", (int) i);
    }
    cache_buf_.reset(ggml_backend_alloc_ctx_tensors(cache_ctx_.get(), c.backend.get()));
    if (!cache_buf_) {
        throw error(VS_ERR_COMPUTE, "no room on " + c.device + " for the token model's cache of " +
                                        std::to_string(n_ctx) + " positions");
    }
    // Zeros, so that the positions a step's attention masks off hold no NaN its weights of 0 would keep.
    ggml_backend_buffer_clear(cache_buf_.get(), 0);
    ++cache_gen_;  // graphs kept for the last cache are not this one's
    n_ctx_ = n_ctx;
    batch_ = batch;
}

namespace {

// Multilingual's perceiver resampler (T3CondEnc.perceiver): its learned queries attend to the
// prompt's embeddings, then to themselves, through one attention block whose LayerNorm is
// shared by queries and keys: x1 + out(attend(q(norm x1), k(norm x2), v(norm x2))).
ggml_tensor * perceiver(vs_context & c, ggml_context * g, const t3_hparams & h, ggml_tensor * prompt) {
    const float scale = 1.0f / std::sqrt((float) (h.n_embd / h.perceiver_heads));
    auto        block = [&](ggml_tensor * x1, ggml_tensor * x2) {
        auto norm = [&](ggml_tensor * x) {
            return layer_norm(g, x, c.w("t3.perceiver.norm.weight"), c.w("t3.perceiver.norm.bias"), 1e-5f);
        };
        ggml_tensor * n1 = norm(x1);
        ggml_tensor * n2 = x1 == x2 ? n1 : norm(x2);
        ggml_tensor * o =
            self_attention(g, linear(c, g, n1, "t3.perceiver.attn_q"), linear(c, g, n2, "t3.perceiver.attn_k"),
                                  linear(c, g, n2, "t3.perceiver.attn_v"), h.perceiver_heads, scale, false);
        return ggml_add(g, x1, linear(c, g, o, "t3.perceiver.attn_out"));
    };
    ggml_tensor * pre = block(c.w("t3.perceiver.query"), prompt);
    return named(block(pre, pre), "t3_cond_perceiver");  // [C, queries]
}

// A block's input norm and its query, key and value projection [3C, n] of x [C, n].
ggml_tensor * attn_input(vs_context & c, ggml_context * g, const t3_hparams & h, ggml_tensor * x,
                         const std::string & p) {
    ggml_tensor * a = h.llama() ? ggml_mul(g, ggml_rms_norm(g, x, h.norm_eps), c.w(p + "attn_norm.weight"))
                                : layer_norm(g, x, c.w(p + "attn_norm.weight"), c.w(p + "attn_norm.bias"), h.norm_eps);
    return linear(c, g, a, p + "attn_qkv", !h.llama());
}

// The rest of block `il` after its attention `o`: the output projection added to x, then the
// feed-forward (Llama's gated SiLU, GPT-2's GELU) added.
ggml_tensor * block_rest(vs_context & c, ggml_context * g, const t3_hparams & h, ggml_tensor * x, ggml_tensor * o,
                         const std::string & p, int64_t il) {
    const bool llama = h.llama();
    x                = named(ggml_add(g, x, linear(c, g, o, p + "attn_out", !llama)), "t3_attn_out", (int) il);
    if (llama) {
        ggml_tensor * f = ggml_mul(g, ggml_rms_norm(g, x, h.norm_eps), c.w(p + "ffn_norm.weight"));
        f = ggml_mul(g, ggml_silu(g, linear(c, g, f, p + "ffn_gate", false)), linear(c, g, f, p + "ffn_up", false));
        return named(ggml_add(g, x, linear(c, g, f, p + "ffn_down", false)), "t3_layer", (int) il);
    }
    const graph_options gelu_on{ ggml_backend_dev_type(c.dev) == GGML_BACKEND_DEVICE_TYPE_CPU, c.limits };
    ggml_tensor *       f = layer_norm(g, x, c.w(p + "ffn_norm.weight"), c.w(p + "ffn_norm.bias"), h.norm_eps);
    f                     = linear(c, g, gelu_tanh(gelu_on, g, linear(c, g, f, p + "ffn_up")), p + "ffn_down");
    return named(ggml_add(g, x, f), "t3_layer", (int) il);  // [C, n]
}

// The output norm and the speech head: logits [Vs, n] of x [C, n].
ggml_tensor * speech_logits(vs_context & c, ggml_context * g, const t3_hparams & h, ggml_tensor * x) {
    x = h.llama() ? ggml_mul(g, ggml_rms_norm(g, x, h.norm_eps), c.w("t3.out_norm.weight"))
                  : layer_norm(g, x, c.w("t3.out_norm.weight"), c.w("t3.out_norm.bias"), h.norm_eps);
    return named(linear(c, g, x, "t3.speech_head", !h.llama()), "t3_logits");
}

}  // namespace

t3_state::step_out t3_state::forward(vs_context & c, int64_t pos, const std::vector<int32_t> & text,
                                     const std::vector<int32_t> & speech, const float * speaker,
                                     const std::vector<int32_t> & prompt, int64_t n_logits,
                                     const std::vector<int32_t> & speech_pos, float emotion, int64_t batch,
                                     int64_t n_text, int64_t n_align, int64_t slot0) {
    const bool     llama  = h_.llama();
    const int64_t  C      = h_.n_embd;
    const int64_t  n_cond = speaker ? h_.n_cond((int64_t) prompt.size()) : 0;
    const int64_t  n      = n_cond + (int64_t) text.size() + (int64_t) speech.size();
    auto           gb     = c.new_graph((size_t) (h_.n_layer * (80 + 40 * batch) + 256));
    ggml_context * g      = gb.ctx.get();
    ggml_cgraph *  gf     = gb.gf;

    // The sequence's embeddings [C, n]: conditioning, text, speech, each part present or not.
    std::vector<std::pair<ggml_tensor *, const void *>> inputs;
    std::vector<std::vector<int32_t>>                   ranges;  // kept alive until the inputs are set
    auto                                                input_ids = [&](const std::vector<int32_t> & ids) {
        ggml_tensor * t = ggml_new_tensor_1d(g, GGML_TYPE_I32, (int64_t) ids.size());
        ggml_set_input(t);
        inputs.push_back({ t, ids.data() });
        return t;
    };
    auto range = [&](int64_t from, int64_t count) -> const std::vector<int32_t> & {
        ranges.emplace_back((size_t) count);
        for (int64_t i = 0; i < count; ++i) {
            ranges.back()[(size_t) i] = (int32_t) (from + i);
        }
        return ranges.back();
    };
    ranges.reserve(16);
    std::vector<ggml_tensor *> cond;
    std::vector<float>         emotion_in{ emotion };
    if (speaker) {
        ggml_tensor * spk = ggml_new_tensor_2d(g, GGML_TYPE_F32, h_.speaker_embed_size, 1);
        ggml_set_input(spk);
        inputs.push_back({ spk, speaker });
        cond.push_back(named(linear(c, g, spk, "t3.spkr_enc"), "t3_cond_speaker"));  // [C, 1]
        if (!prompt.empty()) {
            ggml_tensor * e = ggml_get_rows(g, c.w("t3.speech_emb"), input_ids(prompt));  // [C, P]
            if (llama) {
                e = ggml_add(g, e,
                             ggml_get_rows(g, c.w("t3.speech_pos_emb"), input_ids(range(0, (int64_t) prompt.size()))));
                e = perceiver(c, g, h_, e);
            }
            cond.push_back(e);
        }
        if (llama) {  // the emotion projection of the exaggeration
            ggml_tensor * x = ggml_new_tensor_1d(g, GGML_TYPE_F32, 1);
            ggml_set_input(x);
            inputs.push_back({ x, emotion_in.data() });
            cond.push_back(ggml_reshape_2d(g, ggml_mul(g, c.w("t3.emotion.weight"), x), C, 1));
        }
    }
    // Text and speech the same in each sequence, except that guidance's unconditional sequence
    // (the second) has no text, only its positions.
    ggml_tensor *text_e = nullptr, *text_pos = nullptr, *speech_e = nullptr;
    if (!text.empty()) {
        text_e = ggml_get_rows(g, c.w("t3.text_emb"), input_ids(text));
        if (llama) {
            text_pos = ggml_get_rows(g, c.w("t3.text_pos_emb"), input_ids(range(0, (int64_t) text.size())));
            text_e   = ggml_add(g, text_e, text_pos);
        }
    }
    if (!speech.empty()) {
        speech_e = ggml_get_rows(g, c.w("t3.speech_emb"), input_ids(speech));
        if (llama) {
            speech_e = ggml_add(g, speech_e, ggml_get_rows(g, c.w("t3.speech_pos_emb"), input_ids(speech_pos)));
        }
    }
    std::vector<ggml_tensor *> rows;
    for (int64_t b = 0; b < batch; ++b) {
        std::vector<ggml_tensor *> parts = cond;
        if (text_e) {
            parts.push_back(b == 0 ? text_e : text_pos);
        }
        if (speech_e) {
            parts.push_back(speech_e);
        }
        rows.push_back(concat_all(g, parts, 1));
    }
    ggml_tensor * x = concat_all(g, rows, 1);  // [C, n * batch], the sequences in turn
    if (!llama) {
        x = ggml_add(g, x, ggml_get_rows(g, c.w("t3.pos_emb"), input_ids(range(pos, n))));
    }
    x = named(x, "t3_embd");

    // Causal mask [pos + n, n] for more than one new position.
    std::vector<float> mask;
    ggml_tensor *      kq_mask = nullptr;
    if (n > 1) {
        const int64_t n_kv = pos + n;
        mask.assign((size_t) (n_kv * n), 0.0f);
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = pos + i + 1; j < n_kv; ++j) {
                mask[(size_t) (i * n_kv + j)] = -INFINITY;
            }
        }
        kq_mask = ggml_new_tensor_2d(g, GGML_TYPE_F32, n_kv, n);
        ggml_set_input(kq_mask);
        inputs.push_back({ kq_mask, mask.data() });
    }
    ggml_tensor * rope_pos = llama ? input_ids(range(pos, n)) : nullptr;

    const int64_t d     = C / h_.n_head;
    const float   scale = 1.0f / std::sqrt((float) d);
    ggml_tensor * align = nullptr;
    for (int64_t il = 0; il < h_.n_layer; ++il) {
        const std::string p   = "t3.blk." + std::to_string(il) + ".";
        ggml_tensor *     qkv = attn_input(c, g, h_, x, p);  // [3C, n * batch]
        const size_t      es  = ggml_element_size(qkv);
        ggml_tensor *     q = nullptr, *k = nullptr;
        if (llama) {  // rotary positions on each head's halves (Hugging Face's rotate_half)
            auto rope = [&](int i) {
                ggml_tensor * t = ggml_view_4d(g, qkv, d, h_.n_head, n, batch, d * es, qkv->nb[1], n * qkv->nb[1],
                                               (size_t) i * C * es);
                return ggml_rope_ext(g, t, rope_pos, c.w("t3.rope_freqs"), (int) d, GGML_ROPE_TYPE_NEOX, 0,
                                     h_.rope_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);  // [d, h, n, batch]
            };
            q = rope(0);
            k = rope(1);
        }
        std::vector<ggml_tensor *> outs;
        for (int64_t b = 0; b < batch; ++b) {
            auto part = [&](int i) {
                return ggml_view_2d(g, qkv, C, n, qkv->nb[1], (size_t) b * n * qkv->nb[1] + (size_t) i * C * es);
            };
            auto seq = [&](ggml_tensor * t) { return ggml_view_2d(g, t, C, n, t->nb[2], (size_t) b * t->nb[3]); };
            ggml_tensor * scores = nullptr;
            const size_t  slot   = (size_t) (il * batch_ + slot0 + b);
            outs.push_back(cached_attention(g, gf, llama ? seq(q) : part(0), llama ? seq(k) : part(1), part(2),
                                            k_[slot], v_[slot], pos, h_.n_head, kq_mask, scale, &scores));
            // The alignment heads' attention of the last n_align positions over the text (the
            // conditional sequence's).
            for (size_t i = 0; llama && b == 0 && n_text > 0 && i < h_.alignment_heads.size(); i += 2) {
                if (h_.alignment_heads[i] != il) {
                    continue;
                }
                ggml_tensor * row = ggml_view_2d(g, scores, n_text, n_align, scores->nb[1],
                                                 (size_t) (n - n_align) * scores->nb[1] +
                                                     (size_t) h_.alignment_heads[i + 1] * scores->nb[2] +
                                                     (size_t) text_at_ * scores->nb[0]);
                align             = align ? ggml_add(g, align, row) : ggml_cont(g, row);
            }
        }
        x = block_rest(c, g, h_, x, concat_all(g, outs, 1), p, il);  // [C, n * batch]
    }
    std::vector<ggml_tensor *> last;
    for (int64_t b = 0; b < batch; ++b) {
        last.push_back(ggml_view_2d(g, x, C, n_logits, x->nb[1], (size_t) (b * n + n - n_logits) * x->nb[1]));
    }
    ggml_tensor * logits = speech_logits(c, g, h_, concat_all(g, last, 1));  // [Vs, n_logits * batch]
    ggml_set_output(logits);
    ggml_build_forward_expand(gf, logits);
    if (align) {
        align = ggml_scale(g, align, 2.0f / (float) h_.alignment_heads.size());  // their mean
        ggml_set_output(align);
        ggml_build_forward_expand(gf, align);
    }
    c.alloc(VS_STAGE_TOKENS, gf);
    for (const auto & [t, data] : inputs) {
        c.set_input(t, data);
    }
    c.compute(gf);
    step_out out;
    out.logits.resize((size_t) ggml_nelements(logits));
    ggml_backend_tensor_get(logits, out.logits.data(), 0, ggml_nbytes(logits));
    if (align) {
        out.align.resize((size_t) ggml_nelements(align));
        ggml_backend_tensor_get(align, out.align.data(), 0, ggml_nbytes(align));
    }
    return out;
}

void alignment_guard::step(std::vector<float> rows, int32_t last, std::vector<float> & logits) {
    const int64_t S = S_;
    for (size_t r = 0; r < rows.size(); r += (size_t) S) {
        for (int64_t j = frame_ + 1; j < S; ++j) {  // no further along the text than one token a frame
            rows[r + (size_t) j] = 0.0f;
        }
    }
    a_.insert(a_.end(), rows.begin(), rows.end());
    const int64_t T   = (int64_t) (a_.size() / (size_t) S);
    auto          at  = [&](int64_t t, int64_t s) { return a_[(size_t) (t * S + s)]; };
    const auto    row = a_.end() - S;  // the newest
    const int64_t cur = (int64_t) (std::max_element(row, a_.end()) - row);
    if (-4 < cur - text_pos_ && cur - text_pos_ < 7) {  // else a discontinuity: the position stays
        text_pos_ = cur;
    }
    // A false start: attention far down the text in the last frames, or none yet on its start.
    float tail = 0.0f, head = 0.0f;
    for (int64_t t = std::max<int64_t>(T - 2, 0); t < T; ++t) {
        for (int64_t s = std::max<int64_t>(S - 2, 0); s < S; ++s) {
            tail = std::max(tail, at(t, s));
        }
    }
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t s = 0; s < std::min<int64_t>(S, 4); ++s) {
            head = std::max(head, at(t, s));
        }
    }
    const bool false_start = !started_ && (tail > 0.1f || head < 0.5f);
    started_               = !false_start;
    if (started_ && started_at_ < 0) {
        started_at_ = T;
    }
    complete_ = complete_ || text_pos_ >= S - 3;
    if (complete_ && completed_at_ < 0) {
        completed_at_ = T;
    }
    bool long_tail = false, repetition = false;
    if (complete_) {
        // Attention that stays on the last tokens (5 frames: 200 ms), or goes back to earlier text.
        for (int64_t s = std::max<int64_t>(S - 3, 0); s < S; ++s) {
            float sum = 0.0f;
            for (int64_t t = completed_at_; t < T; ++t) {
                sum += at(t, s);
            }
            long_tail = long_tail || sum >= 5.0f;
        }
        float back = 0.0f;
        for (int64_t t = completed_at_; S > 5 && t < T; ++t) {
            float m = at(t, 0);
            for (int64_t s = 1; s < S - 5; ++s) {
                m = std::max(m, at(t, s));
            }
            back += m;
        }
        repetition = back > 5.0f;
    }
    recent_.push_back(last);
    if (recent_.size() > 8) {
        recent_.erase(recent_.begin());
    }
    const bool token_repetition = recent_.size() >= 3 && recent_[recent_.size() - 1] == recent_[recent_.size() - 2];
    if (cur < S - 3 && S > 5) {  // not near the text's end: no stop yet
        logits[(size_t) stop_] = -32768.0f;
    }
    if (long_tail || repetition || token_repetition) {  // a runaway: stop now
        std::fill(logits.begin(), logits.end(), -32768.0f);
        logits[(size_t) stop_] = 32768.0f;
    }
    ++frame_;
}

void t3_state::copy_conditioning(vs_context & c, int64_t n_cond, int64_t per, int64_t n_seq) {
    auto           gb = c.new_graph((size_t) (h_.n_layer * n_seq * 6 + 16));
    ggml_context * g  = gb.ctx.get();
    for (int64_t il = 0; il < h_.n_layer; ++il) {
        for (int64_t b = per; b < n_seq; ++b) {
            const size_t  from = (size_t) (il * batch_ + b % per), to = (size_t) (il * batch_ + b);
            ggml_tensor * k = k_[from];
            ggml_tensor * v = v_[from];
            ggml_build_forward_expand(gb.gf, ggml_cpy(g, ggml_view_2d(g, k, k->ne[0], n_cond, k->nb[1], 0),
                                                      ggml_view_2d(g, k_[to], k->ne[0], n_cond, k->nb[1], 0)));
            ggml_build_forward_expand(gb.gf, ggml_cpy(g, ggml_view_2d(g, v, n_cond, v->ne[1], v->nb[1], 0),
                                                      ggml_view_2d(g, v_[to], n_cond, v->ne[1], v->nb[1], 0)));
        }
    }
    c.alloc(VS_STAGE_TOKENS, gb.gf);
    c.compute(gb.gf);
}

std::vector<t3_state::step_out> t3_state::advance(vs_context & c, const std::vector<int32_t> & tok,
                                                  const std::vector<int32_t> & speech_pos,
                                                  const std::vector<int64_t> & pos, const std::vector<int64_t> & slot,
                                                  const std::vector<int64_t> & align_text) {
    const bool    llama = h_.llama();
    const int64_t C = h_.n_embd, R = (int64_t) tok.size(), d = C / h_.n_head;
    const float   scale = 1.0f / std::sqrt((float) d);
    // Every position comes in as an input (the cache rows written, the positions embedded and
    // rotated), so a graph serves each step of a run. Where graphs are kept, each row attends to
    // its positions rounded up to 256, the rest masked: one graph then serves 256 steps.
    const bool           keep = c.keep_graphs;
    std::vector<int64_t> n_kv((size_t) R);
    std::string          key;
    if (keep) {
        key = "t3 step " + std::to_string(cache_gen_) + " " + std::to_string(text_at_);
    }
    for (int64_t r = 0; r < R; ++r) {
        n_kv[(size_t) r] = keep ? std::min((pos[(size_t) r] + 256) / 256 * 256, n_ctx_) : pos[(size_t) r] + 1;
        if (keep) {
            key += " " + std::to_string(slot[(size_t) r]) + ":" + std::to_string(n_kv[(size_t) r]) + ":" +
                   std::to_string(align_text[(size_t) r]);
        }
    }
    vs::stage_graph & sg = c.stage_graph(
        VS_STAGE_TOKENS, key,
        [&](ggml_context * g, ggml_cgraph * gf) {
            auto input = [&](ggml_type type, int64_t n0, int64_t n1 = 1) {
                ggml_tensor * t = ggml_new_tensor_2d(g, type, n0, n1);
                ggml_set_input(t);
                return t;
            };
            ggml_tensor * ids   = input(GGML_TYPE_I32, R);
            ggml_tensor * at    = input(GGML_TYPE_I32, R);
            ggml_tensor * spos  = llama ? input(GGML_TYPE_I32, R) : nullptr;
            ggml_tensor * k_at  = input(GGML_TYPE_I64, R);
            ggml_tensor * v_at  = input(GGML_TYPE_I64, C, R);
            ggml_tensor * masks = keep ? input(GGML_TYPE_F32, n_ctx_, R) : nullptr;  // row r: its first n_kv[r]
            ggml_tensor * x     = ggml_get_rows(g, c.w("t3.speech_emb"), ids);       // [C, R]
            x                   = ggml_add(g, x,
                                           ggml_get_rows(g, llama ? c.w("t3.speech_pos_emb") : c.w("t3.pos_emb"), llama ? spos : at));
            x                   = named(x, "t3_embd");

            std::vector<ggml_tensor *> align((size_t) R, nullptr);
            for (int64_t il = 0; il < h_.n_layer; ++il) {
                const std::string p   = "t3.blk." + std::to_string(il) + ".";
                ggml_tensor *     qkv = attn_input(c, g, h_, x, p);  // [3C, R]
                const size_t      es  = ggml_element_size(qkv);
                ggml_tensor *     q = nullptr, *k = nullptr;
                if (llama) {  // rotary positions, each row its own
                    auto rope = [&](int i) {
                        ggml_tensor * t = ggml_view_4d(g, qkv, d, h_.n_head, R, 1, d * es, qkv->nb[1], R * qkv->nb[1],
                                                       (size_t) i * C * es);
                        return ggml_rope_ext(g, t, at, c.w("t3.rope_freqs"), (int) d, GGML_ROPE_TYPE_NEOX, 0,
                                             h_.rope_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);  // [d, h, R, 1]
                    };
                    q = rope(0);
                    k = rope(1);
                }
                std::vector<ggml_tensor *> outs;
                for (int64_t r = 0; r < R; ++r) {
                    auto part = [&](int i) {
                        return ggml_view_2d(g, qkv, C, 1, qkv->nb[1], (size_t) r * qkv->nb[1] + (size_t) i * C * es);
                    };
                    auto row = [&](ggml_tensor * t) {
                        return ggml_view_2d(g, t, C, 1, t->nb[2], (size_t) r * t->nb[2]);
                    };
                    const int64_t nk = n_kv[(size_t) r];
                    ggml_tensor * mask =
                        masks ? ggml_view_2d(g, masks, nk, 1, masks->nb[1], (size_t) r * masks->nb[1]) : nullptr;
                    ggml_tensor * scores = nullptr;
                    const size_t  s      = (size_t) (il * batch_ + slot[(size_t) r]);
                    outs.push_back(indexed_attention(g, llama ? row(q) : part(0), llama ? row(k) : part(1), part(2),
                                                     k_[s], v_[s], ggml_view_1d(g, k_at, 1, (size_t) r * k_at->nb[0]),
                                                     ggml_view_1d(g, v_at, C, (size_t) r * v_at->nb[1]), nk, h_.n_head,
                                                     mask, scale, &scores));
                    for (size_t i = 0; llama && align_text[(size_t) r] > 0 && i < h_.alignment_heads.size(); i += 2) {
                        if (h_.alignment_heads[i] != il) {
                            continue;
                        }
                        ggml_tensor * seen = ggml_view_2d(
                            g, scores, align_text[(size_t) r], 1, scores->nb[1],
                            (size_t) h_.alignment_heads[i + 1] * scores->nb[2] + (size_t) text_at_ * scores->nb[0]);
                        align[(size_t) r] =
                            align[(size_t) r] ? ggml_add(g, align[(size_t) r], seen) : ggml_cont(g, seen);
                    }
                }
                x = block_rest(c, g, h_, x, concat_all(g, outs, 1), p, il);  // [C, R]
            }
            ggml_tensor * logits = speech_logits(c, g, h_, x);  // [Vs, R]
            ggml_set_output(logits);
            ggml_build_forward_expand(gf, logits);
            std::vector<ggml_tensor *> made = { ids, at, spos, k_at, v_at, masks, logits };
            for (ggml_tensor * t : align) {
                if (t) {
                    t = ggml_scale(g, t, 2.0f / (float) h_.alignment_heads.size());  // their mean
                    ggml_set_output(t);
                    ggml_build_forward_expand(gf, t);
                }
                made.push_back(t);
            }
            return made;
        },
        (size_t) (h_.n_layer * (48 + 48 * R) + 256));

    std::vector<int32_t> positions(pos.begin(), pos.end());
    std::vector<int64_t> k_at(pos.begin(), pos.end()), v_at((size_t) (C * R));
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t i = 0; i < C; ++i) {
            v_at[(size_t) (r * C + i)] = i * n_ctx_ + pos[(size_t) r];
        }
    }
    c.set_input(sg.t[0], tok.data());
    c.set_input(sg.t[1], positions.data());
    if (llama) {
        c.set_input(sg.t[2], speech_pos.data());
    }
    c.set_input(sg.t[3], k_at.data());
    c.set_input(sg.t[4], v_at.data());
    std::vector<float> masks;
    if (sg.t[5]) {
        masks.assign((size_t) (n_ctx_ * R), -INFINITY);
        for (int64_t r = 0; r < R; ++r) {
            std::fill_n(masks.begin() + r * n_ctx_, pos[(size_t) r] + 1, 0.0f);
        }
        c.set_input(sg.t[5], masks.data());
    }
    c.compute(sg);
    std::vector<float> all((size_t) ggml_nelements(sg.t[6]));
    ggml_backend_tensor_get(sg.t[6], all.data(), 0, ggml_nbytes(sg.t[6]));
    std::vector<step_out> out((size_t) R);
    const int64_t         Vs = h_.speech_vocab;
    for (int64_t r = 0; r < R; ++r) {
        out[(size_t) r].logits.assign(all.begin() + r * Vs, all.begin() + (r + 1) * Vs);
        if (ggml_tensor * t = sg.t[(size_t) (7 + r)]) {
            out[(size_t) r].align.resize((size_t) ggml_nelements(t));
            ggml_backend_tensor_get(t, out[(size_t) r].align.data(), 0, ggml_nbytes(t));
        }
    }
    return out;
}

std::vector<int32_t> t3_state::generate(vs_context & c, const std::vector<int32_t> & text_ids, const float * speaker,
                                        const std::vector<int32_t> & prompt, const vs_synth_params & p,
                                        size_t max_tokens, const token_callback & on_token) {
    return generate_many(c, { text_ids }, speaker, prompt, p, { max_tokens }, { p.seed }, on_token)[0];
}

std::vector<std::vector<int32_t>> t3_state::generate_many(
    vs_context & c, const std::vector<std::vector<int32_t>> & texts, const float * speaker,
    const std::vector<int32_t> & prompt, const vs_synth_params & p, const std::vector<size_t> & max_tokens,
    const std::vector<uint64_t> & seeds, const token_callback & on_token) {
    const int64_t Vs = h_.speech_vocab, G = (int64_t) texts.size();
    const bool    llama  = h_.llama();
    const bool    forced = p.speech_tokens != nullptr;
    if (texts.empty() || max_tokens.size() != texts.size() || seeds.size() != texts.size()) {
        throw error(VS_ERR_INVALID_ARG, "a run of the token model takes one or more texts, a limit and a seed each");
    }
    if (forced && G > 1) {
        throw error(VS_ERR_INVALID_ARG, "given speech tokens are for one text");
    }
    for (int32_t t : prompt) {
        if (t < 0 || t >= h_.start_speech) {
            throw error(VS_ERR_INVALID_ARG, "prompt token " + std::to_string(t) + " is not a speech token (0 to " +
                                                std::to_string(h_.start_speech - 1) + ")");
        }
    }
    if ((int64_t) prompt.size() > h_.prompt_tokens) {
        throw error(VS_ERR_INVALID_ARG, std::to_string(prompt.size()) + " prompt tokens; the model takes at most " +
                                            std::to_string(h_.prompt_tokens));
    }
    for (int64_t i = 0; i < h_.speaker_embed_size; ++i) {
        if (!std::isfinite(speaker[i])) {
            throw error(VS_ERR_INVALID_ARG, "the speaker embedding holds a NaN or infinite value");
        }
    }
    for (size_t i = 0; forced && i < p.n_speech_tokens; ++i) {
        if (p.speech_tokens[i] < 0 || p.speech_tokens[i] >= Vs) {
            throw error(VS_ERR_INVALID_ARG, "speech token " + std::to_string(p.speech_tokens[i]) +
                                                " is not in the model's vocabulary of " + std::to_string(Vs));
        }
    }
    const int64_t n_cond = h_.n_cond((int64_t) prompt.size());
    // Each text as the model reads it (Llama's between its start and stop tokens), checked.
    struct run {
        std::vector<int32_t> text;
        int64_t              n_prefix = 0, pos = 0;
        size_t               max_tokens = 0;
        uint64_t             seed       = 0;
        std::vector<int32_t> history, out;
        alignment_guard      guard{ 0, 0 };
        step_out             last;  // the logits (and alignment rows) of its newest position
        bool                 done = false;
    };
    std::vector<run> runs((size_t) G);
    int64_t          n_ctx = 0;
    for (int64_t g = 0; g < G; ++g) {
        run & r = runs[(size_t) g];
        if (texts[(size_t) g].empty()) {
            throw error(VS_ERR_TEXT, "no text tokens to speak");
        }
        for (int32_t t : texts[(size_t) g]) {
            if (t < 0 || t >= h_.text_vocab) {
                throw error(VS_ERR_INVALID_ARG, "text token " + std::to_string(t) +
                                                    " is not in the model's vocabulary of " +
                                                    std::to_string(h_.text_vocab));
            }
        }
        r.text = texts[(size_t) g];
        if (llama) {
            r.text.insert(r.text.begin(), (int32_t) h_.start_text);
            r.text.push_back((int32_t) h_.stop_text);
        }
        r.max_tokens           = max_tokens[(size_t) g];
        r.seed                 = seeds[(size_t) g];
        r.n_prefix             = n_cond + (int64_t) r.text.size() + (llama ? 2 : 1);
        const int64_t n_speech = (int64_t) (forced ? p.n_speech_tokens : r.max_tokens);
        const int64_t n_total  = r.n_prefix + n_speech;
        if (llama ? (int64_t) r.text.size() > h_.text_positions : n_total > h_.n_positions) {
            throw error(VS_ERR_INVALID_ARG, std::to_string(r.text.size()) + " text tokens with " +
                                                std::to_string(prompt.size()) + " prompt tokens and up to " +
                                                std::to_string(n_speech) + " speech tokens pass the model's " +
                                                std::to_string(llama ? h_.text_positions : h_.n_positions) +
                                                (llama ? " text" : "") + " positions");
        }
        if (llama && n_speech + 1 > h_.speech_positions) {
            throw error(VS_ERR_INVALID_ARG, std::to_string(n_speech) + " speech tokens pass the model's " +
                                                std::to_string(h_.speech_positions - 1));
        }
        n_ctx = std::max(n_ctx, n_total);
    }

    sampling s;
    s.temperature        = p.temperature >= 0.0f ? p.temperature : h_.temperature;
    s.top_k              = p.top_k >= 0 ? p.top_k : h_.top_k;
    s.top_p              = p.top_p >= 0.0f ? p.top_p : h_.top_p;
    s.min_p              = p.min_p >= 0.0f ? p.min_p : h_.min_p;
    s.repetition_penalty = p.repetition_penalty >= 0.0f ? p.repetition_penalty : h_.repetition_penalty;
    s.penalty_first      = llama;
    const float cfg      = llama ? (p.cfg_weight >= 0.0f ? p.cfg_weight : h_.cfg_weight) : 0.0f;
    const float emotion  = llama ? (p.exaggeration >= 0.0f ? p.exaggeration : h_.exaggeration) : 0.0f;
    if (!std::isfinite(cfg) || cfg > 100.0f || !std::isfinite(emotion) || emotion > 100.0f) {
        throw error(VS_ERR_INVALID_ARG, "cfg_weight and exaggeration must be from 0 to 100");
    }
    const int64_t batch = cfg > 0.0f ? 2 : 1;  // sequences a text: guidance's conditional and unconditional

    reserve(c, n_ctx, G * batch);
    // The conditioning is the same for every sentence in one voice: its keys and values stay in
    // the cache, and the next call in that voice starts after them.
    uint64_t key = mix64((uint64_t) prompt.size() ^ ((uint64_t) batch << 32));
    for (int64_t i = 0; i < h_.speaker_embed_size; ++i) {
        uint32_t bits;
        std::memcpy(&bits, speaker + i, sizeof bits);
        key = mix64(key ^ bits);
    }
    for (int32_t t : prompt) {
        key = mix64(key ^ (uint64_t) (uint32_t) t ^ (uint64_t(1) << 40));
    }
    uint32_t emotion_bits;
    std::memcpy(&emotion_bits, &emotion, sizeof emotion_bits);
    key += mix64(emotion_bits ^ (uint64_t(1) << 41));
    key += key == 0;
    const bool    reuse = key == cond_key_;
    const int64_t pos0  = reuse ? n_cond : 0;
    cond_key_           = 0;  // until this call's forward has written it
    text_at_            = n_cond;
    auto n_text         = [&](const run & r) { return llama ? (int64_t) r.text.size() : (int64_t) 0; };

    c.timed_stage(VS_STAGE_TOKENS, 0, p, [&] {
        run & first = runs[0];
        if (forced) {
            // One pass over the prefix and the given tokens; logits at every speech position.
            std::vector<int32_t> speech{ (int32_t) h_.start_speech };
            speech.insert(speech.end(), p.speech_tokens, p.speech_tokens + p.n_speech_tokens);
            const int64_t        n_logits = (int64_t) speech.size();
            std::vector<int32_t> at((size_t) n_logits);
            std::iota(at.begin(), at.end(), 0);
            step_out r = forward(c, pos0, first.text, speech, reuse ? nullptr : speaker, prompt, n_logits, at, emotion,
                                 batch, n_text(first), 1);
            cond_key_  = key;
            const auto half = r.logits.begin() + n_logits * Vs;
            if (batch == 2) {
                c.set_output("t3_logits_uncond", std::vector<float>(half, r.logits.end()), n_logits, Vs);
            }
            c.set_output("t3_logits", std::vector<float>(r.logits.begin(), half), n_logits, Vs);
            first.out.assign(p.speech_tokens, p.speech_tokens + p.n_speech_tokens);
            return;
        }
        // The reference's run: the prefix ends in the start token (Multilingual's in two, both at
        // the first speech position), whose logits give the first token; each later step feeds
        // the last token. Turbo's repetition penalty reads the start token for the first draw
        // and the drawn tokens after; Multilingual's all of them. The texts' prefixes run one
        // after another (the first writes the voice's conditioning, which the others copy); their
        // steps run together, a sequence a text (two with guidance) in one graph.
        const std::vector<int32_t> start(llama ? 2 : 1, (int32_t) h_.start_speech);
        for (int64_t g = 0; g < G; ++g) {
            run & r = runs[(size_t) g];
            if (g == 1) {
                copy_conditioning(c, n_cond, batch, G * batch);
            }
            const bool own = g == 0 && !reuse;
            r.last         = forward(c, own ? 0 : n_cond, r.text, start, own ? speaker : nullptr, prompt, 1,
                                     std::vector<int32_t>(start.size(), 0), emotion, batch, n_text(r), (int64_t) start.size(),
                                     g * batch);
            cond_key_      = key;
            r.history      = { (int32_t) h_.start_speech };
            r.guard        = alignment_guard(n_text(r), (int32_t) h_.stop_speech);
            r.pos          = r.n_prefix;
        }
        for (size_t step = 0;; ++step) {
            c.check_abort();
            std::vector<int32_t> tok, spos;
            std::vector<int64_t> pos, slot, align_text;
            for (int64_t g = 0; g < G; ++g) {
                run & r = runs[(size_t) g];
                if (r.done) {
                    continue;
                }
                std::vector<float> logits(r.last.logits.begin(), r.last.logits.begin() + Vs);
                if (batch == 2) {  // guidance: cond + cfg (cond - uncond)
                    for (int64_t i = 0; i < Vs; ++i) {
                        logits[(size_t) i] += cfg * (logits[(size_t) i] - r.last.logits[(size_t) (Vs + i)]);
                    }
                }
                if (llama && !h_.alignment_heads.empty()) {
                    r.guard.step(std::move(r.last.align), r.history.back(), logits);
                }
                const double  u = (double) (mix64(r.seed ^ mix64(step)) >> 11) * (1.0 / 9007199254740992.0);
                const int32_t t = sample_token(logits, r.history, s, u);
                if (step == 0 && !llama) {
                    r.history.clear();
                }
                r.history.push_back(t);
                if (t == (int32_t) h_.stop_speech) {
                    r.done = true;
                    continue;
                }
                r.out.push_back(t);
                if (on_token && g == 0) {
                    on_token(r.out);
                }
                if (r.out.size() >= r.max_tokens) {
                    r.done = true;
                    continue;
                }
                for (int64_t b = 0; b < batch; ++b) {
                    tok.push_back(t);
                    spos.push_back((int32_t) step + 1);
                    pos.push_back(r.pos);
                    slot.push_back(g * batch + b);
                    align_text.push_back(b == 0 ? n_text(r) : 0);
                }
                ++r.pos;
            }
            if (tok.empty()) {
                break;
            }
            std::vector<step_out> rows = advance(c, tok, spos, pos, slot, align_text);
            size_t                row  = 0;
            for (run & r : runs) {
                if (r.done) {
                    continue;
                }
                r.last.logits.clear();
                for (int64_t b = 0; b < batch; ++b) {
                    r.last.logits.insert(r.last.logits.end(), rows[row + (size_t) b].logits.begin(),
                                         rows[row + (size_t) b].logits.end());
                }
                r.last.align = std::move(rows[row].align);
                row += (size_t) batch;
            }
        }
        if (llama) {
            c.set_output("t3_alignment", first.guard.alignment(),
                         (int64_t) (first.guard.alignment().size() / (size_t) std::max<int64_t>(n_text(first), 1)),
                         n_text(first));
        }
    });
    std::vector<std::vector<int32_t>> out;
    for (run & r : runs) {
        out.push_back(std::move(r.out));
    }
    return out;
}

}  // namespace vs::chatterbox
