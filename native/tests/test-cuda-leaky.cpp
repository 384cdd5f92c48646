// The LeakyReLU stacks of Piper's decoder (vs::cuda::leaky_stack) and its output layer
// (vs::cuda::leaky_conv_tanh) against loops on the host, with and without a mask, for
// Piper's kernel sizes. Exits 77 (skipped) where there is no CUDA device.
#include "cuda-stack-test.h"

using namespace stack_test;

namespace {

// The LeakyReLU stacks (vs::cuda::leaky_stack, Piper's decoder): x += conv(LeakyReLU(x) *
// mask) + bias for each convolution in turn, in double on the host, the LeakyReLU's output
// rounded to F16 as on the device. Every frame is compared, the masked ones included (both
// add what the convolutions spill there).
bool check_leaky(void * blas, int64_t C, int64_t T, int K, bool with_mask) {
    std::mt19937                          rng((unsigned) (C * 31 + T * 5 + K + (with_mask ? 1 : 0)));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int                             dil[3] = { 1, 3, 12 };
    std::vector<host_conv>                convs(3);
    std::vector<void *>                   device;
    std::vector<vs::cuda::leaky_conv>     dconvs(3);
    for (int i = 0; i < 3; ++i) {
        host_conv & h = convs[(size_t) i];
        h.dilation    = dil[i];
        for (int64_t c = 0; c < C; ++c) {
            h.bias.push_back(0.1f * u(rng));
        }
        h.random_weights(C, K, rng);
        device.push_back(upload(h.bias));
        device.push_back(upload(h.w16));
        dconvs[(size_t) i] = { device.back(), static_cast<const float *>(device[device.size() - 2]), dil[i] };
    }
    // A gap of zeros in the mask every 97 frames, 11 wide.
    std::vector<float> mask((size_t) T, 1.0f);
    for (int64_t t = 0; with_mask && t < T; ++t) {
        mask[(size_t) t] = t % 97 < 86 ? 1.0f : 0.0f;
    }
    std::vector<float> x((size_t) (C * T));
    for (auto & v : x) {
        v = 2.0f * u(rng);
    }
    std::vector<double> want(x.begin(), x.end());
    std::vector<float>  s((size_t) (C * T));
    for (const host_conv & cv : convs) {
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t c = 0; c < C; ++c) {
                const double v          = want[(size_t) (t * C + c)];
                const double l          = (v > 0.0 ? v : 0.1 * v) * mask[(size_t) t];
                s[(size_t) (t * C + c)] = ggml_fp16_to_fp32(ggml_fp32_to_fp16((float) l));
            }
        }
        conv_into(s, C, T, K, cv, [&](size_t i, double v) { want[i] += v; });
    }

    const int64_t frames = vs::cuda::snake_frames(T, K, dil, 3);
    void *        d_x = nullptr, *d_scratch = nullptr, *d_mask = with_mask ? upload(mask) : nullptr;
    cudaMalloc(&d_x, sizeof(float) * (size_t) (C * frames));
    cudaMalloc(&d_scratch, vs::cuda::leaky_scratch_bytes(C, T, K, dil, 3));
    cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice);
    bool ok = true;
    try {
        vs::cuda::leaky_stack(0, blas, static_cast<float *>(d_x), C, T, K, dconvs.data(), 3, 0.1f,
                              static_cast<const float *>(d_mask), d_scratch);
        vs::cuda::synchronize(0);
    } catch (const std::exception & e) {
        std::printf("FAIL leaky C=%lld T=%lld K=%d: %s\n", (long long) C, (long long) T, K, e.what());
        ok = false;
    }
    std::vector<float> got(x.size());
    cudaMemcpy(got.data(), d_x, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
    for (void * p : device) {
        cudaFree(p);
    }
    cudaFree(d_x);
    cudaFree(d_scratch);
    cudaFree(d_mask);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] - want[i]));
        scale = std::max(scale, std::fabs(want[i]));
        if (!std::isfinite(got[i])) {
            worst = INFINITY;
        }
    }
    ok = ok && worst <= 2e-3 * scale;
    std::printf("%s leaky C=%lld T=%lld K=%d%s: largest difference %.2e of %.2e\n", ok ? "ok  " : "FAIL", (long long) C,
                (long long) T, K, with_mask ? " masked" : "", worst, scale);
    return ok;
}

// Piper's output layer (vs::cuda::leaky_conv_tanh): tanh(conv(LeakyReLU(x) * mask)) to one
// channel, in double on the host.
bool check_post(int64_t C, int64_t T, int K) {
    std::mt19937                          rng((unsigned) (C * 17 + T * 3 + K));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float>                    x((size_t) (C * T)), w((size_t) (C * K)), mask((size_t) T);
    for (auto & v : x) {
        v = 2.0f * u(rng);
    }
    for (auto & v : w) {
        v = u(rng) / std::sqrt((float) (C * K));
    }
    for (int64_t t = 0; t < T; ++t) {
        mask[(size_t) t] = t % 301 < 280 ? 1.0f : 0.0f;
    }
    std::vector<double> want((size_t) T);
    for (int64_t t = 0; t < T; ++t) {
        double acc = 0.0;
        for (int k = 0; k < K; ++k) {
            const int64_t src = t + k - K / 2;
            if (src < 0 || src >= T) {
                continue;
            }
            for (int64_t c = 0; c < C; ++c) {
                const double v = x[(size_t) (src * C + c)];
                acc += (double) w[(size_t) (k * C + c)] * (v > 0.0 ? v : 0.01 * v) * mask[(size_t) src];
            }
        }
        want[(size_t) t] = std::tanh(acc);
    }
    void *d_x = upload(x), *d_w = upload(w), *d_m = upload(mask), *d_out = nullptr;
    cudaMalloc(&d_out, sizeof(float) * (size_t) T);
    bool ok = true;
    try {
        vs::cuda::leaky_conv_tanh(0, static_cast<const float *>(d_x), C, T, K, 0.01f, static_cast<const float *>(d_m),
                                  static_cast<const float *>(d_w), static_cast<float *>(d_out));
        vs::cuda::synchronize(0);
    } catch (const std::exception & e) {
        std::printf("FAIL output C=%lld T=%lld K=%d: %s\n", (long long) C, (long long) T, K, e.what());
        ok = false;
    }
    std::vector<float> got((size_t) T);
    cudaMemcpy(got.data(), d_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
    for (void * p : { d_x, d_w, d_m, d_out }) {
        cudaFree(p);
    }
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::isfinite(got[i]) ? std::max(worst, std::fabs(got[i] - want[i])) : INFINITY;
    }
    ok = ok && worst <= 1e-5;
    std::printf("%s output C=%lld T=%lld K=%d: largest difference %.2e\n", ok ? "ok  " : "FAIL", (long long) C,
                (long long) T, K, worst);
    return ok;
}

}  // namespace

int main() {
    if (!cuda_device_present()) {
        return 77;
    }
    void * blas = vs::cuda::blas_create(0);
    bool   ok   = true;
    for (int K : { 3, 5, 7 }) {  // Piper's kernel sizes
        ok = check_leaky(blas, 32, 9, K, false) && ok;
        ok = check_leaky(blas, 64, 613, K, true) && ok;
        ok = check_leaky(blas, 32, 4099, K, true) && ok;
    }
    ok = check_leaky(blas, 96, 613, 5, true) && ok;
    ok = check_leaky(blas, 256, 1000, 3, true) && ok;
    for (int64_t T : { 5, 1000, 70001 }) {  // shorter than the kernel, within a block, many blocks
        ok = check_post(32, T, 7) && ok;
    }
    vs::cuda::blas_destroy(blas);
    return ok ? 0 : 1;
}
