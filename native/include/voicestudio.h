// Voice Studio engine: text-to-speech on ggml.
//
// Usage:
//
//     vs_model * model = NULL;
//     if (vs_model_load("joe.gguf", vs_model_default_params(), &model) != VS_OK) {
//         fprintf(stderr, "%s\n", vs_last_error());
//     }
//     struct vs_context_params cparams = vs_context_default_params();
//     cparams.device = "auto";                       // or "cpu", or an id from vs_device_get()
//     vs_context * ctx = NULL;
//     vs_context_init(model, cparams, &ctx);
//
//     struct vs_synth_params sparams = vs_synth_default_params();
//     sparams.on_chunk = my_chunk_cb;                // audio of each sentence as it is ready
//     vs_audio * audio = NULL;
//     vs_synthesize(ctx, "Hello there.", VS_INPUT_TEXT, sparams, &audio);
//     ... vs_audio_samples(audio), vs_audio_length(audio), vs_audio_sample_rate(audio) ...
//     vs_audio_free(audio);
//     vs_context_free(ctx);                          // contexts before their model
//     vs_model_free(model);
//
// Thread safety: a loaded model is read-only and may be shared by any number of
// contexts; one context must be used by one thread at a time. vs_last_error() is
// per thread.

#ifndef VOICESTUDIO_H
#define VOICESTUDIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(VS_BUILD)
#define VS_API __declspec(dllexport)
#else
#define VS_API __attribute__((visibility("default")))
#endif

// Status codes: VS_OK, or a negative code whose reason vs_last_error() gives.
enum vs_status {
    VS_OK              = 0,
    VS_ERR_INVALID_ARG = -1,
    VS_ERR_IO          = -2,  // file missing or unreadable
    VS_ERR_FORMAT      = -3,  // not a GGUF, truncated, or another architecture
    VS_ERR_DEVICE      = -4,  // unknown device or backend failed to start
    VS_ERR_TEXT        = -5,  // nothing speakable in the input
    VS_ERR_ABORTED     = -6,  // the abort callback asked to stop
    VS_ERR_COMPUTE     = -7,  // a graph failed to allocate or compute
    VS_ERR_PHONEMIZER  = -8,  // espeak-ng could not be loaded or initialised
};

// Stages of synthesis. Each architecture runs a subset in its own order
// (vs_model_stages): Piper phonemize, encoder, duration, flow, decoder; Kokoro
// phonemize, bert, duration, prosody, text_encoder, decoder, generator; Chatterbox mel,
// speaker (its voice encoder, vs_embed), tokens (its token model, vs_generate_tokens), encoder
// and flow (S3Gen's flow, speech tokens to a mel) and generator (its vocoder, vs_vocode). The speaker encoder
// (vs_embed) runs mel, speaker.
enum vs_stage {
    VS_STAGE_PHONEMIZE    = 0,
    VS_STAGE_ENCODER      = 1,
    VS_STAGE_DURATION     = 2,
    VS_STAGE_FLOW         = 3,
    VS_STAGE_DECODER      = 4,
    VS_STAGE_BERT         = 5,
    VS_STAGE_PROSODY      = 6,
    VS_STAGE_TEXT_ENCODER = 7,
    VS_STAGE_GENERATOR    = 8,
    VS_STAGE_MEL          = 9,
    VS_STAGE_SPEAKER      = 10,
    VS_STAGE_TOKENS       = 11,
    VS_STAGE_COUNT        = 12,
};

enum vs_device_type {
    VS_DEVICE_CPU   = 0,
    VS_DEVICE_GPU   = 1,
    VS_DEVICE_IGPU  = 2,
    VS_DEVICE_ACCEL = 3,
};

enum vs_input_kind {
    VS_INPUT_TEXT     = 0,  // plain text, phonemized with espeak-ng
    VS_INPUT_PHONEMES = 1,  // IPA; one sentence per line
};

enum vs_log_level {
    VS_LOG_INFO  = 0,
    VS_LOG_WARN  = 1,
    VS_LOG_ERROR = 2,
};

typedef struct vs_model   vs_model;
typedef struct vs_context vs_context;
typedef struct vs_audio   vs_audio;

typedef void (*vs_log_callback)(int level, const char * text, void * user_data);

// ---------------------------------------------------------------- errors

VS_API const char * vs_last_error(void);
VS_API const char * vs_stage_name(int stage);
VS_API const char * vs_version(void);
VS_API void         vs_set_log_callback(vs_log_callback callback, void * user_data);

// ---------------------------------------------------------------- devices

struct vs_device_info {
    char   id[64];  // stable within a run: "cpu", "cuda0", "vulkan0", ...
    char   name[128];
    char   description[256];
    int    type;          // enum vs_device_type
    size_t memory_free;   // bytes
    size_t memory_total;  // bytes
};

VS_API int vs_device_count(void);
VS_API int vs_device_get(int index, struct vs_device_info * info);

// ---------------------------------------------------------------- model

struct vs_model_params {
    // Called while loading; return false to cancel (vs_model_load then returns VS_ERR_ABORTED).
    bool (*progress)(float fraction, void * user_data);
    void * progress_user_data;
};

VS_API struct vs_model_params vs_model_default_params(void);
VS_API int                    vs_model_load(const char * path, struct vs_model_params params, vs_model ** model);
VS_API void                   vs_model_free(vs_model * model);

// A 64-bit digest of a file's bytes, fast enough to check a model file each time it is
// opened: it tells a damaged or replaced file from the one installed. Not a
// cryptographic hash.
VS_API int vs_file_digest(const char * path, uint64_t * digest);

VS_API const char * vs_model_arch(const vs_model * model);  // "piper", "kokoro", "ge2e" or "chatterbox"
VS_API const char * vs_model_name(const vs_model * model);
VS_API int          vs_model_sample_rate(const vs_model * model);
// A string metadata value of the GGUF file, or NULL (e.g. "piper.espeak_voice").
VS_API const char * vs_model_meta(const vs_model * model, const char * key);
// The stages this model's synthesis runs, in order; returns how many (at most VS_STAGE_COUNT).
VS_API int vs_model_stages(const vs_model * model, int * stages, int max_stages);
// Style packs the model carries (Kokoro: one per stock voice; Piper: none).
VS_API int          vs_model_voice_count(const vs_model * model);
VS_API const char * vs_model_voice_name(const vs_model * model, int index);

// ---------------------------------------------------------------- context

struct vs_context_params {
    const char * device;          // "auto" (default), "cpu", or a vs_device_info.id
    int          n_threads;       // CPU threads: 1 to the CPUs this process may use; 0 means all of them
    const char * espeak_library;  // path of libespeak-ng; NULL: phoneme input only
    const char * espeak_data;     // its espeak-ng-data directory
    // Kokoro: the language its text is read in (by espeak-ng, mapped onto Kokoro's symbols as
    // its own espeak front end maps them): "en-us" (NULL: the default), "en-gb" (long vowels
    // kept, as its British voices were trained), "es", "fr-fr", "hi", "it" or "pt-br". Other
    // models read text in their own language and refuse one given here.
    const char * language;
    // Runs one short synthesis (or embedding) while opening, so that the first real one
    // does not pay for kernel loading and buffer growth, and so that the stages' ops are
    // checked against the device at once (vs_context_fallback_ops). < 0: only on a GPU
    // or other accelerator (default); 0: never; > 0: always.
    int prewarm;
    // Workers a batch is divided between: 1 to VS_MAX_WORKERS; 0 means 1; < 0: automatic,
    // VS_AUTO_WORKERS on a CUDA device with 16 GiB free or more, 2 with 8 GiB, else 1 (each
    // worker has buffers of its own: docs/performance.md). Each is a context
    // of its own on the same device (its own queue, graphs and buffers; the weights shared)
    // computed by a thread of its own, so that one worker's host work (building graphs,
    // launching kernels) overlaps the others' device work. (ggml's Vulkan backend submits
    // every context's work to one queue of the device under one lock, and waits for
    // transfers holding it: there, workers were slower.) With n > 1, vs_synthesize_many,
    // and vs_synthesize with vs_synth_params.batch > 1, give each worker a run of
    // consecutive chunks of each batch; on_stage and abort are then also called from the
    // workers' threads, concurrently, while on_chunk stays on the calling thread, in order.
    // The audio is the same as with one worker.
    int n_workers;
    // Switches for tests and diagnostics; vs_context_default_params() sets each to what a
    // user's synthesis runs with.
    struct vs_context_debug {
        // Build the graphs an accelerator runs (fewer, larger kernels; ggml's im2col op) even
        // on the CPU, so that they are tested where there is no accelerator.
        bool device_graphs;
        // Build graphs for a device whose ops take less than ggml's express, such as a Vulkan
        // device: tensors of at most limit_tensor_mib MiB (0: the device's own limits, and the
        // three below are not read), no matmul over a fourth axis unless limit_matmul_4d, no
        // strided matrices in a matmul unless limit_strided_matmul, no out_prod unless
        // limit_out_prod. With device_graphs the CPU runs such graphs.
        size_t limit_tensor_mib;
        bool   limit_matmul_4d;       // default true
        bool   limit_strided_matmul;  // default true
        bool   limit_out_prod;        // default true
        // Run every stage in ggml's ops, not the engine's own CUDA or CPU kernels (to compare them).
        bool no_engine_kernels;
        // Run the engine's CPU convolutions in 32-bit floats only, not in 16-bit integers
        // where the CPU's integer multiply-adds are faster (to compare them).
        bool no_int16_kernels;
        // On CUDA, capture no graphs of the engine's own kernels and leave ggml's graphs
        // untagged (set ggml's GGML_CUDA_DISABLE_GRAPHS too, for every kernel launched one
        // by one).
        bool no_captures;
        // Keep each stage's graphs between calls: < 0 only on a CUDA device (default), 0
        // never, > 0 on any device.
        int keep_graphs;
        // The most memory kept graphs hold together, in MiB; < 0: 1024 (default).
        int64_t kept_graphs_mib;
        // Pinned host memory through which a CUDA device's inputs are copied, in KiB; < 0:
        // 4096 (default); 0: each input set and waited for at once.
        int64_t staging_kib;
        // On CUDA, wait for each graph before the next, as other backends do (by default kept
        // graphs are queued and ordered by events).
        bool wait_each_graph;
        // A file to write, while op profiling is on, every graph's nodes, their sources and a
        // summary of their values, so that a device's run can be compared with the CPU's node
        // by node (tools/node_trace.py reads it). NULL: none (default). The context's
        // workers write none.
        const char * node_trace;
    } debug;
};

#define VS_MAX_WORKERS 16
#define VS_AUTO_WORKERS 4

VS_API struct vs_context_params vs_context_default_params(void);
VS_API int                      vs_context_init(vs_model * model, struct vs_context_params params, vs_context ** ctx);
VS_API void                     vs_context_free(vs_context * ctx);

VS_API const char * vs_context_device(const vs_context * ctx);  // id of the device it runs on
VS_API vs_model *   vs_context_model(const vs_context * ctx);
VS_API int          vs_context_threads(const vs_context * ctx);
VS_API int          vs_context_workers(const vs_context * ctx);  // vs_context_params.n_workers (1 for encoders)
// Stages that had ops placed on the CPU although a GPU was chosen: bit i = stage i.
VS_API uint32_t vs_context_fallback_stages(const vs_context * ctx);
// The ops of `stage` that ran on the CPU instead of the chosen device, because the device
// does not support them (ggml_backend_supports_op) or the scheduler placed them there:
// "OP(type), ..." (the type of its first
// source) or "" when none. Valid until the next call on the context.
VS_API const char * vs_context_fallback_ops(const vs_context * ctx, int stage);
// Milliseconds the prewarm took while opening (0 when there was none).
VS_API double vs_context_prewarm_ms(const vs_context * ctx);

// Op profiling, for finding where a device spends its time: while on, every graph node
// is computed on its own and synchronized, and its time is added to a per-stage, per-op
// table (this slows synthesis down; the totals include each node's launch and sync).
VS_API void vs_context_set_op_profiling(vs_context * ctx, bool on);
// The table since profiling was last turned on (turning it off keeps it), as tab-separated lines
// "stage<TAB>op<TAB>count<TAB>ms", largest first. Free with vs_string_free().
VS_API int vs_context_op_profile(const vs_context * ctx, char ** table);

// ---------------------------------------------------------------- synthesis

struct vs_timings {
    double  stage_ms[VS_STAGE_COUNT];  // summed over chunks (and workers, whose stages overlap)
    double  total_ms;                  // wall clock of the whole call
    double  first_audio_ms;            // call start to the first chunk delivered
    int32_t n_chunks;
    int32_t n_phoneme_ids;
    int32_t n_frames;
    int64_t n_samples;
    int32_t n_skipped_symbols;  // input symbols the voice has no phoneme for
    // Graphs built for this call, and graphs kept from an earlier call of the same shapes
    // that it ran again (on CUDA a context keeps its stages' graphs between calls).
    int32_t n_graphs_built;
    int32_t n_graphs_reused;
    // Runs of the engine's own CUDA kernels that replayed a capture made by an earlier run of
    // the same shapes (on CUDA a sentence's residual stacks are captured by their length's
    // bucket).
    int32_t n_captures_replayed;
    // Each worker's time in its runs of the call's batches (worker 0 is the context itself;
    // 0 for workers given no run): against total_ms, how evenly a batch was divided and what
    // the call spent outside the workers.
    double worker_ms[VS_MAX_WORKERS];
};

// A voice as Chatterbox takes it, computed from a recording of the speaker: its speaker embedding
// (vs_embed, at 16 kHz), its speech tokens (vs_speech_tokens: of its first 15 s for the token
// model, at most 375; of its first 10 s for S3Gen), S3Gen's mel of those 10 s at 24 kHz
// (vs_prompt_mel) and their x-vector (vs_xvector). app/engine/chatterbox.py's
// ChatterboxModel.conditionals makes them from a recording as the reference does.
struct vs_conditionals {
    // The voice encoder's speaker embedding: vs_model_meta's "chatterbox.t3.speaker_embed_size"
    // values (256), L2-normalized.
    const float * speaker_embedding;
    // The recording's speech tokens (the S3 tokenizer's codes, 0 to 6560): at most
    // "chatterbox.t3.prompt_tokens" of them; none is allowed.
    const int32_t * prompt_tokens;
    size_t          n_prompt_tokens;
    // S3Gen's part (vs_decode_tokens): the recording's speech tokens (0 to 6560; none is
    // allowed), its log-mel at 24 kHz, [n_prompt_frames, 80] row-major, two frames a token (or one
    // more), and its x-vector (the CAMPPlus speaker embedding, 192 values).
    const int32_t * gen_prompt_tokens;
    size_t          n_gen_prompt_tokens;
    const float *   prompt_mel;
    size_t          n_prompt_frames;
    const float *   xvector;
    size_t          n_xvector;
};

struct vs_synth_params {
    float    noise_scale;   // < 0: the voice's default
    float    length_scale;  // < 0: the voice's default; larger is slower
    float    noise_w;       // < 0: the voice's default
    uint64_t seed;
    // Longest run of frames the vocoder decodes at once (longer chunks go in overlapping
    // tiles whose seams are exact); bounds its memory. 0: the engine's default; < 0: whole.
    int decoder_tile_frames;

    // Kokoro: the style pack to speak with, by name (NULL: the model's first), or a
    // pack of its own: `style` holds `style_rows` rows of 256 values (row n styles a
    // sentence of n + 1 phonemes). `style` wins over `voice`.
    const char *  voice;
    const float * style;
    int           style_rows;
    // Frames per token (one per phoneme id, padding included) replacing the predicted
    // durations, for comparing stages with a reference runtime. NULL: predicted.
    const int32_t * durations;
    size_t          n_durations;

    // Chunks (sentences) synthesized together: with n > 1 each stage runs over up to n
    // chunks before the next stage, and the architecture shares work between them where
    // it batches it (Kokoro: its LSTMs run all the chunks' steps in the same kernels; off
    // the CPU, Kokoro's BERT and every stage of Piper take the chunks in one graph); their
    // audio is delivered together, after the batch. <= 1: one chunk at a time, each
    // delivered as soon as it is ready (the default). The audio is the same either way.
    int batch;

    // Chatterbox's token model: the voice (NULL: the model's stock voice), and the reference's
    // sampling, each < 0 for the variant's default (Turbo: temperature 0.8, top_k 1000, top_p
    // 0.95, repetition_penalty 1.2; Multilingual: temperature 0.8, top_p 1, min_p 0.05,
    // repetition_penalty 2, cfg_weight 0.5, exaggeration 0.5). temperature 0 takes the most
    // likely token after the penalty; top_k 0, top_p 1 and min_p 0 keep every token; seed picks
    // the draws. Multilingual: cfg_weight the classifier-free guidance (0: none), exaggeration
    // the emotion conditioning; Turbo has neither.
    const struct vs_conditionals * conditionals;
    float                          temperature;
    int                            top_k;
    float                          top_p;
    float                          repetition_penalty;
    float                          min_p;
    float                          cfg_weight;
    float                          exaggeration;
    // Chatterbox's vocoder (vs_vocode): F0 in Hz, one a mel frame, replacing its F0 predictor's,
    // for comparing with a reference runtime. NULL: predicted.
    const float * f0;
    size_t        n_f0;
    // Speech tokens taken in place of the token model's draws (teacher forcing, after its
    // start token), for comparing with a reference runtime: output "t3_logits". NULL: drawn.
    const int32_t * speech_tokens;
    size_t          n_speech_tokens;
    // S3Gen's flow (vs_decode_tokens): its starting noise, [frames, 80] row-major over the prompt's
    // frames and the new ones, for comparing with a reference runtime. NULL: drawn from seed.
    const float * flow_noise;
    size_t        n_flow_noise;

    // Called after each stage of each chunk (of each batch: with its first chunk's index),
    // with its milliseconds.
    void (*on_stage)(int stage, int chunk, double ms, void * user_data);
    void * on_stage_user_data;
    // Called with the audio of each chunk (a sentence) once it is synthesized.
    void (*on_chunk)(int chunk, const float * samples, size_t n_samples, void * user_data);
    void * on_chunk_user_data;
    // Polled between stages and inside long computations; return true to stop.
    bool (*abort)(void * user_data);
    void * abort_user_data;
};

VS_API struct vs_synth_params vs_synth_default_params(void);

// Synthesizes `input` (text or phonemes) into `*audio`, which the caller frees.
VS_API int vs_synthesize(vs_context * ctx, const char * input, int kind, struct vs_synth_params params,
                         vs_audio ** audio);
// Synthesizes several inputs in one call: their sentences are batched together across the
// inputs (`params.batch` at a time) and audio[i] receives input i's audio (each freed by
// the caller). Chunks are numbered across all inputs, in order. Timings cover the call.
// On an error no audio is returned.
VS_API int vs_synthesize_many(vs_context * ctx, const char * const * inputs, size_t n_inputs, int kind,
                              struct vs_synth_params params, vs_audio ** audio);
// The phonemes espeak-ng produces for `text`, one sentence a line. Free with vs_string_free().
VS_API int  vs_phonemize(vs_context * ctx, const char * text, char ** phonemes);
VS_API void vs_string_free(char * s);

VS_API struct vs_timings vs_context_timings(const vs_context * ctx);  // of the last synthesis

// Chatterbox's token model alone: the speech tokens (at most max_tokens, written to `tokens`,
// their number to *n_tokens) for `text_tokens`, the ids of the model's text tokenizer, in the
// voice of params.conditionals, drawn as params says. The stop token ends the run and is not
// written. Timings: stage tokens. Output "t3_logits" ([speech tokens + 1, vocabulary]) with
// params.speech_tokens.
VS_API int vs_generate_tokens(vs_context * ctx, const int32_t * text_tokens, size_t n_text_tokens,
                              struct vs_synth_params params, int32_t * tokens, size_t max_tokens, size_t * n_tokens);

// Chatterbox's vocoder (HiFT) alone: audio at vs_model_sample_rate of a log-mel spectrogram
// `mel` ([n_frames, 80], row-major, 50 frames a second), written to *audio (freed by the
// caller). Its excitation's noise is params.noise_scale times the reference's (< 0: 1; 0: none,
// and no random phases); params.seed picks it. Timings: stage generator. Outputs "f0"
// ([n_frames]) and "source" ([samples]).
VS_API int vs_vocode(vs_context * ctx, const float * mel, size_t n_frames, struct vs_synth_params params,
                     vs_audio ** audio);

// Chatterbox's S3Gen alone: audio at vs_model_sample_rate of `speech_tokens` (0 to 6560, 25 a
// second) in the voice of params.conditionals' S3Gen part (NULL: the model's stock voice),
// written to *audio (freed by the caller): its flow makes a log-mel (the encoder, then the
// variant's steps from noise drawn from params.seed or given as params.flow_noise), its vocoder
// the audio (as vs_vocode), whose first 40 ms are faded in. Timings: stages encoder, flow,
// generator. Outputs "flow_mu" ([frames, 80], the prompt's frames first), "flow_v.<step>" (the
// velocity of each step, the same shape) and "mel" ([2 x tokens, 80]).
VS_API int vs_decode_tokens(vs_context * ctx, const int32_t * speech_tokens, size_t n_speech_tokens,
                            struct vs_synth_params params, vs_audio ** audio);

// Chatterbox's token model and S3Gen in one call: speech tokens for `text_tokens` in the voice
// of params.conditionals (both parts; NULL: the model's stock voice), drawn as vs_generate_tokens
// draws them (at most max_tokens; their number to *n_tokens), those past S3Gen's vocabulary
// dropped and three of its silence tokens appended, then S3Gen as vs_decode_tokens runs it; the
// audio to *audio (freed by the caller). With stream_tokens > 0, S3Gen runs while the tokens
// are drawn: on the first stream_tokens of them, then each time twice as many more have come
// as the time before (at most eight times stream_tokens), its flow conditioned on the mel
// already made, and params.on_chunk gets each piece of audio (chunk: the piece's index) as soon
// as it is made; 0: S3Gen once, on every token (the audio of vs_generate_tokens, then
// vs_decode_tokens, and one piece). Timings: stages tokens (the token model's own time),
// encoder, flow and generator (all their runs); n_frames the mel's frames.
VS_API int vs_speak_tokens(vs_context * ctx, const int32_t * text_tokens, size_t n_text_tokens,
                           struct vs_synth_params params, size_t max_tokens, size_t stream_tokens, size_t * n_tokens,
                           vs_audio ** audio);

// Several runs of Chatterbox at once: n_texts texts (text_tokens[i], n_text_tokens[i] ids) in the
// voice of params.conditionals (as vs_speak_tokens), the token model's steps for all of them in
// one graph a step (its matmuls read the weights once for all), text i drawn from seeds[i] (in
// place of params.seed) with at most max_tokens[i] tokens, their numbers to n_tokens[i]; then
// S3Gen on each in turn (unstreamed, its noise from seeds[i]). audio[i] gets text i's audio
// (each freed by the caller), params.on_chunk each once made (chunk: i). Text i's tokens are
// those vs_speak_tokens draws for it alone. On an error no audio is returned.
VS_API int vs_speak_many(vs_context * ctx, const int32_t * const * text_tokens, const size_t * n_text_tokens,
                         size_t n_texts, struct vs_synth_params params, const size_t * max_tokens,
                         const uint64_t * seeds, size_t * n_tokens, vs_audio ** audio);

// Chatterbox's speech tokenizer (S3Gen's S3TokenizerV2): the speech tokens (0 to 6560, 25 a
// second) of mono `samples` at 16 kHz (at most 60 s), at most max_tokens of them written to
// `tokens`, their number to *n_tokens: what a voice's conditionals take as prompt tokens.
// Timings: stages mel and encoder. Outputs "s3tok_mel" ([frames, 128], the log-mel) and
// "s3tok_fsq" ([tokens, 8], its quantizer's projections before rounding).
VS_API int vs_speech_tokens(vs_context * ctx, const float * samples, size_t n_samples, int32_t * tokens,
                            size_t max_tokens, size_t * n_tokens);

// Chatterbox's x-vector (S3Gen's CAMPPlus speaker encoder) of mono `samples` at 16 kHz (at most
// 60 s), written to `xvector` (n_xvector values, 192): what a voice's conditionals take for S3Gen.
// Timings: stages mel and speaker. Output "xvec_fbank" ([frames, 80], its Kaldi fbank less its
// mean over time).
VS_API int vs_xvector(vs_context * ctx, const float * samples, size_t n_samples, float * xvector, size_t n_xvector);

// Chatterbox's S3Gen log-mel of mono `samples` at 24 kHz (at most 60 s), 50 frames a second: a
// voice's prompt mel. At most max_frames frames ([frames, 80], row-major) written to `mel`, their
// number to *n_frames. Timings: stage mel.
VS_API int vs_prompt_mel(vs_context * ctx, const float * samples, size_t n_samples, float * mel, size_t max_frames,
                         size_t * n_frames);

// Named intermediate of the last chunk synthesized, for comparison with a reference
// runtime, row-major [time, channels]. Piper: "m_p", "logs_p" ([T, C]), "logw" ([T]),
// "z" ([F, C]). Kokoro: "bert" ([T, 512]), "duration_logits" ([T, 50]), "durations"
// ([T]), "F0", "N" ([2F]), "text_encoder" ([T, 512]), "decoder" ([2F, 512]),
// "har" (the generator's source spectrum, [frames, 22]). Both, of the whole call:
// "chunk_durations" (every chunk's "durations", end to end), "chunk_tokens" (each chunk's
// tokens, [chunks]) and "chunk_inputs" (the input each chunk is of, [chunks]).
// `shape` receives rows and columns. The pointer is valid until the next call. (On a CUDA
// device some are read back from it the first time they are asked for.)
VS_API int vs_context_output(const vs_context * ctx, const char * name, const float ** data, int64_t shape[2]);

// ---------------------------------------------------------------- speaker embeddings

// Values in one embedding of a speaker encoder (architecture "ge2e"), or in the speaker
// embedding of Chatterbox's conditionals; 0 for other voices.
VS_API int vs_model_embedding_size(const vs_model * model);
// The L2-normalized speaker embedding of mono `samples` at vs_model_sample_rate(model) (a
// Chatterbox model: its voice encoder's, of audio at 16 kHz, silence at either end trimmed
// first), written to `embedding` (vs_model_embedding_size values). The audio is cut into partial
// utterances whose embeddings are averaged. Outputs afterwards: "mel" ([frames, bands]) and
// "partials" ([n, size], each normalized). Timings: stages mel and speaker.
VS_API int vs_embed(vs_context * ctx, const float * samples, size_t n_samples, float * embedding, int n_embedding);

VS_API const float * vs_audio_samples(const vs_audio * audio);
VS_API size_t        vs_audio_length(const vs_audio * audio);
VS_API int           vs_audio_sample_rate(const vs_audio * audio);
VS_API void          vs_audio_free(vs_audio * audio);

#ifdef __cplusplus
}
#endif

#endif  // VOICESTUDIO_H
