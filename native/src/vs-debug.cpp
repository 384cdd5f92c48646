// Diagnostics: op profiling through the scheduler's eval callback, and the node trace it feeds.
#include "vs-debug.h"

#include "vs-context.h"

namespace vs {

bool is_view(const ggml_tensor * node) {
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
}  // namespace vs

void vs_context::profile_op(const char * name, double ms) {
    if (profiling) {
        auto & st = op_profile[{ current_stage, name }];
        st.count++;
        st.ms += ms;
    }
}
