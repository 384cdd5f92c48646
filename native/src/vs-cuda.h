// Kernels of the engine's own for CUDA devices, where ggml would run a stage as a long
// chain of tiny kernels: an LSTM's recurrence is one kernel for all of its steps, where
// as ggml ops it is about ten launches a step. Built when ggml has its CUDA backend;
// elsewhere vs::cuda::device_of() is -1 and the stages keep their ggml graphs.
#pragma once

#include <ggml-backend.h>
#include <ggml.h>

#include <cstdint>

namespace vs::cuda {

// The CUDA ordinal of `dev` when it is a CUDA device and this build has the kernels, else -1.
int device_of(ggml_backend_dev_t dev);

// Whether lstm() takes recurrent weights of this type and hidden size.
bool lstm_supported(ggml_type type, int64_t H);

// Whether lstm() on `device` runs one cluster of blocks a column (sm_90 and later, where the
// build has code for it) rather than one block a column.
bool lstm_uses_clusters(int device, ggml_type type, int64_t H);

// Device memory lstm() needs for n steps over `cols` columns.
size_t lstm_scratch_bytes(int64_t H, int64_t n, int64_t cols);

// n steps of LSTMs over `cols` independent columns; column j uses direction j % D of the
// weights. Pointers marked (dev) are device memory of CUDA device `device`:
//   gx    (dev) [4H, n, cols] F32: the steps' input projections plus bias, in step order
//   w_hh  (dev) [H, 4H, D] F16 or F32: recurrent weights, gate rows i, f, g, o
//   h, c  (host) [H, cols]: the state before the first step, replaced by the one after the last
//   out   (host) [H, cols, n]: every step's hidden state
//   scratch (dev) lstm_scratch_bytes()
// Synchronous; throws vs::error(VS_ERR_COMPUTE) when CUDA reports an error.
void lstm(int device, const float * gx, const void * w_hh, ggml_type type, int64_t H, int64_t n, int64_t cols,
          int64_t D, float * h, float * c, float * out, void * scratch);

}  // namespace vs::cuda
