// The C boundary: exceptions become status codes and a per-thread error text.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "vs-context.h"
#include "vs-synthesis.h"

namespace vs {

static thread_local std::string g_last_error;
static vs_log_callback          g_log_cb   = nullptr;
static void *                   g_log_data = nullptr;

void log(int level, const std::string & text) {
    if (g_log_cb) {
        g_log_cb(level, text.c_str(), g_log_data);
    } else if (level >= VS_LOG_WARN) {
        fprintf(stderr, "voicestudio: %s\n", text.c_str());
    }
}

std::unique_ptr<vs_model>   load_model(const std::string & path, const vs_model_params & params);
uint64_t                    file_digest(const std::string & path);
std::unique_ptr<vs_context> make_context(vs_model & model, const vs_context_params & params);
void                        set_op_profiling(vs_context & c, bool on);

template <typename F>
static int guarded(F && fn) {
    try {
        g_last_error.clear();
        fn();
        return VS_OK;
    } catch (const error & e) {
        g_last_error = e.what();
        return e.status;
    } catch (const std::bad_alloc &) {
        g_last_error = "out of memory";
        return VS_ERR_COMPUTE;
    } catch (const std::exception & e) {
        g_last_error = e.what();
        return VS_ERR_COMPUTE;
    }
}

}  // namespace vs

extern "C" {

const char * vs_last_error(void) {
    return vs::g_last_error.c_str();
}

const char * vs_stage_name(int stage) {
    static const char * names[VS_STAGE_COUNT] = {
        "phonemize", "encoder",      "duration",  "flow", "decoder", "bert",
        "prosody",   "text_encoder", "generator", "mel",  "speaker", "tokens"
    };
    return stage >= 0 && stage < VS_STAGE_COUNT ? names[stage] : "unknown";
}

const char * vs_version(void) {
    return "0.1.0";
}

void vs_set_log_callback(vs_log_callback callback, void * user_data) {
    vs::g_log_cb   = callback;
    vs::g_log_data = user_data;
}

int vs_device_count(void) {
    int n = 0;
    vs::guarded([&] { n = (int) vs::devices().size(); });
    return n;
}

int vs_device_get(int index, struct vs_device_info * info) {
    return vs::guarded([&] {
        const auto & list = vs::devices();
        if (!info || index < 0 || index >= (int) list.size()) {
            throw vs::error(VS_ERR_INVALID_ARG, "device index out of range");
        }
        auto e = list[index];
        vs::refresh_memory(e);
        *info = e.info;
    });
}

struct vs_model_params vs_model_default_params(void) {
    vs_model_params p{};
    p.progress           = nullptr;  // no progress report, never cancelled
    p.progress_user_data = nullptr;
    return p;
}

int vs_model_load(const char * path, struct vs_model_params params, vs_model ** model) {
    return vs::guarded([&] {
        if (!path || !model) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_model_load: path and model are required");
        }
        *model = nullptr;
        auto m = vs::load_model(path, params);
        if (m->arch == "kokoro") {
            vs::kokoro_validate(*m);
            m->voices = m->str_array("kokoro.voices");
        } else if (m->arch == "ge2e") {
            vs::ge2e_validate(*m);
        } else if (m->arch == "chatterbox") {
            vs::chatterbox_validate(*m);
        } else {
            vs::piper_validate(*m);
        }
        *model = m.release();
    });
}

int vs_file_digest(const char * path, uint64_t * digest) {
    return vs::guarded([&] {
        if (!path || !digest) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_file_digest: path and digest are required");
        }
        *digest = vs::file_digest(path);
    });
}

void vs_model_free(vs_model * model) {
    delete model;
}

const char * vs_model_arch(const vs_model * model) {
    return model ? model->arch.c_str() : "";
}

const char * vs_model_name(const vs_model * model) {
    return model ? model->name.c_str() : "";
}

int vs_model_sample_rate(const vs_model * model) {
    return model ? model->sample_rate : 0;
}

const char * vs_model_meta(const vs_model * model, const char * key) {
    if (!model || !key) {
        return nullptr;
    }
    auto it = model->strings.find(key);
    return it == model->strings.end() ? nullptr : it->second.c_str();
}

int vs_model_stages(const vs_model * model, int * stages, int max_stages) {
    static const int piper[]  = { VS_STAGE_PHONEMIZE, VS_STAGE_ENCODER, VS_STAGE_DURATION, VS_STAGE_FLOW,
                                  VS_STAGE_DECODER };
    static const int kokoro[] = { VS_STAGE_PHONEMIZE,    VS_STAGE_BERT,    VS_STAGE_DURATION, VS_STAGE_PROSODY,
                                  VS_STAGE_TEXT_ENCODER, VS_STAGE_DECODER, VS_STAGE_GENERATOR };
    static const int ge2e[]   = { VS_STAGE_MEL, VS_STAGE_SPEAKER };
    if (!model) {
        return 0;
    }
    if (model->arch == "chatterbox") {  // a voice's speaker embedding (vs_embed), tokens, S3Gen
        static const int chatterbox[] = { VS_STAGE_MEL,     VS_STAGE_SPEAKER, VS_STAGE_TOKENS,
                                          VS_STAGE_ENCODER, VS_STAGE_FLOW,    VS_STAGE_GENERATOR };
        for (int i = 0; stages && i < (int) std::size(chatterbox) && i < max_stages; ++i) {
            stages[i] = chatterbox[i];
        }
        return (int) std::size(chatterbox);
    }
    if (model->arch == "ge2e") {
        for (int i = 0; stages && i < (int) std::size(ge2e) && i < max_stages; ++i) {
            stages[i] = ge2e[i];
        }
        return (int) std::size(ge2e);
    }
    const bool  is_kokoro = model->arch == "kokoro";
    const int * list      = is_kokoro ? kokoro : piper;
    const int   n         = is_kokoro ? (int) std::size(kokoro) : (int) std::size(piper);
    for (int i = 0; stages && i < n && i < max_stages; ++i) {
        stages[i] = list[i];
    }
    return n;
}

int vs_model_voice_count(const vs_model * model) {
    return model ? (int) model->voices.size() : 0;
}

const char * vs_model_voice_name(const vs_model * model, int index) {
    if (!model || index < 0 || index >= (int) model->voices.size()) {
        return nullptr;
    }
    return model->voices[index].c_str();
}

struct vs_context_params vs_context_default_params(void) {
    vs_context_params p{};
    p.device         = "auto";   // the discrete GPU with the most free memory, else the CPU
    p.n_threads      = 0;        // all cores
    p.espeak_library = nullptr;  // no text input until given
    p.espeak_data    = nullptr;
    p.language       = nullptr;  // the model's own
    p.prewarm        = -1;       // on a GPU or other accelerator
    p.n_workers      = 1;
    // debug: what a user's synthesis runs with
    p.debug.device_graphs        = false;  // only off the CPU
    p.debug.limit_tensor_mib     = 0;      // the device's own limits
    p.debug.limit_matmul_4d      = true;
    p.debug.limit_strided_matmul = true;
    p.debug.limit_out_prod       = true;
    p.debug.no_engine_kernels    = false;    // the engine's CUDA and CPU kernels where they apply
    p.debug.no_int16_kernels     = false;    // integer convolutions where the CPU's kernels have them
    p.debug.no_captures          = false;    // where the CUDA backend captures graphs
    p.debug.keep_graphs          = -1;       // on CUDA
    p.debug.kept_graphs_mib      = -1;       // 1024
    p.debug.staging_kib          = -1;       // 4096
    p.debug.wait_each_graph      = false;    // queued where the device orders them by events
    p.debug.node_trace           = nullptr;  // none
    return p;
}

int vs_context_init(vs_model * model, struct vs_context_params params, vs_context ** ctx) {
    return vs::guarded([&] {
        if (!model || !ctx) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_context_init: model and ctx are required");
        }
        *ctx = nullptr;
        *ctx = vs::make_context(*model, params).release();
    });
}

void vs_context_free(vs_context * ctx) {
    delete ctx;
}

vs_model * vs_context_model(const vs_context * ctx) {
    return ctx ? ctx->model : nullptr;
}

const char * vs_context_device(const vs_context * ctx) {
    return ctx ? ctx->device.c_str() : "";
}

int vs_context_threads(const vs_context * ctx) {
    return ctx ? ctx->n_threads : 0;
}

int vs_context_workers(const vs_context * ctx) {
    return ctx ? (int) ctx->workers.size() + 1 : 0;
}

uint32_t vs_context_fallback_stages(const vs_context * ctx) {
    uint32_t mask = 0;
    for (int i = 0; ctx && i < VS_STAGE_COUNT; ++i) {
        mask |= ctx->fallback_ops[i].empty() ? 0u : 1u << i;
    }
    return mask;
}

const char * vs_context_fallback_ops(const vs_context * ctx, int stage) {
    if (!ctx || stage < 0 || stage >= VS_STAGE_COUNT) {
        return "";
    }
    auto * c = const_cast<vs_context *>(ctx);
    c->fallback_text.clear();
    for (const auto & op : ctx->fallback_ops[stage]) {
        c->fallback_text += (c->fallback_text.empty() ? "" : ", ") + op;
    }
    return c->fallback_text.c_str();
}

double vs_context_prewarm_ms(const vs_context * ctx) {
    return ctx ? ctx->prewarm_ms : 0.0;
}

void vs_context_set_op_profiling(vs_context * ctx, bool on) {
    if (ctx) {
        vs::set_op_profiling(*ctx, on);
    }
}

int vs_context_op_profile(const vs_context * ctx, char ** table) {
    return vs::guarded([&] {
        if (!ctx || !table) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_context_op_profile: ctx and table are required");
        }
        std::vector<std::pair<std::pair<int, std::string>, vs_context::op_stat>> rows(ctx->op_profile.begin(),
                                                                                      ctx->op_profile.end());
        std::stable_sort(rows.begin(), rows.end(),
                         [](const auto & a, const auto & b) { return a.second.ms > b.second.ms; });
        std::string out;
        for (const auto & [key, st] : rows) {
            out += std::string(vs_stage_name(key.first)) + "\t" + key.second + "\t" + std::to_string(st.count) + "\t" +
                   std::to_string(st.ms) + "\n";
        }
        *table = strdup(out.c_str());
    });
}

struct vs_synth_params vs_synth_default_params(void) {
    vs_synth_params p{};
    p.noise_scale         = -1.0f;  // the voice's default
    p.length_scale        = -1.0f;  // the voice's default
    p.noise_w             = -1.0f;  // the voice's default
    p.seed                = 0;
    p.decoder_tile_frames = 0;
    p.voice               = nullptr;  // the model's first style pack
    p.style               = nullptr;
    p.style_rows          = 0;
    p.durations           = nullptr;  // predicted
    p.n_durations         = 0;
    p.batch               = 1;        // stream chunk by chunk
    p.conditionals        = nullptr;  // the model's stock voice
    p.temperature         = -1.0f;    // the variant's default
    p.top_k               = -1;       // the variant's default
    p.top_p               = -1.0f;    // the variant's default
    p.repetition_penalty  = -1.0f;    // the variant's default
    p.min_p               = -1.0f;    // the variant's default
    p.cfg_weight          = -1.0f;    // the variant's default
    p.exaggeration        = -1.0f;    // the variant's default
    p.f0                  = nullptr;  // predicted
    p.n_f0                = 0;
    p.speech_tokens       = nullptr;  // drawn
    p.n_speech_tokens     = 0;
    p.flow_noise          = nullptr;  // drawn
    p.n_flow_noise        = 0;
    return p;
}

int vs_synthesize(vs_context * ctx, const char * input, int kind, struct vs_synth_params params, vs_audio ** audio) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || !input || !audio) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_synthesize: ctx, input and audio are required");
        }
        *audio = nullptr;
        std::vector<std::unique_ptr<vs_audio>> out;
        vs::synthesize_inputs(ctx, { input }, kind, params, out);
        *audio = out[0].release();
    });
}

int vs_synthesize_many(vs_context * ctx, const char * const * inputs, size_t n_inputs, int kind,
                       struct vs_synth_params params, vs_audio ** audio) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || !inputs || n_inputs == 0 || !audio) {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "vs_synthesize_many: ctx, inputs (at least one) and audio are required");
        }
        std::fill_n(audio, n_inputs, nullptr);
        std::vector<const char *> in(inputs, inputs + n_inputs);
        for (const char * s : in) {
            if (!s) {
                throw vs::error(VS_ERR_INVALID_ARG, "vs_synthesize_many: an input is NULL");
            }
        }
        std::vector<std::unique_ptr<vs_audio>> out;
        vs::synthesize_inputs(ctx, in, kind, params, out);
        for (size_t i = 0; i < n_inputs; ++i) {
            audio[i] = out[i].release();
        }
    });
}

int vs_phonemize(vs_context * ctx, const char * text, char ** phonemes) {
    return vs::guarded([&] {
        if (!ctx || !text || !phonemes) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_phonemize: ctx, text and phonemes are required");
        }
        if (!ctx->voice) {
            throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path + "' is a speaker encoder; it has no phonemes");
        }
        std::string ipa = ctx->voice->phonemize(*ctx, text);
        *phonemes       = strdup(ipa.c_str());
    });
}

void vs_string_free(char * s) {
    free(s);
}

struct vs_timings vs_context_timings(const vs_context * ctx) {
    return ctx ? ctx->timings : vs_timings{};
}

int vs_context_output(const vs_context * ctx, const char * name, const float ** data, int64_t shape[2]) {
    return vs::guarded([&] {
        if (!ctx || !name || !data || !shape) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_context_output: all arguments are required");
        }
        const vs_context::named_output * out = ctx->output(name);
        if (!out) {
            throw vs::error(VS_ERR_INVALID_ARG, std::string("no output named '") + name + "'");
        }
        *data    = out->first.data();
        shape[0] = out->second[0];
        shape[1] = out->second[1];
    });
}

int vs_generate_tokens(vs_context * ctx, const int32_t * text_tokens, size_t n_text_tokens,
                       struct vs_synth_params params, int32_t * tokens, size_t max_tokens, size_t * n_tokens) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || (!text_tokens && n_text_tokens) || !tokens || !n_tokens) {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "vs_generate_tokens: ctx, text_tokens, tokens and n_tokens are required");
        }
        *n_tokens = 0;
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "'" + ctx->model->path + "' is a " + ctx->model->arch + " model, which has no token model");
        }
        if (params.speech_tokens && params.n_speech_tokens > max_tokens) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_generate_tokens: room for " + std::to_string(max_tokens) +
                                                    " tokens, " + std::to_string(params.n_speech_tokens) + " given");
        }
        const auto                 t0 = std::chrono::steady_clock::now();
        vs_context::active_call    call(ctx, &params);
        const std::vector<int32_t> out = vs::chatterbox_generate(
            *ctx, std::vector<int32_t>(text_tokens, text_tokens + n_text_tokens), params, max_tokens);
        std::copy(out.begin(), out.end(), tokens);
        *n_tokens             = out.size();
        ctx->timings.n_chunks = 1;
        ctx->timings.n_frames = (int32_t) out.size();
        ctx->timings.total_ms = vs::ms_since(t0);
    });
}

int vs_speak_tokens(vs_context * ctx, const int32_t * text_tokens, size_t n_text_tokens, struct vs_synth_params params,
                    size_t max_tokens, size_t stream_tokens, size_t * n_tokens, vs_audio ** audio) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || (!text_tokens && n_text_tokens) || !n_tokens || !audio) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_speak_tokens: ctx, text_tokens, n_tokens and audio are required");
        }
        *audio    = nullptr;
        *n_tokens = 0;
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "'" + ctx->model->path + "' is a " + ctx->model->arch + " model, which has no token model");
        }
        if (params.speech_tokens || params.flow_noise || params.f0) {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "vs_speak_tokens draws its own tokens and noise: no speech_tokens, "
                            "flow_noise or f0");
        }
        const auto              t0 = std::chrono::steady_clock::now();
        vs_context::active_call call(ctx, &params);
        auto                    out = std::make_unique<vs_audio>();
        out->samples     = vs::chatterbox_speak(*ctx, std::vector<int32_t>(text_tokens, text_tokens + n_text_tokens),
                                                params, max_tokens, stream_tokens, *n_tokens);
        out->sample_rate = ctx->model->sample_rate;
        ctx->timings.n_chunks  = 1;
        ctx->timings.n_samples = (int64_t) out->samples.size();
        ctx->timings.total_ms  = vs::ms_since(t0);
        *audio                 = out.release();
    });
}

int vs_speak_many(vs_context * ctx, const int32_t * const * text_tokens, const size_t * n_text_tokens, size_t n_texts,
                  struct vs_synth_params params, const size_t * max_tokens, const uint64_t * seeds, size_t * n_tokens,
                  vs_audio ** audio) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || !text_tokens || !n_text_tokens || !max_tokens || !seeds || !n_tokens || !audio || n_texts == 0) {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "vs_speak_many: ctx, one or more texts, their lengths, limits and "
                            "seeds, n_tokens and audio are required");
        }
        std::fill(audio, audio + n_texts, nullptr);
        std::fill(n_tokens, n_tokens + n_texts, 0);
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "'" + ctx->model->path + "' is a " + ctx->model->arch + " model, which has no token model");
        }
        if (params.speech_tokens || params.flow_noise || params.f0) {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "vs_speak_many draws its own tokens and noise: no speech_tokens, "
                            "flow_noise or f0");
        }
        std::vector<std::vector<int32_t>> texts;
        for (size_t i = 0; i < n_texts; ++i) {
            if (!text_tokens[i] && n_text_tokens[i]) {
                throw vs::error(VS_ERR_INVALID_ARG, "vs_speak_many: text " + std::to_string(i) + " has no tokens");
            }
            texts.emplace_back(text_tokens[i], text_tokens[i] + n_text_tokens[i]);
        }
        const auto                      t0 = std::chrono::steady_clock::now();
        vs_context::active_call         call(ctx, &params);
        std::vector<size_t>             drawn;
        std::vector<std::vector<float>> out =
            vs::chatterbox_speak_many(*ctx, texts, params, std::vector<size_t>(max_tokens, max_tokens + n_texts),
                                      std::vector<uint64_t>(seeds, seeds + n_texts), drawn);
        int64_t samples = 0;
        for (const auto & a : out) {
            samples += (int64_t) a.size();
        }
        ctx->timings.n_chunks  = (int32_t) n_texts;
        ctx->timings.n_samples = samples;
        ctx->timings.total_ms  = vs::ms_since(t0);
        for (size_t i = 0; i < n_texts; ++i) {
            auto a         = std::make_unique<vs_audio>();
            a->samples     = std::move(out[i]);
            a->sample_rate = ctx->model->sample_rate;
            audio[i]       = a.release();
            n_tokens[i]    = drawn[i];
        }
    });
}

int vs_vocode(vs_context * ctx, const float * mel, size_t n_frames, struct vs_synth_params params, vs_audio ** audio) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || !mel || !audio) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_vocode: ctx, mel and audio are required");
        }
        *audio = nullptr;
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path + "' is a " + ctx->model->arch +
                                                    " model, which has no vocoder of its own");
        }
        const auto              t0 = std::chrono::steady_clock::now();
        vs_context::active_call call(ctx, &params);
        auto                    out = std::make_unique<vs_audio>();
        out->samples                = vs::chatterbox_vocode(*ctx, mel, n_frames, params);
        out->sample_rate            = ctx->model->sample_rate;
        ctx->timings.n_chunks       = 1;
        ctx->timings.n_frames       = (int32_t) n_frames;
        ctx->timings.n_samples      = (int64_t) out->samples.size();
        ctx->timings.total_ms       = vs::ms_since(t0);
        *audio                      = out.release();
    });
}

int vs_decode_tokens(vs_context * ctx, const int32_t * speech_tokens, size_t n_speech_tokens,
                     struct vs_synth_params params, vs_audio ** audio) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || (!speech_tokens && n_speech_tokens) || !audio) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_decode_tokens: ctx, speech_tokens and audio are required");
        }
        *audio = nullptr;
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path + "' is a " + ctx->model->arch +
                                                    " model, which has no speech-token decoder");
        }
        const auto              t0 = std::chrono::steady_clock::now();
        vs_context::active_call call(ctx, &params);
        auto                    out = std::make_unique<vs_audio>();
        out->samples =
            vs::chatterbox_decode(*ctx, std::vector<int32_t>(speech_tokens, speech_tokens + n_speech_tokens), params);
        out->sample_rate       = ctx->model->sample_rate;
        ctx->timings.n_chunks  = 1;
        ctx->timings.n_samples = (int64_t) out->samples.size();
        ctx->timings.total_ms  = vs::ms_since(t0);
        *audio                 = out.release();
    });
}

int vs_speech_tokens(vs_context * ctx, const float * samples, size_t n_samples, int32_t * tokens, size_t max_tokens,
                     size_t * n_tokens) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || (!samples && n_samples) || !tokens || !n_tokens) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_speech_tokens: ctx, samples, tokens and n_tokens are required");
        }
        *n_tokens = 0;
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path + "' is a " + ctx->model->arch +
                                                    " model, which has no speech tokenizer");
        }
        const auto                 t0     = std::chrono::steady_clock::now();
        const vs_synth_params      params = vs_synth_default_params();
        vs_context::active_call    call(ctx, &params);
        const std::vector<int32_t> out = vs::chatterbox_speech_tokens(*ctx, samples, n_samples, params);
        const size_t               n   = std::min(out.size(), max_tokens);
        std::copy(out.begin(), out.begin() + (std::ptrdiff_t) n, tokens);
        *n_tokens              = n;
        ctx->timings.n_samples = (int64_t) n_samples;
        ctx->timings.total_ms  = vs::ms_since(t0);
    });
}

int vs_xvector(vs_context * ctx, const float * samples, size_t n_samples, float * xvector, size_t n_xvector) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || (!samples && n_samples) || !xvector) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_xvector: ctx, samples and xvector are required");
        }
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path + "' is a " + ctx->model->arch +
                                                    " model, which has no x-vector encoder");
        }
        const auto               t0     = std::chrono::steady_clock::now();
        const vs_synth_params    params = vs_synth_default_params();
        vs_context::active_call  call(ctx, &params);
        const std::vector<float> e = vs::chatterbox_xvector(*ctx, samples, n_samples, params);
        if (n_xvector != e.size()) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_xvector: room for " + std::to_string(n_xvector) +
                                                    " values; the x-vector has " + std::to_string(e.size()));
        }
        std::copy(e.begin(), e.end(), xvector);
        ctx->timings.n_samples = (int64_t) n_samples;
        ctx->timings.total_ms  = vs::ms_since(t0);
    });
}

int vs_prompt_mel(vs_context * ctx, const float * samples, size_t n_samples, float * mel, size_t max_frames,
                  size_t * n_frames) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || (!samples && n_samples) || !mel || !n_frames) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_prompt_mel: ctx, samples, mel and n_frames are required");
        }
        *n_frames = 0;
        if (ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG,
                            "'" + ctx->model->path + "' is a " + ctx->model->arch + " model, which has no S3Gen mel");
        }
        const auto               t0     = std::chrono::steady_clock::now();
        const vs_synth_params    params = vs_synth_default_params();
        vs_context::active_call  call(ctx, &params);
        const std::vector<float> out = vs::chatterbox_prompt_mel(*ctx, samples, n_samples, params);
        const size_t             n   = std::min(out.size() / 80, max_frames);
        std::copy(out.begin(), out.begin() + (std::ptrdiff_t) (n * 80), mel);
        *n_frames              = n;
        ctx->timings.n_samples = (int64_t) n_samples;
        ctx->timings.total_ms  = vs::ms_since(t0);
    });
}

int vs_model_embedding_size(const vs_model * model) {
    if (model && model->arch == "chatterbox") {
        return (int) vs::chatterbox_speaker_size(*model);
    }
    return model && model->arch == "ge2e" ? (int) vs::ge2e_embedding_size(*model) : 0;
}

int vs_embed(vs_context * ctx, const float * samples, size_t n_samples, float * embedding, int n_embedding) {
    if (ctx) {
        ctx->clear_results();
    }
    return vs::guarded([&] {
        if (!ctx || !samples || !embedding) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_embed: ctx, samples and embedding are required");
        }
        if (ctx->model->arch != "ge2e" && ctx->model->arch != "chatterbox") {
            throw vs::error(VS_ERR_INVALID_ARG, "'" + ctx->model->path + "' is a voice, not a speaker encoder");
        }
        const int64_t size = vs::ge2e_embedding_size(*ctx->model);
        if (n_embedding < size) {
            throw vs::error(VS_ERR_INVALID_ARG, "vs_embed: the embedding needs " + std::to_string(size) + " values");
        }
        const auto               t0 = std::chrono::steady_clock::now();
        const std::vector<float> e  = vs::ge2e_embed(*ctx, samples, n_samples);
        std::copy(e.begin(), e.end(), embedding);
        ctx->timings.n_samples = (int64_t) n_samples;
        ctx->timings.total_ms  = vs::ms_since(t0);
    });
}

const float * vs_audio_samples(const vs_audio * audio) {
    return audio ? audio->data() : nullptr;
}

size_t vs_audio_length(const vs_audio * audio) {
    return audio ? audio->size() : 0;
}

int vs_audio_sample_rate(const vs_audio * audio) {
    return audio ? audio->sample_rate : 0;
}

void vs_audio_free(vs_audio * audio) {
    delete audio;
}
}
