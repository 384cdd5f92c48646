// Kokoro-82M's shared blocks: graph inputs, style tables, packings, AdaIN and its residual blocks, convolutions.
#include "cpu/kernels.h"
#include "kokoro.h"

namespace vs::kokoro {

ggml_tensor * lstm_input_2d(ggml_context * g, int64_t C, int64_t T, const char * name) {
    ggml_tensor * t = ggml_new_tensor_2d(g, GGML_TYPE_F32, C, T);
    ggml_set_name(t, name);
    return t;
}

ggml_tensor * input_2d(ggml_context * g, int64_t C, int64_t T, const char * name) {
    ggml_tensor * t = lstm_input_2d(g, C, T, name);
    ggml_set_input(t);
    return t;
}

act read_act(ggml_tensor * t) {
    act a;
    a.C = t->ne[0];
    a.T = ggml_nelements(t) / t->ne[0];
    a.v.resize(ggml_nelements(t));
    ggml_backend_tensor_get(t, a.v.data(), 0, ggml_nbytes(t));
    return a;
}

act read_frames(ggml_tensor * t, int64_t T) {
    act a = read_act(t);
    a.T   = T;
    a.v.resize((size_t) (a.C * T));
    return a;
}

void set_input(vs_context & c, ggml_tensor * t, const void * data) {
    c.set_input(t, data);
}

int64_t token_segments(const vs_context & c, const std::vector<kokoro_job> & jobs, int64_t gap, std::string & key) {
    int64_t T = 0;
    for (const auto & j : jobs) {
        T = std::max(T, (int64_t) j.tokens.size());
    }
    const int64_t L = (c.rounds_shapes() ? shape_bucket(T) : T) + (jobs.size() > 1 ? gap : 0);
    key += " " + std::to_string(jobs.size()) + "x" + std::to_string(L);
    return L;
}

// ---------------------------------------------------------------- shared blocks

ggml_tensor * linear(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & module) {
    return ggml_add(g, ggml_mul_mat(g, c.w(module + ".weight"), x), c.w(module + ".bias"));
}

void style_affine(vs_context & c, ggml_context * g, ggml_tensor * s, const std::string & fc, int64_t C,
                  ggml_tensor *& scale, ggml_tensor *& shift) {
    ggml_tensor * h = linear(c, g, s, fc);  // [2C, 1]
    scale           = ggml_scale_bias(g, ggml_view_2d(g, h, C, 1, h->nb[1], 0), 1.0f, 1.0f);
    shift           = ggml_view_2d(g, h, C, 1, h->nb[1], C * ggml_element_size(h));
}

style_table make_style_table(vs_context & c, const vs_model & m, const std::string & prefix) {
    const std::string                                  suffix = ".fc.weight";
    std::vector<std::pair<std::string, ggml_tensor *>> fcs;
    for (const auto & [name, t] : m.host.tensors) {
        if (name.rfind(prefix, 0) == 0 && name.size() > suffix.size() &&
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            fcs.emplace_back(name.substr(0, name.size() - 7), t);  // the module: without ".weight"
        }
    }
    style_table tab;
    int64_t     rows = 0;
    for (const auto & [module, t] : fcs) {
        const ggml_tensor * b = m.tensor(module + ".bias");
        if (t->type != fcs[0].second->type || t->ne[0] != STYLE_DIM || b->type != GGML_TYPE_F32 ||
            b->ne[0] != t->ne[1]) {
            return {};  // the graphs keep one matmul per layer
        }
        tab.offset[module] = rows;
        rows += t->ne[1];
    }
    if (fcs.empty()) {
        return {};
    }
    tab.w =
        c.derived_tensor(prefix + "fc.all.weight", fcs[0].second->type, { STYLE_DIM, rows, 1, 1 }, [&](uint8_t * out) {
            for (const auto & [module, t] : fcs) {
                std::memcpy(out, t->data, ggml_nbytes(t));
                out += ggml_nbytes(t);
            }
        });
    tab.b = c.derived_tensor(prefix + "fc.all.bias", GGML_TYPE_F32, { rows, 1, 1, 1 }, [&](uint8_t * out) {
        auto * dst = reinterpret_cast<float *>(out);
        for (const auto & [module, t] : fcs) {
            const ggml_tensor * b   = m.tensor(module + ".bias");
            const int64_t       C   = b->ne[0] / 2;
            const auto *        src = static_cast<const float *>(b->data);
            for (int64_t i = 0; i < 2 * C; ++i) {
                *dst++ = src[i] + (i < C ? 1.0f : 0.0f);
            }
        }
    });
    return tab;
}

const style_table * kokoro_voice::style_table_for(vs_context & c, const std::string & prefix) const {
    if (!c.device_graphs) {
        return nullptr;
    }
    auto it = tables_.find(prefix);
    if (it == tables_.end()) {
        it = tables_.emplace(prefix, make_style_table(c, model_, prefix)).first;
    }
    return it->second.w ? &it->second : nullptr;
}

packing make_packing(ggml_context * g, int64_t B, int64_t L, ggml_tensor * styles_t) {
    packing p;
    p.B       = B;
    p.L       = L;
    p.mask    = ggml_new_tensor_3d(g, GGML_TYPE_F32, L, B, 1);
    p.inv_len = ggml_new_tensor_3d(g, GGML_TYPE_F32, 1, B, 1);
    p.styles  = styles_t;
    ggml_set_input(p.mask);
    ggml_set_input(p.inv_len);
    p.mask_t = ggml_reshape_2d(g, p.mask, B * L, 1);
    return p;
}

void fill_packing(vs_context & c, ggml_tensor * mask_t, ggml_tensor * inv_len_t, int64_t B, int64_t L,
                  const std::vector<int64_t> & lens, int64_t rate) {
    std::vector<float> mask((size_t) (B * L), 0.0f), inv((size_t) B);
    for (int64_t b = 0; b < B; ++b) {
        std::fill_n(mask.begin() + b * L, rate * lens[(size_t) b], 1.0f);
        inv[(size_t) b] = 1.0f / (float) (rate * lens[(size_t) b]);
    }
    set_input(c, mask_t, mask.data());
    set_input(c, inv_len_t, inv.data());
}

std::vector<std::pair<size_t, size_t>> pack_groups(const std::vector<int64_t> & frames, bool packed, int64_t gap,
                                                   size_t max_tensor_bytes) {
    const int64_t max_frames =
        (int64_t) std::min<size_t>(MAX_PACKED_FRAMES, max_tensor_bytes / (size_t) PACKED_FRAME_BYTES);
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t first = 0; first < frames.size();) {
        size_t  last    = first + 1;
        int64_t longest = frames[first];
        while (packed && last < frames.size() &&
               (int64_t) (last + 1 - first) * (std::max(longest, frames[last]) + gap) <= max_frames) {
            longest = std::max(longest, frames[last++]);
        }
        out.emplace_back(first, last);
        first = last;
    }
    return out;
}

int64_t packed_length(const vs_context & c, const std::vector<int64_t> & lens, bool packed) {
    const int64_t L = *std::max_element(lens.begin(), lens.end()) + (lens.size() > 1 ? PACK_GAP : 0);
    return packed && c.rounds_shapes() ? shape_bucket(L) : L;
}

act unpack_host(const act & packed, int64_t L, int64_t b, int64_t T) {
    act a;
    a.C = packed.C;
    a.T = T;
    a.v.assign(packed.v.begin() + b * L * a.C, packed.v.begin() + (b * L + T) * a.C);
    return a;
}

void pack_cond(ggml_context * g, cond & k, int64_t B, int64_t L, packing & pk, packing & pk2) {
    if (!k.table) {
        throw error(VS_ERR_COMPUTE, "sentences cannot be packed without a style table");
    }
    ggml_tensor * styles_t = ggml_cont(g, ggml_transpose(g, k.styles));
    pk                     = make_packing(g, B, L, styles_t);
    pk2                    = make_packing(g, B, 2 * L, styles_t);
    k.pack                 = &pk;
    k.pack2                = &pk2;
}

void kokoro_voice::use_style_table(vs_context & c, ggml_context * g, cond & k, const std::string & prefix) const {
    if (const style_table * tab = style_table_for(c, prefix)) {
        k.table  = tab;
        k.styles = ggml_add(g, ggml_mul_mat(g, tab->w, k.s), tab->b);
    }
}

bool table_affine(ggml_context * g, const cond & k, const std::string & fc, int64_t C, ggml_tensor *& scale,
                  ggml_tensor *& shift) {
    if (!k.table) {
        return false;
    }
    auto it = k.table->offset.find(fc);
    if (it == k.table->offset.end()) {
        return false;
    }
    const size_t es = ggml_element_size(k.styles);
    scale           = ggml_view_2d(g, k.styles, C, 1, k.styles->nb[1], it->second * es);
    shift           = ggml_view_2d(g, k.styles, C, 1, k.styles->nb[1], (it->second + C) * es);
    return true;
}

cond make_cond(ggml_context * g, int64_t max_frames, int64_t B) {
    cond k;
    k.s    = input_2d(g, STYLE_DIM, B, "style");  // one half of the style row, a column a sentence
    k.ones = input_2d(g, 1, std::max<int64_t>(max_frames, 1024), "ones");
    return k;
}

void fill_cond(vs_context & c, ggml_tensor * s, ggml_tensor * ones, const float * style) {
    set_input(c, s, style);  // B style halves one after another
    if (ones->buffer) {      // a graph whose AdaINs are all adain_tc reads no ones
        std::vector<float> v((size_t) ggml_nelements(ones), 1.0f);
        set_input(c, ones, v.data());
    }
}

void fill_cond(vs_context & c, const cond & k, const float * style) {
    fill_cond(c, k.s, k.ones, style);
}

void adain_affine(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                  ggml_tensor *& a, ggml_tensor *& b) {
    ggml_tensor *scale, *shift;
    style_affine(c, g, k.s, fc, x->ne[0], scale, shift);
    const int64_t T = x->ne[1];
    ggml_tensor * mean, *var;
    if (c.cpu_kernels && ggml_is_contiguous(x) && x->ne[0] % cpu::vector_floats() == 0 && ggml_nrows(x) == T) {
        ggml_tensor * stats = cpu::channel_stats(g, x);  // [C, 2]
        mean                = ggml_view_2d(g, stats, x->ne[0], 1, stats->nb[1], 0);
        var                 = ggml_view_2d(g, stats, x->ne[0], 1, stats->nb[1], stats->nb[1]);
    } else {
        ggml_tensor * ones = ggml_view_2d(g, k.ones, 1, T, k.ones->nb[1], 0);
        mean               = ggml_scale(g, ggml_out_prod(g, x, ones), 1.0f / (float) T);  // [C, 1]
        // Two passes (E[(x - mean)^2], not E[x^2] - mean^2): some channels' means dwarf their spread.
        var = ggml_scale(g, ggml_out_prod(g, ggml_sqr(g, ggml_sub(g, x, mean)), ones), 1.0f / (float) T);
    }
    a = ggml_div(g, scale, ggml_sqrt(g, ggml_scale_bias(g, var, 1.0f, 1e-5f)));
    b = ggml_sub(g, shift, ggml_mul(g, mean, a));
}

ggml_tensor * adain(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc) {
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(g, x);
    }
    ggml_tensor *a, *b;
    adain_affine(c, g, x, k, fc, a, b);
    return ggml_add(g, ggml_mul(g, x, a), b);
}

ggml_tensor * adain_snake(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                          ggml_tensor * alpha) {
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(g, x);
    }
    const int64_t C = x->ne[0];
    ggml_tensor * a, *b;
    adain_affine(c, g, x, k, fc, a, b);
    ggml_tensor * al  = ggml_reshape_2d(g, alpha, C, 1);
    ggml_tensor * inv = ggml_div(g, ggml_view_2d(g, k.ones, C, 1, C * sizeof(float), 0), al);  // 1 / alpha
    ggml_tensor * u   = ggml_add(g, ggml_mul(g, x, ggml_mul(g, a, al)), ggml_mul(g, b, al));
    return ggml_mul(g, ggml_add(g, u, ggml_sqr(g, ggml_sin(g, u))), inv);
}

// Off the CPU, where a graph's cost is its kernel launches, AdaIN (then Snake) of x [C, T]
// with time along ne0, returned as [T, C]. That layout has both as few kernels: the
// instance norm is ggml's group norm with a group a channel (two passes over each), and
// the chain mul, sin, sqr, mul, add (1 / alpha a leaf, made once) is one kernel in
// ggml's CUDA backend.

ggml_tensor * adain_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc) {
    const int64_t C = x->ne[0], T = x->ne[1];
    ggml_tensor * xt = ggml_cont(g, ggml_transpose(g, x));  // [T, C]
    ggml_tensor * n  = ggml_group_norm(g, ggml_reshape_4d(g, xt, T, 1, C, 1), (int) C, 1e-5f);
    ggml_tensor * scale, *shift;
    if (!table_affine(g, k, fc, C, scale, shift)) {
        style_affine(c, g, k.s, fc, C, scale, shift);
    }
    return ggml_add(g, ggml_mul(g, ggml_reshape_2d(g, n, T, C), ggml_reshape_2d(g, scale, 1, C)),
                    ggml_reshape_2d(g, shift, 1, C));
}

ggml_tensor * packed_adain(ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc) {
    const packing & p    = *k.pack;
    const int64_t   C    = x->ne[0];
    ggml_tensor *   x3   = ggml_reshape_3d(g, ggml_cont(g, ggml_transpose(g, x)), p.L, p.B, C);  // [L, B, C]
    ggml_tensor *   mean = ggml_mul(g, ggml_sum_rows(g, ggml_mul(g, x3, p.mask)), p.inv_len);    // [1, B, C]
    ggml_tensor *   d    = ggml_mul(g, ggml_sub(g, x3, mean), p.mask);
    ggml_tensor *   var  = ggml_mul(g, ggml_sum_rows(g, ggml_sqr(g, d)), p.inv_len);
    const int64_t   off  = k.table->offset.at(fc);
    const size_t    es = ggml_element_size(p.styles), nb = p.styles->nb[1];
    ggml_tensor *   scale = ggml_view_3d(g, p.styles, 1, p.B, C, es, nb, off * nb);
    ggml_tensor *   shift = ggml_view_3d(g, p.styles, 1, p.B, C, es, nb, (off + C) * nb);
    ggml_tensor *   a     = ggml_div(g, scale, ggml_sqrt(g, ggml_scale_bias(g, var, 1.0f, 1e-5f)));
    return ggml_add(g, ggml_mul(g, d, a), shift);
}

ggml_tensor * packed_adain_leaky_ct(ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                                    float slope) {
    const packing & p    = *k.pack;
    const int64_t   C    = x->ne[0];
    ggml_tensor *   x3   = ggml_reshape_3d(g, ggml_is_contiguous(x) ? x : ggml_cont(g, x), C, p.L, p.B);
    ggml_tensor *   m    = ggml_reshape_3d(g, p.mask, 1, p.L, p.B);
    ggml_tensor *   il   = ggml_reshape_3d(g, p.inv_len, 1, 1, p.B);
    ggml_tensor *   mean = ggml_mul(g, ggml_out_prod(g, x3, m), il);  // [C, 1, B]
    ggml_tensor *   d    = ggml_sub(g, x3, mean);
    ggml_tensor *   var  = ggml_mul(g, ggml_out_prod(g, ggml_sqr(g, d), m), il);
    const int64_t   off  = k.table->offset.at(fc);
    const size_t    es = ggml_element_size(k.styles), nb = k.styles->nb[1];
    ggml_tensor *   scale = ggml_view_3d(g, k.styles, C, 1, p.B, nb, nb, off * es);
    ggml_tensor *   shift = ggml_view_3d(g, k.styles, C, 1, p.B, nb, nb, (off + C) * es);
    ggml_tensor *   a     = ggml_div(g, scale, ggml_sqrt(g, ggml_scale_bias(g, var, 1.0f, 1e-5f)));
    ggml_tensor *   y     = ggml_leaky_relu(g, ggml_add(g, ggml_mul(g, d, a), shift), slope, false);
    return ggml_reshape_2d(g, ggml_mul(g, y, m), C, p.B * p.L);
}

ggml_tensor * packed_masked(ggml_context * g, ggml_tensor * y, const packing & p) {
    return ggml_reshape_2d(g, ggml_mul(g, y, p.mask), p.B * p.L, y->ne[2]);
}

ggml_tensor * adain_leaky_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                             float slope) {
    if (k.pack) {
        return packed_masked(g, ggml_leaky_relu(g, packed_adain(g, x, k, fc), slope, false), *k.pack);
    }
    return ggml_leaky_relu(g, adain_tc(c, g, x, k, fc), slope, false);
}

ggml_tensor * adain_snake_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                             const std::string & alpha_name) {
    const int64_t C   = x->ne[0];
    ggml_tensor * y   = adain_tc(c, g, x, k, fc);
    ggml_tensor * a   = ggml_reshape_2d(g, c.w(alpha_name), 1, C);
    ggml_tensor * inv = c.derived_tensor(alpha_name + ".inv", GGML_TYPE_F32, { 1, C, 1, 1 }, [&](uint8_t * out) {
        const std::vector<float> alpha = host_floats(c.model->tensor(alpha_name));  // 1 / alpha, made once
        for (int64_t i = 0; i < C; ++i) {
            reinterpret_cast<float *>(out)[i] = 1.0f / alpha[(size_t) i];
        }
    });
    ggml_tensor * s2  = ggml_sqr(g, ggml_sin(g, ggml_mul(g, y, a)));
    return ggml_add(g, y, ggml_mul(g, s2, inv));
}

ggml_tensor * conv1d_tc(vs_context & c, ggml_context * g, ggml_tensor * xt, const std::string & w_name, ggml_tensor * b,
                        int dilation, int padding, bool fine_columns) {
    ggml_tensor * w  = c.w(w_name);
    const int64_t IC = w->ne[0], K = w->ne[1], OC = w->ne[2];
    const int64_t T_out = xt->ne[0] + 2 * padding - dilation * (K - 1);
    if (phases_apply(c.graph_opts(), w, dilation)) {  // its rows a multiple of 8 halves (channel_padded_weight)
        return conv1d_phases(g, xt, padding, T_out, c.channel_padded_weight(w_name), b, dilation, fine_columns);
    }
    ggml_tensor * ws =
        (size_t) (IC * K * T_out) * sizeof(uint16_t) <= std::min(MAX_IM2COL_TC_BYTES, c.limits.max_tensor_bytes)
            ? c.swapped_weight(w_name)
            : nullptr;
    if (!ws) {
        return conv1d(c.graph_opts(), g, ggml_cont(g, ggml_transpose(g, xt)), w, b, dilation, padding);
    }
    const ggml_type type = ws->type == GGML_TYPE_F16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    ggml_tensor *   cols = ggml_im2col(g, ws, xt, 1, 0, padding, 0, dilation, 0, false, type);  // [IC * K, T']
    ggml_tensor *   y    = ggml_mul_mat(g, ggml_reshape_2d(g, ws, K * IC, OC), ggml_reshape_2d(g, cols, IC * K, T_out));
    return b ? ggml_add(g, y, b) : y;
}

ggml_tensor * conv1d_ct(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & w_name, ggml_tensor * b,
                        bool fine_columns) {
    ggml_tensor * w   = c.w(w_name);
    const int     pad = (int) (w->ne[1] - 1) / 2;
    if (phases_apply(c.graph_opts(), w, 1)) {
        return conv1d_phases_ct(g, x, pad, x->ne[1], c.channel_padded_weight(w_name), b, fine_columns);
    }
    return conv1d(c.graph_opts(), g, x, w, b, 1, pad);
}

ggml_tensor * upsample2(ggml_context * g, ggml_tensor * x) {
    ggml_tensor * x3 = ggml_reshape_3d(g, ggml_cont(g, x), x->ne[0], 1, x->ne[1]);
    return ggml_reshape_2d(g, ggml_concat(g, x3, x3, 1), x->ne[0], 2 * x->ne[1]);
}

ggml_tensor * depthwise_upsample(ggml_context * g, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b) {
    const int64_t C = x->ne[0], T = x->ne[1];
    auto          tap  = [&](int k) { return ggml_view_1d(g, w, C, k * w->nb[1]); };
    ggml_tensor * even = ggml_add(g, ggml_mul(g, x, tap(1)), b);
    ggml_tensor * next = ggml_view_2d(g, pad_time(g, x, 0, 1), C, T, x->ne[0] * sizeof(float), C * sizeof(float));
    ggml_tensor * odd  = ggml_add(g, ggml_add(g, ggml_mul(g, x, tap(2)), ggml_mul(g, next, tap(0))), b);
    ggml_tensor * y    = ggml_concat(g, ggml_reshape_3d(g, even, C, 1, T), ggml_reshape_3d(g, odd, C, 1, T), 1);
    return ggml_reshape_2d(g, y, C, 2 * T);
}

ggml_tensor * depthwise_upsample_tc(ggml_context * g, ggml_tensor * xt, ggml_tensor * w, ggml_tensor * b) {
    const int64_t T = xt->ne[0], C = xt->ne[1];
    auto          tap  = [&](int k) { return ggml_reshape_2d(g, ggml_view_1d(g, w, C, k * w->nb[1]), 1, C); };
    ggml_tensor * bt   = ggml_reshape_2d(g, b, 1, C);
    ggml_tensor * even = ggml_add(g, ggml_mul(g, xt, tap(1)), bt);
    ggml_tensor * xp   = ggml_pad_ext(g, xt, 0, 1, 0, 0, 0, 0, 0, 0);  // [T + 1, C]: frame T zeros
    ggml_tensor * next = ggml_view_2d(g, xp, T, C, xp->nb[1], sizeof(float));
    ggml_tensor * odd  = ggml_add(g, ggml_add(g, ggml_mul(g, xt, tap(2)), ggml_mul(g, next, tap(0))), bt);
    ggml_tensor * y    = ggml_concat(g, ggml_reshape_3d(g, even, 1, T, C), ggml_reshape_3d(g, odd, 1, T, C), 0);
    return ggml_reshape_2d(g, y, 2 * T, C);
}

// StyleTTS 2's AdainResBlk1d (LeakyReLU 0.2, optional 2x upsampling), scaled by 1/sqrt(2).
ggml_tensor * kokoro_voice::adain_res_block(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k,
                                            const std::string & pre, bool upsample) const {
    ggml_tensor * r = nullptr;
    if (c.device_graphs && k.pack && c.limits.out_prod) {  // packed, in [C, T] throughout
        const bool    fine = k.pack->B > 1;                // a batch's shapes (phase_columns)
        ggml_tensor * t    = packed_adain_leaky_ct(g, x, k, pre + "norm1.fc", 0.2f);
        cond          k2   = k;  // after the upsampling: its twice as long segments
        if (upsample) {
            k2.pack = k.pack2;
            t       = depthwise_upsample(g, t, c.w(pre + "pool.weight"), c.w(pre + "pool.bias"));
            t       = ggml_mul(g, t, ggml_reshape_2d(g, k2.pack->mask, 1, k2.pack->B * k2.pack->L));
        }
        r = conv1d_ct(c, g, t, pre + "conv1.weight", c.w(pre + "conv1.bias"), fine);
        t = packed_adain_leaky_ct(g, r, k2, pre + "norm2.fc", 0.2f);
        r = conv1d_ct(c, g, t, pre + "conv2.weight", c.w(pre + "conv2.bias"), fine);
    } else if (c.device_graphs) {                      // in [T, C] in between (see adain_tc)
        const bool    fine = k.pack && k.pack->B > 1;  // a batch's shapes (phase_columns)
        ggml_tensor * t    = adain_leaky_tc(c, g, x, k, pre + "norm1.fc", 0.2f);
        cond          k2   = k;  // after the upsampling, in a packing: its twice as long segments
        if (upsample) {
            t = depthwise_upsample_tc(g, t, c.w(pre + "pool.weight"), c.w(pre + "pool.bias"));
            if (k.pack) {
                k2.pack = k.pack2;
                t       = ggml_mul(g, t, k2.pack->mask_t);
            }
        }
        r = conv1d_tc(c, g, t, pre + "conv1.weight", c.w(pre + "conv1.bias"), 1, 1, fine);
        t = adain_leaky_tc(c, g, r, k2, pre + "norm2.fc", 0.2f);
        r = conv1d_tc(c, g, t, pre + "conv2.weight", c.w(pre + "conv2.bias"), 1, 1, fine);
    } else {
        r = ggml_leaky_relu(g, adain(c, g, x, k, pre + "norm1.fc"), 0.2f, false);
        if (upsample) {
            r = depthwise_upsample(g, r, c.w(pre + "pool.weight"), c.w(pre + "pool.bias"));
        }
        r = c.conv(g, r, pre + "conv1");  // K = 3
        r = ggml_leaky_relu(g, adain(c, g, r, k, pre + "norm2.fc"), 0.2f, false);
        r = c.conv(g, r, pre + "conv2");
    }

    // The shortcut: the 1x1 convolution (no bias) before the frames are repeated, on half
    // as many frames as after.
    ggml_tensor * sc = x;
    auto          it = c.weights->tensors.find(pre + "conv1x1.weight");
    if (it != c.weights->tensors.end()) {
        sc = conv1d(c.graph_opts(), g, sc, it->second, nullptr, 1, 0);
    }
    sc = upsample ? upsample2(g, sc) : sc;
    return ggml_scale(g, ggml_add(g, r, sc), 1.0f / std::sqrt(2.0f));
}

// iSTFTNet's AdaINResBlock1: three (AdaIN, Snake, dilated conv, AdaIN, Snake, conv) residuals.
// On the CPU, AdaIN's statistics in ggml's ops, then the normalization, Snake, the convolution,
// its bias and `residual` in the engine's kernel; null where the kernel does not take them.
static ggml_tensor * adain_snake_conv_cpu(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k,
                                          const std::string & fc, const std::string & alpha, const std::string & conv,
                                          int dilation, ggml_tensor * residual) {
    const int64_t C      = x->ne[0];
    ggml_tensor * scales = nullptr;
    ggml_tensor * w      = c.cpu_packed_conv_int16(conv + ".weight", scales);
    if (!w && c.cpu_kernels) {
        w = c.cpu_packed_conv(conv + ".weight");
    }
    if (!w || !cpu::snake_conv_fits(C, w->ne[0])) {
        return nullptr;
    }
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(g, x);
    }
    if (residual && !ggml_is_contiguous(residual)) {
        residual = ggml_cont(g, residual);
    }
    ggml_tensor *a, *b;
    adain_affine(c, g, x, k, fc, a, b);
    if (ggml_nelements(a) != C || ggml_nelements(b) != C) {
        return nullptr;
    }
    ggml_tensor * al  = ggml_reshape_2d(g, c.w(alpha), C, 1);
    ggml_tensor * inv = ggml_div(g, ggml_view_2d(g, k.ones, C, 1, C * sizeof(float), 0), al);  // 1 / alpha
    return cpu::snake_conv(g, x, ggml_mul(g, a, al), ggml_mul(g, b, al), inv, w, scales, c.w(conv + ".bias"), residual,
                           dilation);
}

ggml_tensor * kokoro_voice::snake_res_block(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k,
                                            const std::string & pre, int kernel) const {
    for (int i = 0; i < 3; ++i) {
        const std::string n  = std::to_string(i);
        const int         d  = hp_.res_dilations[i];
        const std::string a1 = pre + "adain1." + n + ".fc", a2 = pre + "adain2." + n + ".fc";
        const std::string s1 = pre + "alpha1." + n, s2 = pre + "alpha2." + n;
        const std::string c1 = pre + "convs1." + n, c2 = pre + "convs2." + n;
        ggml_tensor *     y = adain_snake_conv_cpu(c, g, x, k, a1, s1, c1, d, nullptr);
        if (y) {
            x = adain_snake_conv_cpu(c, g, y, k, a2, s2, c2, 1, x);
            GGML_ASSERT(x);  // the second convolution is the first's shape
            continue;
        }
        if (c.device_graphs) {  // AdaIN and Snake in [T, C] (see adain_tc)
            y = conv1d_tc(c, g, adain_snake_tc(c, g, x, k, a1, s1), c1 + ".weight", c.w(c1 + ".bias"), d,
                          (kernel * d - d) / 2);
            y = conv1d_tc(c, g, adain_snake_tc(c, g, y, k, a2, s2), c2 + ".weight", c.w(c2 + ".bias"), 1,
                          (kernel - 1) / 2);
        } else {
            y = conv1d(c.graph_opts(), g, adain_snake(c, g, x, k, a1, c.w(s1)), c.w(c1 + ".weight"), c.w(c1 + ".bias"),
                       d, (kernel * d - d) / 2);
            y = conv1d(c.graph_opts(), g, adain_snake(c, g, y, k, a2, c.w(s2)), c.w(c2 + ".weight"), c.w(c2 + ".bias"),
                       1, (kernel - 1) / 2);
        }
        x = ggml_add(g, x, y);
    }
    return x;
}

}  // namespace vs::kokoro
