// T3, Chatterbox's token model: conditioning (the speaker embedding's projection, the prompt's
// speech tokens), text tokens and speech tokens as one sequence through a GPT-2 backbone with
// a key/value cache, the speech head's logits drawn from one token at a time.
#include <cmath>
#include <cstring>

#include "../../graph/graph.h"
#include "chatterbox.h"

namespace vs::chatterbox {

t3_hparams read_t3_hparams(const vs_model & m) {
    t3_hparams h;
    h.variant = m.strings.count("chatterbox.variant") ? m.strings.at("chatterbox.variant") : "";
    if (h.variant != "turbo") {
        m.bad("metadata 'chatterbox.variant' is '" + h.variant + "'; this engine runs: turbo");
    }
    h.backbone = m.strings.count("chatterbox.t3.backbone") ? m.strings.at("chatterbox.t3.backbone") : "";
    if (h.backbone != "gpt2") {
        m.bad("metadata 'chatterbox.t3.backbone' is '" + h.backbone + "'; this engine runs: gpt2");
    }
    h.n_layer            = m.u32_in("chatterbox.t3.n_layer", 1, 256);
    h.n_embd             = m.u32_in("chatterbox.t3.n_embd", 64, 16384);
    h.n_head             = m.u32_in("chatterbox.t3.n_head", 1, 256);
    h.n_positions        = m.u32_in("chatterbox.t3.n_positions", 16, 1 << 20);
    h.text_vocab         = m.u32_in("chatterbox.t3.text_vocab", 2, 1 << 20);
    h.speech_vocab       = m.u32_in("chatterbox.t3.speech_vocab", 2, 1 << 20);
    h.start_speech       = m.u32_in("chatterbox.t3.start_speech", 0, (int) h.speech_vocab - 1);
    h.stop_speech        = m.u32_in("chatterbox.t3.stop_speech", 0, (int) h.speech_vocab - 1);
    h.speaker_embed_size = m.u32_in("chatterbox.t3.speaker_embed_size", 1, 4096);
    h.prompt_tokens      = m.u32_in("chatterbox.t3.prompt_tokens", 0, (int) h.n_positions / 2);
    h.norm_eps           = m.f32_in("chatterbox.t3.norm_eps", 0.0f, 1.0f);
    if (h.n_embd % h.n_head) {
        m.bad("metadata 'chatterbox.t3.n_head' (" + std::to_string(h.n_head) + ") does not divide the width " +
              std::to_string(h.n_embd));
    }
    return h;
}

std::vector<tensor_spec> t3_layout(const t3_hparams & h) {
    const int64_t            C = h.n_embd;
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

void t3_state::reserve(vs_context & c, int64_t n_ctx) {
    if (n_ctx <= n_ctx_) {
        return;
    }
    // Grown in steps of 256 positions, so that a run of sentences settles on one cache.
    n_ctx = (n_ctx + 255) / 256 * 256;
    cache_buf_.reset();
    cond_key_ = 0;
    k_.clear();
    v_.clear();
    ggml_init_params ip{ ggml_tensor_overhead() * (size_t) (2 * h_.n_layer + 1), nullptr, true };
    cache_ctx_.reset(ggml_init(ip));
    for (int64_t i = 0; i < h_.n_layer; ++i) {
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
    n_ctx_ = n_ctx;
}

std::vector<float> t3_state::forward(vs_context & c, int64_t pos, const std::vector<int32_t> & text,
                                     const std::vector<int32_t> & speech, const float * speaker,
                                     const std::vector<int32_t> & prompt, int64_t n_logits) {
    const int64_t  C = h_.n_embd, n_cond = speaker ? 1 + (int64_t) prompt.size() : 0;
    const int64_t  n  = n_cond + (int64_t) text.size() + (int64_t) speech.size();
    auto           gb = c.new_graph((size_t) (h_.n_layer * 80 + 128));
    ggml_context * g  = gb.ctx.get();
    ggml_cgraph *  gf = gb.gf;

    // The sequence's embeddings [C, n]: conditioning, text, speech, each part present or not.
    std::vector<std::pair<ggml_tensor *, const void *>> inputs;
    auto                                                input_ids = [&](const std::vector<int32_t> & ids) {
        ggml_tensor * t = ggml_new_tensor_1d(g, GGML_TYPE_I32, (int64_t) ids.size());
        ggml_set_input(t);
        inputs.push_back({ t, ids.data() });
        return t;
    };
    std::vector<ggml_tensor *> parts;
    if (speaker) {
        ggml_tensor * spk = ggml_new_tensor_2d(g, GGML_TYPE_F32, h_.speaker_embed_size, 1);
        ggml_set_input(spk);
        inputs.push_back({ spk, speaker });
        parts.push_back(named(linear(c, g, spk, "t3.spkr_enc"), "t3_cond_speaker"));  // [C, 1]
        if (!prompt.empty()) {
            parts.push_back(ggml_get_rows(g, c.w("t3.speech_emb"), input_ids(prompt)));  // [C, P]
        }
    }
    if (!text.empty()) {
        parts.push_back(ggml_get_rows(g, c.w("t3.text_emb"), input_ids(text)));
    }
    if (!speech.empty()) {
        parts.push_back(ggml_get_rows(g, c.w("t3.speech_emb"), input_ids(speech)));
    }
    std::vector<int32_t> positions((size_t) n);
    for (int64_t i = 0; i < n; ++i) {
        positions[(size_t) i] = (int32_t) (pos + i);
    }
    ggml_tensor * x = ggml_add(g, concat_all(g, parts, 1), ggml_get_rows(g, c.w("t3.pos_emb"), input_ids(positions)));
    x               = named(x, "t3_embd");  // [C, n]

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

    const graph_options gelu_on{ ggml_backend_dev_type(c.dev) == GGML_BACKEND_DEVICE_TYPE_CPU, c.limits };
    const float         scale = 1.0f / std::sqrt((float) (C / h_.n_head));
    for (int64_t il = 0; il < h_.n_layer; ++il) {
        const std::string p    = "t3.blk." + std::to_string(il) + ".";
        ggml_tensor *     a    = layer_norm(g, x, c.w(p + "attn_norm.weight"), c.w(p + "attn_norm.bias"), h_.norm_eps);
        ggml_tensor *     qkv  = linear(c, g, a, p + "attn_qkv");  // [3C, n]
        auto              part = [&](int i) { return ggml_view_2d(g, qkv, C, n, qkv->nb[1], i * C * sizeof(float)); };
        ggml_tensor *     o = cached_attention(g, gf, part(0), part(1), part(2), k_[(size_t) il], v_[(size_t) il], pos,
                                               h_.n_head, kq_mask, scale);
        x                   = named(ggml_add(g, x, linear(c, g, o, p + "attn_out")), "t3_attn_out", (int) il);
        ggml_tensor * f     = layer_norm(g, x, c.w(p + "ffn_norm.weight"), c.w(p + "ffn_norm.bias"), h_.norm_eps);
        f                   = linear(c, g, gelu_tanh(gelu_on, g, linear(c, g, f, p + "ffn_up")), p + "ffn_down");
        x                   = named(ggml_add(g, x, f), "t3_layer", (int) il);  // [C, n]
    }
    ggml_tensor * last   = ggml_view_2d(g, x, C, n_logits, x->nb[1], (n - n_logits) * x->nb[1]);
    last                 = layer_norm(g, last, c.w("t3.out_norm.weight"), c.w("t3.out_norm.bias"), h_.norm_eps);
    ggml_tensor * logits = named(linear(c, g, last, "t3.speech_head"), "t3_logits");  // [Vs, n_logits]
    ggml_set_output(logits);
    ggml_build_forward_expand(gf, logits);
    c.alloc(VS_STAGE_TOKENS, gf);
    for (const auto & [t, data] : inputs) {
        c.set_input(t, data);
    }
    c.compute(gf);
    std::vector<float> out((size_t) ggml_nelements(logits));
    ggml_backend_tensor_get(logits, out.data(), 0, ggml_nbytes(logits));
    return out;
}

std::vector<int32_t> t3_state::generate(vs_context & c, const std::vector<int32_t> & text, const float * speaker,
                                        const std::vector<int32_t> & prompt, const vs_synth_params & p,
                                        size_t max_tokens) {
    const int64_t Vs = h_.speech_vocab;
    if (text.empty()) {
        throw error(VS_ERR_TEXT, "no text tokens to speak");
    }
    for (int32_t t : text) {
        if (t < 0 || t >= h_.text_vocab) {
            throw error(VS_ERR_INVALID_ARG, "text token " + std::to_string(t) +
                                                " is not in the model's vocabulary of " +
                                                std::to_string(h_.text_vocab));
        }
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
    const bool forced = p.speech_tokens != nullptr;
    for (size_t i = 0; forced && i < p.n_speech_tokens; ++i) {
        if (p.speech_tokens[i] < 0 || p.speech_tokens[i] >= Vs) {
            throw error(VS_ERR_INVALID_ARG, "speech token " + std::to_string(p.speech_tokens[i]) +
                                                " is not in the "
                                                "model's vocabulary of " +
                                                std::to_string(Vs));
        }
    }
    const int64_t n_prefix = 1 + (int64_t) prompt.size() + (int64_t) text.size() + 1;
    const int64_t n_total  = n_prefix + (int64_t) (forced ? p.n_speech_tokens : max_tokens);
    if (n_total > h_.n_positions) {
        throw error(VS_ERR_INVALID_ARG, std::to_string(text.size()) + " text tokens with " +
                                            std::to_string(prompt.size()) + " prompt tokens and up to " +
                                            std::to_string(n_total - n_prefix) + " speech tokens pass the model's " +
                                            std::to_string(h_.n_positions) + " positions");
    }
    reserve(c, n_total);
    // The conditioning is the same for every sentence in one voice: its keys and values stay in
    // the cache, and the next call in that voice starts after them.
    uint64_t key = mix64((uint64_t) prompt.size());
    for (int64_t i = 0; i < h_.speaker_embed_size; ++i) {
        uint32_t bits;
        std::memcpy(&bits, speaker + i, sizeof bits);
        key = mix64(key ^ bits);
    }
    for (int32_t t : prompt) {
        key = mix64(key ^ (uint64_t) (uint32_t) t ^ (uint64_t(1) << 40));
    }
    key += key == 0;
    const bool    reuse = key == cond_key_;
    const int64_t pos0  = reuse ? 1 + (int64_t) prompt.size() : 0;
    cond_key_           = 0;  // until this call's forward has written it

    sampling s;
    if (p.temperature >= 0.0f) {
        s.temperature = p.temperature;
    }
    if (p.top_k >= 0) {
        s.top_k = p.top_k;
    }
    if (p.top_p >= 0.0f) {
        s.top_p = p.top_p;
    }
    if (p.repetition_penalty >= 0.0f) {
        s.repetition_penalty = p.repetition_penalty;
    }

    std::vector<int32_t> out;
    c.timed_stage(VS_STAGE_TOKENS, 0, p, [&] {
        if (forced) {
            // One pass over the prefix and the given tokens; logits at every speech position.
            const std::vector<int32_t> speech = [&] {
                std::vector<int32_t> v{ (int32_t) h_.start_speech };
                v.insert(v.end(), p.speech_tokens, p.speech_tokens + p.n_speech_tokens);
                return v;
            }();
            const int64_t      n_logits = (int64_t) speech.size();
            std::vector<float> logits   = forward(c, pos0, text, speech, reuse ? nullptr : speaker, prompt, n_logits);
            cond_key_                   = key;
            c.set_output("t3_logits", logits, n_logits, Vs);
            out.assign(p.speech_tokens, p.speech_tokens + p.n_speech_tokens);
            return;
        }
        // The reference's run: the prefix ends in the start token, whose logits give the first
        // token; each later step feeds the last token. Its repetition penalty reads the start
        // token for the first draw and the drawn tokens after.
        std::vector<float> logits =
            forward(c, pos0, text, { (int32_t) h_.start_speech }, reuse ? nullptr : speaker, prompt, 1);
        cond_key_ = key;
        std::vector<int32_t> history{ (int32_t) h_.start_speech };
        int64_t              pos = n_prefix;
        for (size_t step = 0; step < max_tokens; ++step) {
            c.check_abort();
            const double  u   = (double) (mix64(p.seed ^ mix64(step)) >> 11) * (1.0 / 9007199254740992.0);
            const int32_t tok = sample_token(logits, history, s, u);
            if (step == 0) {
                history.clear();
            }
            history.push_back(tok);
            if (tok == (int32_t) h_.stop_speech) {
                break;
            }
            out.push_back(tok);
            if (out.size() == max_tokens) {
                break;
            }
            logits = forward(c, pos++, {}, { tok }, nullptr, {}, 1);
        }
    });
    return out;
}

}  // namespace vs::chatterbox
