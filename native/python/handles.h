// The binding's handles: a model and a context owned by Python objects (closed explicitly or
// with their owner), the status codes turned into exceptions, a call's callbacks with the GIL
// taken back. Included by engine_module.cpp only.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "voicestudio.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace vs_python {

struct engine_error : std::exception {
    int         code;
    std::string message;
    engine_error(int code, std::string message) : code(code), message(std::move(message)) {}
    const char * what() const noexcept override { return message.c_str(); }
};

void check(int status) {
    if (status != VS_OK) {
        throw engine_error(status, vs_last_error());
    }
}

using audio_array = nb::ndarray<nb::numpy, float, nb::ndim<1>>;

// The C API reads text up to its first NUL: refused rather than cut short there.
void check_no_nul(const std::string & text) {
    const size_t at = text.find('\0');
    if (at != std::string::npos) {
        throw engine_error(VS_ERR_INVALID_ARG, "the text holds a NUL character (byte " + std::to_string(at) +
                                                   "); it is not text that can be spoken");
    }
}

// A loaded model, shared by the Python Model and every Context opened on it: closing the
// Model frees it only once its last context is closed too.
using model_ptr = std::shared_ptr<vs_model>;

class Model {
  public:
    Model(const std::string & path, std::optional<nb::callable> progress) {
        vs_model_params params = vs_model_default_params();
        struct state {
            nb::callable                      fn;
            std::unique_ptr<nb::python_error> error;
        } st;
        if (progress) {
            st.fn                     = *progress;
            params.progress_user_data = &st;
            params.progress           = [](float fraction, void * data) -> bool {
                auto *                 s = static_cast<state *>(data);
                nb::gil_scoped_acquire gil;
                try {
                    nb::object r = s->fn(fraction);
                    return r.is_none() || nb::cast<bool>(r);
                } catch (nb::python_error & e) {
                    s->error = std::make_unique<nb::python_error>(e);
                    return false;
                }
            };
        }
        int        status;
        vs_model * raw = nullptr;
        {
            nb::gil_scoped_release release;
            status = vs_model_load(path.c_str(), params, &raw);
        }
        if (raw) {
            model_ = model_ptr(raw, vs_model_free);
        }
        if (st.error) {
            throw nb::python_error(*st.error);
        }
        check(status);
    }

    void close() { model_.reset(); }

    const model_ptr & shared() const {
        if (!model_) {
            throw engine_error(VS_ERR_INVALID_ARG, "the model is closed");
        }
        return model_;
    }

    vs_model * get() const { return shared().get(); }

    model_ptr model_;
};

struct call_state {
    nb::object                        on_stage, on_chunk, abort;
    std::unique_ptr<nb::python_error> error;            // first exception a callback raised
    std::atomic<bool>                 failed{ false };  // error is set: polled without the GIL

    void capture(nb::python_error & e) {
        if (!error) {
            error = std::make_unique<nb::python_error>(e);
            failed.store(true, std::memory_order_release);
        }
    }
};

// One call on a context at a time: a second thread waits (without the GIL) for the first
// to finish, and a call from inside one of the context's own callbacks is refused.
class busy_guard {
  public:
    busy_guard(std::mutex & mutex, std::atomic<std::thread::id> & owner) :
        lock_(mutex, std::try_to_lock), owner_(owner) {
        if (!lock_.owns_lock()) {
            if (owner.load() == std::this_thread::get_id()) {
                throw engine_error(VS_ERR_INVALID_ARG,
                                   "the engine is busy with this thread's call; a callback "
                                   "cannot use the engine that called it");
            }
            nb::gil_scoped_release release;
            lock_.lock();
        }
        owner_.store(std::this_thread::get_id());
    }
    ~busy_guard() { owner_.store(std::thread::id()); }

  private:
    std::unique_lock<std::mutex>   lock_;
    std::atomic<std::thread::id> & owner_;
};

class Context {
  public:
    Context(Model & model, const std::string & device, int threads, std::optional<std::string> espeak_library,
            std::optional<std::string> espeak_data, int prewarm, int workers, std::optional<nb::dict> debug,
            std::optional<std::string> language) :
        model_(model.shared()), n_stages_(vs_model_stages(model.get(), stages_, VS_STAGE_COUNT)) {
        vs_context_params p = vs_context_default_params();
        p.device            = device.c_str();
        p.n_threads         = threads;
        p.espeak_library    = espeak_library ? espeak_library->c_str() : nullptr;
        p.espeak_data       = espeak_data ? espeak_data->c_str() : nullptr;
        p.language          = language ? language->c_str() : nullptr;
        p.prewarm           = prewarm;
        p.n_workers         = workers;
        std::string node_trace;
        if (debug) {
            set_debug(*debug, p.debug, node_trace);
        }
        vs_model * m = model.get();
        int        status;
        {
            nb::gil_scoped_release release;
            status = vs_context_init(m, p, &ctx_);
        }
        check(status);
    }
    ~Context() { close(); }

    // vs_context_params.debug from a dict of its fields' names (unknown names refused).
    static void set_debug(const nb::dict & d, vs_context_params::vs_context_debug & dbg, std::string & node_trace) {
        for (auto [key, value] : d) {
            const std::string name = nb::cast<std::string>(key);
            if (name == "device_graphs") {
                dbg.device_graphs = nb::cast<bool>(value);
            } else if (name == "limit_tensor_mib") {
                dbg.limit_tensor_mib = nb::cast<size_t>(value);
            } else if (name == "limit_matmul_4d") {
                dbg.limit_matmul_4d = nb::cast<bool>(value);
            } else if (name == "limit_strided_matmul") {
                dbg.limit_strided_matmul = nb::cast<bool>(value);
            } else if (name == "limit_out_prod") {
                dbg.limit_out_prod = nb::cast<bool>(value);
            } else if (name == "no_engine_kernels") {
                dbg.no_engine_kernels = nb::cast<bool>(value);
            } else if (name == "no_int16_kernels") {
                dbg.no_int16_kernels = nb::cast<bool>(value);
            } else if (name == "no_captures") {
                dbg.no_captures = nb::cast<bool>(value);
            } else if (name == "keep_graphs") {
                dbg.keep_graphs = nb::cast<int>(value);
            } else if (name == "kept_graphs_mib") {
                dbg.kept_graphs_mib = nb::cast<int64_t>(value);
            } else if (name == "staging_kib") {
                dbg.staging_kib = nb::cast<int64_t>(value);
            } else if (name == "wait_each_graph") {
                dbg.wait_each_graph = nb::cast<bool>(value);
            } else if (name == "node_trace") {
                node_trace     = nb::cast<std::string>(value);
                dbg.node_trace = node_trace.c_str();
            } else {
                throw nb::key_error(("no debug switch '" + name + "'").c_str());
            }
        }
    }

    void close() {
        busy_guard busy(busy_, owner_);
        if (ctx_) {
            vs_context_free(ctx_);
            ctx_ = nullptr;
        }
        model_.reset();
    }

    busy_guard guard() const { return busy_guard(busy_, owner_); }

    vs_context * get() const {
        if (!ctx_) {
            throw engine_error(VS_ERR_INVALID_ARG, "the context is closed");
        }
        return ctx_;
    }

    using style_array     = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
    using durations_array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    struct audio_deleter {
        void operator()(vs_audio * a) const { vs_audio_free(a); }
    };
    using audio_ptr = std::unique_ptr<vs_audio, audio_deleter>;

    static audio_array to_array(audio_ptr a) {
        vs_audio *  raw = a.release();
        nb::capsule owner(raw, [](void * p) noexcept { vs_audio_free((vs_audio *) p); });
        return audio_array((void *) vs_audio_samples(raw), { vs_audio_length(raw) }, owner);
    }

    audio_array synthesize(const std::string & input, bool phonemes, float noise_scale, float length_scale,
                           float noise_w, uint64_t seed, nb::object on_stage, nb::object on_chunk, nb::object abort,
                           int decoder_tile, std::optional<std::string> voice, std::optional<style_array> style,
                           std::optional<durations_array> durations, int batch) {
        check_no_nul(input);
        audio_ptr out;
        run(noise_scale, length_scale, noise_w, seed, on_stage, on_chunk, abort, decoder_tile, voice, style, durations,
            batch, [&](vs_context * c, const vs_synth_params & p) {
                vs_audio * a     = nullptr;
                const int status = vs_synthesize(c, input.c_str(), phonemes ? VS_INPUT_PHONEMES : VS_INPUT_TEXT, p, &a);
                out.reset(a);
                return status;
            });
        return to_array(std::move(out));
    }

    nb::list synthesize_many(const std::vector<std::string> & inputs, bool phonemes, float noise_scale,
                             float length_scale, float noise_w, uint64_t seed, nb::object on_stage, nb::object on_chunk,
                             nb::object abort, int decoder_tile, std::optional<std::string> voice,
                             std::optional<style_array> style, int batch) {
        for (const auto & input : inputs) {
            check_no_nul(input);
        }
        std::vector<audio_ptr> outs(inputs.size());
        run(noise_scale, length_scale, noise_w, seed, on_stage, on_chunk, abort, decoder_tile, voice, style,
            std::nullopt, batch, [&](vs_context * c, const vs_synth_params & p) {
                std::vector<const char *> in;
                for (const auto & s : inputs) {
                    in.push_back(s.c_str());
                }
                std::vector<vs_audio *> a(inputs.size(), nullptr);
                const int               status = vs_synthesize_many(c, in.data(), in.size(),
                                                      phonemes ? VS_INPUT_PHONEMES : VS_INPUT_TEXT, p, a.data());
                for (size_t i = 0; i < a.size(); ++i) {
                    outs[i].reset(a[i]);
                }
                return status;
            });
        nb::list result;
        for (auto & o : outs) {
            result.append(to_array(std::move(o)));
        }
        return result;
    }

    using tokens_array = nb::ndarray<int32_t, nb::numpy, nb::ndim<1>>;
    using vector_array = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

    tokens_array generate_tokens(durations_array text_tokens, std::optional<vector_array> speaker_embedding,
                                 std::optional<durations_array> prompt_tokens, size_t max_tokens, float temperature,
                                 int top_k, float top_p, float repetition_penalty, float min_p, float cfg_weight,
                                 float exaggeration, uint64_t seed, std::optional<durations_array> speech_tokens,
                                 nb::object on_stage, nb::object abort) {
        vs_conditionals cond{};  // none given: the model's stock voice
        t3_voice(cond, speaker_embedding, prompt_tokens);
        auto *      out = new int32_t[std::max<size_t>(max_tokens, 1)];
        nb::capsule owner(out, [](void * ptr) noexcept { delete[] (int32_t *) ptr; });
        size_t      n = 0;
        run(-1.0f, -1.0f, -1.0f, seed, on_stage, nb::none(), abort, 0, std::nullopt, std::nullopt, std::nullopt, 1,
            [&](vs_context * c, const vs_synth_params & base) {
                vs_synth_params p = base;
                p.conditionals    = speaker_embedding ? &cond : nullptr;
                sampling(p, temperature, top_k, top_p, repetition_penalty, min_p, cfg_weight, exaggeration);
                if (speech_tokens) {
                    p.speech_tokens   = speech_tokens->data();
                    p.n_speech_tokens = speech_tokens->shape(0);
                }
                return vs_generate_tokens(c, text_tokens.data(), text_tokens.shape(0), p, out, max_tokens, &n);
            });
        return tokens_array(out, { n }, owner);
    }

    audio_array vocode(nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> mel,
                       std::optional<vector_array> f0, float noise_scale, uint64_t seed, nb::object on_stage,
                       nb::object abort) {
        audio_ptr out;
        run(noise_scale, -1.0f, -1.0f, seed, on_stage, nb::none(), abort, 0, std::nullopt, std::nullopt, std::nullopt,
            1, [&](vs_context * c, const vs_synth_params & base) {
                vs_synth_params p = base;
                if (f0) {
                    p.f0   = f0->data();
                    p.n_f0 = f0->shape(0);
                }
                vs_audio * a      = nullptr;
                const int  status = vs_vocode(c, mel.data(), mel.shape(0), p, &a);
                out.reset(a);
                return status;
            });
        return to_array(std::move(out));
    }

    tokens_array speech_tokens(nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> audio,
                               size_t                                                               max_tokens) {
        busy_guard   busy = guard();
        vs_context * c    = get();
        auto *       out  = new int32_t[std::max<size_t>(max_tokens, 1)];
        nb::capsule  owner(out, [](void * ptr) noexcept { delete[] (int32_t *) ptr; });
        size_t       n = 0;
        int          status;
        {
            nb::gil_scoped_release release;
            status = vs_speech_tokens(c, audio.data(), audio.shape(0), out, max_tokens, &n);
        }
        check(status);
        return tokens_array(out, { n }, owner);
    }

    audio_array xvector(nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> audio, size_t size) {
        busy_guard   busy = guard();
        vs_context * c    = get();
        auto *       out  = new float[std::max<size_t>(size, 1)];
        nb::capsule  owner(out, [](void * ptr) noexcept { delete[] (float *) ptr; });
        int          status;
        {
            nb::gil_scoped_release release;
            status = vs_xvector(c, audio.data(), audio.shape(0), out, size);
        }
        check(status);
        return audio_array(out, { size }, owner);
    }

    nb::ndarray<nb::numpy, float, nb::ndim<2>> prompt_mel(
        nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> audio) {
        busy_guard   busy = guard();
        vs_context * c    = get();
        // 50 frames a second of 24 kHz audio, and a frame more for the reflected edges
        const size_t max_frames = audio.shape(0) / 480 + 2;
        auto *       out        = new float[max_frames * 80];
        nb::capsule  owner(out, [](void * ptr) noexcept { delete[] (float *) ptr; });
        size_t       n = 0;
        int          status;
        {
            nb::gil_scoped_release release;
            status = vs_prompt_mel(c, audio.data(), audio.shape(0), out, max_frames, &n);
        }
        check(status);
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, { n, 80 }, owner);
    }

    using mel_array = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

    audio_array decode_tokens(durations_array speech_tokens, std::optional<durations_array> prompt_tokens,
                              std::optional<mel_array> prompt_mel, std::optional<vector_array> xvector,
                              std::optional<mel_array> noise, float noise_scale, uint64_t seed, nb::object on_stage,
                              nb::object abort) {
        vs_conditionals cond{};  // no x-vector given: the model's stock voice
        s3gen_voice(cond, prompt_tokens, prompt_mel, xvector);
        if (noise && noise->shape(1) != 80) {
            throw engine_error(VS_ERR_INVALID_ARG, "the flow noise has " + std::to_string(noise->shape(1)) +
                                                       " bands a frame; S3Gen's have 80");
        }
        audio_ptr out;
        run(noise_scale, -1.0f, -1.0f, seed, on_stage, nb::none(), abort, 0, std::nullopt, std::nullopt, std::nullopt,
            1, [&](vs_context * c, const vs_synth_params & base) {
                vs_synth_params p = base;
                p.conditionals    = xvector ? &cond : nullptr;
                if (noise) {
                    p.flow_noise   = noise->data();
                    p.n_flow_noise = noise->shape(0) * noise->shape(1);
                }
                vs_audio * a      = nullptr;
                const int  status = vs_decode_tokens(c, speech_tokens.data(), speech_tokens.shape(0), p, &a);
                out.reset(a);
                return status;
            });
        return to_array(std::move(out));
    }

    nb::tuple speak_tokens(durations_array text_tokens, std::optional<vector_array> speaker_embedding,
                           std::optional<durations_array> prompt_tokens,
                           std::optional<durations_array> gen_prompt_tokens, std::optional<mel_array> prompt_mel,
                           std::optional<vector_array> xvector, size_t max_tokens, size_t stream_tokens,
                           float temperature, int top_k, float top_p, float repetition_penalty, float min_p,
                           float cfg_weight, float exaggeration, float noise_scale, uint64_t seed, nb::object on_stage,
                           nb::object on_chunk, nb::object abort) {
        vs_conditionals cond{};  // none given: the model's stock voice
        if (speaker_embedding.has_value() != xvector.has_value()) {
            throw engine_error(VS_ERR_INVALID_ARG,
                               "a voice's conditionals for speech need both parts: the token model's and S3Gen's");
        }
        t3_voice(cond, speaker_embedding, prompt_tokens);
        s3gen_voice(cond, gen_prompt_tokens, prompt_mel, xvector);
        audio_ptr out;
        size_t    n = 0;
        run(noise_scale, -1.0f, -1.0f, seed, on_stage, on_chunk, abort, 0, std::nullopt, std::nullopt, std::nullopt, 1,
            [&](vs_context * c, const vs_synth_params & base) {
                vs_synth_params p = base;
                p.conditionals    = xvector ? &cond : nullptr;
                sampling(p, temperature, top_k, top_p, repetition_penalty, min_p, cfg_weight, exaggeration);
                vs_audio * a = nullptr;
                const int  status =
                    vs_speak_tokens(c, text_tokens.data(), text_tokens.shape(0), p, max_tokens, stream_tokens, &n, &a);
                out.reset(a);
                return status;
            });
        return nb::make_tuple(to_array(std::move(out)), n);
    }

    nb::list speak_many(const std::vector<durations_array> & text_tokens, std::optional<vector_array> speaker_embedding,
                        std::optional<durations_array> prompt_tokens, std::optional<durations_array> gen_prompt_tokens,
                        std::optional<mel_array> prompt_mel, std::optional<vector_array> xvector,
                        const std::vector<size_t> & max_tokens, const std::vector<uint64_t> & seeds, float temperature,
                        int top_k, float top_p, float repetition_penalty, float min_p, float cfg_weight,
                        float exaggeration, float noise_scale, nb::object on_stage, nb::object on_chunk,
                        nb::object abort) {
        vs_conditionals cond{};  // none given: the model's stock voice
        if (speaker_embedding.has_value() != xvector.has_value()) {
            throw engine_error(VS_ERR_INVALID_ARG,
                               "a voice's conditionals for speech need both parts: the token model's and S3Gen's");
        }
        if (max_tokens.size() != text_tokens.size() || seeds.size() != text_tokens.size()) {
            throw engine_error(VS_ERR_INVALID_ARG, "a limit and a seed for each text");
        }
        t3_voice(cond, speaker_embedding, prompt_tokens);
        s3gen_voice(cond, gen_prompt_tokens, prompt_mel, xvector);
        const size_t                 n = text_tokens.size();
        std::vector<audio_ptr>       outs(n);
        std::vector<size_t>          drawn(n, 0);
        std::vector<const int32_t *> texts;
        std::vector<size_t>          lengths;
        for (const auto & t : text_tokens) {
            texts.push_back(t.data());
            lengths.push_back(t.shape(0));
        }
        run(noise_scale, -1.0f, -1.0f, 0, on_stage, on_chunk, abort, 0, std::nullopt, std::nullopt, std::nullopt, 1,
            [&](vs_context * c, const vs_synth_params & base) {
                vs_synth_params p = base;
                p.conditionals    = xvector ? &cond : nullptr;
                sampling(p, temperature, top_k, top_p, repetition_penalty, min_p, cfg_weight, exaggeration);
                std::vector<vs_audio *> a(n, nullptr);
                const int status = vs_speak_many(c, texts.data(), lengths.data(), n, p, max_tokens.data(), seeds.data(),
                                                 drawn.data(), a.data());
                for (size_t i = 0; i < n; ++i) {
                    outs[i].reset(a[i]);
                }
                return status;
            });
        nb::list result;
        for (size_t i = 0; i < n; ++i) {
            result.append(nb::make_tuple(to_array(std::move(outs[i])), drawn[i]));
        }
        return result;
    }

    audio_array embed(nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> audio) {
        busy_guard   busy = guard();
        vs_context * c    = get();
        const int    size = vs_model_embedding_size(vs_context_model(c));
        if (size <= 0) {
            throw engine_error(VS_ERR_INVALID_ARG, "this model is a voice, not a speaker encoder");
        }
        float * out = new float[(size_t) size];
        int     status;
        {
            nb::gil_scoped_release release;
            status = vs_embed(c, audio.data(), audio.shape(0), out, size);
        }
        nb::capsule owner(out, [](void * p) noexcept { delete[] (float *) p; });
        check(status);
        return audio_array(out, { (size_t) size }, owner);
    }

    // The token model's part of a voice's conditionals: its speaker embedding and prompt tokens.
    void t3_voice(vs_conditionals & cond, const std::optional<vector_array> & speaker_embedding,
                  const std::optional<durations_array> & prompt_tokens) {
        if (!speaker_embedding) {
            return;
        }
        cond.speaker_embedding = speaker_embedding->data();
        if (prompt_tokens) {
            cond.prompt_tokens   = prompt_tokens->data();
            cond.n_prompt_tokens = prompt_tokens->shape(0);
        }
        const int size = vs_model_embedding_size(vs_context_model(get()));
        if (size > 0 && speaker_embedding->shape(0) != (size_t) size) {
            throw engine_error(VS_ERR_INVALID_ARG, "the speaker embedding has " +
                                                       std::to_string(speaker_embedding->shape(0)) +
                                                       " values; the model takes " + std::to_string(size));
        }
    }

    // S3Gen's part: its prompt tokens, prompt mel [frames, 80] and x-vector.
    static void s3gen_voice(vs_conditionals & cond, const std::optional<durations_array> & prompt_tokens,
                            const std::optional<mel_array> & prompt_mel, const std::optional<vector_array> & xvector) {
        if (!xvector) {
            if (prompt_tokens || prompt_mel) {
                throw engine_error(VS_ERR_INVALID_ARG, "S3Gen's prompt tokens and mel need the voice's x-vector too");
            }
            return;
        }
        cond.xvector   = xvector->data();
        cond.n_xvector = xvector->shape(0);
        if (prompt_tokens) {
            cond.gen_prompt_tokens   = prompt_tokens->data();
            cond.n_gen_prompt_tokens = prompt_tokens->shape(0);
        }
        if (prompt_mel) {
            if (prompt_mel->shape(1) != 80) {
                throw engine_error(VS_ERR_INVALID_ARG, "the prompt's mel has " + std::to_string(prompt_mel->shape(1)) +
                                                           " bands a frame; S3Gen's have 80");
            }
            cond.prompt_mel      = prompt_mel->data();
            cond.n_prompt_frames = prompt_mel->shape(0);
        }
    }

    static void sampling(vs_synth_params & p, float temperature, int top_k, float top_p, float repetition_penalty,
                         float min_p, float cfg_weight, float exaggeration) {
        p.temperature        = temperature;
        p.top_k              = top_k;
        p.top_p              = top_p;
        p.repetition_penalty = repetition_penalty;
        p.min_p              = min_p;
        p.cfg_weight         = cfg_weight;
        p.exaggeration       = exaggeration;
    }

    // Builds a synthesis's parameters and callbacks, runs `call` with the GIL released and
    // rethrows the first exception a callback raised (else the engine's error).
    template <typename F>
    void run(float noise_scale, float length_scale, float noise_w, uint64_t seed, nb::object on_stage,
             nb::object on_chunk, nb::object abort, int decoder_tile, const std::optional<std::string> & voice,
             const std::optional<style_array> & style, const std::optional<durations_array> & durations, int batch,
             F && call) {
        busy_guard      busy = guard();
        vs_context *    c    = get();
        call_state      st{ on_stage, on_chunk, abort, nullptr };
        const bool      ask_abort = !abort.is_none();
        vs_synth_params p         = vs_synth_default_params();
        p.noise_scale             = noise_scale;
        p.length_scale            = length_scale;
        p.noise_w                 = noise_w;
        p.seed                    = seed;
        p.decoder_tile_frames     = decoder_tile;
        p.batch                   = batch;
        p.voice                   = voice ? voice->c_str() : nullptr;
        if (style) {
            if (style->shape(1) != 256) {
                throw engine_error(VS_ERR_INVALID_ARG, "a style pack has 256 columns");
            }
            p.style      = style->data();
            p.style_rows = (int) style->shape(0);
        }
        if (durations) {
            p.durations   = durations->data();
            p.n_durations = durations->shape(0);
        }
        if (!on_stage.is_none()) {
            p.on_stage_user_data = &st;
            p.on_stage           = [](int stage, int chunk, double ms, void * data) {
                auto *                 s = static_cast<call_state *>(data);
                nb::gil_scoped_acquire gil;
                try {
                    s->on_stage(vs_stage_name(stage), chunk, ms);
                } catch (nb::python_error & e) {
                    s->capture(e);
                }
            };
        }
        if (!on_chunk.is_none()) {
            p.on_chunk_user_data = &st;
            p.on_chunk           = [](int chunk, const float * samples, size_t n, void * data) {
                auto *                 s = static_cast<call_state *>(data);
                nb::gil_scoped_acquire gil;
                try {
                    float * copy = new float[n];
                    std::copy(samples, samples + n, copy);
                    nb::capsule owner(copy, [](void * ptr) noexcept { delete[] (float *) ptr; });
                    s->on_chunk(chunk, audio_array(copy, { n }, owner));
                } catch (nb::python_error & e) {
                    s->capture(e);
                }
            };
        }
        // Polled by the engine, after every graph and from every worker's thread; a raising
        // callback also stops the run. The GIL only where there is a callable to ask: taking
        // it on a worker's thread makes and drops a Python thread state each time.
        p.abort_user_data = &st;
        if (ask_abort) {
            p.abort = [](void * data) -> bool {
                auto *                 s = static_cast<call_state *>(data);
                nb::gil_scoped_acquire gil;
                if (s->error) {
                    return true;
                }
                try {
                    return nb::cast<bool>(s->abort());
                } catch (nb::python_error & e) {
                    s->capture(e);
                    return true;
                }
            };
        } else {
            p.abort = [](void * data) -> bool {
                return static_cast<call_state *>(data)->failed.load(std::memory_order_acquire);
            };
        }
        int status;
        {
            nb::gil_scoped_release release;
            status = call(c, p);
        }
        if (st.error) {
            throw nb::python_error(*st.error);
        }
        check(status);
    }

    std::string phonemize(const std::string & text) {
        check_no_nul(text);
        busy_guard   busy = guard();
        vs_context * c    = get();
        char *       out  = nullptr;
        int          status;
        {
            nb::gil_scoped_release release;
            status = vs_phonemize(c, text.c_str(), &out);
        }
        check(status);
        std::string s(out);
        vs_string_free(out);
        return s;
    }

    nb::dict timings() const {
        busy_guard busy = guard();
        vs_timings t    = vs_context_timings(get());
        nb::dict   stages;
        for (int i = 0; i < n_stages_; ++i) {
            stages[vs_stage_name(stages_[i])] = t.stage_ms[stages_[i]];
        }
        nb::dict d;
        d["stages_ms"]         = stages;
        d["total_ms"]          = t.total_ms;
        d["first_audio_ms"]    = t.first_audio_ms;
        d["chunks"]            = t.n_chunks;
        d["phoneme_ids"]       = t.n_phoneme_ids;
        d["frames"]            = t.n_frames;
        d["samples"]           = t.n_samples;
        d["skipped_symbols"]   = t.n_skipped_symbols;
        d["graphs_built"]      = t.n_graphs_built;
        d["graphs_reused"]     = t.n_graphs_reused;
        d["captures_replayed"] = t.n_captures_replayed;
        nb::list workers;  // each worker's ms in its runs, as many as the context has
        for (int i = 0; i < std::min(vs_context_workers(get()), VS_MAX_WORKERS); ++i) {
            workers.append(t.worker_ms[i]);
        }
        d["workers_ms"] = workers;
        return d;
    }

    nb::ndarray<nb::numpy, float, nb::ndim<2>> output(const std::string & name) const {
        busy_guard    busy = guard();
        const float * data = nullptr;
        int64_t       shape[2];
        check(vs_context_output(get(), name.c_str(), &data, shape));
        size_t  n    = (size_t) (shape[0] * shape[1]);
        float * copy = new float[n];
        std::copy(data, data + n, copy);
        nb::capsule owner(copy, [](void * p) noexcept { delete[] (float *) p; });
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(copy, { (size_t) shape[0], (size_t) shape[1] }, owner);
    }

    nb::list fallback_stages() const {
        busy_guard busy = guard();
        uint32_t   mask = vs_context_fallback_stages(get());
        nb::list   out;
        for (int i = 0; i < VS_STAGE_COUNT; ++i) {
            if (mask & (1u << i)) {
                out.append(vs_stage_name(i));
            }
        }
        return out;
    }

    // Per stage of the model, the ops that ran on the CPU instead of the device.
    nb::dict fallback_ops() const {
        busy_guard busy = guard();
        nb::dict   out;
        for (int i = 0; i < n_stages_; ++i) {
            nb::list    ops;
            std::string text = vs_context_fallback_ops(get(), stages_[i]);
            for (size_t start = 0; start < text.size();) {
                size_t end = text.find(", ", start);
                end        = end == std::string::npos ? text.size() : end;
                ops.append(text.substr(start, end - start));
                start = end + 2;
            }
            out[vs_stage_name(stages_[i])] = ops;
        }
        return out;
    }

    // [(stage, op, count, ms)], largest time first.
    nb::list op_profile() const {
        busy_guard busy = guard();
        char *     text = nullptr;
        check(vs_context_op_profile(get(), &text));
        std::string table(text);
        vs_string_free(text);
        nb::list out;
        for (size_t start = 0; start < table.size();) {
            size_t      end  = table.find('\n', start);
            std::string line = table.substr(start, end - start);
            start            = end + 1;
            size_t a = line.find('\t'), b = line.find('\t', a + 1), c = line.find('\t', b + 1);
            out.append(nb::make_tuple(line.substr(0, a), line.substr(a + 1, b - a - 1),
                                      std::stoll(line.substr(b + 1, c - b - 1)), std::stod(line.substr(c + 1))));
        }
        return out;
    }

    vs_context *                         ctx_ = nullptr;
    model_ptr                            model_;  // alive while this context is open
    mutable std::mutex                   busy_;
    mutable std::atomic<std::thread::id> owner_;
    int                                  stages_[VS_STAGE_COUNT];
    int                                  n_stages_;  // the model's stages, in order
};

}  // namespace vs_python
