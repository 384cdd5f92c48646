// HiFT's excitation (chatterbox::nsf_sample) in a kernel: a thread a sample.
#include "../models/chatterbox/nsf.h"
#include "common.cuh"

namespace vs::cuda {

namespace {

__global__ void nsf_kernel(const chatterbox::nsf_params p, const float * __restrict__ f0,
                           const double * __restrict__ start, int64_t frames, float * __restrict__ out) {
    const int64_t n = frames * p.per;
    for (int64_t j = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; j < n; j += (int64_t) gridDim.x * blockDim.x) {
        const int64_t t = j / p.per;
        out[j]          = chatterbox::nsf_sample(p, f0[t], start + t * p.n, t, j - t * p.per);
    }
}

}  // namespace

void nsf_source(int device, const chatterbox::nsf_params & p, const float * f0, const double * start, int64_t frames,
                float * out) {
    check(cudaSetDevice(device), "cudaSetDevice");
    const int64_t n      = frames * p.per;
    const size_t  f0_b   = sizeof(float) * (size_t) frames;
    const size_t  st_b   = sizeof(double) * (size_t) (frames * p.n);
    const size_t  out_b  = sizeof(float) * (size_t) n;
    const size_t  st_at  = (f0_b + 255) & ~(size_t) 255;
    const size_t  out_at = st_at + ((st_b + 255) & ~(size_t) 255);
    void *        mem    = nullptr;
    check(cudaMallocAsync(&mem, out_at + out_b, cudaStreamPerThread), "source memory");
    auto * base = static_cast<uint8_t *>(mem);
    try {
        check(cudaMemcpyAsync(base, f0, f0_b, cudaMemcpyHostToDevice, cudaStreamPerThread), "source upload");
        check(cudaMemcpyAsync(base + st_at, start, st_b, cudaMemcpyHostToDevice, cudaStreamPerThread), "source upload");
        nsf_kernel<<<elementwise_blocks(n), ELEMENTWISE, 0, cudaStreamPerThread>>>(
            p, reinterpret_cast<const float *>(base), reinterpret_cast<const double *>(base + st_at), frames,
            reinterpret_cast<float *>(base + out_at));
        check(cudaGetLastError(), "source kernel launch");
        check(cudaMemcpyAsync(out, base + out_at, out_b, cudaMemcpyDeviceToHost, cudaStreamPerThread),
              "source download");
        check(cudaStreamSynchronize(cudaStreamPerThread), "source kernel");
    } catch (...) {
        cudaFreeAsync(mem, cudaStreamPerThread);
        throw;
    }
    check(cudaFreeAsync(mem, cudaStreamPerThread), "source memory");
}

}  // namespace vs::cuda
