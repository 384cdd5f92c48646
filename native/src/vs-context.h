// Per-run state: device, scheduler, weights on that device, timings, outputs.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <set>

#include "graph/graph.h"
#include "vs-impl.h"

namespace vs {

// Buffers laid out one after another in a context's device scratch (vs_context::device_scratch),
// each at a 256-byte boundary: reserve() gives a buffer's offset, bytes the size to ask for.
struct scratch_layout {
    size_t bytes = 0;

    size_t reserve(size_t n) {
        const size_t at = bytes;
        bytes += (n + 255) & ~(size_t) 255;
        return at;
    }
};

class voice;  // an architecture's synthesis (models/*.cpp)
// An architecture's state in one context besides its voice (a token model's key/value cache).
class model_state {
  public:
    virtual ~model_state() = default;
};
struct node_trace;  // vs_context_debug.node_trace's writer (vs-debug.h)

// The memory of graph contexts' tensor and graph metadata, reused: a block goes back to the
// pool when its graph is freed and the next graph of that size takes it, so a stage's graph
// is built at the same addresses call after call. ggml's CUDA backend keeps its state for a
// graph (a copy of every node's properties, about 1 KB a node, for 10 s) under the address
// of the graph's first node: with a new block each call, each call would add an entry.
class meta_pool {
  public:
    struct block {
        std::unique_ptr<uint8_t[]> bytes;
        size_t                     size = 0;
    };
    struct giver {
        std::shared_ptr<meta_pool> pool;
        void                       operator()(block * b) const { pool->give(b); }
    };
    using handle = std::unique_ptr<block, giver>;

    // A block of at least n bytes: the smallest free one that fits, the latest given back
    // among equals; a new one if none fits.
    static handle take(const std::shared_ptr<meta_pool> & pool, size_t n);

  private:
    void                                give(block * b);
    std::vector<std::unique_ptr<block>> free_;
};

// One graph under construction: a metadata-only ggml context (in a block of the context's
// meta_pool) and its cgraph.
struct graph_build {
    graph_build()                    = default;
    graph_build(graph_build &&)      = default;
    graph_build(const graph_build &) = delete;

    graph_build & operator=(graph_build && o) noexcept {
        if (this != &o) {
            ctx.reset();  // before its block goes back
            meta = std::move(o.meta);
            ctx  = std::move(o.ctx);
            gf   = o.gf;
        }
        return *this;
    }

    meta_pool::handle meta;  // destroyed after ctx
    ggml_ctx_ptr      ctx;
    ggml_cgraph *     gf = nullptr;
};

// A stage's graph (vs_context::stage_graph) and the tensors its builder returned: the
// inputs the caller sets and the outputs it reads, in the builder's order.
struct stage_graph {
    graph_build                gb;
    std::vector<ggml_tensor *> t;
    gallocr_ptr                alloc;  // a kept graph's own compute memory; null on the scheduler
    size_t                     bytes    = 0;
    uint64_t                   last_use = 0;
    bool                       shared   = false;  // in vs_context::shared_alloc's memory, not alloc's
};
using graph_builder = std::function<std::vector<ggml_tensor *>(ggml_context *, ggml_cgraph *)>;

}  // namespace vs

struct vs_context {
    vs_context();  // (defined with node_trace complete)
    vs_context(const vs_context &)             = delete;
    vs_context & operator=(const vs_context &) = delete;
    ~vs_context();

    vs_model *                      model = nullptr;
    ggml_backend_dev_t              dev   = nullptr;
    std::string                     device;
    int                             n_threads = 1;
    vs::backend_ptr                 backend;      // the chosen device
    vs::backend_ptr                 cpu_backend;  // fallback for ops the device lacks
    vs::sched_ptr                   sched;
    std::shared_ptr<vs::weight_set> weights;
    int                             cuda_device = -1;  // CUDA ordinal where the engine's kernels run (vs-cuda.h)
    // Graphs built as for a GPU (fewer, larger kernels; ggml's im2col op): off the CPU, or on
    // it with vs_context_debug.device_graphs (to test those graphs where there is no GPU).
    bool device_graphs = false;
    // The engine's own CPU kernels (src/cpu/) where they apply: graphs for the CPU, unless
    // vs_context_debug.no_engine_kernels.
    bool cpu_kernels = false;
    // Those kernels' convolutions in 16-bit integers where they have them (Kokoro's generator),
    // unless vs_context_debug.no_int16_kernels.
    bool cpu_int16 = false;
    // What the device's ops take, where less than ggml's ops express: a Vulkan device binds
    // a shader's buffers up to its maxStorageBufferRange (128 MiB on some) and its matmuls
    // broadcast over no fourth axis; ggml would run such ops on the CPU. Graphs keep their
    // tiles and packings within max_tensor_bytes and build no such matmuls.
    vs::device_limits limits;
    vs::buffer_ptr    scratch;              // device memory for those kernels, grown on demand
    vs::buffer_ptr    handoff;              // activations one stage leaves on the device for a later one
    vs::buffer_ptr    kept_outputs;         // named outputs copied there, read back when asked for
    void *            cuda_blas = nullptr;  // their cuBLAS handle, made on first use
    // Weights re-laid out for this device, made on first use (swapped_weight) and shared by
    // the model's contexts on it.
    vs::derived_weights *            derived = nullptr;
    std::unique_ptr<vs::phonemizer>  phonemizer;
    std::string                      language;  // vs_context_params.language, "" if none given
    std::unique_ptr<vs::voice>       voice;
    std::unique_ptr<vs::model_state> state;
    // Per stage, the ops that ran on the CPU instead of the device ("OP(type)").
    std::array<std::set<std::string>, VS_STAGE_COUNT> fallback_ops;
    std::string                                       fallback_text;  // vs_context_fallback_ops's answer
    double                                            prewarm_ms = 0.0;

    // Op profiling (vs_context_set_op_profiling): the stage being computed, the node's
    // start, and per (stage, op) the count and milliseconds.
    struct op_stat {
        int64_t count = 0;
        double  ms    = 0.0;
    };
    bool                                           profiling     = false;
    int                                            current_stage = 0;
    std::chrono::steady_clock::time_point          node_start;
    std::map<std::pair<int, std::string>, op_stat> op_profile;

    // Node tracing: with vs_context_debug.node_trace naming a file when the context opens, while op
    // profiling is on, every graph's nodes, their sources and a summary of their values go
    // to that file (tools/nodes_vs_cpu.py compares a device's with the CPU's).
    std::unique_ptr<vs::node_trace> trace;

    vs_timings timings{};
    // The last call's named outputs, [rows, cols] each. Those left in device memory (in the
    // handoff or kept_outputs buffer) are read back the first time they are asked for
    // (output()): most calls never ask, and a readback is a wait and a copy a sentence.
    using named_output = std::pair<std::vector<float>, std::array<int64_t, 2>>;
    struct device_output {
        const vs::buffer_ptr * buf    = nullptr;  // the context's buffer it is in
        size_t                 offset = 0;
        int64_t                rows = 0, cols = 0;
    };
    mutable std::map<std::string, named_output>  outputs;
    mutable std::map<std::string, device_output> device_outputs;
    // Each chunk's tokens' frames, as the decoder drew them, in the order of the call's chunks
    // (a voice's synthesize_batch adds its chunks'; a worker's go to the context it works for):
    // the call's outputs "chunk_durations" and "chunk_tokens".
    std::vector<std::vector<float>> chunk_durations;
    const named_output *            output(const std::string & name) const;  // null where there is none

    // Abort polling for the synthesis in progress (also handed to the CPU backend).
    const vs_synth_params * active = nullptr;
    // Sets `active` for one call and clears it when the call ends, however it ends.
    struct active_call {
        vs_context * c;
        active_call(vs_context * ctx, const vs_synth_params * p) : c(ctx) { c->active = p; }
        active_call(const active_call &)             = delete;
        active_call & operator=(const active_call &) = delete;
        ~active_call() { c->active = nullptr; }
    };
    // A worker's: set by the context it works for when another worker has failed.
    const std::atomic<bool> * halt = nullptr;

    // Contexts on the same device that a batch is divided between, each computed by a
    // thread of its own (vs_context_params.n_workers); this context is the first worker.
    std::vector<std::unique_ptr<vs_context>> workers;
    std::atomic<bool>                        workers_halt{ false };

    ggml_tensor * w(const std::string & name) const;  // weight on this context's device
    // Weight `name` [A, B, ...] on this context's device with its first two axes swapped
    // ([B, A, ...]), made once from the file's copy; null for types other than F32 and F16.
    ggml_tensor * swapped_weight(const std::string & name);
    // Weight `name` [A, ...] on this context's device with A rounded up to a multiple of
    // `multiple` (the new entries zero), made once; the weight itself where A is one (or
    // its type is neither F32 nor F16): a GEMM whose rows are a multiple of 8 halves long
    // gets cuBLAS's kernels for 16-byte aligned operands, not those for 4-byte ones.
    ggml_tensor * channel_padded_weight(const std::string & name, int64_t multiple = 8);
    // Weight `name` on this context's device with its entries along `axis` in reverse order,
    // made once; F16 stays F16, other types become F32.
    ggml_tensor * reversed_weight(const std::string & name, int axis);
    // Weight `name` on this context's device as `type` (F16 or F32): the weight itself where
    // it has that type, else a copy converted once from the file's.
    ggml_tensor * weight_as(const std::string & name, ggml_type type);
    // Conv1d of x [IC, T] with weight `name`.weight and bias `name`.bias, padded by `pad` on each
    // side (< 0: "same", dilation * (K - 1) / 2): on the CPU in the engine's kernel where it
    // applies (same padding, F32 or F16 weights), else conv1d.
    ggml_tensor * conv(ggml_context * g, ggml_tensor * x, const std::string & name, int dilation = 1, int pad = -1);
    // Conv weight `name` ([IC, K, OC], F32 or F16) in the CPU kernels' order ([OC, IC, K], F32),
    // made once; null for other types.
    ggml_tensor * cpu_packed_conv(const std::string & name);
    // The same in the integer kernels' order ([OC, IC, K], I16), made once, and each output
    // channel's scale (scales, [OC] F32); null where the CPU's kernels have no integer
    // convolutions, vs_context_debug.no_int16_kernels is set, or the weight is not F32 or F16.
    ggml_tensor * cpu_packed_conv_int16(const std::string & name, ggml_tensor *& scales);
    // A tensor on this context's device made once (under `key`) by `fill` writing its bytes.
    ggml_tensor * derived_tensor(const std::string & key, ggml_type type, const std::array<int64_t, 4> & ne,
                                 const std::function<void(uint8_t *)> & fill);

    // One short synthesis (or embedding) whose timings and outputs are then dropped.
    void prewarm();
    // fn(0) for this context on the calling thread and fn(i) for workers[i - 1] on threads
    // of their own; once all have returned, rethrows the first error (one that is not a
    // halt caused by another worker's). An error halts the other workers at their next
    // abort poll.
    void run_workers(size_t n, const std::function<void(size_t, vs_context &)> & fn);
    // Adds a worker's timings, fallback ops and op profile to this context's (and, for the
    // worker that made the last chunk, takes its named outputs); the worker forgets them.
    void absorb(vs_context & worker, bool last);
    // Forgets the last call's timings and named outputs.
    void clear_results() {
        timings = {};
        outputs.clear();
        device_outputs.clear();
        chunk_durations.clear();
    }

    // Graphs kept between calls by their shapes (stage_graph), on a CUDA device: a kept
    // graph is built, checked and allocated once, in device memory of its own, and its next
    // runs only set its inputs (vs_context_debug.keep_graphs 0 keeps none, > 0 keeps them on any
    // device; not by default on Vulkan, where a test's take once moved further from a fresh
    // graph's than F16 rounding explains). Together they hold at most kept_limit bytes
    // (vs_context_debug.kept_graphs_mib, 1024 by default: Kokoro keeps a graph a stage and length,
    // its decoder's up to 2048 frames), the least recently used going first; one graph over
    // a quarter of that runs in memory of its own and is not kept.
    bool                                                    keep_graphs = false;
    size_t                                                  kept_limit  = size_t(1024) << 20;
    std::map<std::string, std::unique_ptr<vs::stage_graph>> kept;
    size_t                                                  kept_bytes = 0;
    uint64_t                                                graph_uses = 0;
    vs::stage_graph                                         fresh;  // the graph of a stage not kept
    // The memory of the graphs kept with `shared` (stage_graph): one buffer, as large as the
    // largest of them, that each uses while it runs. Such a graph hands nothing over in its
    // own memory (its results go to the device scratch or are read at once), so they need no
    // room each. Where a new one needs more, the others are dropped first, and so they are
    // before the scratch or the handoff buffer (which they may read and write) moves.
    vs::gallocr_ptr shared_alloc;
    size_t          shared_bytes = 0;
    // The most graphs kept in shared memory (each holds its metadata and a capture of its own).
    static constexpr size_t        max_shared_graphs = 96;
    std::shared_ptr<vs::meta_pool> graph_meta        = std::make_shared<vs::meta_pool>();

    // ggml's CUDA backend, built with CUDA graphs, captures a graph and replays it once two
    // runs in a row at the same first-node address have nodes of the same bytes. A graph built
    // for one call (on the scheduler) would be captured and instantiated, milliseconds, for
    // nothing, and some such replays failed on an H100; so where ggml captures graphs, each
    // run of a graph not kept writes its number into every node's spare bytes
    // (ggml_tensor::padding), which ggml compares and no op reads: only kept graphs are
    // captured.
    bool     tag_runs = false;
    uint64_t n_runs   = 0;
    // Before a kept graph is dropped: leaves ggml no instance under its first node's address
    // that another graph there could be updated from (see the .cpp).
    void forget_capture(vs::stage_graph & sg);
    // Drops a kept graph (forget_capture first), and the shared memory with the last graph in it.
    void drop_kept(std::map<std::string, std::unique_ptr<vs::stage_graph>>::iterator it);
    void drop_shared_graphs();
    void tag_run(ggml_cgraph * gf);

    // Whether stages round their shapes up (shape_bucket) so that kept graphs serve other
    // sentences too: where graphs are kept and built as for a device.
    bool rounds_shapes() const { return keep_graphs && device_graphs; }

    // The device this context's graphs are built for (the graph builders' options).
    vs::graph_options graph_opts() const { return { !device_graphs, limits }; }

    vs::graph_build new_graph(size_t max_nodes = 8192);
    // The graph of `stage` for shapes `key`, allocated and ready for its inputs: the kept one
    // of that key, or one `build` makes now (kept where the context keeps graphs and every
    // node runs on the device; with `shared`, in shared_alloc's memory). Valid until the next
    // call.
    vs::stage_graph & stage_graph(int stage, const std::string & key, const vs::graph_builder & build,
                                  size_t max_nodes = 8192, bool shared = false);
    void              compute(vs::stage_graph & sg);
    // Throws for a cancelled or failed computation's status.
    void check_computed(ggml_status st) const;
    // Allocates `gf` on the scheduler; records, per stage, the ops the device could not take.
    void alloc(int stage, ggml_cgraph * gf);
    void compute(ggml_cgraph * gf);
    bool aborted() const;
    void check_abort() const;

    // Sets `bytes` of graph tensor t's data from `offset` (all of it by default): on a CUDA
    // device, for a tensor in its memory, copied through pinned host memory on the backend's
    // stream, which the next compute waits for (no wait a tensor); elsewhere at once.
    void set_input(ggml_tensor * t, const void * data, size_t offset = 0, size_t bytes = SIZE_MAX);
    // The pinned memory is at least staging_min bytes (vs_context_debug.staging_kib, 4096 by
    // default; 0 sets every input at once), grown for a larger input; when it is full, the
    // copies in it are waited for and it is used again from its start.
    vs::buffer_ptr staging;
    size_t         staging_min = size_t(4) << 20;
    size_t         staged      = 0;  // its bytes in copies not yet waited for

    // On a CUDA device a kept graph is queued on ggml's stream and the host goes on to the
    // next one without a wait (queue_graphs; vs_context_debug.wait_each_graph waits for each, as
    // other backends do). ggml's stream and the engine's kernels' (the calling thread's,
    // vs-cuda.h) are ordered by events instead: a graph waits for the engine's work queued
    // before it (after_engine), and the engine's later work, and every copy ggml makes on the
    // calling thread's stream (ggml_backend_tensor_get and _set), wait for the graph. The host
    // waits where it reads results, before memory the device may still use is freed or
    // moved, and at the end of each stage (drain), whose time is then its work's.
    bool          queue_graphs = false;
    vs::event_ptr graph_done, engine_done;
    uint64_t      engine_seen = UINT64_MAX;  // vs::cuda::queued() when the graphs last waited for it
    void          after_engine();
    void          drain();

    // At least `bytes` of device memory, valid until the next call.
    void * device_scratch(size_t bytes);
    // A new F32 tensor [ne0, ne1] of graph context g, `offset` bytes into that memory (sized
    // before by device_scratch): where graphs and the engine's kernels hand activations over.
    ggml_tensor * scratch_tensor(ggml_context * g, size_t offset, int64_t ne0, int64_t ne1);
    // As device_scratch and scratch_tensor, in a second buffer where a stage leaves its
    // output for a later stage of the same call (the scratch being the kernels' between).
    void *        device_handoff(size_t bytes);
    ggml_tensor * handoff_tensor(ggml_context * g, size_t offset, int64_t ne0, int64_t ne1);
    // The cuBLAS handle of the engine's kernels on cuda_device.
    void * blas();
    // Adds a node (or a kernel of the engine's own) to the op profile, under the stage being
    // computed, while profiling is on.
    void profile_op(const char * name, double ms);

    // Whether lstm() runs the recurrence over `w_hh` (on this device) in the engine's kernel.
    bool fused_lstm(const ggml_tensor * w_hh, int64_t H) const;
    // n steps of LSTMs over `cols` columns in the engine's kernel (vs::cuda::lstm), from the
    // input projections `gx` [4H, n' >= n, cols] a graph computed on this device (each
    // column's first n steps run); h, c and out on the host as there. With out null, every
    // step's hidden state is left in the device scratch (returned) for vs::cuda::lstm_gather.
    const float * lstm(const ggml_tensor * gx, const ggml_tensor * w_hh, int64_t H, int64_t n, int64_t cols, int64_t D,
                       float * h, float * c, float * out);

    void set_output(const std::string & name, std::vector<float> data, int64_t rows, int64_t cols);
    // A named output [rows, cols] of F32 left in device memory: `offset` bytes into the
    // handoff buffer (where a stage left it), or copied into kept_outputs by
    // keep_output_on_device (where the next graph would overwrite it; cuda_device only).
    void set_device_output(const std::string & name, const vs::buffer_ptr & buf, size_t offset, int64_t rows,
                           int64_t cols);
    void keep_output_on_device(const std::string & name, const void * src, int64_t rows, int64_t cols);

    // Runs one stage of one chunk: polls abort first, adds its milliseconds to the
    // timings and reports them through the synthesis's on_stage. A stage run inside another
    // (S3Gen on the tokens drawn so far, inside the token model's) counts as its own only.
    double nested_ms = 0.0;  // of the stages run inside the one running
    template <typename F>
    void timed_stage(int stage, int chunk, const vs_synth_params & p, F && fn) {
        check_abort();
        const auto   t0    = std::chrono::steady_clock::now();
        const double outer = nested_ms;
        nested_ms          = 0.0;
        try {
            fn();
        } catch (...) {
            nested_ms = outer;
            try {
                drain();  // nothing of the stage's left running
            } catch (...) {
            }
            throw;
        }
        drain();
        const double total = vs::ms_since(t0);
        const double ms    = total - nested_ms;  // less the stages run inside it
        nested_ms          = outer + total;
        timings.stage_ms[stage] += ms;
        if (p.on_stage) {
            p.on_stage(stage, chunk, ms, p.on_stage_user_data);
        }
    }
};

namespace vs {

// Each of T tokens' frames, from the token each frame of a chunk speaks.
std::vector<float> token_frames(const std::vector<int32_t> & frame_to_token, int64_t T);

// A weight's values as floats, from the file's copy (host memory).
std::vector<float> host_floats(const ggml_tensor * t);

// Whether t is in device memory of c's device (where the engine's kernels can use it).
bool in_device_memory(const vs_context & c, const ggml_tensor * t);

// A buffer of c's device of at least `bytes` in `buf` (grown, its contents lost, where smaller).
void * grown(vs_context & c, buffer_ptr & buf, size_t bytes, const char * what);

// ggml's CUDA event behind `e` (the engine's stream records and waits for it), or null for an
// event of another device.
void * cuda_event(ggml_backend_event_t e, ggml_backend_dev_t dev);

class voice {
  public:
    virtual ~voice() = default;
    // Phoneme ids of each sentence of `input`.
    virtual std::vector<std::vector<int32_t>> ids_from_text(vs_context & ctx, const std::string & text,
                                                            int & skipped)                              = 0;
    virtual std::vector<std::vector<int32_t>> ids_from_phonemes(const std::string & ipa, int & skipped) = 0;
    virtual std::string                       phonemize(vs_context & ctx, const std::string & text)     = 0;
    // Audio of one chunk; calls on_stage for each stage.
    virtual std::vector<float> synthesize(vs_context & ctx, const std::vector<int32_t> & ids, const vs_synth_params & p,
                                          int chunk) = 0;
    // What vs_context::prewarm synthesizes, in order: by default one long sentence (7 s), so
    // that the buffers of most sentences are already there. "The quick brown fox jumps over
    // the lazy dog, and then it runs far away into the woods, where nobody will ever find it
    // again."
    virtual std::vector<std::string> prewarm_phonemes(const vs_context & ctx) const {
        (void) ctx;
        return {
            "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ, ænd ðˈɛn ɪt ɹˈʌnz fˈɑːɹ ɐwˈeɪ "
            "ˌɪntʊ ðə wˈʊdz, wˌɛɹ nˈoʊbɑːdi wɪl ˈɛvɚ fˈaɪnd ɪɾ ɐɡˈɛn."
        };
    }
    // A prewarm of seven lengths from under a second to 17 s (a phrase said 13, 8, 5, 3, 2
    // times and once, then one word: no length over twice the next), longest first so that
    // the buffers are sized once. For GEMMs whose columns follow the sentence's length rounded
    // to a power of two (phase_columns): each shape sentences in that range give has then been
    // called once, where cuBLAS's first call of a shape costs about half a millisecond.
    static std::vector<std::string> prewarm_lengths();
    // Audio of several chunks synthesized together, chunk `first_chunk` onwards: each stage
    // runs over all of them before the next, with work shared where the architecture
    // batches it. By default one after another.
    virtual std::vector<std::vector<float>> synthesize_batch(vs_context &                              ctx,
                                                             const std::vector<std::vector<int32_t>> & ids,
                                                             const vs_synth_params & p, int first_chunk) {
        std::vector<std::vector<float>> out;
        for (size_t i = 0; i < ids.size(); ++i) {
            out.push_back(synthesize(ctx, ids[i], p, first_chunk + (int) i));
        }
        return out;
    }
};

std::unique_ptr<voice> make_piper_voice(vs_model & model);
void                   piper_validate(const vs_model & model);
std::unique_ptr<voice> make_kokoro_voice(vs_model & model);
// The languages Kokoro reads text in (vs_context_params.language), by code.
std::vector<std::string>     kokoro_language_codes();
void                         kokoro_validate(const vs_model & model);
void                         ge2e_validate(const vs_model & model);
void                         chatterbox_validate(const vs_model & model);
std::unique_ptr<model_state> make_chatterbox_state(const vs_model & model);
// Chatterbox's vocoder on a log-mel [n_frames, n_mels] (vs_vocode).
std::vector<float> chatterbox_vocode(vs_context & ctx, const float * mel, size_t n_frames, const vs_synth_params & p);
// Chatterbox's S3Gen on speech tokens: its flow's mel, then the vocoder's audio (vs_decode_tokens).
std::vector<float> chatterbox_decode(vs_context & ctx, const std::vector<int32_t> & tokens, const vs_synth_params & p);
// Chatterbox's speech tokens of 16 kHz audio (vs_speech_tokens).
std::vector<int32_t> chatterbox_speech_tokens(vs_context & ctx, const float * samples, size_t n_samples,
                                              const vs_synth_params & p);
// Chatterbox's x-vector (S3Gen's speaker encoder) of 16 kHz audio (vs_xvector).
std::vector<float> chatterbox_xvector(vs_context & ctx, const float * samples, size_t n_samples,
                                      const vs_synth_params & p);
// S3Gen's log-mel [frames, 80] of 24 kHz audio (vs_prompt_mel).
std::vector<float> chatterbox_prompt_mel(vs_context & ctx, const float * samples, size_t n_samples,
                                         const vs_synth_params & p);
// Values in the speaker embedding of Chatterbox's conditionals.
int64_t chatterbox_speaker_size(const vs_model & model);
// A few tokens of a short text in a voice of zeros (vs_context::prewarm).
void chatterbox_prewarm(vs_context & ctx);
// Chatterbox's speech tokens for text tokens (vs_generate_tokens); `on_token`, where given, gets
// the tokens so far after each one drawn.
std::vector<int32_t> chatterbox_generate(vs_context & ctx, const std::vector<int32_t> & text, const vs_synth_params & p,
                                         size_t                                                    max_tokens,
                                         const std::function<void(const std::vector<int32_t> &)> & on_token = {});
// Several texts' runs of the token model at once, text i at most max_tokens[i] tokens drawn from
// seeds[i] (vs_speak_many).
std::vector<std::vector<int32_t>> chatterbox_generate_many(
    vs_context & ctx, const std::vector<std::vector<int32_t>> & texts, const vs_synth_params & p,
    const std::vector<size_t> & max_tokens, const std::vector<uint64_t> & seeds,
    const std::function<void(const std::vector<int32_t> &)> & on_token = {});
// Their audio: the token model's runs together, then S3Gen on each (vs_speak_many); n_tokens
// gets each run's speech tokens.
std::vector<std::vector<float>> chatterbox_speak_many(vs_context & ctx, const std::vector<std::vector<int32_t>> & texts,
                                                      const vs_synth_params & p, const std::vector<size_t> & max_tokens,
                                                      const std::vector<uint64_t> & seeds,
                                                      std::vector<size_t> &         n_tokens);
// Chatterbox's text tokens to audio, S3Gen streamed through the token model's run where
// stream_tokens > 0 (vs_speak_tokens); n_tokens: the speech tokens drawn.
std::vector<float> chatterbox_speak(vs_context & ctx, const std::vector<int32_t> & text, const vs_synth_params & p,
                                    size_t max_tokens, size_t stream_tokens, size_t & n_tokens);
int64_t            ge2e_embedding_size(const vs_model & model);
// Utterance embedding (L2-normalized) of mono audio at the model's sample rate.
std::vector<float> ge2e_embed(vs_context & ctx, const float * samples, size_t n_samples);

// Boundaries of up to n_workers runs of consecutive chunks, none empty, whose largest run
// has the least work (work[k]: chunk k's) that any such division gives: start[r] to
// start[r + 1] is run r. A batch's call waits for its slowest worker; closing each run once
// it holds its share can leave a sentence's worth more on some runs than on others.
std::vector<size_t> split_runs(const std::vector<size_t> & work, size_t n_workers);

// A chunk's work for split_runs off the CPU: its phoneme ids and this many more. On a GPU each
// sentence also costs launches of its own (Kokoro's generator source graph, its columns of
// the LSTMs), so runs even in phonemes are not even in time; 32 more a sentence evened the
// workers' times of tests/data/script.txt on a GPU (docs/performance.md).
constexpr size_t DEVICE_CHUNK_WORK = 32;

// Joins of at least this many samples (4 MiB) are split between threads.
constexpr size_t JOIN_PARALLEL_SAMPLES = size_t(1) << 20;
constexpr size_t JOIN_MAX_THREADS      = 8;

// Parts one after another in one allocation of n samples (set), each part freed once copied.
// The allocation is left uninitialized and written once: a script's audio is tens of MB, and
// a thread writing fresh memory spends most of its time in page faults, so a large join is
// divided between threads, each taking every T-th part.
std::unique_ptr<float[]> join_parts(std::vector<std::vector<float>> & parts, size_t & n);

}  // namespace vs
