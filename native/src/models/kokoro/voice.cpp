// Kokoro-82M's orchestration: its hyperparameters, a batch's way through the stages, and the voice's checks.
#include "kokoro.h"

namespace vs::kokoro {

kokoro_hparams read_hparams(const vs_model & m) {
    kokoro_hparams h;
    h.sample_rate = m.u32_in("kokoro.sample_rate", 1000, 384000);
    auto symbols  = m.str_array("kokoro.vocab_symbols");
    auto ids      = m.i32_array("kokoro.vocab_ids");
    if (symbols.size() != ids.size()) {
        m.bad("metadata 'kokoro.vocab_symbols' and 'kokoro.vocab_ids' differ in length");
    }
    for (size_t i = 0; i < symbols.size(); ++i) {
        h.vocab[symbols[i]] = ids[i];
    }
    h.voices      = m.str_array("kokoro.voices");
    h.bert_hidden = m.tensor(LAYER + "attention.query.weight")->ne[0];
    for (int i = 0;; ++i) {
        auto it = m.host.tensors.find(GEN + "ups." + std::to_string(i) + ".weight");
        if (it == m.host.tensors.end()) {
            break;
        }
        const int K = (int) it->second->ne[2];
        h.gen_kernels.push_back(K);
        h.gen_rates.push_back(K / 2);
    }
    int64_t up = HOP;
    for (int r : h.gen_rates) {
        up *= r;
    }
    if (h.voices.empty() || h.bert_hidden % BERT_HEAD_DIM != 0 || up != SAMPLES_PER_F0) {
        throw error(VS_ERR_FORMAT, "hyperparameters of '" + m.path + "' are not Kokoro-82M's");
    }
    return h;
}

std::vector<std::vector<float>> kokoro_voice::synthesize_batch(vs_context &                              c,
                                                               const std::vector<std::vector<int32_t>> & ids,
                                                               const vs_synth_params & p, int first_chunk) {
    const float             speed = p.length_scale > 0 ? 1.0f / p.length_scale : 1.0f;
    std::vector<kokoro_job> jobs(ids.size());
    for (size_t b = 0; b < ids.size(); ++b) {
        jobs[b].tokens.push_back(0);
        jobs[b].tokens.insert(jobs[b].tokens.end(), ids[b].begin(), ids[b].end());
        jobs[b].tokens.push_back(0);
        jobs[b].style = style_row(p, ids[b].size());
    }

    auto stage = [&](int id, auto && fn) { c.timed_stage(id, first_chunk, p, fn); };
    stage(VS_STAGE_BERT, [&] { run_bert(c, jobs); });
    stage(VS_STAGE_DURATION, [&] {
        run_duration(c, jobs, speed);
        for (auto & j : jobs) {
            const int64_t T = (int64_t) j.tokens.size();
            if (p.durations && (int64_t) p.n_durations != T) {
                throw error(VS_ERR_INVALID_ARG, "forced durations: " + std::to_string(p.n_durations) + " given for " +
                                                    std::to_string(T) + " tokens");
            }
            for (int64_t t = 0; t < T; ++t) {
                // Round half to even, as the export's Round; at least one frame a token.
                const int frames = p.durations ? p.durations[t] : std::max(1, (int) std::nearbyint(j.dur[t]));
                for (int k = 0; k < frames; ++k) {
                    j.frame_to_token.push_back((int32_t) t);
                }
            }
            if (j.frame_to_token.empty()) {
                throw error(VS_ERR_INVALID_ARG, "forced durations give no frames");
            }
        }
    });
    stage(VS_STAGE_PROSODY, [&] { run_prosody(c, jobs); });
    stage(VS_STAGE_TEXT_ENCODER, [&] { run_text_encoder(c, jobs); });
    stage(VS_STAGE_DECODER, [&] {
        std::vector<int64_t> frames;
        for (const auto & j : jobs) {
            frames.push_back((int64_t) j.frame_to_token.size());
        }
        const bool packs = runs_packed(c, jobs.size(), DEC);
        // The generator's kernels take the decoder's outputs where it leaves them on the
        // device (2 F frames a job).
        // A sentence alone reads it at its bucket's length (run_generator_fused): room for the
        // most frames past the last one's.
        dec_handoff handoff;
        int64_t     past = 0;
        for (int64_t F : frames) {
            handoff.frames += 2 * F;
            std::vector<int64_t> total;
            past = fused_generator(c) ? std::max(past, gen_bucket(2 * F, total) - 2 * F) : 0;
        }
        handoff.frames += past;
        for (auto [first, last] : pack_groups(frames, packs, PACK_GAP, c.limits.max_tensor_bytes)) {
            std::vector<kokoro_job *> group;
            for (size_t b = first; b < last; ++b) {
                group.push_back(&jobs[b]);
            }
            run_decoder(c, group, packs, fused_generator(c) ? &handoff : nullptr);
        }
    });
    stage(VS_STAGE_GENERATOR, [&] {
        if (!fused_generator(c)) {
            for (auto & j : jobs) {
                j.audio = run_generator(c, j.dec, j.f0, j.style, j.har);
            }
            return;
        }
        // Consecutive sentences in a pass of the kernels, up to GEN_PACKED_FRAMES frames (a
        // longer sentence alone) and GEN_PACKED_SENTENCES sentences.
        const int64_t cap =
            std::min<int64_t>(GEN_PACKED_FRAMES, (int64_t) (c.limits.max_tensor_bytes / GEN_FRAME_BYTES));
        for (size_t first = 0; first < jobs.size();) {
            std::vector<kokoro_job *> group  = { &jobs[first] };
            int64_t                   frames = (int64_t) jobs[first].frame_to_token.size();
            for (size_t b = first + 1; b < jobs.size() && group.size() < GEN_PACKED_SENTENCES; ++b) {
                frames += (int64_t) jobs[b].frame_to_token.size();
                if (frames > cap) {
                    break;
                }
                group.push_back(&jobs[b]);
            }
            run_generator_fused(c, group);
            first += group.size();
        }
    });

    std::vector<std::vector<float>> audio;
    for (auto & j : jobs) {
        const int64_t T = (int64_t) j.tokens.size(), F = (int64_t) j.frame_to_token.size();
        c.timings.n_phoneme_ids += (int32_t) T;
        c.timings.n_frames += (int32_t) F;
        audio.push_back(std::move(j.audio));
        c.chunk_durations.push_back(vs::token_frames(j.frame_to_token, T));
    }
    // The named intermediates are the last chunk's.
    kokoro_job &  j = jobs.back();
    const int64_t T = (int64_t) j.tokens.size(), F = (int64_t) j.frame_to_token.size();
    c.set_output("bert", std::move(j.d_en.v), T, j.d_en.C);
    c.set_output("duration_logits", std::move(j.logits), T, 50);
    c.set_output("durations", c.chunk_durations.back(), T, 1);
    c.set_output("F0", std::move(j.f0), 2 * F, 1);
    c.set_output("N", std::move(j.n), 2 * F, 1);
    c.set_output("text_encoder", std::move(j.t_en.v), T, j.t_en.C);
    if (j.dec_at >= 0) {  // left on the device for the generator: read back if asked for
        c.set_device_output("decoder", c.handoff, (size_t) j.dec_at, j.dec.T, j.dec.C);
    } else {
        c.set_output("decoder", std::move(j.dec.v), j.dec.T, j.dec.C);
    }
    if (!j.har_kept) {
        c.set_output("har", std::move(j.har.v), j.har.T, j.har.C);
    }
    return audio;
}

}  // namespace vs::kokoro

namespace vs {

using namespace kokoro;

void kokoro_validate(const vs_model & model) {
    static const std::vector<tensor_spec> layout = {
#include "layout.inc"
    };
    check_tensors(model, layout);
    const kokoro_hparams hp = read_hparams(model);
    if (hp.voices.size() > 4096) {
        model.bad("metadata 'kokoro.voices' names " + std::to_string(hp.voices.size()) + " voices; at most 4096");
    }
    std::vector<tensor_spec> packs;
    for (const auto & v : hp.voices) {
        packs.push_back({ "voice." + v, { 2 * STYLE_DIM, MAX_TOKENS, 1, 1 }, false });
    }
    check_tensors(model, packs);
    const int64_t n_vocab = std::min(model.tensor(BERT + "embeddings.word_embeddings.weight")->ne[1],
                                     model.tensor(TEXT + "embedding.weight")->ne[1]);
    for (const auto & [symbol, id] : hp.vocab) {
        if (id < 0 || id >= n_vocab) {
            model.bad("metadata 'kokoro.vocab_ids' maps '" + symbol + "' to " + std::to_string(id) +
                      "; the embeddings have " + std::to_string(n_vocab) + " rows");
        }
    }
}

std::unique_ptr<voice> make_kokoro_voice(vs_model & model) {
    return std::make_unique<kokoro_voice>(model);
}

std::vector<std::string> kokoro_language_codes() {
    std::vector<std::string> codes;
    for (const auto & l : kokoro::kokoro_languages()) {
        codes.push_back(l.code);
    }
    return codes;
}

}  // namespace vs
