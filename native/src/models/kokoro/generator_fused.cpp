// Kokoro-82M's generator on CUDA: its residual stacks in the engine's kernels between ggml graphs.
#include "kokoro.h"

namespace vs::kokoro {

// As run_generator, for the jobs of `group` at once, their residual stacks in the engine's
// CUDA kernels between three graphs: every sentence's source, noise convolutions and first
// upsampling; each later upsampling; the outputs. Where the group has several sentences,
// each stage's kernels take them packed along time (vs::cuda::snake_segments): sentence b's
// frames, then a gap as wide as the stage's widest convolution pads. The first graph reads
// and writes each sentence's frames alone; the later ones run over the packing, its gaps
// zeroed (a mask), and gather the next stage's packing (or cut each sentence's audio) from
// their result. The graphs and the kernels hand activations over in
// the device scratch, laid out once per group:
//   styles   each sentence's style table rows (the AdaINs' affines), `rows` floats apart
//   xs32[i]  stage i's noise branches as the first graph writes them (F32)
//   up32     a stage's upsampled input as a graph writes it (F32)
//   xs[i]    the noise branches as the stacks take them (F16), their residual stack run in place
//   x, r, s  a stage's input (up32 + xs), a stack's copy, and the stacks' sum (F16)
//   out      the stacks' mean, which the next graph reads (F32)
//   segs[i]  stage i's segments: first frame and count each, then each frame's segment
//   work     snake_stack's own
// A sentence alone, where kept graphs are captured, runs at its length's buckets: its stacks
// at gen_bucket's, captured (captures_), and its graphs at its F0 frames rounded up as other
// stages' are (shape_bucket, within the stacks' buckets), kept in shared memory. Its own
// length is a graph input and device memory, the frames past it masked. Every sentence of
// those buckets then runs the same graphs and launches, replayed.
void kokoro_voice::run_generator_fused(vs_context & c, const std::vector<kokoro_job *> & group) const {
    const int                dev      = c.cuda_device;
    const size_t             n_stages = hp_.gen_rates.size(), B = group.size();
    const style_table &      tab      = *style_table_for(c, GEN);
    const std::array<int, 6> dil      = res_dilations();
    const bool               captured = B == 1 && c.tag_runs && c.keep_graphs && !c.profiling;

    // Each stage's packing: sentence b's first frame at[i][b], its frame count T[i][b]; the
    // kernels' frames total[i]. The graphs run F2g[b] F0 frames, Tg[i][b] at stage i: a
    // captured sentence's bucket, else its own.
    std::vector<int64_t>              Cs, total, F2g;
    std::vector<std::vector<int64_t>> at(n_stages), T(n_stages), Tg(n_stages);
    for (size_t i = 0; i < n_stages; ++i) {
        Cs.push_back(c.w(GEN + "noise_convs." + std::to_string(i) + ".bias")->ne[0]);
    }
    if (captured) {  // the graphs' frames rounded as other stages' (shape_bucket), within the stacks'
        const int64_t F2 = (int64_t) group[0]->f0.size();
        F2g.push_back(std::min(gen_bucket(F2, total), shape_bucket(F2)));
    }
    for (size_t b = 0; b < B; ++b) {
        const std::vector<int64_t> Tb = gen_stage_frames((int64_t) group[b]->f0.size());
        if (!captured) {
            F2g.push_back((int64_t) group[b]->f0.size());
        }
        const std::vector<int64_t> Tgb = gen_stage_frames(F2g[b]);
        for (size_t i = 0; i < n_stages; ++i) {
            T[i].push_back(Tb[i]);
            Tg[i].push_back(Tgb[i]);
        }
    }
    for (size_t i = 0; !captured && i < n_stages; ++i) {
        const int widest = std::max(noise_kernel(i), *std::max_element(hp_.res_kernels.begin(), hp_.res_kernels.end()));
        const int64_t gap    = (int64_t) *std::max_element(dil.begin(), dil.end()) * (widest - 1) / 2;
        int64_t       frames = 0;
        for (size_t b = 0; b < B; ++b) {
            at[i].push_back(frames);
            frames += T[i][b] + (B > 1 ? gap : 0);
        }
        total.push_back(frames);
    }
    for (size_t i = 0; captured && i < n_stages; ++i) {
        at[i].push_back(0);
    }

    // The scratch: stage i has C_i channels and total_i frames; its buffers have room for
    // the frames every kernel size's GEMMs write. The stacks' activations are F16 (xs, x, r
    // and s: see snake_stack); the graphs hand them over as F32 (xs32, up32: ggml's
    // conversion to F16 runs a thread an element, ten times slower than the engine's) and
    // take the mean of a stage's stacks as F32 (out).
    constexpr size_t    F16 = sizeof(uint16_t);
    vs::scratch_layout  scratch;
    const int64_t       rows      = tab.w->ne[1];
    const size_t        styles_at = scratch.reserve(sizeof(float) * (size_t) (rows * (int64_t) B));
    std::vector<size_t> xs_at, xs32_at, segs_at;
    size_t              stage_bytes = 0, work_bytes = 0;
    for (size_t i = 0; i < n_stages; ++i) {
        const int64_t C = Cs[i], F = total[i];
        int64_t       frames = vs::cuda::snake_frames(F, noise_kernel(i), dil.data(), 6, (int) B);
        work_bytes = std::max(work_bytes, vs::cuda::snake_scratch_bytes(C, F, noise_kernel(i), dil.data(), 6, (int) B));
        for (int K : hp_.res_kernels) {
            frames     = std::max(frames, vs::cuda::snake_frames(F, K, dil.data(), 6, (int) B));
            work_bytes = std::max(work_bytes, vs::cuda::snake_scratch_bytes(C, F, K, dil.data(), 6, (int) B));
        }
        xs_at.push_back(scratch.reserve(F16 * (size_t) (C * frames)));
        xs32_at.push_back(scratch.reserve(sizeof(float) * (size_t) (C * frames)));
        segs_at.push_back(B > 1 ? scratch.reserve(sizeof(int) * (size_t) (2 * (int64_t) B + F)) : 0);
        stage_bytes = std::max(stage_bytes, F16 * (size_t) (C * frames));
    }
    const size_t x_at = scratch.reserve(stage_bytes), r_at = scratch.reserve(stage_bytes),
                 s_at = scratch.reserve(stage_bytes), out_at = scratch.reserve(2 * stage_bytes),
                 up32_at = scratch.reserve(2 * stage_bytes);
    const size_t work_at = scratch.reserve(work_bytes);
    // A captured sentence's length at each stage (its segment's range), uploaded at once.
    const size_t ranges_at = captured ? scratch.reserve(sizeof(int) * 2 * n_stages) : 0;
    auto * const base      = static_cast<uint8_t *>(c.device_scratch(scratch.bytes));
    auto         ptr       = [&](size_t off) { return reinterpret_cast<float *>(base + off); };
    // Sentence b's frames of a stage's F32 buffer at `off` (the graphs' Tg), as a tensor of graph g.
    auto frames_of = [&](ggml_context * g, size_t off, size_t i, size_t b) {
        return c.scratch_tensor(g, off + sizeof(float) * (size_t) (at[i][b] * Cs[i]), Cs[i], Tg[i][b]);
    };
    // A captured sentence's graphs are kept by its buckets and the memory they read and write.
    auto key = [&](const std::string & what) {
        if (!captured) {
            return std::string();
        }
        std::string k = "generator " + what + " of " + std::to_string(F2g[0]) + " in";
        for (int64_t F : total) {
            k += " " + std::to_string(F);
        }
        return k + " at " + address(base);
    };

    // Graph 0; its results go to the scratch. Its tensors: the style, its ones, the lengths
    // (captured: each sentence's F0 frames and STFT frames), then per sentence its input x
    // (null where the decoder left it on the device), the source's f0, phases, padding's
    // samples and their places (or null), and har.
    const kokoro_job & j0      = *group[0];
    std::string        key0    = key("source");
    const size_t       per_job = 6;
    if (captured && j0.dec_at >= 0) {
        key0 +=
            " reading " + address(static_cast<uint8_t *>(ggml_backend_buffer_get_base(c.handoff.get())) + j0.dec_at);
    }
    vs::stage_graph & sg0 = c.stage_graph(
        VS_STAGE_GENERATOR, key0,
        [&](ggml_context * g0, ggml_cgraph * gf) {
            cond k = make_cond(g0, 1, (int64_t) B);
            use_style_table(c, g0, k, GEN);
            ggml_tensor *              lens = captured ? input_2d(g0, 2, 1, "lengths") : nullptr;
            std::vector<ggml_tensor *> t    = { k.s, k.ones, lens };
            ggml_build_forward_expand(gf, ggml_cpy(g0, k.styles, c.scratch_tensor(g0, styles_at, rows, (int64_t) B)));
            // Each sentence's source and STFT; in a batch, magnitude and phase once over
            // all their frames side by side (har_of: some forty kernels, not forty a sentence).
            std::vector<gen_source> srcs;
            ggml_tensor *           last_noise = nullptr;  // [C, frames]: a batch's, side by side
            std::vector<size_t>     first(B);              // sentence b's first frame there
            for (size_t b = 0; b < B; ++b) {
                srcs.emplace_back(c, model_, g0, F2g[b], captured, B == 1);
            }
            if (B > 1) {
                std::vector<ggml_tensor *> parts;
                for (const gen_source & src : srcs) {
                    parts.push_back(src.frames);
                }
                while (parts.size() > 1) {  // concatenated pairwise: each frame copied log2(B) times
                    std::vector<ggml_tensor *> next;
                    for (size_t i = 0; i < parts.size(); i += 2) {
                        next.push_back(i + 1 < parts.size() ? ggml_concat(g0, parts[i], parts[i + 1], 1) : parts[i]);
                    }
                    parts = std::move(next);
                }
                ggml_tensor * har_all = har_of(g0, parts[0]);  // [22, the sentences' frames]
                ggml_set_output(har_all);
                // The last stage's noise convolution, where it is frame by frame (one tap,
                // Kokoro's), over them all too.
                if (c.w(GEN + "noise_convs." + std::to_string(n_stages - 1) + ".weight")->ne[1] == 1) {
                    last_noise = gen_noise_conv(c, g0, har_all, n_stages - 1);
                }
                for (size_t b = 0; b < B; ++b) {
                    first[b]    = b == 0 ? 0 : first[b - 1] + (size_t) srcs[b - 1].n_frames;
                    srcs[b].har = ggml_view_2d(g0, har_all, har_all->ne[0], srcs[b].n_frames, har_all->nb[1],
                                               first[b] * har_all->nb[1]);
                }
            }
            for (size_t b = 0; b < B; ++b) {
                const kokoro_job & j    = *group[b];
                ggml_tensor *      x_in = j.dec_at >= 0 ? c.handoff_tensor(g0, (size_t) j.dec_at, j.dec.C, F2g[b])
                                                        : input_2d(g0, j.dec.C, F2g[b], "x");
                const gen_source & src  = srcs[b];
                ggml_tensor *      x = x_in, *har = src.har;
                if (captured) {
                    x   = ggml_mul(g0, x, frame_mask(g0, lens, 0, F2g[b]));
                    har = ggml_mul(g0, har, frame_mask(g0, lens, 1, src.n_frames));
                }
                ggml_build_forward_expand(gf, src.har);
                for (size_t i = 0; i < n_stages; ++i) {
                    ggml_tensor * xs = last_noise && i + 1 == n_stages
                                           ? ggml_view_2d(g0, last_noise, last_noise->ne[0], src.n_frames,
                                                          last_noise->nb[1], first[b] * last_noise->nb[1])
                                           : gen_noise_conv(c, g0, har, i);
                    GGML_ASSERT(xs->ne[0] == Cs[i] && xs->ne[1] == Tg[i][b]);
                    ggml_build_forward_expand(gf, ggml_cpy(g0, xs, frames_of(g0, xs32_at[i], i, b)));
                }
                ggml_tensor * up = gen_upsample(c, g0, x, 0);
                GGML_ASSERT(up->ne[0] == Cs[0] && up->ne[1] == Tg[0][b]);
                ggml_build_forward_expand(gf, ggml_cpy(g0, up, frames_of(g0, up32_at, 0, b)));
                t.insert(t.end(),
                         { j.dec_at >= 0 ? nullptr : x_in, src.fi, src.cyc, src.edges, src.edges_at, src.har });
            }
            return t;
        },
        4096 * B, true);
    std::vector<float> styles;
    for (size_t b = 0; b < B; ++b) {
        const kokoro_job &   j = *group[b];
        ggml_tensor ** const t = sg0.t.data() + 3 + per_job * b;
        if (t[0]) {
            std::vector<float> xv(j.dec.v);
            xv.resize((size_t) (j.dec.C * F2g[b]), 0.0f);
            set_input(c, t[0], xv.data());
        }
        gen_source src;
        src.fi = t[1], src.cyc = t[2], src.edges = t[3], src.edges_at = t[4], src.F2 = F2g[b];
        src.fill(c, j.f0, (float) hp_.sample_rate);
        styles.insert(styles.end(), j.style.begin(), j.style.begin() + STYLE_DIM);  // the acoustic half
    }
    fill_cond(c, sg0.t[0], sg0.t[1], styles.data());
    if (captured) {
        const float lens[2] = { (float) j0.f0.size(), (float) T.back()[0] };
        set_input(c, sg0.t[2], lens);
    }
    c.compute(sg0);
    // The named intermediate is a batch's last sentence's, read back only if asked for.
    if (ggml_tensor * har = sg0.t[3 + per_job * (B - 1) + 5]; in_device_memory(c, har)) {
        c.keep_output_on_device("har", har->data, T.back()[B - 1], har->ne[0]);
        group.back()->har_kept = true;
    } else {
        group.back()->har = read_frames(har, T.back()[B - 1]);
    }

    // Each stage's segments, for the kernels: a batch's, or a captured sentence's length.
    std::vector<vs::cuda::snake_segments> segs(n_stages);
    if (captured) {
        std::vector<int> ranges;
        for (size_t i = 0; i < n_stages; ++i) {
            ranges.insert(ranges.end(), { 0, (int) T[i][0] });
            segs[i] = { 1, reinterpret_cast<const int *>(base + ranges_at) + 2 * i, nullptr, rows };
        }
        vs::cuda::upload(dev, base + ranges_at, ranges.data(), sizeof(int) * ranges.size());
    }
    if (captured && captures_base_ != base) {
        captures_.clear();
        captures_base_ = base;
    }
    for (size_t i = 0; B > 1 && i < n_stages; ++i) {
        std::vector<int> v(2 * B + (size_t) total[i], -1);
        for (size_t b = 0; b < B; ++b) {
            v[2 * b]     = (int) at[i][b];
            v[2 * b + 1] = (int) T[i][b];
            std::fill_n(v.begin() + (std::ptrdiff_t) (2 * B + (size_t) at[i][b]), T[i][b], (int) b);
        }
        vs::cuda::upload(dev, base + segs_at[i], v.data(), sizeof(int) * v.size());
        const int * d = reinterpret_cast<const int *>(base + segs_at[i]);
        segs[i]       = { (int) B, d, d + 2 * B, rows };
    }

    // A residual block's six convolutions with their AdaINs' affines from the table.
    auto convs = [&](const std::string & pre, int64_t C) {
        std::array<vs::cuda::snake_conv, 6> cv;
        for (int n = 0; n < 3; ++n) {
            for (int h = 0; h < 2; ++h) {
                const std::string      sfx  = std::to_string(h + 1) + "." + std::to_string(n);
                const std::string      conv = pre + "convs" + sfx;
                vs::cuda::snake_conv & v    = cv[(size_t) (2 * n + h)];
                const int64_t          off  = tab.offset.at(pre + "adain" + sfx + ".fc");
                v.scale                     = ptr(styles_at) + off;
                v.shift                     = ptr(styles_at) + off + C;
                v.alpha                     = static_cast<const float *>(c.w(pre + "alpha" + sfx)->data);
                v.w                         = c.w(conv + ".weight")->data;
                v.bias                      = static_cast<const float *>(c.w(conv + ".bias")->data);
                v.dilation                  = dil[2 * n + h];
            }
        }
        return cv;
    };
    auto stack = [&](size_t x, const std::string & pre, size_t i, int K) {
        const auto cv = convs(pre, Cs[i]);
        vs::cuda::snake_stack(dev, c.blas(), base + x, Cs[i], total[i], K, cv.data(), 3, ptr(work_at), segs[i]);
    };

    const size_t n_res = hp_.res_kernels.size();
    for (size_t i = 0;; ++i) {
        const int64_t n  = Cs[i] * total[i];
        const auto    t0 = std::chrono::steady_clock::now();
        // x = upsampled + noise branch; then the mean of the residual stacks over x: the
        // first in s, the middle ones in r, the last in x itself; the mean into out. The
        // stacks' inputs are zero in the gaps (the graphs write the sentences' frames only).
        auto queue = [&] {
            vs::cuda::stack_input(dev, base + xs_at[i], ptr(xs32_at[i]), nullptr, Cs[i], total[i], segs[i]);
            stack(xs_at[i], GEN + "noise_res." + std::to_string(i) + ".", i, noise_kernel(i));
            vs::cuda::stack_input(dev, base + x_at, ptr(up32_at), base + xs_at[i], Cs[i], total[i], segs[i]);
            for (size_t j = 0; j < n_res; ++j) {
                const bool   last = j + 1 == n_res;
                const size_t buf  = last ? x_at : j == 0 ? s_at : r_at;
                if (buf != x_at) {
                    vs::cuda::copy(dev, base + buf, base + x_at, F16 * (size_t) n);
                }
                stack(buf, res_prefix(i, j), i, hp_.res_kernels[j]);
                if (j > 0 || n_res == 1) {
                    vs::cuda::accumulate_f16(dev, base + (n_res > 1 ? s_at : x_at), j > 0 ? base + buf : nullptr, n,
                                             last ? 1.0f / (float) n_res : 1.0f, last ? ptr(out_at) : nullptr);
                }
            }
        };
        if (captured) {
            std::string key = std::to_string(i) + " of";  // the stage, and every stage's bucket
            for (int64_t F : total) {
                key += " " + std::to_string(F);
            }
            c.timings.n_captures_replayed += captures_.run(dev, key, queue) ? 1 : 0;
        } else {
            queue();
        }
        if (c.profiling || !c.queue_graphs) {  // otherwise the next graph waits for them on the device
            vs::cuda::synchronize(dev);
        }
        c.profile_op("residual stacks (engine's CUDA kernels)", vs::ms_since(t0));
        c.check_abort();

        const bool last = i + 1 == n_stages;
        if (B > 1) {  // the batch's packing at once, its gaps zeroed (their frames hold what the stacks spilt)
            std::vector<float> mask((size_t) total[i], 0.0f);
            for (size_t b = 0; b < B; ++b) {
                std::fill_n(mask.begin() + at[i][b], T[i][b], 1.0f);
            }
            if (!last) {
                // The upsampling over the packing: each sentence's frames come out at its
                // first frame times the rate (its gap zeros, as wide as the kernel reaches),
                // then gathered into the next stage's packing (the last stage's reflection pad
                // too: its frame 0 is upsampled frame 1). The next stage's gaps read frame 0.
                const int            r       = hp_.gen_rates[i + 1];
                const bool           reflect = i + 2 == n_stages;
                std::vector<int32_t> rows((size_t) total[i + 1], 0);
                for (size_t b = 0; b < B; ++b) {
                    for (int64_t u = 0; u < T[i + 1][b]; ++u) {
                        const int64_t v                   = !reflect ? u : u == 0 ? 1 : u - 1;
                        rows[(size_t) (at[i + 1][b] + u)] = (int32_t) (at[i][b] * r + v);
                    }
                }
                vs::stage_graph & sg = c.stage_graph(VS_STAGE_GENERATOR, "", [&](ggml_context * g, ggml_cgraph * gf) {
                    ggml_tensor * m   = input_2d(g, 1, total[i], "mask");
                    ggml_tensor * idx = ggml_new_tensor_1d(g, GGML_TYPE_I32, total[i + 1]);
                    ggml_set_input(idx);
                    const std::string n = std::to_string(i + 1);
                    ggml_tensor *     x = ggml_mul(g, c.scratch_tensor(g, out_at, Cs[i], total[i]), m);
                    x = conv_transpose1d(g, ggml_leaky_relu(g, x, 0.1f, false), c.w(GEN + "ups." + n + ".weight"),
                                         c.w(GEN + "ups." + n + ".bias"), r, (hp_.gen_kernels[i + 1] - r) / 2);
                    x = ggml_get_rows(g, x, idx);  // [C, the next stage's frames]
                    ggml_build_forward_expand(gf,
                                              ggml_cpy(g, x, c.scratch_tensor(g, up32_at, Cs[i + 1], total[i + 1])));
                    return std::vector<ggml_tensor *>{ m, idx };
                });
                set_input(c, sg.t[0], mask.data());
                set_input(c, sg.t[1], rows.data());
                c.compute(sg);
                continue;
            }
            // The output over the packing: the gaps' frames add nothing to the audio, and are
            // wider than a frame's reach (N_FFT / HOP - 1 frames on), so sentence b's audio is
            // the packing's samples from its first frame's, N_FFT / 2 on. Its gain, applied as
            // each sentence's samples are read back: the head's on its first N_FFT / 2, 4 on
            // the others (the single product gen_output's graph takes).
            const int64_t     raw_len = (total[i] - 1) * HOP + N_FFT;
            vs::stage_graph & sg      = c.stage_graph(VS_STAGE_GENERATOR, "", [&](ggml_context * g, ggml_cgraph * gf) {
                ggml_tensor * m   = input_2d(g, 1, total[i], "mask");
                ggml_tensor * x   = ggml_mul(g, c.scratch_tensor(g, out_at, Cs[i], total[i]), m);
                ggml_tensor * wav = overlap_add(g, gen_frames(c, g, x, m, true));
                GGML_ASSERT(ggml_nelements(wav) == raw_len);
                ggml_set_output(wav);
                ggml_build_forward_expand(gf, wav);
                return std::vector<ggml_tensor *>{ m, wav };
            });
            set_input(c, sg.t[0], mask.data());
            c.compute(sg);
            const std::vector<float> head = istft_head_gain(model_);
            for (size_t b = 0; b < B; ++b) {
                std::vector<float> & audio = group[b]->audio;
                audio.resize(group[b]->f0.size() * SAMPLES_PER_F0);
                ggml_backend_tensor_get(sg.t[1], audio.data(), sizeof(float) * (size_t) (at[i][b] * HOP + N_FFT / 2),
                                        sizeof(float) * audio.size());
                for (size_t k = 0; k < audio.size(); ++k) {
                    audio[k] *= k < head.size() ? head[k] : 4.0f;
                }
            }
            return;
        }
        // The next graph reads each sentence's result where the kernels left it. Its tensors:
        // the lengths (captured: the sentence's frames at this stage), then each sentence's
        // audio on the last stage.
        vs::stage_graph & sg = c.stage_graph(
            VS_STAGE_GENERATOR, key(last ? "output" : "upsampling " + std::to_string(i + 1)),
            [&](ggml_context * g, ggml_cgraph * gf) {
                ggml_tensor *              lens = captured ? input_2d(g, 1, 1, "lengths") : nullptr;
                std::vector<ggml_tensor *> t    = { lens };
                for (size_t b = 0; b < B; ++b) {
                    ggml_tensor * x    = frames_of(g, out_at, i, b);
                    ggml_tensor * mask = captured ? frame_mask(g, lens, 0, Tg[i][b]) : nullptr;
                    x                  = mask ? ggml_mul(g, x, mask) : x;
                    if (!last) {
                        ggml_tensor * up = gen_upsample(c, g, x, i + 1);
                        GGML_ASSERT(up->ne[0] == Cs[i + 1] && up->ne[1] == Tg[i + 1][b]);
                        ggml_build_forward_expand(gf, ggml_cpy(g, up, frames_of(g, up32_at, i + 1, b)));
                    } else {
                        t.push_back(gen_output(c, g, x, F2g[b] * SAMPLES_PER_F0, mask));
                        ggml_build_forward_expand(gf, t.back());
                    }
                }
                return t;
            },
            1024 * B, true);
        if (captured) {
            const float len = (float) T[i][0];
            set_input(c, sg.t[0], &len);
        }
        c.compute(sg);
        if (last) {
            for (size_t b = 0; b < B; ++b) {
                std::vector<float> & audio = group[b]->audio;
                audio.resize(group[b]->f0.size() * SAMPLES_PER_F0);
                ggml_backend_tensor_get(sg.t[1 + b], audio.data(), 0, sizeof(float) * audio.size());
            }
            return;
        }
    }
}

}  // namespace vs::kokoro
