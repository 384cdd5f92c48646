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

void lstm(int, const float *, const void *, ggml_type, int64_t, int64_t, int64_t, int64_t, float *, float *, float *,
          void *) {
    throw error(VS_ERR_COMPUTE, "this build has no CUDA kernels");
}

}  // namespace vs::cuda
