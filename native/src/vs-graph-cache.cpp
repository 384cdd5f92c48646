// Stage graphs: built on pooled metadata, kept between calls by their shapes, run on the scheduler.
#include <algorithm>
#include <cstring>

#include "vs-context.h"
#include "vs-cuda.h"
#include "vs-debug.h"

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
        on_device                = vs::is_view(node) || ggml_backend_supports_op(backend.get(), node);
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
    vs::cuda::wait(cuda_device, vs::cuda_event(graph_done.get(), dev));
    check_computed(st);
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
        if (vs::is_view(node)) {
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
