// app._engine: a thin binding over the C API. Compute runs without the GIL;
// callbacks take it back. Audio is returned as a NumPy array that owns the
// engine's buffer (no copy).
#include "cpu/kernels.h"
#include "handles.h"

using namespace vs_python;

namespace {

nb::list devices() {
    nb::list out;
    int      n = vs_device_count();
    for (int i = 0; i < n; ++i) {
        vs_device_info info;
        check(vs_device_get(i, &info));
        static const char * types[] = { "cpu", "gpu", "igpu", "accel" };
        nb::dict            d;
        d["id"]           = info.id;
        d["name"]         = info.name;
        d["description"]  = info.description;
        d["type"]         = types[info.type];
        d["memory_free"]  = info.memory_free;
        d["memory_total"] = info.memory_total;
        out.append(d);
    }
    return out;
}

nb::object g_log_handler;
// Maps a status code to the exception type to raise (set_error_factory); unset: RuntimeError.
nb::object g_error_factory;

}  // namespace

NB_MODULE(_engine, m) {
    m.doc() = "Voice Studio native engine";

    nb::register_exception_translator([](const std::exception_ptr & p, void *) {
        try {
            std::rethrow_exception(p);
        } catch (const engine_error & e) {
            nb::object cls = g_error_factory.is_valid() && !g_error_factory.is_none() ? g_error_factory(e.code)
                                                                                      : nb::borrow(PyExc_RuntimeError);
            PyErr_SetString(cls.ptr(), e.what());
        }
    });

    m.def("version", &vs_version);
    m.def(
        "file_digest",
        [](const std::string & path) {
            uint64_t digest = 0;
            int      status;
            {
                nb::gil_scoped_release release;
                status = vs_file_digest(path.c_str(), &digest);
            }
            check(status);
            return digest;
        },
        "path"_a, "A fast 64-bit digest of a file's bytes (vs_file_digest): tells a damaged model file.");
    m.def("devices", &devices, "Every device ggml reports (id, name, description, type, memory).");
    m.def("stage_names", [] {
        nb::list out;
        for (int i = 0; i < VS_STAGE_COUNT; ++i) {
            out.append(vs_stage_name(i));
        }
        return out;
    });
    m.def(
        "set_error_factory", [](nb::object factory) { g_error_factory = factory; },
        "The exception type to raise for a status code: factory(code) -> type (None: RuntimeError).");
    m.def("set_log_handler", [](nb::object handler) {
        g_log_handler = handler;
        if (handler.is_none()) {
            vs_set_log_callback(nullptr, nullptr);
            return;
        }
        vs_set_log_callback(
            [](int level, const char * text, void *) {
                nb::gil_scoped_acquire gil;
                try {
                    g_log_handler(level, text);
                } catch (nb::python_error & e) {
                    e.discard_as_unraisable("voicestudio log handler");
                }
            },
            nullptr);
    });

    nb::class_<Model>(m, "Model")
        .def(nb::init<const std::string &, std::optional<nb::callable>>(), "path"_a, "progress"_a = nb::none())
        .def("close", &Model::close)
        .def_prop_ro("arch", [](const Model & s) { return std::string(vs_model_arch(s.get())); })
        .def_prop_ro("name", [](const Model & s) { return std::string(vs_model_name(s.get())); })
        .def_prop_ro("sample_rate", [](const Model & s) { return vs_model_sample_rate(s.get()); })
        .def_prop_ro("embedding_size", [](const Model & s) { return vs_model_embedding_size(s.get()); })
        .def_prop_ro("stages",
                     [](const Model & s) {
                         int      ids[VS_STAGE_COUNT];
                         int      n = vs_model_stages(s.get(), ids, VS_STAGE_COUNT);
                         nb::list out;
                         for (int i = 0; i < n; ++i) {
                             out.append(vs_stage_name(ids[i]));
                         }
                         return out;
                     })
        .def_prop_ro("voices",
                     [](const Model & s) {
                         nb::list out;
                         for (int i = 0; i < vs_model_voice_count(s.get()); ++i) {
                             out.append(vs_model_voice_name(s.get(), i));
                         }
                         return out;
                     })
        .def("meta", [](const Model & s, const std::string & key) -> std::optional<std::string> {
            const char * v = vs_model_meta(s.get(), key.c_str());
            return v ? std::optional<std::string>(v) : std::nullopt;
        });

    m.attr("MAX_WORKERS") = VS_MAX_WORKERS;
    // The vector width (floats) of the engine's CPU kernels on this CPU.
    m.def("cpu_vector_floats", &vs::cpu::vector_floats);
    m.attr("AUTO_WORKERS") = VS_AUTO_WORKERS;

    nb::class_<Context>(m, "Context")
        .def(nb::init<Model &, const std::string &, int, std::optional<std::string>, std::optional<std::string>, int,
                      int, std::optional<nb::dict>, std::optional<std::string>>(),
             "model"_a, "device"_a = "auto", "threads"_a = 0, "espeak_library"_a = nb::none(),
             "espeak_data"_a = nb::none(), "prewarm"_a = -1, "workers"_a = 1, "debug"_a = nb::none(),
             "language"_a = nb::none())
        .def("close", &Context::close)
        .def("synthesize", &Context::synthesize, "input"_a, "phonemes"_a = false, "noise_scale"_a = -1.0f,
             "length_scale"_a = -1.0f, "noise_w"_a = -1.0f, "seed"_a = 0, "on_stage"_a = nb::none(),
             "on_chunk"_a = nb::none(), "abort"_a = nb::none(), "decoder_tile"_a = 0, "voice"_a = nb::none(),
             "style"_a = nb::none(), "durations"_a = nb::none(), "batch"_a = 1)
        .def("synthesize_many", &Context::synthesize_many, "inputs"_a, "phonemes"_a = false, "noise_scale"_a = -1.0f,
             "length_scale"_a = -1.0f, "noise_w"_a = -1.0f, "seed"_a = 0, "on_stage"_a = nb::none(),
             "on_chunk"_a = nb::none(), "abort"_a = nb::none(), "decoder_tile"_a = 0, "voice"_a = nb::none(),
             "style"_a = nb::none(), "batch"_a = 1)
        .def("generate_tokens", &Context::generate_tokens, "text_tokens"_a, "speaker_embedding"_a = nb::none(),
             "prompt_tokens"_a = nb::none(), "max_tokens"_a = 1000, "temperature"_a = -1.0f, "top_k"_a = -1,
             "top_p"_a = -1.0f, "repetition_penalty"_a = -1.0f, "min_p"_a = -1.0f, "cfg_weight"_a = -1.0f,
             "exaggeration"_a = -1.0f, "seed"_a = 0, "speech_tokens"_a = nb::none(), "on_stage"_a = nb::none(),
             "abort"_a = nb::none(),
             "Chatterbox's speech tokens for text tokens in the voice of a speaker embedding and prompt tokens.")
        .def("vocode", &Context::vocode, "mel"_a, "f0"_a = nb::none(), "noise_scale"_a = -1.0f, "seed"_a = 0,
             "on_stage"_a = nb::none(), "abort"_a = nb::none(),
             "Chatterbox's vocoder on a log-mel [frames, 80]: 24 kHz audio.")
        .def("decode_tokens", &Context::decode_tokens, "speech_tokens"_a, "prompt_tokens"_a = nb::none(),
             "prompt_mel"_a = nb::none(), "xvector"_a = nb::none(), "noise"_a = nb::none(), "noise_scale"_a = -1.0f,
             "seed"_a = 0, "on_stage"_a = nb::none(), "abort"_a = nb::none(),
             "Chatterbox's S3Gen on speech tokens (its flow's mel, then its vocoder) in the voice of an x-vector, "
             "prompt tokens and prompt mel [frames, 80]: 24 kHz audio.")
        .def("speak_tokens", &Context::speak_tokens, "text_tokens"_a, "speaker_embedding"_a = nb::none(),
             "prompt_tokens"_a = nb::none(), "gen_prompt_tokens"_a = nb::none(), "prompt_mel"_a = nb::none(),
             "xvector"_a = nb::none(), "max_tokens"_a = 1000, "stream_tokens"_a = 0, "temperature"_a = -1.0f,
             "top_k"_a = -1, "top_p"_a = -1.0f, "repetition_penalty"_a = -1.0f, "min_p"_a = -1.0f,
             "cfg_weight"_a = -1.0f, "exaggeration"_a = -1.0f, "noise_scale"_a = -1.0f, "seed"_a = 0,
             "on_stage"_a = nb::none(), "on_chunk"_a = nb::none(), "abort"_a = nb::none(),
             "Chatterbox's text tokens to 24 kHz audio in a voice (both parts of its conditionals, or none: the "
             "stock voice), S3Gen streamed through the token model's run where stream_tokens > 0: (audio, speech "
             "tokens drawn).")
        .def("speak_many", &Context::speak_many, "text_tokens"_a, "speaker_embedding"_a = nb::none(),
             "prompt_tokens"_a = nb::none(), "gen_prompt_tokens"_a = nb::none(), "prompt_mel"_a = nb::none(),
             "xvector"_a = nb::none(), "max_tokens"_a, "seeds"_a, "temperature"_a = -1.0f, "top_k"_a = -1,
             "top_p"_a = -1.0f, "repetition_penalty"_a = -1.0f, "min_p"_a = -1.0f, "cfg_weight"_a = -1.0f,
             "exaggeration"_a = -1.0f, "noise_scale"_a = -1.0f, "on_stage"_a = nb::none(), "on_chunk"_a = nb::none(),
             "abort"_a = nb::none(),
             "Several texts' runs of Chatterbox at once (the token model's steps together, then S3Gen on each): a "
             "list of (audio, speech tokens drawn).")
        .def("speech_tokens", &Context::speech_tokens, "audio"_a, "max_tokens"_a = 1500,
             "Chatterbox's speech tokens (25 a second) of mono 16 kHz audio.")
        .def("xvector", &Context::xvector, "audio"_a, "size"_a = 192,
             "Chatterbox's x-vector (S3Gen's speaker encoder) of mono 16 kHz audio.")
        .def("prompt_mel", &Context::prompt_mel, "audio"_a,
             "Chatterbox's S3Gen log-mel [frames, 80] of mono 24 kHz audio (a voice's prompt mel).")
        .def("embed", &Context::embed, "audio"_a,
             "The L2-normalized speaker embedding of mono audio at the model's rate (speaker encoders).")
        .def("phonemize", &Context::phonemize)
        .def("timings", &Context::timings)
        .def("output", &Context::output)
        .def_prop_ro("device",
                     [](const Context & s) {
                         busy_guard busy = s.guard();
                         return std::string(vs_context_device(s.get()));
                     })
        .def_prop_ro("threads",
                     [](const Context & s) {
                         busy_guard busy = s.guard();
                         return vs_context_threads(s.get());
                     })
        .def_prop_ro("workers",
                     [](const Context & s) {
                         busy_guard busy = s.guard();
                         return vs_context_workers(s.get());
                     })
        .def_prop_ro("fallback_stages", &Context::fallback_stages)
        .def_prop_ro("fallback_ops", &Context::fallback_ops)
        .def_prop_ro("prewarm_ms",
                     [](const Context & s) {
                         busy_guard busy = s.guard();
                         return vs_context_prewarm_ms(s.get());
                     })
        .def(
            "set_op_profiling",
            [](Context & s, bool on) {
                busy_guard busy = s.guard();
                vs_context_set_op_profiling(s.get(), on);
            },
            "on"_a)
        .def("op_profile", &Context::op_profile);
}
