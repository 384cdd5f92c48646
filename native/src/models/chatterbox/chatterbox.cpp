// Chatterbox's entry points: the model checked when loaded, a context's state, token generation
// in a voice given by its conditionals (or the model's stock voice), the vocoder on a mel.
#include "chatterbox.h"

#include <cmath>

namespace vs {

void chatterbox_validate(const vs_model & model) {
    check_tensors(model, chatterbox::t3_layout(chatterbox::read_t3_hparams(model)), true);
    check_tensors(model, chatterbox::hift_layout(chatterbox::read_hift_hparams(model)));
    check_tensors(model, chatterbox::flow_layout(chatterbox::read_flow_hparams(model)));
    check_tensors(model, chatterbox::s3tok_layout(chatterbox::read_s3tok_hparams(model)));
    check_tensors(model, chatterbox::xvector_layout(chatterbox::read_xvector_hparams(model)));
    ge2e_validate(model);  // the voice encoder, under "ve."
    const int64_t ve = ge2e_embedding_size(model), t3 = chatterbox::read_t3_hparams(model).speaker_embed_size;
    if (ve != t3) {
        model.bad("the voice encoder makes embeddings of " + std::to_string(ve) + " values; the token model takes " +
                  std::to_string(t3));
    }
}

namespace {

// The model's stock voice's values under `name` (voice.*), or a clear error where it has none.
std::vector<float> stock_values(const vs_model & m, const char * name) {
    auto it = m.host.tensors.find(name);
    if (it == m.host.tensors.end()) {
        throw error(VS_ERR_INVALID_ARG,
                    "'" + m.path + "' carries no stock voice: give the conditionals of one (vs_conditionals)");
    }
    return host_floats(it->second);
}

// Token ids stored as whole numbers in F32 (the loader takes no integer tensors).
std::vector<int32_t> stock_ids(const vs_model & m, const char * name) {
    std::vector<int32_t> ids;
    for (float id : stock_values(m, name)) {
        if (!(std::fabs(id) < 1e9f) || id != std::floor(id)) {
            m.bad(std::string("its stock voice's '") + name + "' are not token ids");
        }
        ids.push_back((int32_t) id);
    }
    return ids;
}

// A voice's recording as the encoders take it: at most 60 s at `rate`, every sample finite.
void check_recording(const float * samples, size_t n, int64_t rate, const char * what) {
    if ((int64_t) n > 60 * rate) {
        throw error(VS_ERR_INVALID_ARG,
                    "a recording of " + std::to_string(n / (size_t) rate) + " s: " + what + " takes at most 60 s");
    }
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(samples[i])) {
            throw error(VS_ERR_INVALID_ARG, "the recording holds a NaN or infinite sample");
        }
    }
}

// S3Token2Wav's fade-in against spillover from the prompt: the first 20 ms silent, the next
// 20 ms rising as half a cosine.
void trim_fade(std::vector<float> & audio, int64_t sample_rate) {
    const int64_t n = sample_rate / 50;
    for (int64_t i = 0; i < 2 * n && i < (int64_t) audio.size(); ++i) {
        const float ramp =
            i < n ? 0.0f : (std::cos((float) M_PI - (float) (i - n) * ((float) M_PI / (float) (n - 1))) + 1.0f) * 0.5f;
        audio[(size_t) i] *= ramp;
    }
}

}  // namespace

std::vector<float> chatterbox_decode(vs_context & c, const std::vector<int32_t> & tokens, const vs_synth_params & p) {
    const chatterbox::flow_hparams h = chatterbox::read_flow_hparams(*c.model);
    const int64_t                  M = h.n_mels;
    if (tokens.empty()) {
        throw error(VS_ERR_INVALID_ARG, "no speech tokens to decode");
    }
    if (tokens.size() > 15000) {  // 10 minutes
        throw error(VS_ERR_INVALID_ARG,
                    std::to_string(tokens.size()) + " speech tokens: at most 15000 (10 minutes) a call");
    }
    // The voice: the conditionals' S3Gen part, or the stock voice's.
    std::vector<int32_t> prompt;
    std::vector<float>   prompt_mel, xvector;
    if (const vs_conditionals * cond = p.conditionals) {
        if (!cond->xvector) {
            throw error(VS_ERR_INVALID_ARG, "the conditionals have no x-vector (S3Gen's speaker embedding)");
        }
        if ((int64_t) cond->n_xvector != h.xvector) {
            throw error(VS_ERR_INVALID_ARG, "the x-vector has " + std::to_string(cond->n_xvector) +
                                                " values; the model takes " + std::to_string(h.xvector));
        }
        if ((cond->n_gen_prompt_tokens && !cond->gen_prompt_tokens) || (cond->n_prompt_frames && !cond->prompt_mel)) {
            throw error(VS_ERR_INVALID_ARG, "the conditionals count S3Gen prompt tokens or mel frames but hold none");
        }
        prompt.assign(cond->gen_prompt_tokens, cond->gen_prompt_tokens + cond->n_gen_prompt_tokens);
        prompt_mel.assign(cond->prompt_mel, cond->prompt_mel + cond->n_prompt_frames * (size_t) M);
        xvector.assign(cond->xvector, cond->xvector + h.xvector);
    } else {
        prompt     = stock_ids(*c.model, "voice.gen_prompt_tokens");
        prompt_mel = stock_values(*c.model, "voice.prompt_feat");
        xvector    = stock_values(*c.model, "voice.xvector");
        if ((int64_t) xvector.size() != h.xvector || prompt_mel.size() % (size_t) M) {
            c.model->bad("its stock voice's S3Gen conditionals are not of the flow's sizes");
        }
    }
    const int64_t n_prompt_frames = (int64_t) (prompt_mel.size() / (size_t) M);
    const int64_t P = (int64_t) prompt.size(), N = (int64_t) tokens.size();
    if (n_prompt_frames != h.token_mel_ratio * P && n_prompt_frames != h.token_mel_ratio * P + 1) {
        throw error(VS_ERR_INVALID_ARG, "the prompt's mel has " + std::to_string(n_prompt_frames) + " frames for " +
                                            std::to_string(P) + " prompt tokens: two a token (or one more)");
    }
    double norm = 0.0;
    for (float v : xvector) {
        if (!std::isfinite(v)) {
            throw error(VS_ERR_INVALID_ARG, "the x-vector holds a NaN or infinite value");
        }
        norm += (double) v * v;
    }
    for (float v : prompt_mel) {
        if (!std::isfinite(v)) {
            throw error(VS_ERR_INVALID_ARG, "the prompt's mel holds a NaN or infinite value");
        }
    }
    for (float & v : xvector) {  // F.normalize
        v = (float) (v / std::max(std::sqrt(norm), 1e-12));
    }
    const int64_t T = h.token_mel_ratio * (P + N);
    if (p.flow_noise && p.n_flow_noise != (size_t) (T * M)) {
        throw error(VS_ERR_INVALID_ARG, "flow noise of " + std::to_string(p.n_flow_noise) + " values; " +
                                            std::to_string(T) + " frames of " + std::to_string(M) + " take " +
                                            std::to_string(T * M));
    }

    std::vector<int32_t> ids(prompt);
    ids.insert(ids.end(), tokens.begin(), tokens.end());
    std::vector<float> mu;
    c.timed_stage(VS_STAGE_ENCODER, 0, p, [&] { mu = chatterbox::flow_encode(c, h, ids); });
    c.set_output("flow_mu", mu, T, M);

    std::vector<float> x((size_t) (T * M)), cond((size_t) (T * M), 0.0f);
    std::copy(prompt_mel.begin(), prompt_mel.end(), cond.begin());
    if (p.flow_noise) {
        std::copy(p.flow_noise, p.flow_noise + T * M, x.begin());
        for (float v : x) {
            if (!std::isfinite(v)) {
                throw error(VS_ERR_INVALID_ARG, "the flow noise holds a NaN or infinite value");
            }
        }
    } else {
        for (int64_t i = 0; i < T * M; i += 2) {
            float a, b;
            gaussian_pair(p.seed ^ 0xf10e5eedull, (uint64_t) (i / 2), 1.0f, a, b);
            x[(size_t) i] = a;
            if (i + 1 < T * M) {
                x[(size_t) i + 1] = b;
            }
        }
    }
    // Euler steps from 0 to 1: mean flow over a linear span; else over a cosine one
    // (1 - cos(pi s / 2)), each velocity guided: (1 + rate) v - rate v_uncond.
    auto at = [&](int64_t s) {
        const float u = (float) s / (float) h.steps;
        return h.meanflow ? u : 1.0f - std::cos(u * 0.5f * (float) M_PI);
    };
    c.timed_stage(VS_STAGE_FLOW, 0, p, [&] {
        for (int64_t s = 0; s < h.steps; ++s) {
            c.check_abort();
            const float        t = at(s), r = at(s + 1);
            std::vector<float> v = chatterbox::flow_velocity(c, h, x, mu, xvector, cond, t, r);
            if (h.cfg_rate > 0.0f) {
                const std::vector<float> u = chatterbox::flow_velocity(c, h, x, mu, xvector, cond, t, r, true);
                for (size_t i = 0; i < v.size(); ++i) {
                    v[i] = (1.0f + h.cfg_rate) * v[i] - h.cfg_rate * u[i];
                }
            }
            for (size_t i = 0; i < x.size(); ++i) {
                x[i] += (r - t) * v[i];
            }
            c.set_output("flow_v." + std::to_string(s), std::move(v), T, M);
        }
    });
    const int64_t      F = T - n_prompt_frames;
    std::vector<float> mel(x.begin() + n_prompt_frames * M, x.end());
    std::vector<float> audio = chatterbox_vocode(c, mel.data(), (size_t) F, p);
    c.set_output("mel", std::move(mel), F, M);
    trim_fade(audio, c.model->sample_rate);
    c.timings.n_frames = (int32_t) F;
    return audio;
}

std::vector<int32_t> chatterbox_speech_tokens(vs_context & c, const float * samples, size_t n_samples,
                                              const vs_synth_params & p) {
    const chatterbox::s3tok_hparams h = chatterbox::read_s3tok_hparams(*c.model);
    check_recording(samples, n_samples, h.sample_rate, "the speech tokenizer");
    return chatterbox::s3tok_tokens(c, h, samples, (int64_t) n_samples, p);
}

std::vector<float> chatterbox_xvector(vs_context & c, const float * samples, size_t n_samples,
                                      const vs_synth_params & p) {
    const chatterbox::xvector_hparams h = chatterbox::read_xvector_hparams(*c.model);
    check_recording(samples, n_samples, h.sample_rate, "the speaker encoder");
    return chatterbox::xvector_embed(c, h, samples, (int64_t) n_samples, p);
}

std::vector<float> chatterbox_prompt_mel(vs_context & c, const float * samples, size_t n_samples,
                                         const vs_synth_params & p) {
    const chatterbox::flow_hparams h = chatterbox::read_flow_hparams(*c.model);
    check_recording(samples, n_samples, h.mel_sample_rate, "S3Gen's mel");
    std::vector<float> mel;
    c.timed_stage(VS_STAGE_MEL, 0, p, [&] { mel = chatterbox::flow_prompt_mel(c, h, samples, (int64_t) n_samples); });
    return mel;
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
        stock_speaker = stock_values(*c.model, "voice.speaker_emb");
        if ((int64_t) stock_speaker.size() != chatterbox_speaker_size(*c.model)) {
            c.model->bad("its stock voice's speaker embedding is not of the token model's size");
        }
        stock_prompt            = stock_ids(*c.model, "voice.prompt_tokens");
        stock.speaker_embedding = stock_speaker.data();
        stock.prompt_tokens     = stock_prompt.data();
        stock.n_prompt_tokens   = stock_prompt.size();
        cond                    = &stock;
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
    vs_conditionals              cond{};
    cond.speaker_embedding = speaker.data();
    cond.prompt_tokens     = prompt.data();
    cond.n_prompt_tokens   = prompt.size();
    vs_synth_params p      = vs_synth_default_params();
    p.conditionals         = &cond;
    p.temperature          = 0.0f;
    chatterbox_generate(c, { 0, 1, 2, 3, 4, 5, 6, 7 }, p, 8);
}

}  // namespace vs
