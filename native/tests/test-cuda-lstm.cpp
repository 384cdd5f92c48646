// The engine's CUDA LSTM kernels (vs-cuda.h) against a loop on the host: F16 and F32
// weights, a hidden size the cluster kernel takes (256, on sm_90) and one only the
// one-block kernel takes (72), two directions, three sequences, a state carried in (or
// none: zeros, not read back), and input projections with more steps a column than are run
// (a graph's rounded-up shapes).
// Exits 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>
#include <ggml.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda-test.h"
#include "vs-cuda.h"

namespace {

float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}

bool check(ggml_type type, int64_t H, int64_t n, int64_t D, int64_t B, int64_t stride, bool carried = true) {
    std::mt19937                          rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t                         cols = D * B, H4 = 4 * H;
    std::vector<float>                    w((size_t) (H * H4 * D)), gx((size_t) (H4 * stride * cols));
    std::vector<float>                    h((size_t) (H * cols)), c((size_t) (H * cols));
    for (float & v : w) {
        v = 0.15f * u(rng);
    }
    for (auto * vec : { &gx, &h, &c }) {
        for (float & v : *vec) {
            v = carried || vec == &gx ? u(rng) : 0.0f;
        }
    }
    // The weights as the device holds them (F16 rounds them; the reference uses the rounded values).
    std::vector<ggml_fp16_t> w16(w.size());
    if (type == GGML_TYPE_F16) {
        for (size_t i = 0; i < w.size(); ++i) {
            w16[i] = ggml_fp32_to_fp16(w[i]);
            w[i]   = ggml_fp16_to_fp32(w16[i]);
        }
    }
    // Reference: column j = (direction j % D, sequence j / D), step-major gx [4H, stride, cols]
    // of which each column's first n steps run.
    std::vector<float> rh = h, rc = c, rout((size_t) (H * cols * n));
    for (int64_t j = 0; j < cols; ++j) {
        const float * wd = w.data() + (j % D) * H4 * H;
        for (int64_t t = 0; t < n; ++t) {
            std::vector<float> z((size_t) H4);
            for (int64_t r = 0; r < H4; ++r) {
                double acc = gx[(size_t) ((j * stride + t) * H4 + r)];
                for (int64_t k = 0; k < H; ++k) {
                    acc += (double) wd[r * H + k] * rh[(size_t) (j * H + k)];
                }
                z[(size_t) r] = (float) acc;
            }
            for (int64_t k = 0; k < H; ++k) {
                const float i = sigmoid(z[(size_t) k]), f = sigmoid(z[(size_t) (H + k)]);
                const float g = std::tanh(z[(size_t) (2 * H + k)]), o = sigmoid(z[(size_t) (3 * H + k)]);
                float &     cs                          = rc[(size_t) (j * H + k)];
                cs                                      = f * cs + i * g;
                rh[(size_t) (j * H + k)]                = o * std::tanh(cs);
                rout[(size_t) ((t * cols + j) * H + k)] = rh[(size_t) (j * H + k)];
            }
        }
    }

    const size_t wbytes = type == GGML_TYPE_F16 ? w16.size() * sizeof(ggml_fp16_t) : w.size() * sizeof(float);
    void *       d_w = nullptr, *d_gx = nullptr, *d_scratch = nullptr;
    cudaMalloc(&d_w, wbytes);
    cudaMalloc(&d_gx, gx.size() * sizeof(float));
    cudaMalloc(&d_scratch, vs::cuda::lstm_scratch_bytes(H, n, cols));
    cudaMemset(d_scratch, 0x3f, vs::cuda::lstm_scratch_bytes(H, n, cols));  // no zeros left from an earlier use
    cudaMemcpy(d_w, type == GGML_TYPE_F16 ? (const void *) w16.data() : (const void *) w.data(), wbytes,
               cudaMemcpyHostToDevice);
    cudaMemcpy(d_gx, gx.data(), gx.size() * sizeof(float), cudaMemcpyHostToDevice);
    std::vector<float> out((size_t) (H * cols * n));
    vs::cuda::lstm(0, (const float *) d_gx, d_w, type, H, n, stride, cols, D, carried ? h.data() : nullptr,
                   carried ? c.data() : nullptr, out.data(), d_scratch);
    cudaFree(d_w);
    cudaFree(d_gx);
    cudaFree(d_scratch);

    double worst = 0.0;
    for (size_t i = 0; i < out.size(); ++i) {
        worst = std::max(worst, (double) std::fabs(out[i] - rout[i]));
    }
    for (size_t i = 0; carried && i < h.size(); ++i) {
        worst = std::max(worst, (double) std::fabs(h[i] - rh[i]));
        worst = std::max(worst, (double) std::fabs(c[i] - rc[i]));
    }
    const bool ok = worst < 1e-4;
    std::printf("%s %s H=%lld n=%lld of %lld D=%lld B=%lld %s: largest difference %.2e\n", ok ? "ok  " : "FAIL",
                ggml_type_name(type), (long long) H, (long long) n, (long long) stride, (long long) D, (long long) B,
                carried ? "state carried" : "zero state", worst);
    return ok;
}

}  // namespace

int main() {
    if (!cuda_device_present()) {
        return 77;
    }
    bool           ok = true;
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    for (ggml_type type : { GGML_TYPE_F16, GGML_TYPE_F32 }) {
        // On sm_90 and later, H = 256 takes the cluster kernel (this build has code for it).
        const bool clusters = vs::cuda::lstm_uses_clusters(0, type, 256);
        std::printf("%s on %s (sm_%d%d): H=256 %s\n", ggml_type_name(type), prop.name, prop.major, prop.minor,
                    clusters ? "in clusters" : "one block a column");
        if (prop.major >= 9 && !clusters) {
            std::printf("FAIL the cluster kernel is not taken on sm_%d%d\n", prop.major, prop.minor);
            ok = false;
        }
        ok = check(type, 256, 37, 2, 3, 37) && ok;
        ok = check(type, 256, 37, 2, 3, 48) && ok;
        ok = check(type, 72, 19, 2, 2, 19) && ok;
        ok = check(type, 72, 19, 2, 2, 32) && ok;
        ok = check(type, 256, 5, 1, 1, 5) && ok;
        ok = check(type, 256, 37, 2, 3, 48, false) && ok;
        ok = check(type, 72, 19, 2, 2, 32, false) && ok;
    }
    return ok ? 0 : 1;
}
