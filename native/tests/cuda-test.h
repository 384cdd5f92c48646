// What the CUDA tests share.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

// Whether a CUDA device is there; without one a test prints so and returns 77, which ctest
// counts as skipped.
inline bool cuda_device_present() {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        std::printf("no CUDA device: skipped\n");
        return false;
    }
    return true;
}
