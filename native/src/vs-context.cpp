// Context: device, scheduler and the stage runner shared by the architectures.
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

#include "vs-cuda.h"
#include "vs-graph.h"

// ggml's event as ggml-backend-impl.h (not an installed header) lays it out: on a CUDA device
// its context is the cudaEvent_t, which the engine's stream records and waits for
// (vs::cuda::record, wait). Null for an event of another device.
struct ggml_event_layout {
    ggml_backend_dev_t device;
    void *             context;
};

static void * cuda_event(ggml_backend_event_t e, ggml_backend_dev_t dev) {
    const auto * l = reinterpret_cast<const ggml_event_layout *>(e);
    return e && l->device == dev ? l->context : nullptr;
}

ggml_tensor * vs_context::w(const std::string & name) const {
    auto it = weights->tensors.find(name);
    if (it == weights->tensors.end()) {
        throw vs::error(VS_ERR_FORMAT, "model '" + model->path + "' lacks tensor '" + name + "'");
    }
    return it->second;
}

ggml_tensor * vs_context::derived_tensor(const std::string & key, ggml_type type, const std::array<int64_t, 4> & ne,
                                         const std::function<void(uint8_t *)> & fill) {
    auto it = derived.find(key);
    if (it != derived.end()) {
        return it->second;
    }
    ggml_init_params ip{ ggml_tensor_overhead(), nullptr, true };
    vs::ggml_ctx_ptr ctx(ggml_init(ip));
    ggml_tensor *    t = ggml_new_tensor_4d(ctx.get(), type, ne[0], ne[1], ne[2], ne[3]);
    ggml_set_name(t, key.substr(0, GGML_MAX_NAME - 1).c_str());
    vs::buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), backend.get()));
    if (!buf) {
        throw vs::error(VS_ERR_COMPUTE, "out of memory on " + device + " for '" + key + "'");
    }
    std::vector<uint8_t> bytes(ggml_nbytes(t));
    fill(bytes.data());
    ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
    derived_ctx.push_back(std::move(ctx));
    derived_buf.push_back(std::move(buf));
    return derived[key] = t;
}

ggml_tensor * vs_context::swapped_weight(const std::string & name) {
    const ggml_tensor * src = model->tensor(name);
    if (src->type != GGML_TYPE_F32 && src->type != GGML_TYPE_F16) {
        return nullptr;
    }
    const size_t  es = ggml_type_size(src->type);
    const int64_t A = src->ne[0], B = src->ne[1], R = src->ne[2] * src->ne[3];
    return derived_tensor(name + ".swapped", src->type, { B, A, src->ne[2], src->ne[3] }, [&](uint8_t * out) {
        const auto * in = static_cast<const uint8_t *>(src->data);
        for (int64_t r = 0; r < R; ++r) {
            for (int64_t a = 0; a < A; ++a) {
                for (int64_t b = 0; b < B; ++b) {
                    std::memcpy(out + ((r * A + a) * B + b) * es, in + ((r * B + b) * A + a) * es, es);
                }
            }
        }
    });
}

ggml_tensor * vs_context::channel_padded_weight(const std::string & name, int64_t multiple) {
    const ggml_tensor * src = model->tensor(name);
    const int64_t       A = src->ne[0], A2 = (A + multiple - 1) / multiple * multiple;
    if (A2 == A || (src->type != GGML_TYPE_F32 && src->type != GGML_TYPE_F16)) {
        return w(name);
    }
    const size_t  es   = ggml_type_size(src->type);
    const int64_t rows = ggml_nrows(src);
    return derived_tensor(name + ".padded", src->type, { A2, src->ne[1], src->ne[2], src->ne[3] }, [&](uint8_t * out) {
        const auto * in = static_cast<const uint8_t *>(src->data);
        std::memset(out, 0, (size_t) (A2 * rows) * es);
        for (int64_t r = 0; r < rows; ++r) {
            std::memcpy(out + (size_t) (r * A2) * es, in + (size_t) (r * A) * es, (size_t) A * es);
        }
    });
}

ggml_tensor * vs_context::reversed_weight(const std::string & name, int axis) {
    const ggml_tensor * src  = model->tensor(name);
    const ggml_type     type = src->type == GGML_TYPE_F16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    const int64_t       n    = ggml_nelements(src);
    GGML_ASSERT(axis >= 0 && axis < GGML_MAX_DIMS);
    int64_t stride = 1;  // elements between neighbours along `axis`
    for (int a = 0; a < axis; ++a) {
        stride *= src->ne[a];
    }
    const int64_t len = src->ne[axis];
    return derived_tensor(name + ".reversed" + std::to_string(axis), type,
                          { src->ne[0], src->ne[1], src->ne[2], src->ne[3] }, [&](uint8_t * out) {
                              std::vector<float> floats;  // F32 and other types, as floats
                              if (type == GGML_TYPE_F32) {
                                  floats = vs::host_floats(src);
                              }
                              const auto * in = type == GGML_TYPE_F32 ? reinterpret_cast<const uint8_t *>(floats.data())
                                                                      : static_cast<const uint8_t *>(src->data);
                              const size_t es = ggml_type_size(type);
                              for (int64_t i = 0; i < n; ++i) {
                                  const int64_t at = (i / stride) % len;
                                  std::memcpy(out + (i + (len - 1 - 2 * at) * stride) * es, in + i * es, es);
                              }
                          });
}

ggml_tensor * vs_context::weight_as(const std::string & name, ggml_type type) {
    GGML_ASSERT(type == GGML_TYPE_F16 || type == GGML_TYPE_F32);
    const ggml_tensor * src = model->tensor(name);
    if (src->type == type) {
        return w(name);
    }
    return derived_tensor(name + "." + ggml_type_name(type), type, { src->ne[0], src->ne[1], src->ne[2], src->ne[3] },
                          [&](uint8_t * out) {
                              const std::vector<float> floats = vs::host_floats(src);
                              if (type == GGML_TYPE_F32) {
                                  std::memcpy(out, floats.data(), floats.size() * sizeof(float));
                              } else {
                                  ggml_fp32_to_fp16_row(floats.data(), reinterpret_cast<ggml_fp16_t *>(out),
                                                        (int64_t) floats.size());
                              }
                          });
}

vs::meta_pool::handle vs::meta_pool::take(const std::shared_ptr<meta_pool> & pool, size_t n) {
    auto & fr   = pool->free_;
    auto   best = fr.end();
    for (auto it = fr.begin(); it != fr.end(); ++it) {
        if ((*it)->size >= n && (best == fr.end() || (*it)->size <= (*best)->size)) {
            best = it;
        }
    }
    std::unique_ptr<block> b;
    if (best != fr.end()) {
        b = std::move(*best);
        fr.erase(best);
    } else {
        b        = std::make_unique<block>();
        b->bytes = std::make_unique<uint8_t[]>(n);
        b->size  = n;
    }
    return handle(b.release(), giver{ pool });
}

void vs::meta_pool::give(block * b) {
    free_.emplace_back(b);
}

vs::graph_build vs_context::new_graph(size_t max_nodes) {
    timings.n_graphs_built++;
    vs::graph_build gb;
    gb.meta = vs::meta_pool::take(graph_meta,
                                  ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false));
    ggml_init_params ip{ gb.meta->size, gb.meta->bytes.get(), true };
    gb.ctx.reset(ggml_init(ip));
    if (!gb.ctx) {
        throw vs::error(VS_ERR_COMPUTE, "out of memory for a graph");
    }
    gb.gf = ggml_new_graph_custom(gb.ctx.get(), max_nodes, false);
    return gb;
}

static bool is_view(const ggml_tensor * node) {
    switch (node->op) {
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return true;  // computes nothing, wherever the scheduler files it
        default:
            return false;
    }
}

vs::stage_graph & vs_context::stage_graph(int stage, const std::string & key, const vs::graph_builder & build,
                                          size_t max_nodes, bool shared) {
    const bool keep = keep_graphs && !profiling && !key.empty();
    current_stage   = stage;
    if (keep) {
        auto it = kept.find(key);
        if (it != kept.end()) {
            it->second->last_use = ++graph_uses;
            timings.n_graphs_reused++;
            return *it->second;
        }
    }
    auto sg        = std::make_unique<vs::stage_graph>();
    sg->gb         = new_graph(max_nodes);
    sg->t          = build(sg->gb.ctx.get(), sg->gb.gf);
    bool on_device = keep;
    for (int i = 0; on_device && i < ggml_graph_n_nodes(sg->gb.gf); ++i) {
        const ggml_tensor * node = ggml_graph_node(sg->gb.gf, i);
        on_device                = is_view(node) || ggml_backend_supports_op(backend.get(), node);
    }
    if (!on_device) {
        drain();  // the last such graph's memory goes, which the device may still use
        fresh = std::move(*sg);
        alloc(stage, fresh.gb.gf);
        return fresh;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(backend.get());
    auto                       oom  = [&] {
        return vs::error(VS_ERR_COMPUTE,
                                                std::string("out of memory on ") + device + " for the " + vs_stage_name(stage) + " graph");
    };
    size_t need = 0;
    if (shared) {  // measured without allocating
        vs::gallocr_ptr measure(ggml_gallocr_new(buft));
        if (!measure) {
            throw oom();
        }
        ggml_gallocr_reserve_n_size(measure.get(), sg->gb.gf, nullptr, nullptr, &need);
    }
    if (shared && need <= kept_limit / 4) {
        size_t n_shared = 0;
        auto   lru      = kept.end();
        for (auto it = kept.begin(); it != kept.end(); ++it) {
            if (it->second->shared) {
                ++n_shared;
                lru = lru == kept.end() || it->second->last_use < lru->second->last_use ? it : lru;
            }
        }
        if (n_shared >= max_shared_graphs) {
            drop_kept(lru);
        }
        if (!shared_alloc || need > shared_bytes) {  // the others go first: their memory is about to be freed
            drop_shared_graphs();                    // (each waited for: drop_kept)
            shared_alloc.reset(ggml_gallocr_new(buft));
        }
        if (!shared_alloc || !ggml_gallocr_alloc_graph(shared_alloc.get(), sg->gb.gf)) {
            drop_shared_graphs();  // none may be left in memory about to be freed (the last frees it)
            shared_alloc.reset();  // a new one none is in yet
            throw oom();
        }
        const size_t bytes = ggml_gallocr_get_buffer_size(shared_alloc.get(), 0);
        kept_bytes += bytes - shared_bytes;
        shared_bytes = bytes;
        sg->shared   = true;
    } else {
        sg->alloc.reset(ggml_gallocr_new(buft));
        if (!sg->alloc || !ggml_gallocr_alloc_graph(sg->alloc.get(), sg->gb.gf)) {
            throw oom();
        }
        sg->bytes = ggml_gallocr_get_buffer_size(sg->alloc.get(), 0);
        if (sg->bytes > kept_limit / 4) {  // too large to keep: run once in its own memory
            drain();                       // the last such graph's memory goes
            fresh = std::move(*sg);
            return fresh;
        }
        kept_bytes += sg->bytes;
    }
    sg->last_use = ++graph_uses;
    while (kept_bytes > kept_limit && !kept.empty()) {  // the least recently used go first
        auto lru = kept.begin();
        for (auto it = kept.begin(); it != kept.end(); ++it) {
            lru = it->second->last_use < lru->second->last_use ? it : lru;
        }
        drop_kept(lru);
    }
    return *(kept[key] = std::move(sg));
}

void vs_context::drop_kept(std::map<std::string, std::unique_ptr<vs::stage_graph>>::iterator it) {
    drain();  // its memory goes, and the device may still read or write it
    forget_capture(*it->second);
    kept_bytes -= it->second->bytes;
    const bool shared = it->second->shared;
    kept.erase(it);
    if (shared && std::none_of(kept.begin(), kept.end(), [](const auto & e) { return e.second->shared; })) {
        shared_alloc.reset();
        kept_bytes -= shared_bytes;
        shared_bytes = 0;
    }
}

void vs_context::drop_shared_graphs() {
    for (auto it = kept.begin(); it != kept.end();) {
        auto next = std::next(it);
        if (it->second->shared) {
            drop_kept(it);
        }
        it = next;
    }
}

void vs_context::compute(vs::stage_graph & sg) {
    if (!sg.alloc && !sg.shared) {
        compute(sg.gb.gf);
        return;
    }
    if (&sg == &fresh) {  // in memory of its own, but run once
        tag_run(sg.gb.gf);
    }
    after_engine();
    if (!queue_graphs) {
        const ggml_status st = ggml_backend_graph_compute(backend.get(), sg.gb.gf);
        staged               = 0;  // copied: the computation waited for its stream
        check_computed(st);
        return;
    }
    const ggml_status st = ggml_backend_graph_compute_async(backend.get(), sg.gb.gf);
    ggml_backend_event_record(graph_done.get(), backend.get());
    vs::cuda::wait(cuda_device, cuda_event(graph_done.get(), dev));
    check_computed(st);
}

void vs_context::after_engine() {
    if (cuda_device < 0 || vs::cuda::queued() == engine_seen) {
        return;
    }
    engine_seen = vs::cuda::queued();
    if (void * e = cuda_event(engine_done.get(), dev)) {
        vs::cuda::record(cuda_device, e);
        ggml_backend_event_wait(backend.get(), engine_done.get());
    } else {
        vs::cuda::synchronize(cuda_device);
    }
}

void vs_context::drain() {
    if (cuda_device < 0 || !backend) {
        return;
    }
    ggml_backend_synchronize(backend.get());
    vs::cuda::synchronize(cuda_device);
    staged      = 0;
    engine_seen = UINT64_MAX;  // the next graph orders itself after whatever the engine queues next
}

// ggml's CUDA backend keeps a captured graph's instance under the address of the graph's
// first node, and when it next captures a graph at that address it updates the instance in
// place (cudaGraphExecUpdate) wherever the kernels line up. A dropped graph's metadata block
// goes back to the pool, so another graph's first node can land at that address. Such
// updates stopped the process on an illegal instruction (with graphs dropped for room, and
// not with ggml's captures off), most likely because an update keeps a kernel node's
// thread-block cluster dimensions, which cuBLAS's Hopper GEMMs set by their shapes. So a
// kept graph that may have been captured leaves behind, at that address, a capture of its
// first node alone (run twice: ggml captures a graph's second run): no other graph's kernels
// line up with it, and the next one there is instantiated anew. Its first node runs twice
// more, into memory of its own about to be freed; one that writes into the device scratch,
// which may hold a stage's live activations, is left alone.
// Only CUDA backends capture (tag_runs), and they stop the process on a CUDA error rather
// than return one, so the status is not checked: a cancelled job's graph is still dropped.
void vs_context::forget_capture(vs::stage_graph & sg) {
    if (!tag_runs || (!sg.alloc && !sg.shared) || ggml_graph_n_nodes(sg.gb.gf) == 0) {
        return;
    }
    ggml_tensor *       first = ggml_graph_node(sg.gb.gf, 0);
    const ggml_tensor * owner = first->view_src ? first->view_src : first;
    if ((scratch && owner->buffer == scratch.get()) || (handoff && owner->buffer == handoff.get())) {
        return;
    }
    const ggml_init_params params = { ggml_graph_overhead_custom(1, false), nullptr, true };
    vs::ggml_ctx_ptr       ctx(ggml_init(params));
    ggml_cgraph *          alone = ctx ? ggml_new_graph_custom(ctx.get(), 1, false) : nullptr;
    if (!alone) {
        throw vs::error(VS_ERR_COMPUTE, "out of memory");
    }
    ggml_graph_add_node(alone, first);
    for (int run = 0; run < 2; ++run) {
        ggml_backend_graph_compute(backend.get(), alone);
    }
}

void vs_context::tag_run(ggml_cgraph * gf) {
    if (!tag_runs) {
        return;
    }
    ++n_runs;
    static_assert(sizeof(ggml_tensor::padding) >= sizeof(n_runs));
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        std::memcpy(ggml_graph_node(gf, i)->padding, &n_runs, sizeof(n_runs));
    }
}

void vs_context::check_computed(ggml_status st) const {
    if (st == GGML_STATUS_ABORTED || aborted()) {
        throw vs::error(VS_ERR_ABORTED, "synthesis cancelled");
    }
    if (st != GGML_STATUS_SUCCESS) {
        throw vs::error(VS_ERR_COMPUTE, "graph computation failed on " + device);
    }
}

namespace vs {

std::vector<float> host_floats(const ggml_tensor * t) {
    std::vector<float> v((size_t) ggml_nelements(t));
    if (t->type == GGML_TYPE_F32) {
        std::memcpy(v.data(), t->data, ggml_nbytes(t));
    } else if (const auto * traits = ggml_get_type_traits(t->type); traits->to_float) {
        traits->to_float(t->data, v.data(), ggml_nelements(t));
    } else {
        throw error(VS_ERR_FORMAT, std::string("'") + ggml_get_name(t) + "' has a type without floats");
    }
    return v;
}

// One line per graph ("G index stage nodes") and per node it computes ("N id op name type
// ne srcs count nonfinite maxabs mean rms samples..."), in the order the backend ran them
// (ggml's Vulkan backend reorders a graph): id is the node's place among the graph's
// non-view nodes as built, srcs the ids of the nodes each source is (or views), -1 for an
// input or a weight. The statistics are over every value (F32 and F16 nodes that are
// contiguous), the samples 64 values evenly spaced, so that two traces of the same graphs
// compare.
struct node_trace {
    FILE *                                       f     = nullptr;
    int                                          graph = -1;
    std::unordered_map<const ggml_tensor *, int> ids;
    std::vector<uint8_t>                         raw;
    std::vector<float>                           vals;

    // Its first line: the device's limits (vs_context_debug's limit_* fields) for the CPU to build the
    // device's graphs.
    node_trace(const char * path, const std::string & device, const device_limits & l) : f(std::fopen(path, "w")) {
        if (!f) {
            throw vs::error(VS_ERR_IO, std::string("cannot write the node trace '") + path + "'");
        }
        std::fprintf(f, "D %s %llu,%d,%d,%d\n", device.c_str(), (unsigned long long) (l.max_tensor_bytes >> 20),
                     (int) l.matmul_4d, (int) l.strided_batches, (int) l.out_prod);
    }

    ~node_trace() { std::fclose(f); }

    // Before the scheduler sees the graph: allocating it may reorder its nodes.
    void index_graph(ggml_cgraph * gf) {
        ids.clear();
        for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
            const ggml_tensor * node = ggml_graph_node(gf, i);
            if (!is_view(node)) {
                ids.emplace(node, (int) ids.size());
            }
        }
    }

    void begin_graph(int stage) { std::fprintf(f, "G %d %s %d\n", ++graph, vs_stage_name(stage), (int) ids.size()); }

    int id_of(const ggml_tensor * t) const {
        for (; t; t = t->view_src) {
            auto it = ids.find(t);
            if (it != ids.end()) {
                return it->second;
            }
        }
        return -1;
    }

    void record(const ggml_tensor * node) {
        auto it = ids.find(node);
        if (it == ids.end()) {
            return;  // a view (it computes nothing) or the scheduler's copy of an input
        }
        const int   id   = it->second;
        std::string name = node->name[0] ? node->name : "-";
        for (char & ch : name) {
            ch = std::isspace((unsigned char) ch) ? '_' : ch;  // the line's fields are split at spaces
        }
        std::fprintf(f, "N %d %s %s %s %lld,%lld,%lld,%lld ", id, ggml_op_desc(node), name.c_str(),
                     ggml_type_name(node->type), (long long) node->ne[0], (long long) node->ne[1],
                     (long long) node->ne[2], (long long) node->ne[3]);
        int n_src = 0;
        for (const ggml_tensor * s : node->src) {
            if (s) {
                std::fprintf(f, "%s%d", n_src++ ? "," : "", id_of(s));
            }
        }
        if (!n_src) {
            std::fputc('-', f);
        }
        const int64_t n = ggml_nelements(node);
        if ((node->type != GGML_TYPE_F32 && node->type != GGML_TYPE_F16) || !ggml_is_contiguous(node) || n == 0) {
            std::fputs(" 0\n", f);
            return;
        }
        vals.resize((size_t) n);
        if (node->type == GGML_TYPE_F32) {
            ggml_backend_tensor_get(node, vals.data(), 0, ggml_nbytes(node));
        } else {
            raw.resize(ggml_nbytes(node));
            ggml_backend_tensor_get(node, raw.data(), 0, raw.size());
            ggml_fp16_to_fp32_row(reinterpret_cast<const ggml_fp16_t *>(raw.data()), vals.data(), n);
        }
        int64_t nonfinite = 0;
        double  maxabs = 0.0, sum = 0.0, sumsq = 0.0;
        for (float v : vals) {
            if (!std::isfinite(v)) {
                nonfinite++;
                continue;
            }
            maxabs = std::max(maxabs, (double) std::fabs(v));
            sum += v;
            sumsq += (double) v * v;
        }
        const double m = (double) std::max<int64_t>(n - nonfinite, 1);
        std::fprintf(f, " %lld %lld %.9g %.9g %.9g", (long long) n, (long long) nonfinite, maxabs, sum / m,
                     std::sqrt(sumsq / m));
        const int64_t k = std::min<int64_t>(n, 64);
        for (int64_t i = 0; i < k; ++i) {
            std::fprintf(f, " %.9g", vals[(size_t) (i * n / k)]);
        }
        std::fputc('\n', f);
    }
};

}  // namespace vs

void vs_context::alloc(int stage, ggml_cgraph * gf) {
    drain();  // the scheduler may move its memory, which the device may still use
    current_stage = stage;
    if (profiling && trace) {
        trace->index_graph(gf);
    }
    ggml_backend_sched_reset(sched.get());
    if (!ggml_backend_sched_alloc_graph(sched.get(), gf)) {
        throw vs::error(VS_ERR_COMPUTE,
                        std::string("cannot allocate the ") + vs_stage_name(stage) + " graph on " + device);
    }
    if (!cpu_backend) {
        return;
    }
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * node = ggml_graph_node(gf, i);
        if (is_view(node)) {
            continue;
        }
        // An op the device lacks, or one the scheduler filed on the CPU for another reason
        // (e.g. all its sources live there).
        if (!ggml_backend_supports_op(backend.get(), node) ||
            ggml_backend_sched_get_tensor_backend(sched.get(), node) == cpu_backend.get()) {
            const ggml_tensor * src = node->src[0] ? node->src[0] : node;
            const std::string   op  = std::string(ggml_op_desc(node)) + "(" + ggml_type_name(src->type) + ")";
            if (fallback_ops[stage].insert(op).second) {
                vs::log(VS_LOG_WARN, std::string("stage ") + vs_stage_name(stage) + ": " + op + " runs on the CPU (" +
                                         device + " cannot)");
            }
        }
    }
}

void vs_context::compute(ggml_cgraph * gf) {
    if (profiling && trace) {
        trace->begin_graph(current_stage);
    }
    tag_run(gf);
    after_engine();
    const ggml_status st = ggml_backend_sched_graph_compute(sched.get(), gf);
    staged               = 0;  // copied: the computation waited for its stream
    check_computed(st);
}

void vs_context::set_input(ggml_tensor * t, const void * data, size_t offset, size_t bytes) {
    bytes                           = bytes == SIZE_MAX ? ggml_nbytes(t) - offset : bytes;
    const ggml_backend_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
    ggml_backend_buffer_type_t  pinned =
        cuda_device >= 0 && staging_min > 0 ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
    if (!pinned || !buf || ggml_backend_buffer_is_host(buf) || bytes == 0) {
        ggml_backend_tensor_set(t, data, offset, bytes);
        return;
    }
    const size_t need = (bytes + 255) & ~(size_t) 255;
    if (!staging || staged + need > ggml_backend_buffer_get_size(staging.get())) {
        ggml_backend_synchronize(backend.get());  // what is staged there has been copied
        staged = 0;
        if (!staging || need > ggml_backend_buffer_get_size(staging.get())) {
            staging.reset();
            staging.reset(ggml_backend_buft_alloc_buffer(pinned, std::max(need, staging_min)));
        }
        if (!staging) {
            ggml_backend_tensor_set(t, data, offset, bytes);
            return;
        }
    }
    auto * p = static_cast<uint8_t *>(ggml_backend_buffer_get_base(staging.get())) + staged;
    std::memcpy(p, data, bytes);
    staged += need;
    after_engine();  // the engine may still read or write t's memory
    ggml_backend_tensor_set_async(backend.get(), t, p, offset, bytes);
}

// A buffer of the device of at least `bytes` (grown, its contents lost, where smaller).
static void * grown(vs_context & c, vs::buffer_ptr & buf, size_t bytes, const char * what) {
    if (!buf || ggml_backend_buffer_get_size(buf.get()) < bytes) {
        c.drain();  // the device may still use the old one
        if (buf && (&buf == &c.scratch || &buf == &c.handoff)) {
            c.drop_shared_graphs();  // while what they read and write is there
        }
        buf.reset();  // the old one first: only one is ever held
        buf.reset(ggml_backend_buft_alloc_buffer(ggml_backend_get_default_buffer_type(c.backend.get()), bytes));
        if (!buf) {
            throw vs::error(VS_ERR_COMPUTE, "out of device memory on " + c.device + " (" + std::to_string(bytes >> 20) +
                                                " MiB of " + what + ")");
        }
        ggml_backend_buffer_clear(buf.get(), 0);  // what is read before it is written is zeros, not NaNs
    }
    return ggml_backend_buffer_get_base(buf.get());
}

// A new F32 tensor [ne0, ne1] of graph context g at `offset` bytes into buf.
static ggml_tensor * tensor_in(vs_context & c, const vs::buffer_ptr & buf, ggml_context * g, size_t offset, int64_t ne0,
                               int64_t ne1, const char * what) {
    ggml_tensor * t = ggml_new_tensor_2d(g, GGML_TYPE_F32, ne0, ne1);
    if (!buf || offset + ggml_nbytes(t) > ggml_backend_buffer_get_size(buf.get()) ||
        ggml_backend_tensor_alloc(buf.get(), t,
                                  static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf.get())) + offset) !=
            GGML_STATUS_SUCCESS) {
        throw vs::error(VS_ERR_COMPUTE, std::string("a tensor outside the device ") + what + " on " + c.device);
    }
    return t;
}

bool vs::in_device_memory(const vs_context & c, const ggml_tensor * t) {
    return t->buffer && ggml_backend_buffer_get_type(t->buffer) == ggml_backend_dev_buffer_type(c.dev) &&
           !ggml_backend_buffer_is_host(t->buffer) && ggml_is_contiguous(t);
}

void * vs_context::device_scratch(size_t bytes) {
    return grown(*this, scratch, bytes, "scratch");
}

ggml_tensor * vs_context::scratch_tensor(ggml_context * g, size_t offset, int64_t ne0, int64_t ne1) {
    return tensor_in(*this, scratch, g, offset, ne0, ne1, "scratch");
}

// The named outputs left in `buf`, which is about to be written.
static void drop_outputs_in(vs_context & c, const vs::buffer_ptr & buf) {
    for (auto it = c.device_outputs.begin(); it != c.device_outputs.end();) {
        it = it->second.buf == &buf ? c.device_outputs.erase(it) : std::next(it);
    }
}

void * vs_context::device_handoff(size_t bytes) {
    drop_outputs_in(*this, handoff);
    return grown(*this, handoff, bytes, "stage handoff");
}

ggml_tensor * vs_context::handoff_tensor(ggml_context * g, size_t offset, int64_t ne0, int64_t ne1) {
    return tensor_in(*this, handoff, g, offset, ne0, ne1, "stage handoff");
}

void * vs_context::blas() {
    if (!cuda_blas) {
        cuda_blas = vs::cuda::blas_create(cuda_device);
    }
    return cuda_blas;
}

vs_context::vs_context() = default;

vs_context::~vs_context() {
    try {
        drain();
    } catch (...) {
    }
    vs::cuda::blas_destroy(cuda_blas);
}

void vs_context::profile_op(const char * name, double ms) {
    if (profiling) {
        auto & st = op_profile[{ current_stage, name }];
        st.count++;
        st.ms += ms;
    }
}

bool vs_context::fused_lstm(const ggml_tensor * w_hh, int64_t H) const {
    return cuda_device >= 0 && vs::cuda::lstm_supported(w_hh->type, H) && w_hh->buffer &&
           !ggml_backend_buffer_is_host(w_hh->buffer);
}

const float * vs_context::lstm(const ggml_tensor * gx, const ggml_tensor * w_hh, int64_t H, int64_t n, int64_t cols,
                               int64_t D, float * h, float * c, float * out) {
    if (!gx->buffer || ggml_backend_buffer_is_host(gx->buffer)) {
        throw vs::error(VS_ERR_COMPUTE,
                        std::string(ggml_get_name(w_hh)) + ": input projections were not computed on " + device);
    }
    const auto    t0 = std::chrono::steady_clock::now();
    const float * kept =
        vs::cuda::lstm(cuda_device, static_cast<const float *>(gx->data), w_hh->data, w_hh->type, H, n, gx->ne[1], cols,
                       D, h, c, out, device_scratch(vs::cuda::lstm_scratch_bytes(H, n, cols)));
    if (profiling && !out) {
        vs::cuda::synchronize(cuda_device);  // the op's time is the kernel's
    }
    profile_op("LSTM (engine's CUDA kernel)", vs::ms_since(t0));
    return kept;
}

bool vs_context::aborted() const {
    return (halt && halt->load()) || (active && active->abort && active->abort(active->abort_user_data));
}

namespace vs {

std::vector<size_t> split_runs(const std::vector<size_t> & work, size_t n_workers) {
    const size_t n = work.size(), n_runs = std::min(n, std::max<size_t>(n_workers, 1));
    // Runs of at most `most` each, closed early only where each run left needs one of the
    // chunks left.
    auto divide = [&](size_t most) {
        std::vector<size_t> start = { 0 };
        size_t              run   = 0;
        for (size_t k = 0; k < n; ++k) {
            const size_t left_runs = n_runs - start.size();
            if (k > start.back() && left_runs > 0 && (run + work[k] > most || n - k == left_runs)) {
                start.push_back(k);
                run = 0;
            }
            run += work[k];
        }
        start.push_back(n);
        return start;
    };
    auto fits = [&](size_t most) {  // whether n_runs runs of at most `most` each hold every chunk
        size_t runs = 1, run = 0;
        for (size_t w : work) {
            if (w > most) {
                return false;
            }
            if (run + w > most) {
                ++runs;
                run = 0;
            }
            run += w;
        }
        return runs <= n_runs;
    };
    size_t lo = 0, hi = 0;  // the least largest run is in (lo, hi]
    for (size_t w : work) {
        hi += w;
    }
    while (hi - lo > 1) {
        const size_t mid      = lo + (hi - lo) / 2;
        (fits(mid) ? hi : lo) = mid;
    }
    return divide(hi);
}

std::unique_ptr<float[]> join_parts(std::vector<std::vector<float>> & parts, size_t & n) {
    std::vector<size_t> at;
    n = 0;
    for (const auto & part : parts) {
        at.push_back(n);
        n += part.size();
    }
    std::unique_ptr<float[]> out(new float[std::max<size_t>(n, 1)]);
    const size_t             T =
        n < JOIN_PARALLEL_SAMPLES
                        ? 1
                        : std::min({ JOIN_MAX_THREADS, parts.size(), (size_t) std::max(1u, std::thread::hardware_concurrency()) });
    auto copy = [&](size_t t) {
        for (size_t k = t; k < parts.size(); k += T) {
            std::copy(parts[k].begin(), parts[k].end(), out.get() + at[k]);
            std::vector<float>().swap(parts[k]);
        }
    };
    std::vector<std::thread> threads;
    size_t                   started = 1;
    for (; started < T; ++started) {
        try {
            threads.emplace_back(copy, started);
        } catch (const std::system_error &) {  // no thread to be had: the rest on this one
            break;
        }
    }
    copy(0);
    for (size_t t = started; t < T; ++t) {
        copy(t);
    }
    for (std::thread & th : threads) {
        th.join();
    }
    return out;
}

}  // namespace vs

void vs_context::run_workers(size_t n, const std::function<void(size_t, vs_context &)> & fn) {
    n            = std::min(n, workers.size() + 1);
    workers_halt = false;
    halt         = &workers_halt;
    std::vector<std::exception_ptr> errors(n);
    auto                            body = [&](size_t i) {
        try {
            fn(i, i == 0 ? *this : *workers[i - 1]);
        } catch (...) {
            errors[i]    = std::current_exception();
            workers_halt = true;
        }
    };
    std::vector<std::thread> threads;
    try {
        for (size_t i = 1; i < n; ++i) {
            threads.emplace_back(body, i);
        }
    } catch (...) {  // no thread to be had: the ones started stop at their next poll
        errors[0]    = std::current_exception();
        workers_halt = true;
    }
    if (!errors[0]) {
        body(0);
    }
    for (std::thread & t : threads) {
        t.join();
    }
    halt = nullptr;
    // The first error that is not another's halt; all of them halts: the caller's abort.
    std::exception_ptr first;
    for (const std::exception_ptr & e : errors) {
        if (!e) {
            continue;
        }
        try {
            std::rethrow_exception(e);
        } catch (const vs::error & err) {
            if (err.status != VS_ERR_ABORTED) {
                throw;
            }
        } catch (...) {
            throw;
        }
        if (!first) {
            first = e;
        }
    }
    if (first) {
        std::rethrow_exception(first);
    }
}

void vs_context::check_abort() const {
    if (aborted()) {
        throw vs::error(VS_ERR_ABORTED, "synthesis cancelled");
    }
}

void vs_context::absorb(vs_context & worker, bool last) {
    for (int s = 0; s < VS_STAGE_COUNT; ++s) {
        timings.stage_ms[s] += worker.timings.stage_ms[s];
        fallback_ops[s].insert(worker.fallback_ops[s].begin(), worker.fallback_ops[s].end());
    }
    timings.n_phoneme_ids += worker.timings.n_phoneme_ids;
    timings.n_frames += worker.timings.n_frames;
    timings.n_graphs_built += worker.timings.n_graphs_built;
    timings.n_graphs_reused += worker.timings.n_graphs_reused;
    timings.n_captures_replayed += worker.timings.n_captures_replayed;
    for (const auto & [key, st] : worker.op_profile) {
        op_profile[key].count += st.count;
        op_profile[key].ms += st.ms;
    }
    worker.op_profile.clear();
    if (last) {
        // The worker's buffers are its own: its device outputs are copied on the device into
        // this context's kept_outputs (read back only if asked for, as this context's own),
        // and waited for, since another thread may ask.
        outputs = std::move(worker.outputs);
        device_outputs.clear();
        vs::scratch_layout  layout;
        std::vector<size_t> at;
        for (const auto & [name, d] : worker.device_outputs) {
            at.push_back(layout.reserve(sizeof(float) * (size_t) (d.rows * d.cols)));
        }
        if (layout.bytes > 0) {
            auto * dst = static_cast<uint8_t *>(grown(*this, kept_outputs, layout.bytes, "named outputs"));
            size_t k   = 0;
            for (const auto & [name, d] : worker.device_outputs) {
                const auto * src = static_cast<const uint8_t *>(ggml_backend_buffer_get_base(d.buf->get()));
                vs::cuda::copy(cuda_device, dst + at[k], src + d.offset, sizeof(float) * (size_t) (d.rows * d.cols));
                set_device_output(name, kept_outputs, at[k++], d.rows, d.cols);
            }
            vs::cuda::synchronize(cuda_device);
        }
    }
    worker.clear_results();
}

void vs_context::set_output(const std::string & name, std::vector<float> data, int64_t rows, int64_t cols) {
    device_outputs.erase(name);
    outputs[name] = { std::move(data), { rows, cols } };
}

void vs_context::set_device_output(const std::string & name, const vs::buffer_ptr & buf, size_t offset, int64_t rows,
                                   int64_t cols) {
    GGML_ASSERT(buf && offset + sizeof(float) * (size_t) (rows * cols) <= ggml_backend_buffer_get_size(buf.get()));
    outputs.erase(name);
    device_outputs[name] = { &buf, offset, rows, cols };
}

void vs_context::keep_output_on_device(const std::string & name, const void * src, int64_t rows, int64_t cols) {
    drop_outputs_in(*this, kept_outputs);
    const size_t bytes = sizeof(float) * (size_t) (rows * cols);
    vs::cuda::copy(cuda_device, grown(*this, kept_outputs, bytes, "named outputs"), src, bytes);
    set_device_output(name, kept_outputs, 0, rows, cols);
}

const vs_context::named_output * vs_context::output(const std::string & name) const {
    if (auto d = device_outputs.find(name); d != device_outputs.end()) {
        named_output out{ std::vector<float>((size_t) (d->second.rows * d->second.cols)),
                          { d->second.rows, d->second.cols } };
        const auto * base = static_cast<const uint8_t *>(ggml_backend_buffer_get_base(d->second.buf->get()));
        vs::cuda::download(cuda_device, out.first.data(), base + d->second.offset, sizeof(float) * out.first.size());
        device_outputs.erase(d);
        outputs[name] = std::move(out);
    }
    auto it = outputs.find(name);
    return it == outputs.end() ? nullptr : &it->second;
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

// Op profiling through the scheduler's eval callback: asked about every node (so each is
// computed alone and synchronized), then told when it is done.
static bool profile_node(ggml_tensor * node, bool ask, void * data) {
    auto * c = static_cast<vs_context *>(data);
    if (ask) {
        c->node_start = std::chrono::steady_clock::now();
        return true;
    }
    if (!is_view(node)) {
        c->profile_op(ggml_op_desc(node), ms_since(c->node_start));
    }
    if (c->trace) {
        c->trace->record(node);
    }
    return true;
}

void set_op_profiling(vs_context & c, bool on) {
    if (on && !c.profiling) {
        c.op_profile.clear();  // a new table; turning it off keeps the last one readable
    }
    c.profiling = on;
    ggml_backend_sched_set_eval_callback(c.sched.get(), on ? profile_node : nullptr, on ? &c : nullptr);
    for (auto & w : c.workers) {
        set_op_profiling(*w, on);
    }
}

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
    const vs_context_params::vs_context_debug & dbg = params.debug;
    ctx->cuda_device                                = dbg.no_engine_kernels ? -1 : cuda::device_of(ctx->dev);
    ctx->device_graphs = ggml_backend_dev_type(ctx->dev) != GGML_BACKEND_DEVICE_TYPE_CPU || dbg.device_graphs;
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
        ctx->queue_graphs = cuda_event(ctx->graph_done.get(), ctx->dev) &&
                            cuda_event(ctx->engine_done.get(), ctx->dev) && !dbg.wait_each_graph;
    }
    ctx->sched.reset(ggml_backend_sched_new(backends.data(), nullptr, (int) backends.size(), 32768, false, false));
    if (!worker && params.espeak_library && *params.espeak_library) {
        ctx->phonemizer =
            std::make_unique<phonemizer>(params.espeak_library, params.espeak_data ? params.espeak_data : "");
    }
    if (model.arch == "kokoro") {
        ctx->voice = make_kokoro_voice(model);
    } else if (model.arch == "piper") {
        ctx->voice = make_piper_voice(model);
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
