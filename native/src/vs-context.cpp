// A context: opened on a device (its backends, scheduler, limits and debug switches), its
// workers made and prewarmed; polled for abort between stages.
#include "vs-context.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "cpu/kernels.h"
#include "graph/graph.h"
#include "vs-cuda.h"
#include "vs-debug.h"

vs_context::vs_context() = default;

vs_context::~vs_context() {
    try {
        drain();
    } catch (...) {
    }
    vs::cuda::blas_destroy(cuda_blas);
}

void vs_context::check_computed(ggml_status st) const {
    if (st == GGML_STATUS_ABORTED || aborted()) {
        throw vs::error(VS_ERR_ABORTED, "synthesis cancelled");
    }
    if (st != GGML_STATUS_SUCCESS) {
        throw vs::error(VS_ERR_COMPUTE, "graph computation failed on " + device);
    }
}

bool vs_context::aborted() const {
    return (halt && halt->load()) || (active && active->abort && active->abort(active->abort_user_data));
}

void vs_context::check_abort() const {
    if (aborted()) {
        throw vs::error(VS_ERR_ABORTED, "synthesis cancelled");
    }
}

std::vector<std::string> vs::voice::prewarm_lengths() {
    const std::string        phrase = "ðə kwˈɪk bɹˈaʊn fˈɑːks";
    std::vector<std::string> out;
    for (int n : { 13, 8, 5, 3, 2, 1 }) {
        std::string ipa = phrase;
        for (int i = 1; i < n; ++i) {
            ipa += ", " + phrase;
        }
        out.push_back(ipa + ".");
    }
    out.push_back("fˈɑːks.");
    return out;
}

void vs_context::prewarm() {
    const auto t0 = std::chrono::steady_clock::now();
    if (voice) {
        const std::vector<std::string> sentences = voice->prewarm_phonemes(*this);
        vs_synth_params                p         = vs_synth_default_params();
        // Where ggml captures kept graphs (tag_runs), a graph's second run is the one captured
        // and instantiated, milliseconds more than a replay: the prewarm runs its sentences
        // twice so that a first take of their shapes replays.
        const int                         passes = keep_graphs && tag_runs ? 2 : 1;
        std::vector<std::vector<int32_t>> ids;  // each sentence's first chunk
        for (const std::string & ipa : sentences) {
            int  skipped = 0;
            auto chunks  = voice->ids_from_phonemes(ipa.c_str(), skipped);
            if (chunks.empty()) {
                throw vs::error(VS_ERR_FORMAT, "'" + model->path + "' has none of the phonemes its prewarm needs");
            }
            ids.push_back(std::move(chunks[0]));
        }
        active = &p;
        try {
            for (int pass = 0; pass < passes; ++pass) {
                for (const auto & chunk : ids) {
                    voice->synthesize(*this, chunk, p, 0);
                }
            }
        } catch (...) {
            active = nullptr;
            throw;
        }
        active = nullptr;
    } else if (model->arch == "chatterbox") {
        vs::chatterbox_prewarm(*this);
    } else {
        // Two seconds of a chord, a partial utterance or two for the speaker encoder.
        std::vector<float> s((size_t) model->sample_rate * 2);
        for (size_t i = 0; i < s.size(); ++i) {
            const double t = (double) i / model->sample_rate;
            s[i]           = (float) (0.1 * std::sin(2 * M_PI * 220 * t) + 0.05 * std::sin(2 * M_PI * 330 * t));
        }
        vs::ge2e_embed(*this, s.data(), s.size());
    }
    clear_results();
    prewarm_ms = vs::ms_since(t0);
}

namespace vs {

static bool abort_trampoline(void * data) {
    return static_cast<vs_context *>(data)->aborted();
}

static void set_backend_threads(ggml_backend_t backend, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    if (!reg) {
        return;
    }
    auto set_threads =
        (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (set_threads) {
        set_threads(backend, n_threads);
    }
}

// What the device's matmul takes, asked through supports_op (ggml's answer for what it
// would run elsewhere): the largest input a power of two up to 1 GiB (down to 16 MiB), and
// whether a 2-D src0 broadcasts over src1's fourth axis.
static vs::device_limits probe_device_limits(ggml_backend_dev_t dev) {
    constexpr int64_t K = 1024;
    ggml_init_params  ip{ ggml_tensor_overhead() * 32, nullptr, true };
    vs::ggml_ctx_ptr  g(ggml_init(ip));
    vs::device_limits l;
    l.max_tensor_bytes = size_t(1) << 30;
    for (; l.max_tensor_bytes > (size_t(16) << 20); l.max_tensor_bytes /= 2) {
        ggml_tensor * a = ggml_new_tensor_2d(g.get(), GGML_TYPE_F16, K, 64);
        ggml_tensor * b =
            ggml_new_tensor_2d(g.get(), GGML_TYPE_F32, K, (int64_t) (l.max_tensor_bytes / (K * sizeof(float))));
        if (ggml_backend_dev_supports_op(dev, ggml_mul_mat(g.get(), a, b))) {
            break;
        }
    }
    ggml_tensor * a = ggml_new_tensor_2d(g.get(), GGML_TYPE_F16, 64, 64);
    ggml_tensor * b = ggml_new_tensor_4d(g.get(), GGML_TYPE_F16, 64, 64, 2, 3);
    l.matmul_4d     = ggml_backend_dev_supports_op(dev, ggml_mul_mat(g.get(), a, b));
    ggml_tensor * x = ggml_new_tensor_3d(g.get(), GGML_TYPE_F32, 64, 64, 2);
    ggml_tensor * m = ggml_new_tensor_3d(g.get(), GGML_TYPE_F32, 1, 64, 2);
    l.out_prod      = ggml_backend_dev_supports_op(dev, ggml_out_prod(g.get(), x, m));
    return l;
}

// Whether dev is one of ggml's CUDA devices (whatever this build's own kernels).
static bool is_cuda(ggml_backend_dev_t dev) {
    return std::strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "CUDA") == 0;
}

// Whether ggml captures and replays graphs on dev: a CUDA backend built with CUDA graphs
// (its feature USE_GRAPHS). Where ggml's own GGML_CUDA_DISABLE_GRAPHS turns them off and
// vs_context_debug.no_captures is not set, runs are tagged and the prewarm runs twice for
// nothing; the audio is the same.
static bool captures_graphs(ggml_backend_dev_t dev) {
    if (!is_cuda(dev)) {
        return false;
    }
    ggml_backend_reg_t reg          = ggml_backend_dev_backend_reg(dev);
    auto               get_features = reinterpret_cast<ggml_backend_get_features_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
    for (const ggml_backend_feature * f = get_features ? get_features(reg) : nullptr; f && f->name; ++f) {
        if (std::strcmp(f->name, "USE_GRAPHS") == 0) {
            return true;
        }
    }
    return false;
}

// The CPUs this process may run on (its affinity mask: a container's or taskset's share).
static int available_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
        return CPU_COUNT(&set);
    }
    return (int) std::max(1u, std::thread::hardware_concurrency());
}

// One context; a worker has no phonemizer (its context phonemizes) and writes no trace.
static std::unique_ptr<vs_context> make_one(vs_model & model, const vs_context_params & params, bool worker) {
    auto ctx       = std::make_unique<vs_context>();
    ctx->model     = &model;
    ctx->dev       = resolve_device(params.device ? params.device : "auto");
    ctx->device    = device_id(ctx->dev);
    ctx->n_threads = params.n_threads > 0 ? params.n_threads : available_cpus();

    ctx->backend.reset(ggml_backend_dev_init(ctx->dev, nullptr));
    if (!ctx->backend) {
        throw error(VS_ERR_DEVICE, "cannot start the backend of " + ctx->device);
    }
    std::vector<ggml_backend_t> backends = { ctx->backend.get() };
    if (ggml_backend_dev_type(ctx->dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
        ctx->cpu_backend.reset(ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr));
        if (!ctx->cpu_backend) {
            throw error(VS_ERR_DEVICE, "cannot start the CPU backend");
        }
        backends.push_back(ctx->cpu_backend.get());
    }
    for (ggml_backend_t b : backends) {
        if (ggml_backend_dev_type(ggml_backend_get_device(b)) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            set_backend_threads(b, ctx->n_threads);
            ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(b));
            auto set_abort = (void (*)(ggml_backend_t, ggml_abort_callback, void *)) ggml_backend_reg_get_proc_address(
                reg, "ggml_backend_set_abort_callback");
            if (set_abort) {
                set_abort(b, abort_trampoline, ctx.get());
            }
        }
    }
    ctx->weights                                    = weights_for(model, ctx->dev);
    ctx->derived                                    = &derived_for(model, ctx->dev);
    const vs_context_params::vs_context_debug & dbg = params.debug;
    ctx->cuda_device                                = dbg.no_engine_kernels ? -1 : cuda::device_of(ctx->dev);
    ctx->device_graphs = ggml_backend_dev_type(ctx->dev) != GGML_BACKEND_DEVICE_TYPE_CPU || dbg.device_graphs;
    ctx->cpu_kernels   = !ctx->device_graphs && !dbg.no_engine_kernels;
    ctx->cpu_int16     = ctx->cpu_kernels && !dbg.no_int16_kernels && vs::cpu::int16_convs();
    if (ggml_backend_dev_type(ctx->dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
        ctx->limits                 = probe_device_limits(ctx->dev);
        ctx->limits.strided_batches = vs::matmul_reads_batch_strides(ctx->backend.get());
        if (!ctx->limits.strided_batches) {
            vs::log(VS_LOG_INFO, ctx->device + ": its matmuls read windows packed, so convolutions use im2col");
        }
    }
    if (dbg.limit_tensor_mib > 0) {
        ctx->limits.max_tensor_bytes = dbg.limit_tensor_mib << 20;
        ctx->limits.matmul_4d        = dbg.limit_matmul_4d;
        ctx->limits.strided_batches  = dbg.limit_strided_matmul;
        ctx->limits.out_prod         = dbg.limit_out_prod;
    }
    if (!worker && dbg.node_trace && *dbg.node_trace) {
        ctx->trace = std::make_unique<vs::node_trace>(dbg.node_trace, ctx->device, ctx->limits);
    }
    ctx->keep_graphs = dbg.keep_graphs < 0 ? is_cuda(ctx->dev) : dbg.keep_graphs > 0;
    ctx->tag_runs    = captures_graphs(ctx->dev) && !dbg.no_captures;
    if (dbg.kept_graphs_mib >= 0) {
        ctx->kept_limit = (size_t) dbg.kept_graphs_mib << 20;
    }
    if (dbg.staging_kib >= 0) {
        ctx->staging_min = (size_t) dbg.staging_kib << 10;
    }
    if (ctx->cuda_device >= 0) {
        ctx->graph_done.reset(ggml_backend_event_new(ctx->dev));
        ctx->engine_done.reset(ggml_backend_event_new(ctx->dev));
        ctx->queue_graphs = vs::cuda_event(ctx->graph_done.get(), ctx->dev) &&
                            vs::cuda_event(ctx->engine_done.get(), ctx->dev) && !dbg.wait_each_graph;
    }
    ctx->sched.reset(ggml_backend_sched_new(backends.data(), nullptr, (int) backends.size(), 32768, false, false));
    ctx->language = params.language ? params.language : "";
    if (!ctx->language.empty() && model.arch != "kokoro") {
        throw error(VS_ERR_INVALID_ARG,
                    "language '" + ctx->language + "': a " + model.arch + " model reads its own language");
    }
    if (!ctx->language.empty()) {
        std::string known;
        bool        found = false;
        for (const auto & code : kokoro_language_codes()) {
            known += (known.empty() ? "" : ", ") + code;
            found |= code == ctx->language;
        }
        if (!found) {
            throw error(VS_ERR_INVALID_ARG, "language '" + ctx->language + "': Kokoro reads " + known);
        }
    }
    if (!worker && params.espeak_library && *params.espeak_library) {
        ctx->phonemizer =
            std::make_unique<phonemizer>(params.espeak_library, params.espeak_data ? params.espeak_data : "");
    }
    if (model.arch == "kokoro") {
        ctx->voice = make_kokoro_voice(model);
    } else if (model.arch == "piper") {
        ctx->voice = make_piper_voice(model);
    } else if (model.arch == "chatterbox") {
        ctx->state = make_chatterbox_state(model);
    }  // a speaker encoder speaks no text
    return ctx;
}

std::unique_ptr<vs_context> make_context(vs_model & model, const vs_context_params & params) {
    // More threads than CPUs only wait for each other at every op's barrier.
    const int cpus = available_cpus();
    if (params.n_threads < 0 || params.n_threads > cpus) {
        throw error(VS_ERR_INVALID_ARG, std::to_string(params.n_threads) + " threads: this machine runs 1 to " +
                                            std::to_string(cpus) + " (0: all of them)");
    }
    if (params.n_workers > VS_MAX_WORKERS) {
        throw error(VS_ERR_INVALID_ARG,
                    "at most " + std::to_string(VS_MAX_WORKERS) + " workers, not " + std::to_string(params.n_workers));
    }
    auto       ctx       = make_one(model, params, false);
    const bool on_cpu    = ggml_backend_dev_type(ctx->dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    int        n_workers = params.n_workers;
    if (n_workers < 0) {  // automatic: VS_AUTO_WORKERS on a CUDA device with room for them
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(ctx->dev, &free, &total);
        const size_t GiB = size_t(1) << 30;
        n_workers        = !is_cuda(ctx->dev) ? 1 : free >= 16 * GiB ? VS_AUTO_WORKERS : free >= 8 * GiB ? 2 : 1;
    }
    for (int i = 1; i < n_workers && ctx->voice; ++i) {
        ctx->workers.push_back(make_one(model, params, true));
        ctx->workers.back()->halt = &ctx->workers_halt;
    }
    if (params.prewarm > 0 || (params.prewarm < 0 && !on_cpu)) {
        const auto t0 = std::chrono::steady_clock::now();
        ctx->run_workers(ctx->workers.size() + 1, [](size_t, vs_context & c) { c.prewarm(); });
        ctx->prewarm_ms = ms_since(t0);
        for (auto & w : ctx->workers) {
            ctx->absorb(*w, false);
        }
        ctx->clear_results();
    }
    return ctx;
}

}  // namespace vs
