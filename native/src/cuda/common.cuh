// What the engine's CUDA kernels (see vs-cuda.h) share: error checks, the calling thread's
// count of queued work, and the size of elementwise launches.
#pragma once

#include <cooperative_groups.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "../graph/graph.h"
#include "../vs-cuda.h"
#include "../vs-impl.h"
namespace vs::cuda {

inline void check(cudaError_t e, const char * what) {
    if (e != cudaSuccess) {
        throw error(VS_ERR_COMPUTE, std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
    }
}
inline void check_blas(cublasStatus_t st, const char * what) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        throw error(VS_ERR_COMPUTE, std::string("cuBLAS: ") + what + ": status " + std::to_string((int) st));
    }
}
// Calls on this thread that queued work on its stream (see queued()).
extern thread_local uint64_t n_queued;

constexpr int ELEMENTWISE = 256;
constexpr int MAX_GRID_Y  = 65535;  // CUDA's most blocks along y

inline unsigned elementwise_blocks(int64_t n4) {
    return (unsigned) std::min<int64_t>((n4 + ELEMENTWISE - 1) / ELEMENTWISE, 8192);
}

}  // namespace vs::cuda
