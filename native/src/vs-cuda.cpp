// Builds without CUDA: no device is a CUDA device with the engine's kernels (vs-cuda.h).
#include "vs-cuda.h"

#include "vs-impl.h"

namespace vs::cuda {

int device_of(ggml_backend_dev_t) {
    return -1;
}

bool lstm_supported(ggml_type, int64_t) {
    return false;
}

bool lstm_uses_clusters(int, ggml_type, int64_t) {
    return false;
}

size_t lstm_scratch_bytes(int64_t, int64_t, int64_t) {
    return 0;
}

const float * lstm(int, const float *, const void *, ggml_type, int64_t, int64_t, int64_t, int64_t, int64_t, float *,
                   float *, float *, void *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void lstm_gather(int, const float *, int64_t, int64_t, int64_t, const lstm_span *, size_t) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

bool snake_supported(int64_t, int) {
    return false;
}

int64_t snake_frames(int64_t T, int, const int *, int, int) {
    return T;
}

size_t snake_scratch_bytes(int64_t, int64_t, int, const int *, int, int) {
    return 0;
}

void * blas_create(int) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void blas_destroy(void *) {}

void snake_stack(int, void *, void *, int64_t, int64_t, int, const snake_conv *, int, void *, const snake_segments &) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

size_t leaky_scratch_bytes(int64_t, int64_t, int, const int *, int) {
    return 0;
}

void leaky_stack(int, void *, float *, int64_t, int64_t, int, const leaky_conv *, int, float, const float *, void *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

bool leaky_conv_tanh_supported(int64_t, int) {
    return false;
}

void leaky_conv_tanh(int, const float *, int64_t, int64_t, int, float, const float *, const float *, float *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void upload(int, void *, const void *, size_t) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void download(int, void *, const void *, size_t) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void accumulate(int, float *, const float *, int64_t, float) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void stack_input(int, void *, const float *, const void *, int64_t, int64_t, const snake_segments &) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void accumulate_f16(int, void *, const void *, int64_t, float, float *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void copy(int, void *, const void *, size_t) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void clear(int, void *, size_t) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void gaussian(int, uint64_t, float *, int64_t, float) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void nsf_source(int, const chatterbox::nsf_params &, const float *, const double *, int64_t, float *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void synchronize(int) {}

void record(int, void *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

void wait(int, void *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

uint64_t queued() {
    return 0;
}

int64_t snake_bucket(int64_t T, const int *, int, const int *, int) {
    return T;
}

bool launch_cache::run(int, const std::string &, const std::function<void()> & queue) {
    queue();
    return false;
}

void launch_cache::clear() {}

size_t launch_cache::captured() const {
    return 0;
}

}  // namespace vs::cuda
