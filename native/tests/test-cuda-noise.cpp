// The engine's CUDA noise (vs::cuda::gaussian) against the host's draw of the same streams
// (vs::gaussian_pair): odd and even lengths, a scale, nothing written past the end, and the
// draw's mean and variance. Exits 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda-test.h"
#include "vs-cuda.h"
#include "vs-impl.h"

namespace {

bool check(uint64_t key, int64_t n, float scale) {
    const int64_t canary = 5;
    float *       d      = nullptr;
    cudaMalloc(&d, sizeof(float) * (size_t) (n + canary));
    std::vector<float> got((size_t) (n + canary), 7.0f);
    cudaMemcpy(d, got.data(), sizeof(float) * got.size(), cudaMemcpyHostToDevice);
    vs::cuda::gaussian(0, key, d, n, scale);
    vs::cuda::synchronize(0);
    cudaMemcpy(got.data(), d, sizeof(float) * got.size(), cudaMemcpyDeviceToHost);
    cudaFree(d);
    double worst = 0.0, sum = 0.0, sq = 0.0;
    for (int64_t p = 0; 2 * p < n; ++p) {
        float a = 0.0f, b = 0.0f;
        vs::gaussian_pair(key, (uint64_t) p, scale, a, b);
        worst = std::fmax(worst, std::fabs(got[(size_t) (2 * p)] - a));
        if (2 * p + 1 < n) {
            worst = std::fmax(worst, std::fabs(got[(size_t) (2 * p + 1)] - b));
        }
    }
    for (int64_t i = 0; i < n; ++i) {
        sum += got[(size_t) i] / scale;
        sq += (double) got[(size_t) i] * got[(size_t) i] / ((double) scale * scale);
    }
    bool untouched = true;
    for (int64_t i = n; i < n + canary; ++i) {
        untouched = untouched && got[(size_t) i] == 7.0f;
    }
    const double mean = sum / (double) n, var = sq / (double) n - mean * mean;
    // The moments only where there are enough values to say something (4 sigma).
    const bool moments = n < 10000 || (std::fabs(mean) < 4.0 / std::sqrt((double) n) &&
                                       std::fabs(var - 1.0) < 4.0 * std::sqrt(2.0 / (double) n));
    const bool ok      = worst <= 1e-5 * scale && untouched && moments;
    std::printf("%s key=%llu n=%lld scale=%g: largest difference %.2e, mean %.4f, variance %.4f%s\n",
                ok ? "ok  " : "FAIL", (unsigned long long) key, (long long) n, scale, worst, mean, var,
                untouched ? "" : ", wrote past the end");
    return ok;
}

}  // namespace

int main() {
    if (!cuda_device_present()) {
        return 77;
    }
    bool ok = true;
    ok      = check(1, 1, 1.0f) && ok;
    ok      = check(vs::mix64(42), 7, 1.0f) && ok;
    ok      = check(vs::mix64(3), 192 * 331, 1.0f) && ok;
    ok      = check(0x9E3779B97F4A7C15ull, 1000001, 0.667f) && ok;
    return ok ? 0 : 1;
}
