// What the tests of the engine's CUDA residual stacks share: F16 rounding, the host's
// convolutions, random stacks and uploads.
#pragma once

#include <cuda_runtime.h>
#include <ggml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda-test.h"
#include "vs-cuda.h"
namespace stack_test {

// Floats as F16 (snake_stack's activations), and back.
inline std::vector<ggml_fp16_t> to_f16(const std::vector<float> & v) {
    std::vector<ggml_fp16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        h[i] = ggml_fp32_to_fp16(v[i]);
    }
    return h;
}

inline std::vector<float> from_f16(const std::vector<ggml_fp16_t> & h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
        v[i] = ggml_fp16_to_fp32(h[i]);
    }
    return v;
}

// What the device's F16 activations may add to a stack's error over the host's floats: half
// a unit in F16's last place at the stack's largest value for each rounding of x after the
// input (three pairs' sums, then the biases).
inline double f16_allowance(double peak) {
    return 4 * std::ldexp(1.0, std::ilogb(std::max(peak, 1e-30)) - 11);
}

// The largest finite magnitude in v.
inline double peak_of(const std::vector<float> & v) {
    double p = 0.0;
    for (float f : v) {
        p = std::isfinite(f) ? std::max(p, (double) std::fabs(f)) : p;
    }
    return p;
}

struct host_conv {
    std::vector<float>       scale, shift, alpha, w, bias;  // w [OC][K][IC], values F16 holds
    std::vector<ggml_fp16_t> w16;
    int                      dilation = 1;

    // C -> C weights of kernel size K, uniform within 1 / sqrt(K C), as F16 and their floats.
    void random_weights(int64_t C, int K, std::mt19937 & rng) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        const float                           gain = 1.0f / std::sqrt((float) (K * C));
        for (int64_t i = 0; i < C * K * C; ++i) {
            w16.push_back(ggml_fp32_to_fp16(gain * u(rng)));
            w.push_back(ggml_fp16_to_fp32(w16.back()));
        }
    }
};

// out(t * C + oc, value) for every output of cv's convolution (bias included) over s [T, C]
// ("same" padding), summed in double.
template <typename Out>
void conv_into(const std::vector<float> & s, int64_t C, int64_t T, int K, const host_conv & cv, Out && out) {
    const int64_t pad = (int64_t) cv.dilation * (K - 1) / 2;
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t oc = 0; oc < C; ++oc) {
            double acc = cv.bias[(size_t) oc];
            for (int k = 0; k < K; ++k) {
                const int64_t src = t + (int64_t) k * cv.dilation - pad;
                if (src < 0 || src >= T) {
                    continue;
                }
                const float * wr = cv.w.data() + (size_t) ((oc * K + k) * C);
                const float * xr = s.data() + (size_t) (src * C);
                for (int64_t ic = 0; ic < C; ++ic) {
                    acc += (double) wr[ic] * xr[ic];
                }
            }
            out((size_t) (t * C + oc), acc);
        }
    }
}

// out = (accumulate ? out : 0) + conv(Snake(AdaIN(in))) + bias, in double.
void reference_step(const std::vector<float> & in, std::vector<float> & out, bool accumulate, int64_t C, int64_t T,
                    int K, const host_conv & cv) {
    std::vector<float> s((size_t) (C * T));
    for (int64_t c = 0; c < C; ++c) {
        double mean = 0.0, var = 0.0;
        for (int64_t t = 0; t < T; ++t) {
            mean += in[(size_t) (t * C + c)];
        }
        mean /= (double) T;
        for (int64_t t = 0; t < T; ++t) {
            const double d = in[(size_t) (t * C + c)] - mean;
            var += d * d;
        }
        var /= (double) T;
        const double a = cv.scale[(size_t) c] / std::sqrt(var + 1e-5), b = cv.shift[(size_t) c] - mean * a;
        const double al = cv.alpha[(size_t) c];
        for (int64_t t = 0; t < T; ++t) {
            const double u          = a * in[(size_t) (t * C + c)] + b;
            const double sn         = std::sin(al * u);
            s[(size_t) (t * C + c)] = ggml_fp16_to_fp32(ggml_fp32_to_fp16((float) (u + sn * sn / al)));
        }
    }
    conv_into(s, C, T, K, cv, [&](size_t i, double v) { out[i] = (float) ((accumulate ? out[i] : 0.0) + v); });
}

template <typename V>
void * upload(const std::vector<V> & v) {
    void * p = nullptr;
    cudaMalloc(&p, v.size() * sizeof(V));
    cudaMemcpy(p, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice);
    return p;
}

// The dilations of a stack's six convolutions.
constexpr int STACK_DIL[6] = { 1, 1, 3, 1, 5, 1 };

// A stack's six convolutions of random weights, scales, shifts, alphas and biases, on the
// host and on the device (freed with it).
struct random_stack {
    std::vector<host_conv>            convs;
    std::vector<vs::cuda::snake_conv> dconvs;
    std::vector<void *>               device;

    random_stack(int64_t C, int K, std::mt19937 & rng) : convs(6), dconvs(6) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (int i = 0; i < 6; ++i) {
            host_conv & h = convs[(size_t) i];
            h.dilation    = STACK_DIL[i];
            for (int64_t c = 0; c < C; ++c) {
                h.scale.push_back(1.0f + 0.3f * u(rng));
                h.shift.push_back(0.2f * u(rng));
                h.alpha.push_back(0.5f + 0.5f * (u(rng) + 1.0f));
                h.bias.push_back(0.1f * u(rng));
            }
            h.random_weights(C, K, rng);
            for (const auto * v : { &h.scale, &h.shift, &h.alpha, &h.bias }) {
                device.push_back(upload(*v));
            }
            device.push_back(upload(h.w16));
            vs::cuda::snake_conv & d = dconvs[(size_t) i];
            const size_t           n = device.size();
            d.scale                  = static_cast<const float *>(device[n - 5]);
            d.shift                  = static_cast<const float *>(device[n - 4]);
            d.alpha                  = static_cast<const float *>(device[n - 3]);
            d.bias                   = static_cast<const float *>(device[n - 2]);
            d.w                      = device[n - 1];
            d.dilation               = STACK_DIL[i];
        }
    }
    ~random_stack() {
        for (void * p : device) {
            cudaFree(p);
        }
    }
    random_stack(const random_stack &)             = delete;
    random_stack & operator=(const random_stack &) = delete;
};

// The host's stack over x [T, C].
std::vector<float> reference_stack(const std::vector<float> & x, int64_t C, int64_t T, int K,
                                   const std::vector<host_conv> & convs) {
    std::vector<float> want = x, y((size_t) (C * T));
    for (int p = 0; p < 3; ++p) {
        reference_step(want, y, false, C, T, K, convs[(size_t) (2 * p)]);
        reference_step(y, want, true, C, T, K, convs[(size_t) (2 * p + 1)]);
    }
    return want;
}

}  // namespace stack_test
