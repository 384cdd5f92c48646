// A call's inputs through a context's voice: chunks batched across the inputs, each batch
// divided between the workers, each take's chunks joined.
#include "vs-synthesis.h"

#include <algorithm>
#include <chrono>
#include <cstring>

std::vector<float> vs::token_frames(const std::vector<int32_t> & frame_to_token, int64_t T) {
    std::vector<float> frames((size_t) T, 0.0f);
    for (int32_t t : frame_to_token) {
        frames[(size_t) t] += 1.0f;
    }
    return frames;
}

void vs::synthesize_inputs(vs_context * ctx, const std::vector<const char *> & inputs, int kind,
                           const vs_synth_params & params, std::vector<std::unique_ptr<vs_audio>> & audio) {
    if (ctx->model->arch == "chatterbox") {
        throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path +
                                                "' holds Chatterbox's token model and no speech decoder: it makes "
                                                "speech tokens (vs_generate_tokens), not audio");
    }
    if (!ctx->voice) {
        throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path + "' is a speaker encoder; it cannot speak");
    }
    const std::pair<const char *, float> scales[] = { { "noise_scale", params.noise_scale },
                                                      { "length_scale", params.length_scale },
                                                      { "noise_w", params.noise_w } };
    for (const auto & [name, v] : scales) {
        if (!std::isfinite(v) || v > 100.0f) {
            throw vs::error(VS_ERR_INVALID_ARG, std::string(name) + " is " + std::to_string(v) +
                                                    "; give a finite value up to 100 (< 0: the voice's default)");
        }
    }
    if (params.length_scale >= 0.0f && params.length_scale < 0.01f) {
        throw vs::error(VS_ERR_INVALID_ARG, "length_scale is " + std::to_string(params.length_scale) +
                                                "; speech that fast has no frames (at least 0.01)");
    }
    vs_context::active_call call(ctx, &params);
    const auto              t0 = std::chrono::steady_clock::now();

    int                               skipped = 0;
    std::vector<std::vector<int32_t>> chunks;
    std::vector<size_t>               owner;  // the input of each chunk
    {
        auto tp = std::chrono::steady_clock::now();
        for (size_t i = 0; i < inputs.size(); ++i) {
            auto ids = kind == VS_INPUT_PHONEMES ? ctx->voice->ids_from_phonemes(inputs[i], skipped)
                                                 : ctx->voice->ids_from_text(*ctx, inputs[i], skipped);
            if (ids.empty()) {
                throw vs::error(VS_ERR_TEXT, inputs.size() == 1 ? "nothing to speak in the input"
                                                                : "nothing to speak in input " + std::to_string(i));
            }
            for (auto & c : ids) {
                chunks.push_back(std::move(c));
                owner.push_back(i);
            }
        }
        double ms                                 = vs::ms_since(tp);
        ctx->timings.stage_ms[VS_STAGE_PHONEMIZE] = ms;
        if (params.on_stage) {
            params.on_stage(VS_STAGE_PHONEMIZE, 0, ms, params.on_stage_user_data);
        }
    }
    ctx->timings.n_skipped_symbols = skipped;
    if (skipped > 0) {
        vs::log(VS_LOG_WARN, std::to_string(skipped) + " symbol(s) the voice cannot pronounce were skipped");
    }
    audio.clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
        audio.push_back(std::make_unique<vs_audio>());
        audio.back()->sample_rate = ctx->model->sample_rate;
    }
    // Chunks [first, first + pcm.size()) to their inputs, in order, on the calling thread:
    // each to on_chunk now, and kept for its input's audio, which is joined once at the end
    // (appended chunk by chunk, a long input's audio would be copied again at each growth).
    std::vector<std::vector<std::vector<float>>> parts(inputs.size());
    auto                                         deliver = [&](size_t first, std::vector<std::vector<float>> & pcm) {
        for (size_t k = 0; k < pcm.size(); ++k) {
            if (params.on_chunk) {
                params.on_chunk((int) (first + k), pcm[k].data(), pcm[k].size(), params.on_chunk_user_data);
            }
            if (first + k == 0) {
                ctx->timings.first_audio_ms = vs::ms_since(t0);
            }
            ctx->timings.n_samples += (int64_t) pcm[k].size();
            ctx->timings.n_chunks++;
            parts[owner[first + k]].push_back(std::move(pcm[k]));
        }
    };
    const size_t batch = (size_t) std::max(1, params.batch);
    for (size_t i = 0; i < chunks.size(); i += batch) {
        ctx->check_abort();
        const size_t        n = std::min(batch, chunks.size() - i);
        std::vector<size_t> ids(n);  // each chunk's phoneme ids: its work
        for (size_t k = 0; k < n; ++k) {
            ids[k] = chunks[i + k].size() + (ctx->device_graphs ? vs::DEVICE_CHUNK_WORK : 0);
        }
        std::vector<size_t> start = vs::split_runs(ids, ctx->workers.size() + 1);
        for (size_t & b : start) {
            b += i;
        }
        const size_t                                 n_run = start.size() - 1;
        std::vector<std::vector<std::vector<float>>> pcm(n_run);
        std::vector<double>                          busy_ms(n_run);
        ctx->run_workers(n_run, [&](size_t r, vs_context & c) {
            const auto                        tr = std::chrono::steady_clock::now();
            std::vector<std::vector<int32_t>> run(chunks.begin() + start[r], chunks.begin() + start[r + 1]);
            if (r == 0) {
                pcm[0]     = c.voice->synthesize_batch(c, run, params, (int) start[0]);
                busy_ms[0] = vs::ms_since(tr);
                deliver(start[0], pcm[0]);  // while the other workers go on
                return;
            }
            c.clear_results();
            vs_context::active_call worker_call(&c, &params);
            pcm[r]     = c.voice->synthesize_batch(c, run, params, (int) start[r]);
            busy_ms[r] = vs::ms_since(tr);
        });
        for (size_t r = 0; r < n_run; ++r) {
            ctx->timings.worker_ms[r] += busy_ms[r];
        }
        for (size_t r = 1; r < n_run; ++r) {
            ctx->absorb(*ctx->workers[r - 1], r + 1 == n_run);
            deliver(start[r], pcm[r]);
        }
    }
    if (ctx->chunk_durations.size() == chunks.size()) {  // every chunk's durations, end to end
        std::vector<float> all, tokens, of;
        for (size_t k = 0; k < chunks.size(); ++k) {
            all.insert(all.end(), ctx->chunk_durations[k].begin(), ctx->chunk_durations[k].end());
            tokens.push_back((float) ctx->chunk_durations[k].size());
            of.push_back((float) owner[k]);
        }
        const auto n = (int64_t) all.size();
        ctx->set_output("chunk_durations", std::move(all), n, 1);
        ctx->set_output("chunk_tokens", std::move(tokens), (int64_t) chunks.size(), 1);
        ctx->set_output("chunk_inputs", std::move(of), (int64_t) chunks.size(), 1);
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (parts[i].size() == 1) {
            audio[i]->samples = std::move(parts[i][0]);
        } else {
            audio[i]->joined = vs::join_parts(parts[i], audio[i]->n_joined);
        }
    }
    ctx->timings.total_ms = vs::ms_since(t0);
}
