// Kokoro-82M's LSTMs: a recurrence over chunks of steps (on CUDA, in the engine's kernel).
#include "kokoro.h"

namespace vs::kokoro {

// ---------------------------------------------------------------- LSTM

void scatter_steps(const float * o, int64_t t0, int64_t n, int64_t cols, int64_t D, int64_t H, std::vector<act> & ys) {
    for (size_t b = 0; b < ys.size(); ++b) {
        act & y = ys[b];
        for (int64_t d = 0; d < D; ++d) {
            for (int64_t j = 0; j < n && t0 + j < y.T; ++j) {
                const int64_t t = d == 0 ? t0 + j : y.T - 1 - (t0 + j);
                std::copy_n(o + (j * cols + (int64_t) b * D + d) * H, H, y.v.data() + t * y.C + d * H);
            }
        }
    }
}

// (Bi)LSTMs over several sequences at once: x[b] [in, T_b] -> [dirs * H, T_b] (forward
// channels first), as a recurrence of ggml ops, LSTM_CHUNK steps per graph (on CUDA, the
// engine's kernel); the state moves between chunks on the host. Each sequence and direction
// is one column of the batched step [H, dirs * B]: direction 0 reads its steps forward,
// direction 1 backward from its own last step, and steps past a sequence's end read zeros
// and are dropped (they come after its real ones in both directions), so each sequence gets
// exactly what it would get alone while the steps of all of them share each step's kernels.
// The input goes to the device once, every sequence's frames back to back; each step's
// projections are gathered from the frames' (no copy of a frame per direction or padding).
// With `rows`, sequence b has rows[b]->size() steps, step t reading frame (*rows[b])[t] of
// xs[b]: the prosody's frames read their tokens' rows, which are projected once a token.
// With `on_device`, where the recurrence is one kernel call, its output stays on the device
// (see lstm_device_out) and the acts returned have their shapes alone. With `in_graph`
// (only where the recurrence is one kernel call), the projections' graph computes the input
// itself (lstm_graph_input) and xs give its shapes alone.
std::vector<act> kokoro_voice::run_lstm(vs_context & c, int stage, const std::string & prefix,
                                        const std::vector<const act *> &                  xs,
                                        const std::vector<const std::vector<int32_t> *> & rows,
                                        lstm_device_out * on_device, const lstm_graph_input * in_graph) const {
    ggml_tensor *    w_ih_h = model_.tensor(prefix + ".weight_ih");
    const int64_t    in = w_ih_h->ne[0], H4 = w_ih_h->ne[1], D = w_ih_h->ne[2], H = H4 / 4;
    const int64_t    B = (int64_t) xs.size();
    int64_t          T = 0;
    std::vector<act> ys(xs.size());
    GGML_ASSERT(rows.empty() || rows.size() == xs.size());
    for (int64_t b = 0; b < B; ++b) {
        if (xs[b]->C != in) {
            throw error(VS_ERR_COMPUTE, prefix + ": input has " + std::to_string(xs[b]->C) + " channels, expected " +
                                            std::to_string(in));
        }
        ys[b].C = D * H;
        ys[b].T = rows.empty() ? xs[b]->T : (int64_t) rows[(size_t) b]->size();
        T       = std::max(T, ys[b].T);
        for (int64_t i = 0; !rows.empty() && i < ys[b].T; ++i) {
            GGML_ASSERT((*rows[(size_t) b])[(size_t) i] >= 0 && (*rows[(size_t) b])[(size_t) i] < xs[b]->T);
        }
    }
    // Row of xs[b] that sequence b's step t reads.
    auto row = [&](int64_t b, int64_t t) { return rows.empty() ? t : (int64_t) (*rows[(size_t) b])[(size_t) t]; };
    const int64_t cols = D * B;  // (direction, sequence) columns, direction fastest
    // Every sequence's frames one after another, then columns of zeros: Np >= N + 1 columns.
    std::vector<int64_t> first;
    std::vector<float>   frames;
    for (const act * x : xs) {
        first.push_back((int64_t) frames.size() / in);
        frames.insert(frames.end(), x->v.begin(), x->v.end());
    }
    if (in_graph) {
        first = in_graph->first;
    }
    const int64_t      N = in_graph ? in_graph->N : (int64_t) frames.size() / in;
    std::vector<float> h((size_t) (H * cols), 0.0f), cs((size_t) (H * cols), 0.0f);
    // On a CUDA device the recurrence is one kernel of the engine's own per chunk (the
    // graph computes only the input projections); elsewhere ggml ops, step by step.
    ggml_tensor * w_hh  = c.w(prefix + ".weight_hh");
    const bool    fused = c.fused_lstm(w_hh, H);
    const int64_t chunk = fused ? LSTM_CHUNK_FUSED : LSTM_CHUNK;
    const bool    kept  = on_device && fused && T <= chunk;  // output left on the device
    GGML_ASSERT(!in_graph || (fused && T <= chunk));
    for (int64_t b = 0; !kept && b < B; ++b) {
        ys[b].v.assign((size_t) (D * H * ys[b].T), 0.0f);
    }

    // On CUDA, where graphs are kept by their shapes, the frames and steps of a chunk's graph
    // are rounded up (shape_bucket); the steps added gather the zeros and are not run.
    const bool    rounds = fused && c.rounds_shapes() && !in_graph;  // (in_graph's key has its shapes)
    const int64_t Np     = rounds ? shape_bucket(N + 1) : N + 1;
    if (!in_graph) {
        frames.resize((size_t) (Np * in), 0.0f);
    }

    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        c.check_abort();
        const int64_t     n   = std::min<int64_t>(chunk, T - t0);
        const int64_t     np  = rounds ? std::min<int64_t>(shape_bucket(n), chunk) : n;
        const std::string key = fused ? "lstm " + prefix + " " + std::to_string(Np) + " " + std::to_string(np) + "x" +
                                            std::to_string(B) + (in_graph ? " of " + in_graph->key : std::string())
                                      : std::string();
        vs::stage_graph & sg  = c.stage_graph(
            stage, key,
            [&](ggml_context * g, ggml_cgraph * gf) {
                // Input projections of every sequence's frames at once, each direction's [4H, Np]
                // (x's column N and after zeros), side by side; the chunk's steps gathered from
                // them in the batched step's layout [4H, np, D, B] (steps past a sequence's end:
                // the zeros').
                std::vector<ggml_tensor *> made;  // in_graph's tensors to fill
                ggml_tensor *              xt = in_graph ? in_graph->build(g, gf, made) : input_2d(g, in, Np, "x");
                GGML_ASSERT(xt->ne[0] == in && xt->ne[1] == Np);
                ggml_tensor * at = ggml_new_tensor_1d(g, GGML_TYPE_I32, np * cols);
                ggml_set_input(at);
                ggml_tensor *              w_ih = c.w(prefix + ".weight_ih"), *bias = c.w(prefix + ".bias");
                const bool                 by_seq = B > 1 && !c.limits.matmul_4d;  // for the recurrence below
                std::vector<ggml_tensor *> dirs;
                for (int64_t d = 0; d < D; ++d) {
                    ggml_tensor * w = ggml_view_2d(g, w_ih, in, H4, w_ih->nb[1], d * w_ih->nb[2]);
                    dirs.push_back(ggml_add(g, ggml_mul_mat(g, w, xt),
                                             ggml_view_1d(g, bias, H4, d * H4 * ggml_element_size(bias))));
                }
                ggml_tensor * gx =
                    ggml_reshape_4d(g, ggml_get_rows(g, concat_all(g, std::move(dirs), 1), at), H4, np, D, B);
                if (fused) {
                    ggml_set_output(gx);
                    ggml_build_forward_expand(gf, gx);
                    made.insert(made.begin(), { xt, at, gx });
                    return made;
                }
                ggml_tensor * h0 = ggml_new_tensor_2d(g, GGML_TYPE_F32, H, cols);
                ggml_tensor * c0 = ggml_new_tensor_2d(g, GGML_TYPE_F32, H, cols);
                ggml_set_input(h0);
                ggml_set_input(c0);
                std::vector<ggml_tensor *> steps;
                ggml_tensor *              hs = h0, *cc = c0;
                for (int64_t j = 0; j < n; ++j) {
                    ggml_tensor * gj = ggml_view_4d(g, gx, H4, 1, D, B, gx->nb[1], gx->nb[2], gx->nb[3], j * gx->nb[1]);
                    ggml_tensor * rec = nullptr;
                    if (by_seq) {  // the sequences as one matrix's columns: [H, B, D] -> [4H, B, D]
                        ggml_tensor * hb = ggml_permute(g, ggml_reshape_3d(g, hs, H, D, B), 0, 2, 1, 3);
                        rec              = ggml_permute(g, ggml_mul_mat(g, w_hh, hb), 0, 2, 1, 3);  // [4H, D, B] view
                        rec              = ggml_reshape_4d(g, ggml_cont(g, rec), H4, 1, D, B);
                    } else {
                        rec = ggml_mul_mat(g, w_hh, ggml_reshape_4d(g, hs, H, 1, D, B));  // [4H, 1, D, B]
                    }
                    ggml_tensor * z = ggml_reshape_2d(g, ggml_add(g, rec, gj), H4, cols);
                    // Gates i, f, g, o: sigmoid and tanh of all four rows (two kernels, no copies).
                    ggml_tensor * sg   = ggml_sigmoid(g, z);
                    ggml_tensor * th   = ggml_tanh(g, z);
                    auto          gate = [&](ggml_tensor * t, int k) {
                        return ggml_view_2d(g, t, H, cols, t->nb[1], k * H * sizeof(float));
                    };
                    cc = ggml_add(g, ggml_mul(g, gate(sg, 1), cc), ggml_mul(g, gate(sg, 0), gate(th, 2)));
                    hs = ggml_mul(g, gate(sg, 3), ggml_tanh(g, cc));
                    steps.push_back(ggml_reshape_3d(g, hs, H, cols, 1));
                }
                ggml_tensor * out = concat_all(g, std::move(steps), 2);  // the steps' hidden states, [H, cols, n]
                for (ggml_tensor * t : { out, hs, cc }) {
                    ggml_set_output(t);
                    ggml_build_forward_expand(gf, t);
                }
                return std::vector<ggml_tensor *>{ xt, at, gx, h0, c0, out, hs, cc };
            },
            fused ? 64 + (in_graph ? 128 * (size_t) B : 0) : 32 * (size_t) n + 64);

        if (in_graph) {
            in_graph->fill(std::vector<ggml_tensor *>(sg.t.begin() + 3, sg.t.end()));
        } else {
            set_input(c, sg.t[0], frames.data());
        }
        std::vector<int32_t> cols_of_steps((size_t) (np * cols), (int32_t) N);  // each step's column
        for (int64_t b = 0; b < B; ++b) {
            const int64_t Tb = ys[b].T;
            for (int64_t d = 0; d < D; ++d) {
                for (int64_t j = 0; j < n; ++j) {
                    const int64_t t = d == 0 ? t0 + j : Tb - 1 - (t0 + j);
                    cols_of_steps[(size_t) ((b * D + d) * np + j)] =
                        (int32_t) (d * Np + (t >= 0 && t < Tb ? first[(size_t) b] + row(b, t) : N));
                }
            }
        }
        set_input(c, sg.t[1], cols_of_steps.data());
        std::vector<float> o(kept ? 0 : (size_t) (H * cols * n));
        if (fused) {
            c.compute(sg);
            // A recurrence of one call starts from zeros and its last state is not needed.
            const bool    one_call = T <= chunk;
            const float * out      = c.lstm(sg.t[2], w_hh, H, n, cols, D, one_call ? nullptr : h.data(),
                                       one_call ? nullptr : cs.data(), kept ? nullptr : o.data());
            if (kept) {
                *on_device = { out, H, cols, D, n };
                return ys;
            }
        } else {
            set_input(c, sg.t[3], h.data());
            set_input(c, sg.t[4], cs.data());
            c.compute(sg);
            ggml_backend_tensor_get(sg.t[5], o.data(), 0, ggml_nbytes(sg.t[5]));
            ggml_backend_tensor_get(sg.t[6], h.data(), 0, ggml_nbytes(sg.t[6]));
            ggml_backend_tensor_get(sg.t[7], cs.data(), 0, ggml_nbytes(sg.t[7]));
        }
        scatter_steps(o.data(), t0, n, cols, D, H, ys);
    }
    return ys;
}

void kokoro_voice::set_from_lstm(vs_context & c, lstm_device_out & o, std::vector<act> & ys,
                                 const std::vector<lstm_dest> & dests) const {
    bool gather = o.out != nullptr;
    for (const lstm_dest & d : dests) {
        GGML_ASSERT(d.t->ne[0] == ys[d.seq].C && d.frames >= ys[d.seq].T);
        gather = gather && in_device_memory(c, d.t);
    }
    if (gather) {
        std::vector<vs::cuda::lstm_span> spans;
        for (const lstm_dest & d : dests) {
            spans.push_back(
                { (int64_t) d.seq * o.D, ys[d.seq].T, d.frames, static_cast<float *>(d.t->data) + d.at * d.t->ne[0] });
        }
        vs::cuda::lstm_gather(c.cuda_device, o.out, o.H, o.cols, o.D, spans.data(), spans.size());
        return;
    }
    if (o.out) {  // to the host once, for this and any later consumer
        std::vector<float> v((size_t) (o.H * o.cols * o.steps));
        vs::cuda::download(c.cuda_device, v.data(), o.out, sizeof(float) * v.size());
        for (act & y : ys) {
            y.v.assign((size_t) (y.C * y.T), 0.0f);
        }
        scatter_steps(v.data(), 0, o.steps, o.cols, o.D, o.H, ys);
        o.out = nullptr;
    }
    // Each tensor's frames from its first destination's to its last's, in one upload.
    std::map<ggml_tensor *, std::pair<int64_t, int64_t>> extent;
    for (const lstm_dest & d : dests) {
        auto [it, fresh] = extent.try_emplace(d.t, d.at, d.at + d.frames);
        it->second       = { std::min(it->second.first, d.at), std::max(it->second.second, d.at + d.frames) };
    }
    for (const auto & [t, ext] : extent) {
        const int64_t      C = t->ne[0];
        std::vector<float> v((size_t) (C * (ext.second - ext.first)), 0.0f);
        for (const lstm_dest & d : dests) {
            const act & y = ys[d.seq];
            if (d.t == t) {
                std::copy_n(y.v.begin(), std::min(y.T, d.frames) * C, v.begin() + (d.at - ext.first) * C);
            }
        }
        c.set_input(t, v.data(), sizeof(float) * (size_t) (ext.first * C), sizeof(float) * v.size());
    }
}

}  // namespace vs::kokoro
