// What a context keeps for diagnostics: the node trace (vs_context_debug.node_trace), op
// profiling, and which nodes compute nothing (is_view, also the scheduler's path's).
#pragma once

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"
#include "vs-impl.h"

namespace vs {

// Whether a node computes nothing (a view, a reshape), wherever the scheduler files it.
bool is_view(const ggml_tensor * node);

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
