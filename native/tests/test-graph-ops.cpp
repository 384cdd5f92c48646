// The shared graph builders against direct loops on the CPU backend.
#include <ggml-backend.h>
#include <ggml-cpu.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "graph/graph.h"

namespace {

std::mt19937 rng(42);

std::vector<float> random_vec(size_t n) {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float>                    v(n);
    for (float & x : v) {
        x = d(rng);
    }
    return v;
}

ggml_tensor * input(ggml_context * ctx, const std::vector<float> & data, std::vector<int64_t> ne) {
    ggml_tensor * t = ggml_new_tensor(ctx, GGML_TYPE_F32, (int) ne.size(), ne.data());
    std::copy(data.begin(), data.end(), (float *) t->data);
    return t;
}

// Integer weights (the CPU kernels' int16 packing) as a tensor of shape ne.
ggml_tensor * input_i16(ggml_context * ctx, const std::vector<int16_t> & data, std::vector<int64_t> ne) {
    ggml_tensor * t = ggml_new_tensor(ctx, GGML_TYPE_I16, (int) ne.size(), ne.data());
    std::copy(data.begin(), data.end(), (int16_t *) t->data);
    return t;
}

// The largest magnitude among values.
double peak(const std::vector<float> & values) {
    double top = 0;
    for (float v : values) {
        top = std::max(top, (double) std::fabs(v));
    }
    return top;
}

// Builds a graph on a context with allocated data and computes it on the CPU.
std::vector<float> run(const std::function<ggml_tensor *(ggml_context *)> & build) {
    ggml_init_params ip{ 256u << 20, nullptr, false };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    out = build(ctx);
    ggml_cgraph *    gf  = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_graph_compute(cpu, gf);
    std::vector<float> result((float *) out->data, (float *) out->data + ggml_nelements(out));
    ggml_backend_free(cpu);
    ggml_free(ctx);
    return result;
}

int failures = 0;

void expect_close(const char * what, const std::vector<float> & got, const std::vector<float> & want,
                  double tolerance = 1e-4) {
    double worst = got.size() == want.size() ? 0.0 : INFINITY;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        worst = std::max(worst, (double) std::fabs(got[i] - want[i]));
    }
    bool ok = worst < tolerance;
    printf("%-28s %s (max |diff| %.2e, %zu values)\n", what, ok ? "ok" : "FAILED", worst, want.size());
    failures += ok ? 0 : 1;
}

// conv1d by direct loops: output frame t sums w [IC, K, OC] times x [IC, T] at frames
// t + k * dilation + offset (zero outside x), plus the bias.
std::vector<float> reference_conv1d(const std::vector<float> & x, const std::vector<float> & w,
                                    const std::vector<float> & b, int IC, int OC, int K, int T, int T_out, int dilation,
                                    int offset) {
    std::vector<float> want(OC * T_out);
    for (int t = 0; t < T_out; ++t) {
        for (int o = 0; o < OC; ++o) {
            double acc = b[o];
            for (int i = 0; i < IC; ++i) {
                for (int k = 0; k < K; ++k) {
                    int src = t + k * dilation + offset;
                    if (src >= 0 && src < T) {
                        acc += w[(o * K + k) * IC + i] * x[src * IC + i];  // first index fastest
                    }
                }
            }
            want[t * OC + o] = (float) acc;
        }
    }
    return want;
}

// Weights as stored in F16: `w` is rounded in place so the reference sees the same values.
ggml_tensor * f16_weights(ggml_context * ctx, std::vector<float> & w, int IC, int K, int OC) {
    for (float & v : w) {
        v = ggml_fp16_to_fp32(ggml_fp32_to_fp16(v));
    }
    ggml_tensor * w16 = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, IC, K, OC);
    ggml_fp32_to_fp16_row(w.data(), (ggml_fp16_t *) w16->data, ggml_nelements(w16));
    return w16;
}

// F16 weights take the folded (one mul_mat) path; F32 the per-tap one.
// As built for a GPU, F16 weights go through conv1d_phases: phases_ct from x [C, T]
// (conv1d_phases_ct, undilated), time_along_ne0 from [T, C] (as Kokoro's GPU graphs pass it).
enum class layout { plain, phases_ct, time_along_ne0 };

// The device the tests' graphs are built for: the CPU's, then a GPU's (main).
vs::graph_options g_opts;

// With pad_ic, conv1d_phases reads weights of IC + pad_ic input channels, the extra ones
// zero (as channel_padded_weight makes them); with fine, its columns by eight steps an octave.
void test_conv1d(int IC, int OC, int K, int T, int dilation, int pad, ggml_type wtype = GGML_TYPE_F32,
                 layout how = layout::plain, int pad_ic = 0, bool fine = false) {
    auto      x = random_vec(IC * T), w = random_vec(OC * IC * K), b = random_vec(OC);
    const int T_out = T + 2 * pad - dilation * (K - 1);
    auto      got   = run([&](ggml_context * ctx) {
        ggml_tensor * wt = wtype == GGML_TYPE_F16 ? f16_weights(ctx, w, IC, K, OC) : input(ctx, w, { IC, K, OC });
        ggml_tensor * xt = input(ctx, x, { IC, T });
        if (pad_ic > 0) {  // rows of IC + pad_ic values, the last pad_ic zero
            ggml_tensor * wp = ggml_new_tensor_3d(ctx, wt->type, IC + pad_ic, K, OC);
            const size_t  es = ggml_element_size(wt);
            std::memset(wp->data, 0, ggml_nbytes(wp));  // zero in F16 as in F32
            for (int r = 0; r < K * OC; ++r) {
                std::memcpy((char *) wp->data + r * (IC + pad_ic) * es, (const char *) wt->data + r * IC * es, IC * es);
            }
            wt = wp;
        }
        if (how == layout::time_along_ne0) {
            return vs::conv1d_phases(ctx, ggml_cont(ctx, ggml_transpose(ctx, xt)), pad, T_out, wt,
                                            input(ctx, b, { OC }), dilation, fine);
        }
        if (how == layout::phases_ct) {
            return vs::conv1d_phases_ct(ctx, xt, pad, T_out, wt, input(ctx, b, { OC }), fine);
        }
        return vs::conv1d(g_opts, ctx, xt, wt, input(ctx, b, { OC }), dilation, pad);
    });
    char      name[96];
    snprintf(name, sizeof name, "conv1d %s k%d d%d p%d T%d%s%s%s", ggml_type_name(wtype), K, dilation, pad, T,
             how == layout::time_along_ne0 ? " [T, C]"
             : how == layout::phases_ct    ? " phases"
                                           : "",
             pad_ic > 0 ? " channels padded" : "", fine ? " fine columns" : "");
    // F16 weights: the input is rounded to F16 as well.
    expect_close(name, got, reference_conv1d(x, w, b, IC, OC, K, T, T_out, dilation, -pad),
                 wtype == GGML_TYPE_F16 ? 2e-2 : 1e-4);
}

// conv1d_window reading a longer, already padded input from frame `start` (Piper's tiles),
// F16 weights.
void test_conv1d_window(int IC, int OC, int K, int T_out, int dilation, int start) {
    const int T = start + (int) vs::conv1d_frames_needed(T_out, K, dilation) + 5;
    auto      x = random_vec(IC * T), w = random_vec(OC * IC * K), b = random_vec(OC);
    auto      got = run([&](ggml_context * ctx) {
        return vs::conv1d_window(g_opts, ctx, input(ctx, x, { IC, T }), start, T_out, f16_weights(ctx, w, IC, K, OC),
                                      input(ctx, b, { OC }), dilation);
    });
    char      name[64];
    snprintf(name, sizeof name, "conv1d_window k%d d%d from %d", K, dilation, start);
    expect_close(name, got, reference_conv1d(x, w, b, IC, OC, K, T, T_out, dilation, start), 2e-2);
}

void test_depthwise(int C, int K, int T, int dilation) {
    const int          pad = (K * dilation - dilation) / 2;
    auto               x = random_vec(C * T), w = random_vec(C * K), b = random_vec(C);  // w: [C, K] with C fastest
    std::vector<float> want(C * T);
    for (int t = 0; t < T; ++t) {
        for (int c = 0; c < C; ++c) {
            double acc = b[c];
            for (int k = 0; k < K; ++k) {
                int src = t + k * dilation - pad;
                if (src >= 0 && src < T) {
                    acc += w[k * C + c] * x[src * C + c];
                }
            }
            want[t * C + c] = (float) acc;
        }
    }
    auto got = run([&](ggml_context * ctx) {
        return vs::conv1d_depthwise(ctx, input(ctx, x, { C, T }), input(ctx, w, { C, K }), input(ctx, b, { C }),
                                    dilation, pad);
    });
    expect_close("depthwise conv1d", got, want);
}

void test_conv_transpose(int IC, int OC, int stride, int T, int zeros_before = 0, int zeros_after = 0) {
    const int K = 2 * stride, pad = (K - stride) / 2;
    auto      x = random_vec(IC * T), w = random_vec(IC * OC * K), b = random_vec(OC);  // w: PyTorch [IC, OC, K]
    const int full = (T - 1) * stride + K, T_out = full - 2 * pad;
    std::vector<double> acc((size_t) OC * full, 0.0);
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < IC; ++i) {
            for (int o = 0; o < OC; ++o) {
                for (int k = 0; k < K; ++k) {
                    acc[(size_t) (t * stride + k) * OC + o] += w[(i * OC + o) * K + k] * x[t * IC + i];
                }
            }
        }
    }
    std::vector<float> want(OC * (zeros_before + T_out + zeros_after), 0.0f);
    for (int t = 0; t < T_out; ++t) {
        for (int o = 0; o < OC; ++o) {
            want[(zeros_before + t) * OC + o] = (float) acc[(size_t) (t + pad) * OC + o] + b[o];
        }
    }
    // The converter stores the weight as ggml [IC, OC, K] (PyTorch [K, OC, IC]).
    std::vector<float> wt(IC * OC * K);
    for (int i = 0; i < IC; ++i) {
        for (int o = 0; o < OC; ++o) {
            for (int k = 0; k < K; ++k) {
                wt[(k * OC + o) * IC + i] = w[(i * OC + o) * K + k];
            }
        }
    }
    auto got = run([&](ggml_context * ctx) {
        return vs::conv_transpose1d(ctx, input(ctx, x, { IC, T }), input(ctx, wt, { IC, OC, K }), input(ctx, b, { OC }),
                                    stride, pad, zeros_before, zeros_after);
    });
    char name[64];
    snprintf(name, sizeof name, "conv_transpose1d s%d z%d,%d", stride, zeros_before, zeros_after);
    expect_close(name, got, want);
    // The engine's CPU fold of the same taps (src/cpu/): the matmul's columns folded, the bias
    // added and the margins zeroed in one op.
    auto folded = run([&](ggml_context * ctx) {
        ggml_tensor * cols =
            ggml_mul_mat(ctx, input(ctx, wt, { IC, OC * K }), vs::pad_time(ctx, input(ctx, x, { IC, T }), 1, 1));
        return vs::cpu::transpose_fold(ctx, cols, input(ctx, b, { OC }), stride, pad, T_out, zeros_before, zeros_after);
    });
    snprintf(name, sizeof name, "  transpose_fold s%d z%d,%d", stride, zeros_before, zeros_after);
    expect_close(name, folded, want);
}

// HiFi-GAN's output head (src/cpu/) against direct loops: tanh of a convolution of
// LeakyReLU(x, 0.01) to one channel, from frame `first` of x.
void test_conv_head(int C, int K, int T, int first) {
    const int          L = first + T + K - 1 + 3;
    std::vector<float> x = random_vec((size_t) C * L), w = random_vec((size_t) C * K), want(T);
    for (int t = 0; t < T; ++t) {
        double acc = 0;
        for (int k = 0; k < K; ++k) {
            for (int c = 0; c < C; ++c) {
                const float v = x[(size_t) (first + t + k) * C + c];
                acc += (double) w[(size_t) k * C + c] * (v < 0 ? 0.01 * v : v);
            }
        }
        want[t] = (float) std::tanh(acc);
    }
    auto got = run([&](ggml_context * ctx) {
        return vs::cpu::conv_head(ctx, input(ctx, x, { C, L }), input(ctx, w, { C, K, 1 }), first, T, 0.01f);
    });
    char name[64];
    snprintf(name, sizeof name, "conv_head C%d K%d", C, K);
    expect_close(name, got, want);
}

// step_above_zero on every device ggml finds (the CPU in CI): 0 at -1, -0, +0, 1 at a tiny
// positive value and at 1. ggml's own step is printed, not asked: its Vulkan shader gives 1
// at zero, where the CPU and CUDA give 0.
void test_step_on_every_device() {
    const std::vector<float> x    = { -1.0f, -0.0f, 0.0f, 1e-30f, 1.0f };
    const std::vector<float> want = { 0.0f, 0.0f, 0.0f, 1.0f, 1.0f };
    ggml_backend_load_all();
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev     = ggml_backend_dev_get(i);
        ggml_backend_t     backend = ggml_backend_dev_init(dev, nullptr);
        if (!backend) {
            continue;
        }
        ggml_init_params ip{ ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true };
        ggml_context *   ctx    = ggml_init(ip);
        ggml_tensor *    in     = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, (int64_t) x.size());
        ggml_tensor *    strict = vs::step_above_zero(ctx, in);
        ggml_tensor *    plain  = ggml_step(ctx, in);
        ggml_cgraph *    gf     = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, strict);
        ggml_build_forward_expand(gf, plain);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
        ggml_backend_tensor_set(in, x.data(), 0, ggml_nbytes(in));
        ggml_backend_graph_compute(backend, gf);
        std::vector<float> got(x.size()), step(x.size());
        ggml_backend_tensor_get(strict, got.data(), 0, ggml_nbytes(strict));
        ggml_backend_tensor_get(plain, step.data(), 0, ggml_nbytes(plain));
        char name[96];
        snprintf(name, sizeof name, "step_above_zero on %s", ggml_backend_dev_name(dev));
        expect_close(name, got, want, 1e-6);
        printf("  (ggml's step there is x %s 0)\n", step[1] == 1.0f && step[2] == 1.0f ? ">=" : ">");
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
        ggml_backend_free(backend);
    }
}

// A batch's columns waste at most an eighth; a sentence's stay powers of two (the prewarm's).
void test_phase_columns() {
    const int64_t n[] = { 1, 3, 16, 17, 67, 129, 534, 1042, 2081, 4096, 4097 };
    bool          ok  = true;
    for (int64_t v : n) {
        const int64_t pow2 = vs::phase_columns(v), fine = vs::phase_columns(v, true);
        ok = ok && pow2 >= v && (pow2 & (pow2 - 1)) == 0 && pow2 < 2 * v + 1;
        ok = ok && fine >= v && fine <= pow2 && (v <= 16 || fine <= v + v / 8 + 1);
    }
    ok = ok && vs::phase_columns(1042, true) == 1152 && vs::phase_columns(1042) == 2048;
    printf("%s phase_columns: powers of two, and eight steps an octave for a batch\n", ok ? "ok  " : "FAIL");
    failures += ok ? 0 : 1;
}

// The engine's fused residual convolution (src/cpu/) against direct loops: for the frames of
// the window, x + mask * (b + conv(leaky(x))), elsewhere x; through ggml (the graph's threads)
// and with each vector width this CPU runs, one thread and three.
void test_residual_conv(int C, int K, int T, int d, bool with_mask) {
    const int          pad = d * (K - 1) / 2, margin = pad + 3, L = margin + T + pad + 5;
    std::vector<float> x = random_vec((size_t) C * L), w = random_vec((size_t) C * K * C), b = random_vec(C);
    std::vector<float> mask(T);
    for (int t = 0; t < T; ++t) {
        mask[t] = with_mask && t % 7 == 3 ? 0.0f : 1.0f;
    }
    std::vector<float> want(x);
    for (int t = 0; t < T; ++t) {
        for (int o = 0; o < C; ++o) {
            double acc = b[o];
            for (int k = 0; k < K; ++k) {
                const int src = margin + t - pad + k * d;
                for (int i = 0; i < C; ++i) {
                    const float v = x[(size_t) src * C + i];
                    acc += (double) w[(size_t) (o * K + k) * C + i] * (v >= 0 ? v : 0.1f * v);
                }
            }
            want[(size_t) (margin + t) * C + o] += (float) (mask[t] * acc);
        }
    }
    vs::cpu::residual_conv_params p;
    p.begin = margin, p.frames = T, p.pad = pad, p.dilation = d, p.slope = 0.1f;
    std::vector<float> packed((size_t) C * K * C);
    vs::cpu::pack_conv_weight(w.data(), C, K, C, packed.data());  // for the widest vectors
    char what[96];
    auto got = run([&](ggml_context * ctx) {
        return vs::cpu::residual_conv(ctx, input(ctx, x, { C, L }), input(ctx, packed, { C, C, K }), nullptr,
                                      input(ctx, b, { C }), with_mask ? input(ctx, mask, { 1, T }) : nullptr, p);
    });
    snprintf(what, sizeof what, "residual_conv C%d K%d d%d%s", C, K, d, with_mask ? " mask" : "");
    expect_close(what, got, want, 1e-3);
    for (int width : { 4, 8, 16 }) {
        if (width > vs::cpu::vector_floats() || C % (2 * width) != 0) {
            continue;
        }
        vs::cpu::pack_conv_weight(w.data(), C, K, C, packed.data(), 2 * width);
        vs::cpu::packed_weight pw;
        pw.f32 = packed.data();
        for (int nth : { 1, 3 }) {
            std::vector<float> out(x.size(), NAN);
            for (int ith = 0; ith < nth; ++ith) {
                vs::cpu::residual_conv_run(x.data(), C, L, pw, K, b.data(), with_mask ? mask.data() : nullptr,
                                           out.data(), p, ith, nth, width);
            }
            snprintf(what, sizeof what, "  %d floats, %d thread%s", width, nth, nth > 1 ? "s" : "");
            expect_close(what, out, want, 1e-3);
        }
    }
    if (!vs::cpu::int16_convs()) {
        return;
    }
    // In 16-bit integers: within the quantization's error (as for the Snake convolution) of the
    // largest convolution output.
    double top = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        top = std::max(top, (double) std::fabs(want[i] - x[i]));
    }
    std::vector<int16_t> q((size_t) C * K * C);
    std::vector<float>   ws(C);
    vs::cpu::pack_conv_weight_int16(w.data(), C, K, C, q.data(), ws.data());
    got = run([&](ggml_context * ctx) {
        return vs::cpu::residual_conv(ctx, input(ctx, x, { C, L }), input_i16(ctx, q, { C, C, K }),
                                      input(ctx, ws, { C }), input(ctx, b, { C }),
                                      with_mask ? input(ctx, mask, { 1, T }) : nullptr, p);
    });
    snprintf(what, sizeof what, "  int16 op (of %.0f)", top);
    expect_close(what, got, want, 2e-3 * top);
    for (int width : { 8, 16 }) {
        if (width > vs::cpu::vector_floats() || C % (2 * width) != 0) {
            continue;
        }
        vs::cpu::pack_conv_weight_int16(w.data(), C, K, C, q.data(), ws.data(), 2 * width);
        vs::cpu::packed_weight pw;
        pw.int16  = q.data();
        pw.scales = ws.data();
        std::vector<float> out(x.size(), NAN);
        for (int ith = 0; ith < 3; ++ith) {
            vs::cpu::residual_conv_run(x.data(), C, L, pw, K, b.data(), with_mask ? mask.data() : nullptr, out.data(),
                                       p, ith, 3, width);
        }
        snprintf(what, sizeof what, "  int16, %d lanes, 3 threads", width);
        expect_close(what, out, want, 2e-3 * top);
    }
}

// The Snake-activated convolution in 16-bit integers against the same direct loops: within the
// quantization's error of the largest output (its activations to about 14 bits of each tile's
// largest, its weights to about 12 of each output channel's), at each vector width that has it,
// through the op and on plain arrays over 3 threads.
void test_snake_conv_int16(const std::vector<float> & x, const std::vector<float> & scale,
                           const std::vector<float> & shift, const std::vector<float> & inv,
                           const std::vector<float> & w, const std::vector<float> & b, const float * res, int C, int OC,
                           int K, int T, int d, const std::vector<float> & want) {
    if (!vs::cpu::int16_convs()) {
        printf("  int16: not on this CPU's kernels\n");
        return;
    }
    const double         top = peak(want), tolerance = 2e-3 * top;
    std::vector<int16_t> q((size_t) C * K * OC);
    std::vector<float>   ws(OC);
    vs::cpu::pack_conv_weight_int16(w.data(), C, K, OC, q.data(), ws.data());
    char what[96];
    auto got = run([&](ggml_context * ctx) {
        return vs::cpu::snake_conv(
            ctx, input(ctx, x, { C, T }), input(ctx, scale, { C }), input(ctx, shift, { C }), input(ctx, inv, { C }),
            input_i16(ctx, q, { OC, C, K }), input(ctx, ws, { OC }), input(ctx, b, { OC }),
            res ? input(ctx, std::vector<float>(res, res + (size_t) OC * T), { OC, T }) : nullptr, d);
    });
    snprintf(what, sizeof what, "  int16 op (of %.0f)", top);
    expect_close(what, got, want, tolerance);
    for (int width : { 8, 16 }) {
        if (width > vs::cpu::vector_floats() || C % width != 0 || OC % (2 * width) != 0) {
            continue;
        }
        vs::cpu::pack_conv_weight_int16(w.data(), C, K, OC, q.data(), ws.data(), 2 * width);
        vs::cpu::packed_weight pw;
        pw.int16  = q.data();
        pw.scales = ws.data();
        std::vector<float> out(want.size(), NAN);
        for (int ith = 0; ith < 3; ++ith) {
            vs::cpu::snake_conv_run(x.data(), C, T, scale.data(), shift.data(), inv.data(), pw, K, OC, b.data(), res,
                                    out.data(), d, ith, 3, width);
        }
        snprintf(what, sizeof what, "  int16, %d lanes, 3 threads", width);
        expect_close(what, out, want, tolerance);
    }
}

// Kokoro's Snake-activated convolution (src/cpu/) against direct loops: "same" zero padding of
// the activated input, bias and an optional residual, with AdaIN's per-channel affine folded
// into the Snake's argument; inputs that reach well past sin's first periods.
// largest: every activation and weight the same, so that the integer kernels' sums reach their
// bound (a sum over more pairs than int16_flush_pairs would overflow).
void test_snake_conv(int C, int OC, int K, int T, int d, bool with_residual, bool largest = false) {
    const int          pad = d * (K - 1) / 2;
    std::vector<float> x = random_vec((size_t) C * T), w = random_vec((size_t) C * K * OC), b = random_vec(OC);
    std::vector<float> scale = random_vec(C), shift = random_vec(C), inv(C), res = random_vec((size_t) OC * T);
    for (int c = 0; c < C; ++c) {
        scale[c] *= 40.0f;
        inv[c] = 1.0f / (0.2f + std::fabs(scale[c]) / 40.0f);
    }
    if (largest) {
        std::fill(w.begin(), w.end(), 1.0f);
        std::fill(scale.begin(), scale.end(), 0.0f);
        std::fill(shift.begin(), shift.end(), 1.0f);
        std::fill(inv.begin(), inv.end(), 1.0f);
    }
    std::vector<double> act((size_t) C * T);
    for (size_t i = 0; i < act.size(); ++i) {
        const int    c = (int) (i % C);
        const double u = (double) x[i] * scale[c] + shift[c];
        act[i]         = (u + std::sin(u) * std::sin(u)) * inv[c];
    }
    std::vector<float> want((size_t) OC * T);
    for (int t = 0; t < T; ++t) {
        for (int o = 0; o < OC; ++o) {
            double acc = b[o] + (with_residual ? res[(size_t) t * OC + o] : 0.0);
            for (int k = 0; k < K; ++k) {
                const int src = t - pad + k * d;
                if (src < 0 || src >= T) {
                    continue;
                }
                for (int i = 0; i < C; ++i) {
                    acc += (double) w[(size_t) (o * K + k) * C + i] * act[(size_t) src * C + i];
                }
            }
            want[(size_t) t * OC + o] = (float) acc;
        }
    }
    // Float rounding over C * K terms, growing as its square root, of the largest output.
    const double       tolerance = 4e-7 * peak(want) * std::sqrt((double) C * K);
    std::vector<float> packed((size_t) C * K * OC);
    vs::cpu::pack_conv_weight(w.data(), C, K, OC, packed.data());
    char what[96];
    auto got = run([&](ggml_context * ctx) {
        return vs::cpu::snake_conv(ctx, input(ctx, x, { C, T }), input(ctx, scale, { C }), input(ctx, shift, { C }),
                                   input(ctx, inv, { C }), input(ctx, packed, { OC, C, K }), nullptr,
                                   input(ctx, b, { OC }), with_residual ? input(ctx, res, { OC, T }) : nullptr, d);
    });
    snprintf(what, sizeof what, "snake_conv C%d OC%d K%d d%d%s%s", C, OC, K, d, with_residual ? " residual" : "",
             largest ? " largest" : "");
    expect_close(what, got, want, tolerance);
    for (int width : { 4, 8, 16 }) {
        if (width > vs::cpu::vector_floats() || C % width != 0 || OC % (2 * width) != 0) {
            continue;
        }
        vs::cpu::pack_conv_weight(w.data(), C, K, OC, packed.data(), 2 * width);
        std::vector<float>     out(want.size(), NAN);
        vs::cpu::packed_weight pw;
        pw.f32 = packed.data();
        for (int ith = 0; ith < 3; ++ith) {
            vs::cpu::snake_conv_run(x.data(), C, T, scale.data(), shift.data(), inv.data(), pw, K, OC, b.data(),
                                    with_residual ? res.data() : nullptr, out.data(), d, ith, 3, width);
        }
        snprintf(what, sizeof what, "  %d floats, 3 threads", width);
        expect_close(what, out, want, tolerance);
    }
    test_snake_conv_int16(x, scale, shift, inv, w, b, with_residual ? res.data() : nullptr, C, OC, K, T, d, want);
}

// Each channel's mean and variance (src/cpu/) against double-precision loops, on a signal
// whose means dwarf its spread in some channels (AdaIN's case for two passes).
void test_channel_stats(int C, int T) {
    std::vector<float> x = random_vec((size_t) C * T);
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = x[i] * 0.1f + (i % C % 3 == 0 ? 10.0f : 0.0f);
    }
    std::vector<float> want((size_t) 2 * C);
    for (int c = 0; c < C; ++c) {
        double sum = 0, dev = 0;
        for (int t = 0; t < T; ++t) {
            sum += x[(size_t) t * C + c];
        }
        for (int t = 0; t < T; ++t) {
            dev += std::pow(x[(size_t) t * C + c] - sum / T, 2);
        }
        want[c]     = (float) (sum / T);
        want[C + c] = (float) (dev / T);
    }
    auto got = run([&](ggml_context * ctx) { return vs::cpu::channel_stats(ctx, input(ctx, x, { C, T })); });
    char what[64];
    snprintf(what, sizeof what, "channel_stats C%d T%d", C, T);
    double worst = 0;  // relative to each value
    for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] - want[i]) / std::max(1e-6, (double) std::fabs(want[i])));
    }
    const bool ok = got.size() == want.size() && worst < 2e-4;
    printf("%-28s %s (max relative diff %.2e)\n", what, ok ? "ok" : "FAILED", worst);
    failures += ok ? 0 : 1;
}

// A plain convolution in the CPU kernel (src/cpu/: WaveNet's) against direct loops, "same"
// padding, at each vector width.
void test_plain_conv(int IC, int OC, int K, int T, int d) {
    std::vector<float> x = random_vec((size_t) IC * T), w = random_vec((size_t) IC * K * OC), b = random_vec(OC);
    const auto         want = reference_conv1d(x, w, b, IC, OC, K, T, T, d, -d * (K - 1) / 2);
    std::vector<float> packed((size_t) IC * K * OC);
    vs::cpu::pack_conv_weight(w.data(), IC, K, OC, packed.data());
    char what[64];
    auto got = run([&](ggml_context * ctx) {
        return vs::cpu::conv(ctx, input(ctx, x, { IC, T }), input(ctx, packed, { OC, IC, K }), input(ctx, b, { OC }),
                             d);
    });
    snprintf(what, sizeof what, "conv IC%d OC%d K%d d%d", IC, OC, K, d);
    expect_close(what, got, want);
    for (int width : { 4, 8, 16 }) {
        if (width > vs::cpu::vector_floats() || OC % (2 * width) != 0) {
            continue;
        }
        vs::cpu::pack_conv_weight(w.data(), IC, K, OC, packed.data(), 2 * width);
        std::vector<float> out(want.size(), NAN);
        for (int ith = 0; ith < 3; ++ith) {
            vs::cpu::conv_run(x.data(), IC, T, packed.data(), K, OC, b.data(), out.data(), d, ith, 3, width);
        }
        snprintf(what, sizeof what, "  %d floats, 3 threads", width);
        expect_close(what, out, want);
    }
}

// WaveNet's gate (src/cpu/) against the C library's tanh and exp, over a range that
// reaches where the sigmoid and tanh saturate: through ggml, and at each vector width.
void test_gate(int H, int T) {
    std::vector<float> x = random_vec((size_t) 2 * H * T);
    for (float & v : x) {
        v *= 12.0f;
    }
    std::vector<float> want((size_t) H * T);
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
            const double a = x[(size_t) t * 2 * H + h], b = x[(size_t) t * 2 * H + H + h];
            want[(size_t) t * H + h] = (float) (std::tanh(a) / (1.0 + std::exp(-b)));
        }
    }
    char what[96];
    auto got = run([&](ggml_context * ctx) { return vs::cpu::gate(ctx, input(ctx, x, { 2 * H, T })); });
    snprintf(what, sizeof what, "gate H%d T%d", H, T);
    expect_close(what, got, want, 1e-6);
    for (int width : { 4, 8, 16 }) {
        if (width > vs::cpu::vector_floats()) {
            continue;
        }
        std::vector<float> out(want.size(), NAN);
        for (int ith = 0; ith < 3; ++ith) {
            vs::cpu::gate_run(x.data(), H, T, out.data(), ith, 3, width);
        }
        snprintf(what, sizeof what, "  %d floats, 3 threads", width);
        expect_close(what, out, want, 1e-6);
    }
}

// The elementwise activations (src/cpu/) against the C library's functions in doubles, through
// ggml and at each vector width, over +-20 (GELU's erf within 1.5e-7, so within |x| 1e-7 or an
// ulp of x; Mish through its saturation), and a tail shorter than a vector.
void test_unary(vs::cpu::unary_op op, int n) {
    std::vector<float> x = random_vec((size_t) n);
    for (float & v : x) {
        v *= 20.0f;
    }
    const bool         gelu = op == vs::cpu::unary_op::gelu_erf;
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i];
        want[i] = (float) (gelu ? 0.5 * v * std::erfc(-v / std::sqrt(2.0)) : v * std::tanh(std::log1p(std::exp(v))));
    }
    char what[96];
    auto got = run([&](ggml_context * ctx) { return vs::cpu::unary(ctx, input(ctx, x, { n }), op); });
    snprintf(what, sizeof what, "%s n%d", gelu ? "gelu_erf" : "mish", n);
    expect_close(what, got, want, 4e-6);
    for (int width : { 4, 8, 16 }) {
        if (width > vs::cpu::vector_floats()) {
            continue;
        }
        std::vector<float> out(want.size(), NAN);
        for (int ith = 0; ith < 3; ++ith) {
            vs::cpu::unary_run(op, x.data(), n, out.data(), ith, 3, width);
        }
        snprintf(what, sizeof what, "  %d floats, 3 threads", width);
        expect_close(what, out, want, 4e-6);
    }
}

// Self-attention over whole sequences (src/cpu/) against softmax(scale q k^T) v in doubles, per
// head and sequence, through ggml and at each vector width whose vectors a head's features fill.
void test_attention(int C, int n_head, int T, int n_seq) {
    const int          L = T * n_seq, d = C / n_head;
    const float        scale = 1.0f / std::sqrt((float) d);
    std::vector<float> q = random_vec((size_t) C * L), k = random_vec((size_t) C * L), v = random_vec((size_t) C * L);
    for (float & x : q) {
        x *= 3.0f;  // scores of a few units: a softmax far from uniform
    }
    std::vector<float> want((size_t) C * L);
    for (int s = 0; s < n_seq; ++s) {
        for (int h = 0; h < n_head; ++h) {
            for (int i = 0; i < T; ++i) {
                std::vector<double> w((size_t) T);
                double              top = -INFINITY, sum = 0.0;
                for (int t = 0; t < T; ++t) {
                    double dot = 0.0;
                    for (int j = 0; j < d; ++j) {
                        dot +=
                            (double) q[(size_t) (s * T + i) * C + h * d + j] * k[(size_t) (s * T + t) * C + h * d + j];
                    }
                    w[(size_t) t] = dot * scale;
                    top           = std::max(top, w[(size_t) t]);
                }
                for (double & x : w) {
                    x = std::exp(x - top);
                    sum += x;
                }
                for (int j = 0; j < d; ++j) {
                    double o = 0.0;
                    for (int t = 0; t < T; ++t) {
                        o += w[(size_t) t] * v[(size_t) (s * T + t) * C + h * d + j];
                    }
                    want[(size_t) (s * T + i) * C + h * d + j] = (float) (o / sum);
                }
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attention C%d h%d T%d x%d", C, n_head, T, n_seq);
    if (vs::cpu::attention_fits(d)) {
        auto got = run([&](ggml_context * ctx) {
            return vs::cpu::attention(ctx, input(ctx, q, { C, L }), input(ctx, k, { C, L }), input(ctx, v, { C, L }),
                                      n_head, scale, n_seq);
        });
        expect_close(what, got, want, 1e-5);
    }
    for (int width : { 4, 8, 16 }) {
        if (width > vs::cpu::vector_floats() || !(d == 2 * width || d == 4 * width || d == 8 * width)) {
            continue;
        }
        std::vector<float> out(want.size(), NAN);
        for (int ith = 0; ith < 3; ++ith) {
            vs::cpu::attention_run(q.data(), k.data(), v.data(), C, d, T, n_seq, scale, out.data(), ith, 3, width);
        }
        snprintf(what, sizeof what, "  %d floats, 3 threads", width);
        expect_close(what, out, want, 1e-5);
    }
}

}  // namespace

int main() {
    test_phase_columns();
    test_step_on_every_device();
    test_conv1d(8, 6, 1, 17, 1, 0);
    test_conv1d(8, 6, 3, 17, 1, 1);
    test_conv1d(5, 7, 5, 23, 6, 12);
    test_conv1d(4, 3, 7, 31, 12, 36);
    test_conv1d(32, 16, 5, 50, 2, 4);
    test_conv1d(16, 8, 3, 64, 3, 3);
    test_conv1d(8, 6, 3, 17, 1, 1, GGML_TYPE_F16);
    test_conv1d(5, 7, 5, 23, 6, 12, GGML_TYPE_F16);
    test_conv1d(32, 16, 5, 50, 2, 4, GGML_TYPE_F16);
    test_conv1d(16, 8, 3, 64, 3, 3, GGML_TYPE_F16);
    test_conv1d(4, 3, 7, 31, 12, 36, GGML_TYPE_F16);
    test_depthwise(6, 3, 19, 1);
    test_depthwise(6, 3, 40, 9);
    test_conv_transpose(8, 5, 8, 9);
    test_conv_transpose(6, 4, 4, 13);
    test_conv_transpose(6, 4, 4, 13, 3, 7);
    // As built for a GPU: F32 weights folded too, the im2col matrix materialized; and
    // conv1d_phases from [T, C] and from [C, T] (outputs a multiple of K * d or not, phases'
    // columns rounded up).
    printf("as built for a GPU:\n");
    g_opts.device_is_cpu = false;
    test_conv1d(8, 6, 3, 17, 1, 1);
    test_conv1d(5, 7, 5, 23, 6, 12);
    test_conv1d(16, 8, 3, 64, 3, 3, GGML_TYPE_F16);
    test_conv1d_window(16, 8, 3, 37, 1, 4);
    test_conv1d_window(16, 8, 5, 41, 3, 7);
    test_conv1d(16, 8, 3, 64, 3, 3, GGML_TYPE_F16, layout::time_along_ne0);
    test_conv1d(8, 6, 3, 16, 1, 1, GGML_TYPE_F16, layout::time_along_ne0);
    test_conv1d(32, 16, 11, 200, 5, 25, GGML_TYPE_F16, layout::time_along_ne0);
    test_conv1d(12, 9, 7, 91, 1, 3, GGML_TYPE_F16, layout::time_along_ne0);
    test_conv1d(12, 9, 7, 90, 3, 9, GGML_TYPE_F16, layout::time_along_ne0);
    test_conv1d(6, 5, 3, 40, 1, 0, GGML_TYPE_F16, layout::time_along_ne0);
    test_conv1d(10, 8, 3, 60, 1, 1, GGML_TYPE_F16, layout::time_along_ne0, 6);         // Kokoro's 1090 -> 1096
    test_conv1d(6, 5, 3, 1601, 1, 1, GGML_TYPE_F16, layout::time_along_ne0, 2, true);  // 534 windows: 576 columns
    test_conv1d(8, 6, 5, 1300, 3, 6, GGML_TYPE_F16, layout::time_along_ne0, 0, true);  // dilated
    test_conv1d(8, 6, 3, 200, 1, 1, GGML_TYPE_F16, layout::time_along_ne0, 0, true);   // 67 windows: 72 columns
    test_conv1d(32, 22, 7, 301, 1, 3, GGML_TYPE_F16, layout::phases_ct);               // conv_post's taps and outputs
    test_conv1d(12, 9, 7, 28, 1, 3, GGML_TYPE_F16, layout::phases_ct);                 // outputs a multiple of K
    test_conv1d(8, 6, 3, 17, 1, 0, GGML_TYPE_F16, layout::phases_ct);                  // no padding
    test_conv1d(10, 8, 3, 60, 1, 1, GGML_TYPE_F16, layout::phases_ct, 6);              // Kokoro's 1090 -> 1096
    test_conv1d(6, 5, 3, 1601, 1, 1, GGML_TYPE_F16, layout::phases_ct, 2, true);       // a batch's columns
    // F32 weights (Kokoro's prosody and text encoder, Piper's F32 installs): the same GEMMs in F32.
    test_conv1d(12, 9, 7, 91, 1, 3, GGML_TYPE_F32, layout::time_along_ne0);
    test_conv1d(16, 8, 3, 64, 3, 3, GGML_TYPE_F32, layout::time_along_ne0);  // dilated
    test_conv1d(8, 6, 3, 200, 1, 1, GGML_TYPE_F32, layout::time_along_ne0, 0, true);
    test_conv1d(12, 9, 7, 28, 1, 3, GGML_TYPE_F32, layout::phases_ct);
    test_conv1d(10, 8, 3, 60, 1, 1, GGML_TYPE_F32, layout::phases_ct, 6);
    test_conv1d(2, 3, 3, 70000, 1, 1, GGML_TYPE_F32, layout::phases_ct, 2);  // more frames than a GPU grid's rows
    g_opts.device_is_cpu = true;
    // The probe that keeps conv1d_phases off devices whose matmul reads its windows wrong.
    ggml_backend_t cpu     = ggml_backend_cpu_init();
    const bool     strided = vs::matmul_reads_batch_strides(cpu);
    ggml_backend_free(cpu);
    printf("%s the CPU's matmul reads strided windows\n", strided ? "ok  " : "FAIL");
    failures += strided ? 0 : 1;
    // The engine's own CPU kernels (src/cpu/), last: their random inputs leave the others' as they were.
    // The engine's CPU kernel of HiFi-GAN's residual stacks: Piper's kernels and dilations.
    test_residual_conv(32, 3, 61, 1, true);
    test_residual_conv(64, 7, 50, 3, false);
    test_residual_conv(32, 11, 100, 5, true);
    test_residual_conv(128, 3, 7, 1, true);  // fewer frames than a block
    // Kokoro's generator: its kernels and dilations, and fewer frames than the padding.
    test_snake_conv(64, 64, 3, 70, 1, false);
    test_snake_conv(32, 64, 7, 53, 3, true);
    test_snake_conv(32, 32, 11, 9, 5, true);
    test_channel_stats(128, 18240);  // AdaIN over Kokoro's longest stage
    test_channel_stats(64, 3);
    test_conv_head(32, 7, 301, 4);                     // Piper's conv_post
    test_conv_head(20, 3, 17, 0);                      // channels that are not whole vectors
    test_plain_conv(24, 64, 5, 41, 2);                 // WaveNet's in_layers
    test_plain_conv(20, 32, 1, 9, 1);                  // its res_skip_layers
    test_gate(192, 37);                                // Piper's flow
    test_gate(20, 5);                                  // channels that are not whole vectors
    test_snake_conv(256, 32, 11, 40, 1, false);        // several flushes of the integer sums per tap
    test_snake_conv(256, 32, 11, 40, 1, false, true);  // those sums at their bound
    test_unary(vs::cpu::unary_op::gelu_erf, 4099);
    test_unary(vs::cpu::unary_op::mish, 4099);
    test_attention(128, 2, 70, 2);  // S3Gen's flow's heads of 64, a guided pair side by side
    test_attention(96, 3, 37, 1);   // heads of 32, fewer keys than a block
    return failures == 0 ? 0 : 1;
}
