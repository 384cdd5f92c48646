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
// `first`: the audio's first sample's place in the whole.
void trim_fade(std::vector<float> & audio, int64_t sample_rate, int64_t first) {
    const int64_t n = sample_rate / 50;
    for (int64_t i = first; i < 2 * n && i - first < (int64_t) audio.size(); ++i) {
        const float ramp =
            i < n ? 0.0f : (std::cos((float) M_PI - (float) (i - n) * ((float) M_PI / (float) (n - 1))) + 1.0f) * 0.5f;
        audio[(size_t) (i - first)] *= ramp;
    }
}

}  // namespace

std::vector<float> chatterbox_decode(vs_context & c, const std::vector<int32_t> & tokens, const vs_synth_params & p) {
    chatterbox::s3gen_stream stream(c, p);
    std::vector<float>       audio = stream.feed(tokens, true);
    c.timings.n_frames             = (int32_t) stream.frames();
    return audio;
}

namespace chatterbox {

s3gen_voice read_s3gen_voice(const vs_model & m, const flow_hparams & h, const vs_conditionals * cond) {
    const int64_t M = h.n_mels;
    s3gen_voice   v;
    if (cond) {
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
        v.prompt.assign(cond->gen_prompt_tokens, cond->gen_prompt_tokens + cond->n_gen_prompt_tokens);
        v.prompt_mel.assign(cond->prompt_mel, cond->prompt_mel + cond->n_prompt_frames * (size_t) M);
        v.xvector.assign(cond->xvector, cond->xvector + h.xvector);
    } else {  // the model's stock voice
        v.prompt     = stock_ids(m, "voice.gen_prompt_tokens");
        v.prompt_mel = stock_values(m, "voice.prompt_feat");
        v.xvector    = stock_values(m, "voice.xvector");
        if ((int64_t) v.xvector.size() != h.xvector || v.prompt_mel.size() % (size_t) M) {
            m.bad("its stock voice's S3Gen conditionals are not of the flow's sizes");
        }
    }
    v.prompt_frames = (int64_t) (v.prompt_mel.size() / (size_t) M);
    const int64_t P = (int64_t) v.prompt.size(), R = h.token_mel_ratio;
    if (v.prompt_frames != R * P && v.prompt_frames != R * P + 1) {
        throw error(VS_ERR_INVALID_ARG, "the prompt's mel has " + std::to_string(v.prompt_frames) + " frames for " +
                                            std::to_string(P) + " prompt tokens: two a token (or one more)");
    }
    double norm = 0.0;
    for (float x : v.xvector) {
        if (!std::isfinite(x)) {
            throw error(VS_ERR_INVALID_ARG, "the x-vector holds a NaN or infinite value");
        }
        norm += (double) x * x;
    }
    for (float x : v.prompt_mel) {
        if (!std::isfinite(x)) {
            throw error(VS_ERR_INVALID_ARG, "the prompt's mel holds a NaN or infinite value");
        }
    }
    for (float & x : v.xvector) {  // F.normalize
        x = (float) (x / std::max(std::sqrt(norm), 1e-12));
    }
    return v;
}

namespace {

void check_noise_scale(const vs_synth_params & p) {
    if (!(p.noise_scale < 0.0f) && !(p.noise_scale <= 10.0f)) {
        throw error(VS_ERR_INVALID_ARG, "noise_scale must be at most 10");
    }
}

void check_mel_frames(int64_t frames) {
    if (frames > 30000) {  // 10 minutes
        throw error(VS_ERR_INVALID_ARG, std::to_string(frames) + " mel frames: at most 30000 (10 minutes) a call");
    }
}

}  // namespace

s3gen_stream::s3gen_stream(vs_context & c, const vs_synth_params & p, std::shared_ptr<const s3gen_voice> voice) :
    c_(c),
    p_(p),
    h_(read_flow_hparams(*c.model)),
    vh_(read_hift_hparams(*c.model)),
    voice_(voice ? std::move(voice)
                 : std::make_shared<const s3gen_voice>(read_s3gen_voice(*c.model, h_, p.conditionals))) {
    check_noise_scale(p);
}

std::vector<float> s3gen_stream::vocode_mel(vs_context & c, const vs_synth_params & p, const float * mel,
                                            size_t n_frames) {
    if (n_frames == 0) {
        throw error(VS_ERR_INVALID_ARG, "no mel frames to vocode");
    }
    check_mel_frames((int64_t) n_frames);
    check_noise_scale(p);
    s3gen_stream s(c, p, std::make_shared<const s3gen_voice>());
    s.mel_.assign(mel, mel + n_frames * (size_t) s.h_.n_mels);
    for (float v : s.mel_) {
        if (!std::isfinite(v)) {
            throw error(VS_ERR_INVALID_ARG, "the mel holds a NaN or infinite value");
        }
    }
    s.fade_ = false;
    return s.vocode(true);
}

std::vector<float> s3gen_stream::feed(const std::vector<int32_t> & tokens, bool final) {
    if (ended_) {
        throw error(VS_ERR_INVALID_ARG, "S3Gen's stream has had its final feed");
    }
    if ((int64_t) tokens.size() < tokens_done_) {
        throw error(VS_ERR_INVALID_ARG, "a stream's tokens only grow");
    }
    if (final && tokens.empty()) {
        throw error(VS_ERR_INVALID_ARG, "no speech tokens to decode");
    }
    if (tokens.size() > 15000) {  // 10 minutes
        throw error(VS_ERR_INVALID_ARG,
                    std::to_string(tokens.size()) + " speech tokens: at most 15000 (10 minutes) a call");
    }
    for (int32_t id : tokens) {
        if (id < 0 || id >= h_.vocab) {
            throw error(VS_ERR_INVALID_ARG, "speech token " + std::to_string(id) + " is not one of the flow's 0 to " +
                                                std::to_string(h_.vocab - 1));
        }
    }
    const int64_t hold = final ? 0 : h_.lookahead;
    if ((int64_t) tokens.size() - hold > tokens_done_ || (final && (int64_t) tokens.size() > tokens_done_)) {
        flow(tokens, final);
    }
    ended_ = final;
    return vocode(final);
}

void s3gen_stream::flow(const std::vector<int32_t> & tokens, bool final) {
    const s3gen_voice & v = *voice_;
    const int64_t M = h_.n_mels, R = h_.token_mel_ratio, P = (int64_t) v.prompt.size(), N = (int64_t) tokens.size();
    const bool    first = tokens_done_ == 0;
    const int64_t off   = v.prompt_frames - R * P;  // the prompt's extra frame overlays the first speech frame
    // The window: the prompt, the context (its frames pinned as made), the new tokens; the
    // decoder stops short of the held-back tokens' frames.
    const int64_t ctx = first ? 0 : std::min(context_tokens, tokens_done_ - off);
    const int64_t w0 = tokens_done_ - ctx, lead = first ? v.prompt_frames : R * P, pinned = R * ctx;
    const int64_t T = R * (P + N - w0), hold = final ? 0 : h_.lookahead, Tv = T - R * hold;
    if (p_.flow_noise && !(first && final)) {
        throw error(VS_ERR_INVALID_ARG, "flow noise is given for one decode of every token, not for a stream");
    }
    if (p_.flow_noise && p_.n_flow_noise != (size_t) (T * M)) {
        throw error(VS_ERR_INVALID_ARG, "flow noise of " + std::to_string(p_.n_flow_noise) + " values; " +
                                            std::to_string(T) + " frames of " + std::to_string(M) + " take " +
                                            std::to_string(T * M));
    }
    std::vector<int32_t> ids(v.prompt);
    ids.insert(ids.end(), tokens.begin() + w0, tokens.end());
    std::vector<float> mu;
    c_.timed_stage(VS_STAGE_ENCODER, 0, p_, [&] { mu = flow_encode(c_, h_, ids); });
    mu.resize((size_t) (Tv * M));
    c_.set_output("flow_mu", mu, Tv, M);

    std::vector<float> x((size_t) (Tv * M)), cond((size_t) (Tv * M), 0.0f);
    std::copy(v.prompt_mel.begin(), v.prompt_mel.begin() + lead * M, cond.begin());
    std::copy(mel_.end() - pinned * M, mel_.end(), cond.begin() + lead * M);
    c_.set_output("flow_cond", cond, Tv, M);
    if (p_.flow_noise) {
        std::copy(p_.flow_noise, p_.flow_noise + T * M, x.begin());
        for (float v : x) {
            if (!std::isfinite(v)) {
                throw error(VS_ERR_INVALID_ARG, "the flow noise holds a NaN or infinite value");
            }
        }
    } else {  // a frame's noise is the same in every window that holds it
        for (int64_t w = 0; w < Tv; ++w) {
            const int64_t frame = w + (w >= R * P ? R * w0 : 0);
            for (int64_t b = 0; b < M; b += 2) {
                float n0, n1;
                gaussian_pair(p_.seed ^ 0xf10e5eedull, (uint64_t) ((frame * M + b) / 2), 1.0f, n0, n1);
                x[(size_t) (w * M + b)] = n0;
                if (b + 1 < M) {
                    x[(size_t) (w * M + b + 1)] = n1;
                }
            }
        }
    }
    // Euler steps from 0 to 1: mean flow over a linear span; else over a cosine one
    // (1 - cos(pi s / 2)), each velocity guided: (1 + rate) v - rate v_uncond.
    auto at = [&](int64_t s) {
        const float u = (float) s / (float) h_.steps;
        return h_.meanflow ? u : 1.0f - std::cos(u * 0.5f * (float) M_PI);
    };
    c_.timed_stage(VS_STAGE_FLOW, 0, p_, [&] {
        for (int64_t s = 0; s < h_.steps; ++s) {
            c_.check_abort();
            const float        t = at(s), r = at(s + 1);
            const bool         guided = h_.cfg_rate > 0.0f;
            std::vector<float> vel    = flow_velocity(c_, h_, x, mu, v.xvector, cond, t, r, guided);
            if (guided) {  // the conditional velocity's frames, then the unconditional one's
                const size_t n = vel.size() / 2;
                for (size_t i = 0; i < n; ++i) {
                    vel[i] = (1.0f + h_.cfg_rate) * vel[i] - h_.cfg_rate * vel[n + i];
                }
                vel.resize(n);
            }
            for (size_t i = 0; i < x.size(); ++i) {
                x[i] += (r - t) * vel[i];
            }
            c_.set_output("flow_v." + std::to_string(s), std::move(vel), Tv, M);
        }
    });
    mel_.insert(mel_.end(), x.begin() + (lead + pinned) * M, x.end());
    tokens_done_ = N - hold;
    c_.set_output("mel", mel_, (int64_t) (mel_.size() / (size_t) M), M);
}

std::vector<float> s3gen_stream::vocode(bool final) {
    const int64_t M = h_.n_mels, E = (int64_t) (mel_.size() / (size_t) M), per = hift_samples_per_frame(vh_);
    const int64_t end = final ? E : std::max(vocoded_, E - hold_frames);
    if (end <= vocoded_) {
        return {};
    }
    check_mel_frames(E);
    const int64_t start = std::max<int64_t>(0, vocoded_ - context_frames), T = E - start;
    if (p_.f0 && !(start == 0 && final && (int64_t) p_.n_f0 == E)) {
        throw error(VS_ERR_INVALID_ARG, std::to_string(p_.n_f0) + " F0 values for " + std::to_string(E) + " frames");
    }
    for (size_t i = 0; p_.f0 && i < p_.n_f0; ++i) {
        if (!(p_.f0[i] >= 0.0f && p_.f0[i] <= 0.5f * (float) vh_.sample_rate)) {
            throw error(VS_ERR_INVALID_ARG, "F0 value " + std::to_string(i) + " is not from 0 to half the sample rate");
        }
    }
    const float        noise = p_.noise_scale < 0.0f ? 1.0f : p_.noise_scale;
    const float *      mel   = mel_.data() + start * M;
    std::vector<float> audio, f0;
    c_.timed_stage(VS_STAGE_GENERATOR, 0, p_, [&] {
        f0 = p_.f0 ? std::vector<float>(p_.f0, p_.f0 + E) : hift_f0(c_, vh_, mel, T);
        // The excitation: the context's as made, the new frames' going on from it, the held-back
        // ones' provisionally (made again with the frames after them).
        std::vector<float> source(source_.end() - (vocoded_ - start) * per, source_.end());
        std::vector<float> made =
            hift_source(c_, vh_, std::vector<float>(f0.begin() + (vocoded_ - start), f0.begin() + (end - start)), noise,
                        p_.seed, &source_state_);
        source.insert(source.end(), made.begin(), made.end());
        source_.insert(source_.end(), made.begin(), made.end());
        c_.set_output("source", made, (int64_t) made.size(), 1);
        if (end < E) {
            source_state       ahead = source_state_;
            std::vector<float> more =
                hift_source(c_, vh_, std::vector<float>(f0.begin() + (end - start), f0.end()), noise, p_.seed, &ahead);
            source.insert(source.end(), more.begin(), more.end());
        }
        c_.check_abort();
        std::vector<float> window = hift_vocode(c_, vh_, mel, T, source);
        audio.assign(window.begin() + (vocoded_ - start) * per, window.begin() + (end - start) * per);
    });
    if (source_.size() > (size_t) (context_frames * per)) {
        source_.erase(source_.begin(), source_.end() - context_frames * per);
    }
    c_.set_output("f0", std::vector<float>(f0.begin() + (vocoded_ - start), f0.begin() + (end - start)), end - vocoded_,
                  1);
    if (fade_) {
        trim_fade(audio, c_.model->sample_rate, samples_);
    }
    vocoded_ = end;
    samples_ += (int64_t) audio.size();
    return audio;
}

}  // namespace chatterbox

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
    return chatterbox::s3gen_stream::vocode_mel(c, p, mel, n_frames);
}

int64_t chatterbox_speaker_size(const vs_model & model) {
    return chatterbox::read_t3_hparams(model).speaker_embed_size;
}

std::unique_ptr<model_state> make_chatterbox_state(const vs_model & model) {
    return std::make_unique<chatterbox::t3_state>(chatterbox::read_t3_hparams(model));
}

std::vector<int32_t> chatterbox_generate(vs_context & c, const std::vector<int32_t> & text, const vs_synth_params & p,
                                         size_t max_tokens, const chatterbox::token_callback & on_token) {
    return chatterbox_generate_many(c, { text }, p, { max_tokens }, { p.seed }, on_token)[0];
}

std::vector<std::vector<int32_t>> chatterbox_generate_many(vs_context &                              c,
                                                           const std::vector<std::vector<int32_t>> & texts,
                                                           const vs_synth_params &                   p,
                                                           const std::vector<size_t> &               max_tokens,
                                                           const std::vector<uint64_t> &             seeds,
                                                           const chatterbox::token_callback &        on_token) {
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
    return state->generate_many(c, texts, cond->speaker_embedding, prompt, p, max_tokens, seeds, on_token);
}

namespace {

// A run's tokens as S3Gen speaks them: those past its vocabulary (the token model's own) dropped,
// its silence tokens appended.
std::vector<int32_t> s3gen_tokens(const chatterbox::flow_hparams & h, const std::vector<int32_t> & tokens) {
    std::vector<int32_t> speech;
    for (int32_t t : tokens) {
        if (t < h.vocab) {
            speech.push_back(t);
        }
    }
    speech.insert(speech.end(), 3, (int32_t) h.silence_token);
    return speech;
}

}  // namespace

std::vector<std::vector<float>> chatterbox_speak_many(vs_context & c, const std::vector<std::vector<int32_t>> & texts,
                                                      const vs_synth_params & p, const std::vector<size_t> & max_tokens,
                                                      const std::vector<uint64_t> & seeds,
                                                      std::vector<size_t> &         n_tokens) {
    const auto                     t0 = std::chrono::steady_clock::now();
    const chatterbox::flow_hparams h  = chatterbox::read_flow_hparams(*c.model);
    // the voice read and checked once, before any token is drawn
    const auto voice =
        std::make_shared<const chatterbox::s3gen_voice>(chatterbox::read_s3gen_voice(*c.model, h, p.conditionals));
    const std::vector<std::vector<int32_t>> runs = chatterbox_generate_many(c, texts, p, max_tokens, seeds);
    std::vector<std::vector<float>>         audio;
    int64_t                                 frames = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
        n_tokens.push_back(runs[i].size());
        vs_synth_params q = p;
        q.seed            = seeds[i];
        chatterbox::s3gen_stream stream(c, q, voice);
        audio.push_back(stream.feed(s3gen_tokens(h, runs[i]), true));
        frames += stream.frames();
        if (i == 0) {
            c.timings.first_audio_ms = ms_since(t0);
        }
        if (p.on_chunk) {
            p.on_chunk((int) i, audio.back().data(), audio.back().size(), p.on_chunk_user_data);
        }
    }
    c.timings.n_frames = (int32_t) frames;
    return audio;
}

std::vector<float> chatterbox_speak(vs_context & c, const std::vector<int32_t> & text, const vs_synth_params & p,
                                    size_t max_tokens, size_t stream_tokens, size_t & n_tokens) {
    const auto                     t0 = std::chrono::steady_clock::now();
    const chatterbox::flow_hparams h  = chatterbox::read_flow_hparams(*c.model);
    chatterbox::s3gen_stream       stream(c, p);  // the voice checked before any token is drawn
    std::vector<float>             audio;
    int                            piece = 0;
    auto                           emit  = [&](const std::vector<float> & a) {
        if (!a.empty()) {
            if (piece == 0) {
                c.timings.first_audio_ms = ms_since(t0);
            }
            audio.insert(audio.end(), a.begin(), a.end());
            if (p.on_chunk) {
                p.on_chunk(piece, a.data(), a.size(), p.on_chunk_user_data);
            }
            ++piece;
        }
    };
    // The tokens S3Gen speaks: those past its vocabulary (the token model's own) dropped.
    std::vector<int32_t> speech;
    size_t               next = stream_tokens, step = stream_tokens;
    auto                 on_token = [&](const std::vector<int32_t> & tokens) {
        if (tokens.back() < h.vocab) {
            speech.push_back(tokens.back());
        }
        if (speech.size() >= next) {  // each piece twice the last, up to eight times the first
            emit(stream.feed(speech, false));
            step = std::min(2 * step, 8 * stream_tokens);
            next = speech.size() + step;
        }
    };
    const std::vector<int32_t> tokens =
        chatterbox_generate(c, text, p, max_tokens, stream_tokens ? chatterbox::token_callback(on_token) : nullptr);
    n_tokens = tokens.size();
    emit(stream.feed(s3gen_tokens(h, tokens), true));
    c.timings.n_frames = (int32_t) stream.frames();
    return audio;
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
