// Chatterbox's entry points: the model checked when loaded, a context's state, token generation
// in a voice given by its conditionals (or the model's stock voice), the vocoder on a mel.
#include "chatterbox.h"

#include <cmath>

namespace vs {

void chatterbox_validate(const vs_model & model) {
    check_tensors(model, chatterbox::t3_layout(chatterbox::read_t3_hparams(model)));
    check_tensors(model, chatterbox::hift_layout(chatterbox::read_hift_hparams(model)));
    ge2e_validate(model);  // the voice encoder, under "ve."
    const int64_t ve = ge2e_embedding_size(model), t3 = chatterbox::read_t3_hparams(model).speaker_embed_size;
    if (ve != t3) {
        model.bad("the voice encoder makes embeddings of " + std::to_string(ve) + " values; the token model takes " +
                  std::to_string(t3));
    }
}

std::vector<float> chatterbox_vocode(vs_context & c, const float * mel, size_t n_frames, const vs_synth_params & p) {
    const chatterbox::hift_hparams h = chatterbox::read_hift_hparams(*c.model);
    if (n_frames == 0) {
        throw error(VS_ERR_INVALID_ARG, "no mel frames to vocode");
    }
    if (n_frames > 30000) {  // 10 minutes
        throw error(VS_ERR_INVALID_ARG, std::to_string(n_frames) + " mel frames: at most 30000 (10 minutes) a call");
    }
    const size_t n = n_frames * (size_t) h.n_mels;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(mel[i])) {
            throw error(VS_ERR_INVALID_ARG, "the mel holds a NaN or infinite value");
        }
    }
    if (p.f0 && p.n_f0 != n_frames) {
        throw error(VS_ERR_INVALID_ARG,
                    std::to_string(p.n_f0) + " F0 values for " + std::to_string(n_frames) + " frames");
    }
    for (size_t i = 0; p.f0 && i < n_frames; ++i) {
        if (!(p.f0[i] >= 0.0f && p.f0[i] <= 0.5f * (float) h.sample_rate)) {
            throw error(VS_ERR_INVALID_ARG, "F0 value " + std::to_string(i) + " is not from 0 to half the sample rate");
        }
    }
    if (!(p.noise_scale < 0.0f) && !(p.noise_scale <= 10.0f)) {
        throw error(VS_ERR_INVALID_ARG, "noise_scale must be at most 10");
    }
    const float        noise = p.noise_scale < 0.0f ? 1.0f : p.noise_scale;
    const int64_t      T     = (int64_t) n_frames;
    std::vector<float> audio, f0, source;
    c.timed_stage(VS_STAGE_GENERATOR, 0, p, [&] {
        f0     = p.f0 ? std::vector<float>(p.f0, p.f0 + n_frames) : chatterbox::hift_f0(c, h, mel, T);
        source = chatterbox::hift_source(c, h, f0, noise, p.seed);
        c.check_abort();
        audio = chatterbox::hift_vocode(c, h, mel, T, source);
    });
    c.set_output("f0", std::move(f0), T, 1);
    c.set_output("source", std::move(source), (int64_t) audio.size(), 1);
    return audio;
}

int64_t chatterbox_speaker_size(const vs_model & model) {
    return chatterbox::read_t3_hparams(model).speaker_embed_size;
}

std::unique_ptr<model_state> make_chatterbox_state(const vs_model & model) {
    return std::make_unique<chatterbox::t3_state>(chatterbox::read_t3_hparams(model));
}

std::vector<int32_t> chatterbox_generate(vs_context & c, const std::vector<int32_t> & text, const vs_synth_params & p,
                                         size_t max_tokens) {
    const vs_conditionals * cond = p.conditionals;
    std::vector<float>      stock_speaker;
    std::vector<int32_t>    stock_prompt;
    vs_conditionals         stock{};
    if (!cond) {  // the model's stock voice
        auto it = c.model->host.tensors.find("voice.speaker_emb");
        auto jt = c.model->host.tensors.find("voice.prompt_tokens");
        if (it == c.model->host.tensors.end() || jt == c.model->host.tensors.end()) {
            throw error(
                VS_ERR_INVALID_ARG,
                "'" + c.model->path + "' carries no stock voice: give the conditionals of one (vs_conditionals)");
        }
        stock_speaker = host_floats(it->second);
        if ((int64_t) stock_speaker.size() != chatterbox_speaker_size(*c.model)) {
            c.model->bad("its stock voice's speaker embedding is not of the token model's size");
        }
        for (float id : host_floats(jt->second)) {  // whole numbers, checked by the token model
            if (!(std::fabs(id) < 1e9f) || id != std::floor(id)) {
                c.model->bad("its stock voice's prompt tokens are not token ids");
            }
            stock_prompt.push_back((int32_t) id);
        }
        stock = { stock_speaker.data(), stock_prompt.data(), stock_prompt.size() };
        cond  = &stock;
    }
    if (!cond->speaker_embedding) {
        throw error(VS_ERR_INVALID_ARG, "the conditionals have no speaker embedding");
    }
    if (cond->n_prompt_tokens && !cond->prompt_tokens) {
        throw error(VS_ERR_INVALID_ARG, "the conditionals count prompt tokens but hold none");
    }
    const std::vector<int32_t> prompt(cond->prompt_tokens, cond->prompt_tokens + cond->n_prompt_tokens);
    auto *                     state = static_cast<chatterbox::t3_state *>(c.state.get());
    return state->generate(c, text, cond->speaker_embedding, prompt, p, max_tokens);
}

void chatterbox_prewarm(vs_context & c) {
    const chatterbox::t3_hparams h = chatterbox::read_t3_hparams(*c.model);
    const std::vector<float>     speaker((size_t) h.speaker_embed_size, 0.0f);
    std::vector<int32_t>         prompt((size_t) h.prompt_tokens, 0);
    vs_conditionals              cond{ speaker.data(), prompt.data(), prompt.size() };
    vs_synth_params              p = vs_synth_default_params();
    p.conditionals                 = &cond;
    p.temperature                  = 0.0f;
    chatterbox_generate(c, { 0, 1, 2, 3, 4, 5, 6, 7 }, p, 8);
}

}  // namespace vs
