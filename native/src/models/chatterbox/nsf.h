// HiFT's neural source filter excitation, sample by sample: one definition for the host
// (hift.cpp) and the engine's CUDA kernel (cuda/source.cu).
#pragma once

#include <cmath>
#include <cstdint>

#include "../../vs-impl.h"

namespace vs::chatterbox {

constexpr int NSF_MAX_HARMONICS = 65;  // the fundamental and hift_hparams' most overtones

// SineGen and the source's linear layer: per harmonic i < n (the fundamental first), the
// running sum of f0 (i + 1) / sample_rate (in double, as PyTorch's cumsum on the CPU sums),
// its fraction, a phase; voiced samples (f0 > threshold) the sine times alpha, unvoiced ones
// none; noise of sigma (voiced) or alpha / 3 (unvoiced) times noise_scale; tanh of their
// weighted sum.
struct nsf_params {
    int      n           = 0;  // harmonics, the fundamental included
    int64_t  per         = 0;  // samples a frame of f0
    float    sample_rate = 0.0f, alpha = 0.0f, sigma = 0.0f, threshold = 0.0f, noise_scale = 0.0f, bias = 0.0f;
    uint64_t seed                      = 0;
    int64_t  first                     = 0;  // the first frame's first sample in the noise's stream
    float    weight[NSF_MAX_HARMONICS] = {};
    float    phase[NSF_MAX_HARMONICS]  = {};
};

// Sample k of frame t (f0 f): `start` [n] the harmonics' cycles before the frame's first
// sample. Noise value v of the stream is gaussian_pair(seed, v / 2)'s first (v even) or
// second half, v = (sample's place) n + i.
VS_HOST_DEVICE inline float nsf_sample(const nsf_params & p, float f, const double * start, int64_t t, int64_t k) {
    const bool     voiced = f > p.threshold;
    const float    amp    = voiced ? p.sigma : p.alpha / 3.0f;
    const uint64_t v0     = (uint64_t) (p.first + t * p.per + k) * (uint64_t) p.n;
    float          acc = p.bias, a = 0.0f, b = 0.0f;
    for (int i = 0; i < p.n; ++i) {
        const float    inc    = f * (float) (i + 1) / p.sample_rate;
        const float    cycles = (float) (start[i] + (double) (k + 1) * (double) inc);
        const float    frac   = cycles - floorf(cycles);
        float          s      = voiced ? p.alpha * sinf(6.28318530718f * frac + p.phase[i]) : 0.0f;
        const uint64_t v      = v0 + (uint64_t) i;
        if (p.noise_scale > 0.0f) {
            if (i == 0 || (v & 1) == 0) {
                gaussian_pair(p.seed, v >> 1, 1.0f, a, b);
            }
            s += p.noise_scale * amp * ((v & 1) ? b : a);
        }
        acc += p.weight[i] * s;
    }
    return tanhf(acc);
}

}  // namespace vs::chatterbox
