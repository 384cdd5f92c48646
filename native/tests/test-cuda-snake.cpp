// The engine's CUDA residual stacks (vs::cuda::snake_stack) against a loop on the host:
// three pairs of AdaIN, Snake and convolution (dilations 1, 3, 5, then 1), for kernel
// sizes 3, 7 and 11, lengths shorter and longer than a kernel's reach, 32 and 128
// channels, some of means far above their spreads; differences are measured against the
// largest value the stack added, and what F16 activations allow (f16_allowance). The
// host rounds Snake's output to F16 as the device does before its GEMMs. The same stacks
// over segments packed along time (check_segments), each against the host's stack over it
// alone. A stack at a bucket's length, captured and replayed for other lengths of that
// bucket (check_captured), the cache of captures itself (check_cache), and a stack's input
// (check_stack_input). Exits 77 (skipped) where there is no CUDA device.
#include "cuda-stack-test.h"

using namespace stack_test;

namespace {

bool check(void * blas, int64_t C, int64_t T, int K) {
    std::mt19937                          rng((unsigned) (C * 131 + T * 7 + K));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int *                           dil = STACK_DIL;
    const random_stack                    st(C, K, rng);
    // An input with channels of unlike means and spreads (the AdaIN's statistics matter),
    // every seventh channel's mean 25 times its spread or more (a variance taken as the mean
    // of squares less the squared mean, unshifted, would lose digits there).
    std::vector<float> x((size_t) (C * T));
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < C; ++c) {
            const float mean = ((float) (c % 5) - 2.0f) * (c % 7 == 0 ? 25.0f : 1.0f) + (c % 7 == 0 ? 60.0f : 0.0f);
            x[(size_t) (t * C + c)] = mean + (1.0f + (float) (c % 3)) * u(rng);
        }
    }
    x                             = from_f16(to_f16(x));  // as the device holds it
    const std::vector<float> want = reference_stack(x, C, T, K, st.convs);

    const int64_t frames = vs::cuda::snake_frames(T, K, dil, 6);
    void *        d_x = nullptr, *d_scratch = nullptr;
    cudaMalloc(&d_x, sizeof(ggml_fp16_t) * (size_t) (C * frames));
    cudaMalloc(&d_scratch, vs::cuda::snake_scratch_bytes(C, T, K, dil, 6));
    cudaMemcpy(d_x, to_f16(x).data(), x.size() * sizeof(ggml_fp16_t), cudaMemcpyHostToDevice);
    bool ok = true;
    try {
        vs::cuda::snake_stack(0, blas, d_x, C, T, K, st.dconvs.data(), 3, d_scratch);
        vs::cuda::synchronize(0);
    } catch (const std::exception & e) {
        std::printf("FAIL C=%lld T=%lld K=%d: %s\n", (long long) C, (long long) T, K, e.what());
        ok = false;
    }
    std::vector<ggml_fp16_t> got16(x.size());
    cudaMemcpy(got16.data(), d_x, got16.size() * sizeof(ggml_fp16_t), cudaMemcpyDeviceToHost);
    const std::vector<float> got = from_f16(got16);
    cudaFree(d_x);
    cudaFree(d_scratch);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, (double) std::fabs(got[i] - want[i]));  // NaN fails below
        scale = std::max(scale, (double) std::fabs(want[i] - x[i]));    // of what the stack added
        if (!std::isfinite(got[i])) {
            worst = INFINITY;
        }
    }
    ok = ok && worst <= 2e-3 * scale + f16_allowance(peak_of(want));
    std::printf("%s C=%lld T=%lld K=%d: largest difference %.2e of %.2e added\n", ok ? "ok  " : "FAIL", (long long) C,
                (long long) T, K, worst, scale);
    return ok;
}

// The same stacks over sentences packed along time (vs::cuda::snake_segments): segments of
// unlike lengths, each with its own AdaIN scales and shifts and an input of its own, with
// gaps of exactly the widest padding between them. Each segment's frames must come out as
// the host's stack over that segment alone.
bool check_segments(void * blas, int64_t C, int K, const std::vector<int64_t> & lengths) {
    std::mt19937                          rng((unsigned) (C * 7 + K * 3 + (int64_t) lengths.size()));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int                             dil[6] = { 1, 1, 3, 1, 5, 1 };
    const int64_t                         gap = 5 * (K - 1) / 2, n_seg = (int64_t) lengths.size();
    std::vector<int64_t>                  first;
    int64_t                               T = 0;
    for (int64_t len : lengths) {
        first.push_back(T);
        T += len + gap;
    }
    // Shared weights, alphas and biases; per segment and convolution a scale and a shift,
    // [segment][convolution][scale C, shift C] on the device.
    std::vector<std::vector<host_conv>> convs((size_t) n_seg, std::vector<host_conv>(6));
    std::vector<float>                  styles;
    std::vector<void *>                 device;
    for (int i = 0; i < 6; ++i) {
        host_conv & h = convs[0][(size_t) i];
        h.dilation    = dil[i];
        for (int64_t c = 0; c < C; ++c) {
            h.alpha.push_back(0.5f + 0.5f * (u(rng) + 1.0f));
            h.bias.push_back(0.1f * u(rng));
        }
        h.random_weights(C, K, rng);
    }
    for (int64_t sg = 0; sg < n_seg; ++sg) {
        for (int i = 0; i < 6; ++i) {
            host_conv & h = convs[(size_t) sg][(size_t) i];
            if (sg > 0) {
                h = convs[0][(size_t) i];
                h.scale.clear();
                h.shift.clear();
            }
            for (int64_t c = 0; c < C; ++c) {
                h.scale.push_back(1.0f + 0.5f * u(rng));
                h.shift.push_back(0.5f * u(rng));
            }
            styles.insert(styles.end(), h.scale.begin(), h.scale.end());
            styles.insert(styles.end(), h.shift.begin(), h.shift.end());
        }
    }
    void *                            d_styles = upload(styles);
    std::vector<vs::cuda::snake_conv> dconvs(6);
    for (int i = 0; i < 6; ++i) {
        const host_conv & h = convs[0][(size_t) i];
        device.push_back(upload(h.alpha));
        device.push_back(upload(h.bias));
        device.push_back(upload(h.w16));
        vs::cuda::snake_conv & d = dconvs[(size_t) i];
        d.scale                  = static_cast<const float *>(d_styles) + 2 * C * i;
        d.shift                  = d.scale + C;
        d.alpha                  = static_cast<const float *>(device[device.size() - 3]);
        d.bias                   = static_cast<const float *>(device[device.size() - 2]);
        d.w                      = device.back();
        d.dilation               = dil[i];
    }
    std::vector<int> seg_info;
    for (int64_t sg = 0; sg < n_seg; ++sg) {
        seg_info.push_back((int) first[(size_t) sg]);
        seg_info.push_back((int) lengths[(size_t) sg]);
    }
    std::vector<int> frame_seg((size_t) T, -1);
    for (int64_t sg = 0; sg < n_seg; ++sg) {
        std::fill_n(frame_seg.begin() + first[(size_t) sg], lengths[(size_t) sg], (int) sg);
    }
    seg_info.insert(seg_info.end(), frame_seg.begin(), frame_seg.end());
    void * d_seg = upload(seg_info);

    // Each segment's input, its channels' means unlike the other segments'; the gaps hold
    // values far from any segment's (what a packed stack leaves there).
    std::vector<float>              x((size_t) (C * T), 1e4f);
    std::vector<std::vector<float>> want((size_t) n_seg);
    for (int64_t sg = 0; sg < n_seg; ++sg) {
        const int64_t      len = lengths[(size_t) sg];
        std::vector<float> xs((size_t) (C * len));
        for (int64_t t = 0; t < len; ++t) {
            for (int64_t c = 0; c < C; ++c) {
                xs[(size_t) (t * C + c)] =
                    (float) (sg * 3 - 2) + ((float) (c % 5) - 2.0f) + (1.0f + (float) sg) * u(rng);
            }
        }
        xs = from_f16(to_f16(xs));  // as the device holds it
        std::copy(xs.begin(), xs.end(), x.begin() + first[(size_t) sg] * C);
        std::vector<float> y((size_t) (C * len));
        want[(size_t) sg] = xs;
        for (int p = 0; p < 3; ++p) {
            reference_step(want[(size_t) sg], y, false, C, len, K, convs[(size_t) sg][(size_t) (2 * p)]);
            reference_step(y, want[(size_t) sg], true, C, len, K, convs[(size_t) sg][(size_t) (2 * p + 1)]);
        }
    }

    const int64_t frames = vs::cuda::snake_frames(T, K, dil, 6, (int) n_seg);
    void *        d_x = nullptr, *d_scratch = nullptr;
    cudaMalloc(&d_x, sizeof(ggml_fp16_t) * (size_t) (C * frames));
    cudaMalloc(&d_scratch, vs::cuda::snake_scratch_bytes(C, T, K, dil, 6, (int) n_seg));
    cudaMemcpy(d_x, to_f16(x).data(), x.size() * sizeof(ggml_fp16_t), cudaMemcpyHostToDevice);
    vs::cuda::snake_segments seg;
    seg.n            = (int) n_seg;
    seg.range        = static_cast<const int *>(d_seg);
    seg.frame        = seg.range + 2 * n_seg;
    seg.style_stride = 12 * C;
    bool ok          = true;
    try {
        vs::cuda::snake_stack(0, blas, d_x, C, T, K, dconvs.data(), 3, d_scratch, seg);
        vs::cuda::synchronize(0);
    } catch (const std::exception & e) {
        std::printf("FAIL segments C=%lld K=%d: %s\n", (long long) C, K, e.what());
        ok = false;
    }
    std::vector<ggml_fp16_t> got16(x.size());
    cudaMemcpy(got16.data(), d_x, got16.size() * sizeof(ggml_fp16_t), cudaMemcpyDeviceToHost);
    const std::vector<float> got = from_f16(got16);
    for (void * p : device) {
        cudaFree(p);
    }
    for (void * p : { d_x, d_scratch, d_styles, d_seg }) {
        cudaFree(p);
    }
    double worst = 0.0, scale = 0.0, peak = 0.0;
    for (int64_t sg = 0; sg < n_seg; ++sg) {
        peak = std::max(peak, peak_of(want[(size_t) sg]));
        for (int64_t i = 0; i < C * lengths[(size_t) sg]; ++i) {
            const double g = got[(size_t) (first[(size_t) sg] * C + i)], w = want[(size_t) sg][(size_t) i];
            worst = std::isfinite(g) ? std::max(worst, std::fabs(g - w)) : INFINITY;
            scale = std::max(scale, std::fabs(w - x[(size_t) (first[(size_t) sg] * C + i)]));
        }
    }
    ok = ok && worst <= 2e-3 * scale + f16_allowance(peak);
    std::printf("%s segments C=%lld K=%d (%lld of them): largest difference %.2e of %.2e added\n", ok ? "ok  " : "FAIL",
                (long long) C, K, (long long) n_seg, worst, scale);
    return ok;
}

// A sentence's stacks at its bucket's length (snake_bucket), its own length a range on the
// device and the frames after it NaN, run through a launch_cache: run, captured, then
// replayed for other lengths of that bucket. Each length's frames must come out as the
// host's stack over them alone, and the cache must hold one capture.
bool check_captured(void * blas, int64_t C, int K, const std::vector<int64_t> & lengths) {
    std::mt19937                          rng((unsigned) (C * 17 + K));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int *                           dil = STACK_DIL;
    const random_stack                    st(C, K, rng);
    const int64_t                         Tb = vs::cuda::snake_bucket(lengths[0], &K, 1, dil, 6);
    bool                                  ok = true;
    for (int64_t T : lengths) {
        if (vs::cuda::snake_bucket(T, &K, 1, dil, 6) != Tb || T > Tb) {
            std::printf("FAIL captured C=%lld K=%d: %lld frames are not in the bucket of %lld\n", (long long) C, K,
                        (long long) T, (long long) lengths[0]);
            ok = false;
        }
    }
    void *d_x = nullptr, *d_scratch = nullptr, *d_range = nullptr;
    cudaMalloc(&d_x, sizeof(ggml_fp16_t) * (size_t) (C * vs::cuda::snake_frames(Tb, K, dil, 6)));
    cudaMalloc(&d_scratch, vs::cuda::snake_scratch_bytes(C, Tb, K, dil, 6));
    cudaMalloc(&d_range, 2 * sizeof(int));
    vs::cuda::snake_segments seg;
    seg.range = static_cast<const int *>(d_range);
    vs::cuda::launch_cache cache;
    double                 worst = 0.0, scale = 0.0, peak = 0.0;
    for (size_t run = 0; ok && run <= lengths.size(); ++run) {
        const int64_t      T = lengths[run == 0 ? 0 : run - 1];  // the first length twice: run, then captured
        std::vector<float> x((size_t) (C * Tb), NAN);
        for (int64_t i = 0; i < C * T; ++i) {
            x[(size_t) i] = ((float) (i % C % 5) - 2.0f) + u(rng);
        }
        x                  = from_f16(to_f16(x));  // as the device holds it
        const int range[2] = { 0, (int) T };
        cudaMemcpy(d_x, to_f16(x).data(), x.size() * sizeof(ggml_fp16_t), cudaMemcpyHostToDevice);
        cudaMemcpy(d_range, range, sizeof(range), cudaMemcpyHostToDevice);
        try {
            cache.run(0, "stack",
                      [&] { vs::cuda::snake_stack(0, blas, d_x, C, Tb, K, st.dconvs.data(), 3, d_scratch, seg); });
            vs::cuda::synchronize(0);
        } catch (const std::exception & e) {
            std::printf("FAIL captured C=%lld K=%d T=%lld: %s\n", (long long) C, K, (long long) T, e.what());
            ok = false;
            break;
        }
        std::vector<ggml_fp16_t> got16((size_t) (C * T));
        cudaMemcpy(got16.data(), d_x, got16.size() * sizeof(ggml_fp16_t), cudaMemcpyDeviceToHost);
        const std::vector<float> got = from_f16(got16);
        const std::vector<float> want =
            reference_stack(std::vector<float>(x.begin(), x.begin() + C * T), C, T, K, st.convs);
        peak = std::max(peak, peak_of(want));
        for (size_t i = 0; i < got.size(); ++i) {
            worst = std::isfinite(got[i]) ? std::max(worst, (double) std::fabs(got[i] - want[i])) : INFINITY;
            scale = std::max(scale, (double) std::fabs(want[i] - x[i]));
        }
    }
    for (void * p : { d_x, d_scratch, d_range }) {
        cudaFree(p);
    }
    ok = ok && worst <= 2e-3 * scale + f16_allowance(peak) && cache.captured() == 1;
    std::printf("%s captured C=%lld K=%d at %lld frames (%zu captured): largest difference %.2e of %.2e added\n",
                ok ? "ok  " : "FAIL", (long long) C, K, (long long) Tb, cache.captured(), worst, scale);
    return ok;
}

// launch_cache's keys (limit 2): each key run, then captured, then replayed, the work
// replayed reading what its memory holds then (a copy of a buffer changed between runs);
// past the limit the key used longest ago goes, captured or not, and comes back unseen.
bool check_cache() {
    const int n     = 1000;
    void *    d_src = nullptr, *d_dst = nullptr;
    cudaMalloc(&d_src, n * sizeof(float));
    cudaMalloc(&d_dst, n * sizeof(float));
    vs::cuda::launch_cache cache(2);
    std::vector<float>     src(n), dst(n);
    bool                   ok   = true;
    int                    step = 0;
    // Runs `key`, which copies src to dst, with src filled with `step`; its return and the
    // captures held afterwards must be as given, and dst must be the new src.
    auto run = [&](const char * key, bool replayed, size_t captured) {
        ++step;
        std::fill(src.begin(), src.end(), (float) step);
        cudaMemcpy(d_src, src.data(), n * sizeof(float), cudaMemcpyHostToDevice);
        bool got = false;
        try {
            got = cache.run(0, key, [&] { vs::cuda::copy(0, d_dst, d_src, n * sizeof(float)); });
            vs::cuda::synchronize(0);
        } catch (const std::exception & e) {
            std::printf("FAIL cache step %d: %s\n", step, e.what());
            ok = false;
            return;
        }
        cudaMemcpy(dst.data(), d_dst, n * sizeof(float), cudaMemcpyDeviceToHost);
        const bool same = std::all_of(dst.begin(), dst.end(), [&](float v) { return v == (float) step; });
        if (got != replayed || cache.captured() != captured || !same) {
            std::printf("FAIL cache step %d (%s): replayed %d, %zu captured, copy %s\n", step, key, (int) got,
                        cache.captured(), same ? "right" : "wrong");
            ok = false;
        }
    };
    run("a", false, 0);  // run
    run("a", false, 1);  // captured
    run("a", true, 1);   // replayed
    run("b", false, 1);
    run("b", false, 2);
    run("b", true, 2);
    run("a", true, 2);
    run("c", false, 1);  // b, used longest ago, goes
    run("b", false, 0);  // unseen again; a, used longest ago, goes
    run("c", false, 1);  // captured
    run("c", true, 1);
    cudaFree(d_src);
    cudaFree(d_dst);
    std::printf("%s launch_cache: run, captured, replayed, dropped past its limit\n", ok ? "ok  " : "FAIL");
    return ok;
}

// A stack's input (stack_input) from a graph's F32 output and an F16 addend, NaN in the
// gaps of both: a + b rounded to F16 on the segments' frames, zeros in the gaps; with a
// frame map (a batch), with one segment's range (a captured sentence), and over all frames.
bool check_stack_input(int64_t C, int64_t T) {
    std::vector<float> a((size_t) (C * T)), b((size_t) (C * T));
    for (size_t i = 0; i < a.size(); ++i) {
        a[i] = (float) (i % 97) * 0.25f - 12.0f;
        b[i] = (float) (i % 31) * 0.5f;
    }
    const int64_t    first[2] = { 3, T / 2 }, len[2] = { T / 3, T / 4 };
    std::vector<int> seg_info = { (int) first[0], (int) len[0], (int) first[1], (int) len[1] };
    std::vector<int> frame((size_t) T, -1);
    for (int s = 0; s < 2; ++s) {
        std::fill_n(frame.begin() + first[s], len[s], s);
    }
    seg_info.insert(seg_info.end(), frame.begin(), frame.end());
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; t < first[0] && c < C; ++c) {  // a gap's frames hold what no mask takes out
            a[(size_t) (t * C + c)] = NAN;
            b[(size_t) (t * C + c)] = NAN;
        }
    }
    const std::vector<ggml_fp16_t> b16 = to_f16(b);
    void *                         d_a = upload(a), *d_b = upload(b16), *d_seg = upload(seg_info), *d_out = nullptr;
    cudaMalloc(&d_out, sizeof(ggml_fp16_t) * a.size());
    bool ok = true;
    for (int mode = 0; mode < 3; ++mode) {  // frame map, range, all frames (b left out)
        vs::cuda::snake_segments seg;
        if (mode == 0) {
            seg.n     = 2;
            seg.range = static_cast<const int *>(d_seg);
            seg.frame = seg.range + 4;
        } else if (mode == 1) {
            seg.range = static_cast<const int *>(d_seg) + 2;  // the second segment alone
        }
        cudaMemset(d_out, 0xff, sizeof(ggml_fp16_t) * a.size());  // NaN before
        std::vector<ggml_fp16_t> got16(a.size());
        try {
            vs::cuda::stack_input(0, d_out, static_cast<const float *>(d_a), mode == 2 ? nullptr : d_b, C, T, seg);
            vs::cuda::synchronize(0);
            cudaMemcpy(got16.data(), d_out, got16.size() * sizeof(ggml_fp16_t), cudaMemcpyDeviceToHost);
        } catch (const std::exception & e) {
            std::printf("FAIL stack input C=%lld T=%lld: %s\n", (long long) C, (long long) T, e.what());
            ok = false;
            break;
        }
        const std::vector<float> got = from_f16(got16);
        size_t                   bad = 0;
        for (int64_t t = 0; t < T; ++t) {
            const bool in = mode == 0   ? frame[(size_t) t] >= 0
                            : mode == 1 ? t >= first[1] && t < first[1] + len[1]
                                        : true;
            for (int64_t c = 0; c < C; ++c) {
                const size_t i       = (size_t) (t * C + c);
                const float  want    = !in ? 0.0f : mode == 2 ? a[i] : a[i] + ggml_fp16_to_fp32(b16[i]);
                const float  rounded = ggml_fp16_to_fp32(ggml_fp32_to_fp16(want));
                bad += !(got[i] == rounded || (std::isnan(want) && std::isnan(got[i])));
            }
        }
        ok = ok && bad == 0;
        std::printf("%s stack input C=%lld T=%lld (%s): %zu values off\n", bad == 0 ? "ok  " : "FAIL", (long long) C,
                    (long long) T,
                    mode == 0   ? "frame map"
                    : mode == 1 ? "range"
                                : "all frames",
                    bad);
    }
    for (void * p : { d_a, d_b, d_seg, d_out }) {
        cudaFree(p);
    }
    return ok;
}
}  // namespace

int main() {
    if (!cuda_device_present()) {
        return 77;
    }
    void * blas = vs::cuda::blas_create(0);
    bool   ok   = true;
    for (int K : { 3, 7, 11 }) {
        ok = check(blas, 32, 9, K) && ok;     // shorter than the widest reach (5 * 10 frames)
        ok = check(blas, 128, 613, K) && ok;  // no multiple of any window
        ok = check(blas, 32, 4099, K) && ok;  // more frames than a statistics row covers
        ok = check_segments(blas, 32, K, { 613, 9, 4099, 40 }) && ok;
        ok = check_segments(blas, 128, K, { 700 }) && ok;  // one segment, with its gap
    }
    // A lane two float4s of a row (two statistics columns), and rows that 32 lanes do not divide.
    ok = check(blas, 256, 613, 7) && ok;
    ok = check(blas, 96, 2100, 3) && ok;
    ok = check_segments(blas, 256, 7, { 300, 1500, 20 }) && ok;
    ok = check_segments(blas, 96, 11, { 90, 1100 }) && ok;
    ok = check_captured(blas, 64, 7, { 300, 295, 290 }) && ok;
    ok = check_captured(blas, 32, 3, { 1000, 1152, 961 }) && ok;  // the bucket's length itself
    ok = check_captured(blas, 32, 11, { 100, 110, 95 }) && ok;
    ok = check_cache() && ok;
    ok = check_stack_input(128, 1000) && ok;
    ok = check_stack_input(96, 70001) && ok;  // rows that 32 lanes do not divide, many blocks
    vs::cuda::blas_destroy(blas);
    return ok ? 0 : 1;
}
