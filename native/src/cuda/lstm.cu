// The LSTM recurrence in one kernel (a block, or on sm_90 a cluster, a column), and its output gathered into graph
// inputs.
#include "common.cuh"

namespace vs::cuda {

namespace {

constexpr int LSTM_THREADS    = 1024;  // 32 warps share a step's gate rows (one block a column)
constexpr int CLUSTER         = 8;     // blocks a column (sm_90 and later: one cluster a column)
constexpr int CLUSTER_THREADS = 256;
constexpr int LSTM_ROWS       = 4;  // gate rows a warp has in flight at once
constexpr int LSTM_MAX_VEC    = 2;  // 16-byte loads a lane makes per row: H <= 32 * 2 * (16 / sizeof(W))

__device__ __forceinline__ float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// 16 bytes of weights as floats.
template <typename W>
struct vec16;

template <>
struct vec16<half> {
    static constexpr int N = 8;

    __device__ static void load(const half * p, float * out) {
        const uint4   raw = *reinterpret_cast<const uint4 *>(p);
        const half2 * h2  = reinterpret_cast<const half2 *>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(h2[i]);
            out[2 * i]     = f.x;
            out[2 * i + 1] = f.y;
        }
    }
};

template <>
struct vec16<float> {
    static constexpr int N = 4;

    __device__ static void load(const float * p, float * out) {
        const float4 f = *reinterpret_cast<const float4 *>(p);
        out[0]         = f.x;
        out[1]         = f.y;
        out[2]         = f.z;
        out[3]         = f.w;
    }
};

// z[r] = row r of w (H weights a row) times h, for rows [0, R): each warp takes LSTM_ROWS
// rows at a time (so several row loads are in flight), each lane holding its slice of h in
// registers; lane 0 writes the sums. The caller synchronizes before reading z.
template <typename W>
__device__ __forceinline__ void gate_rows(const W * __restrict__ w, const float * h, int H, int R, float * z) {
    constexpr int V    = vec16<W>::N;
    const int     lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    const int     n_vec = (H + 32 * V - 1) / (32 * V);  // loads per lane and row
    float         hv[LSTM_MAX_VEC][V];
#pragma unroll
    for (int v = 0; v < LSTM_MAX_VEC; ++v) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const int k = (v * 32 + lane) * V + e;
            hv[v][e]    = v < n_vec && k < H ? h[k] : 0.0f;
        }
    }
    for (int r0 = warp * LSTM_ROWS; r0 < R; r0 += n_warps * LSTM_ROWS) {
        float acc[LSTM_ROWS] = {};
#pragma unroll
        for (int v = 0; v < LSTM_MAX_VEC; ++v) {
            const int k = (v * 32 + lane) * V;
            if (v >= n_vec || k >= H) {
                break;
            }
#pragma unroll
            for (int r = 0; r < LSTM_ROWS; ++r) {
                if (r0 + r < R) {
                    float wv[V];
                    vec16<W>::load(w + (size_t) (r0 + r) * H + k, wv);
#pragma unroll
                    for (int e = 0; e < V; ++e) {
                        acc[r] = fmaf(wv[e], hv[v][e], acc[r]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < LSTM_ROWS; ++r) {
#pragma unroll
            for (int off = 16; off > 0; off /= 2) {
                acc[r] += __shfl_xor_sync(0xffffffff, acc[r], off);
            }
            if (lane == 0 && r0 + r < R) {
                z[r0 + r] = acc[r];
            }
        }
    }
}

// One block per column. Each step: the block's warps take the gate rows (gate_rows), then
// the first H threads add the input projections, update the cell and publish h. The
// weights (at most a few MB) stay in L2 across steps; c stays in a register.
template <typename W>
__global__ void __launch_bounds__(LSTM_THREADS)
    lstm_kernel(const float * __restrict__ gx, const W * __restrict__ w_hh, int H, int n, int stride, int cols, int D,
                float * __restrict__ h_state, float * __restrict__ c_state, float * __restrict__ out) {
    extern __shared__ float smem[];
    float *                 sh = smem;      // h [H]
    float *                 z  = smem + H;  // recurrent part of the gates [4H]

    const int     col = blockIdx.x, tid = threadIdx.x, H4 = 4 * H;
    const W *     w = w_hh + (size_t) (col % D) * H4 * H;
    const float * g = gx + (size_t) col * stride * H4;

    for (int k = tid; k < H; k += blockDim.x) {
        sh[k] = h_state[(size_t) col * H + k];
    }
    float c = tid < H ? c_state[(size_t) col * H + tid] : 0.0f;
    __syncthreads();

    for (int j = 0; j < n; ++j) {
        gate_rows(w, sh, H, H4, z);
        __syncthreads();
        if (tid < H) {
            const float * gj = g + (size_t) j * H4;  // the step's input projections
            const float   i = sigmoid(z[tid] + gj[tid]), f = sigmoid(z[H + tid] + gj[H + tid]);
            const float   gg = tanhf(z[2 * H + tid] + gj[2 * H + tid]), o = sigmoid(z[3 * H + tid] + gj[3 * H + tid]);
            c                                        = f * c + i * gg;
            const float h                            = o * tanhf(c);
            sh[tid]                                  = h;
            out[((size_t) j * cols + col) * H + tid] = h;
        }
        __syncthreads();
    }
    if (tid < H) {
        h_state[(size_t) col * H + tid] = sh[tid];
        c_state[(size_t) col * H + tid] = c;
    }
}

// Gate activations from the exponential's fast intrinsic (a few ulp): the recurrence's steps
// wait on them, where sigmoidf's and tanhf's slow paths cost as much as the step's matvec.
__device__ __forceinline__ float fast_sigmoid(float x) {
    return __fdividef(1.0f, 1.0f + __expf(-x));
}

__device__ __forceinline__ float fast_tanh(float x) {
    return 2.0f * fast_sigmoid(2.0f * x) - 1.0f;
}

// sm_90 and later, H = CLUSTER_H (Kokoro's and the speaker encoder's LSTMs): one cluster of
// CLUSTER blocks a column, each taking the gates of U = H / CLUSTER hidden units, 4 U rows.
// Each row is Q threads', each holding H / Q of the row's weights in registers, as floats,
// for all of the steps (no weight traffic after the first), and reading h from its block's
// copy in shared memory (broadcasts). A warp's lanes are units of 4 Q lanes, lane Q g + q of
// a unit taking part q of gate g's row. A step: each lane's part of the dot product (eight
// accumulators), the row's sum (shuffles), its input projection (loaded a step ahead), then
// every lane of the unit gathers the four gates and updates the unit's cell (the same in
// all of them), and its lane r < CLUSTER writes h into block r's next copy (distributed
// shared memory); one cluster barrier a step, its arrival before the step's output is
// stored. No gate table in shared memory and no block barrier. (Four threads a row, twice
// the warps, was slower under Nsight Compute.)
constexpr int CLUSTER_H = 256;
constexpr int CLUSTER_Q = 2;

template <typename W>
__global__ void __launch_bounds__(CLUSTER_THREADS, 1)
    lstm_cluster_kernel(const float * __restrict__ gx, const W * __restrict__ w_hh, int n, int stride, int cols, int D,
                        float * __restrict__ h_state, float * __restrict__ c_state, float * __restrict__ out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg    = cooperative_groups;
    constexpr int H = CLUSTER_H, U = H / CLUSTER, H4 = 4 * H, Q = CLUSTER_Q, PART = H / Q, LANES = 4 * Q;
    constexpr int PAD = PART + 4;  // a part's stride in a copy of h: consecutive parts in different banks
    static_assert(32 % LANES == 0 && LANES >= CLUSTER && PART % 8 == 0 && 4 * U * Q == CLUSTER_THREADS,
                  "a unit's lanes in one warp, a row's threads in one block");
    cg::cluster_group cluster = cg::this_cluster();
    const int         rank    = (int) cluster.block_rank();
    const int         col = blockIdx.x / CLUSTER, tid = threadIdx.x, lane = tid % 32;
    const int         u = (tid / 32) * (32 / LANES) + lane / LANES, gate = (lane % LANES) / Q, part = lane % Q;
    const int         unit = rank * U + u, base = lane - lane % LANES, at = (unit / PART) * PAD + unit % PART;

    __shared__ __align__(16) float hb[2][Q * PAD];  // h now and next, part by part

    float     wr[PART];
    const W * w = w_hh + (size_t) (col % D) * H4 * H + (size_t) (gate * H + unit) * H + part * PART;
#pragma unroll
    for (int k = 0; k < PART; k += vec16<W>::N) {
        vec16<W>::load(w + k, wr + k);
    }
    for (int k = tid; k < H; k += blockDim.x) {
        hb[0][(k / PART) * PAD + k % PART] = h_state[(size_t) col * H + k];
    }
    float         c  = c_state[(size_t) col * H + unit];
    const float * g  = gx + (size_t) col * stride * H4 + gate * H + unit;
    float         gn = g[0];  // the step's input projection, loaded a step ahead
    cluster.sync();           // every block's copy of h is loaded

    for (int j = 0; j < n; ++j) {
        const float gj     = gn;
        gn                 = j + 1 < n ? g[(size_t) (j + 1) * H4] : 0.0f;
        const float * hc   = hb[j & 1] + part * PAD;
        float         a[8] = {};
#pragma unroll
        for (int k = 0; k < PART; k += 8) {
            const float4 h0 = *reinterpret_cast<const float4 *>(hc + k);
            const float4 h1 = *reinterpret_cast<const float4 *>(hc + k + 4);
            a[0]            = fmaf(wr[k], h0.x, a[0]);
            a[1]            = fmaf(wr[k + 1], h0.y, a[1]);
            a[2]            = fmaf(wr[k + 2], h0.z, a[2]);
            a[3]            = fmaf(wr[k + 3], h0.w, a[3]);
            a[4]            = fmaf(wr[k + 4], h1.x, a[4]);
            a[5]            = fmaf(wr[k + 5], h1.y, a[5]);
            a[6]            = fmaf(wr[k + 6], h1.z, a[6]);
            a[7]            = fmaf(wr[k + 7], h1.w, a[7]);
        }
        float z = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
#pragma unroll
        for (int off = 1; off < Q; off *= 2) {
            z += __shfl_xor_sync(0xffffffff, z, off);
        }
        z += gj;
        const float zi = __shfl_sync(0xffffffff, z, base), zf = __shfl_sync(0xffffffff, z, base + Q);
        const float zg = __shfl_sync(0xffffffff, z, base + 2 * Q), zo = __shfl_sync(0xffffffff, z, base + 3 * Q);
        c             = fast_sigmoid(zf) * c + fast_sigmoid(zi) * fast_tanh(zg);
        const float h = fast_sigmoid(zo) * fast_tanh(c);
        if (lane % LANES < CLUSTER) {
            cluster.map_shared_rank(hb[(j + 1) & 1], lane % LANES)[at] = h;
        }
        cluster.barrier_arrive();
        if (lane % LANES == 0) {
            out[((size_t) j * cols + col) * H + unit] = h;
        }
        cluster.barrier_wait();  // the next h is complete everywhere; this step's copy may be overwritten
    }
    if (lane % LANES == 0) {
        h_state[(size_t) col * H + unit] = hb[n & 1][at];
        c_state[(size_t) col * H + unit] = c;
    }
#endif
}

// The device launches clusters, and the code it runs was compiled for sm_90 or later (a
// build for older architectures only would run the kernel's empty body there, from PTX).
bool cluster_support(int device, ggml_type type, int64_t H) {
    int                cluster_launch = 0;
    cudaFuncAttributes fa{};
    cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device);
    const cudaError_t e = type == GGML_TYPE_F16 ? cudaFuncGetAttributes(&fa, lstm_cluster_kernel<half>)
                                                : cudaFuncGetAttributes(&fa, lstm_cluster_kernel<float>);
    return e == cudaSuccess && fa.ptxVersion >= 90 && cluster_launch && H == CLUSTER_H;
}

// cluster_support, asked of CUDA once per device, type and H.
bool cluster_supported(int device, ggml_type type, int64_t H) {
    static std::mutex                                    mutex;
    static std::map<std::tuple<int, int, int64_t>, bool> known;
    const std::lock_guard<std::mutex>                    lock(mutex);
    const auto                                           key = std::make_tuple(device, (int) type, H);
    auto                                                 it  = known.find(key);
    if (it == known.end()) {
        it = known.emplace(key, cluster_support(device, type, H)).first;
    }
    return it->second;
}

template <typename W>
void launch_cluster(cudaStream_t s, const float * gx, const void * w_hh, int64_t n, int64_t stride, int64_t cols,
                    int64_t D, float * h, float * c, float * out) {
    cudaLaunchConfig_t  cfg{};
    cudaLaunchAttribute attr{};
    attr.id               = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = CLUSTER;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.gridDim           = dim3((unsigned) (cols * CLUSTER));
    cfg.blockDim          = dim3(CLUSTER_THREADS);
    cfg.stream            = s;
    cfg.attrs             = &attr;
    cfg.numAttrs          = 1;
    check(cudaLaunchKernelEx(&cfg, lstm_cluster_kernel<W>, gx, static_cast<const W *>(w_hh), (int) n, (int) stride,
                             (int) cols, (int) D, h, c, out),
          "LSTM kernel launch");
}

// lstm_gather's spans a launch, passed by value (kernel parameters; 32 * 32 bytes).
constexpr int GATHER_SPANS = 32;

struct gather_spans {
    lstm_span s[GATHER_SPANS];
};

// Block (x, i) writes frames x, x + gridDim.x, ... of span i (lstm_span), a thread a channel.
__global__ void lstm_gather_kernel(const float * __restrict__ out, int H, int64_t cols, int D, gather_spans a) {
    const lstm_span & sp = a.s[blockIdx.y];
    const int         C  = D * H;
    for (int64_t t = blockIdx.x; t < sp.frames; t += gridDim.x) {
        for (int ch = threadIdx.x; ch < C; ch += blockDim.x) {
            const int d = ch / H, k = ch - d * H;
            float     v = 0.0f;
            if (t < sp.steps) {
                const int64_t j = d == 0 ? t : sp.steps - 1 - t;
                v               = out[(j * cols + sp.column + d) * H + k];
            }
            sp.dst[t * C + ch] = v;
        }
    }
}

}  // namespace

bool lstm_supported(ggml_type type, int64_t H) {
    const int64_t V = type == GGML_TYPE_F16 ? 8 : type == GGML_TYPE_F32 ? 4 : 0;
    return V > 0 && H > 0 && H % V == 0 && H <= 32 * LSTM_MAX_VEC * V && H <= LSTM_THREADS;
}

bool lstm_uses_clusters(int device, ggml_type type, int64_t H) {
    return lstm_supported(type, H) && cudaSetDevice(device) == cudaSuccess && cluster_supported(device, type, H);
}

size_t lstm_scratch_bytes(int64_t H, int64_t n, int64_t cols) {
    return sizeof(float) * (size_t) (H * cols * (2 + n));
}

const float * lstm(int device, const float * gx, const void * w_hh, ggml_type type, int64_t H, int64_t n,
                   int64_t stride, int64_t cols, int64_t D, float * h, float * c, float * out, void * scratch) {
    GGML_ASSERT(lstm_supported(type, H) && cols > 0 && n > 0 && stride >= n && !h == !c);
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    cudaStream_t s       = cudaStreamPerThread;
    float *      h_dev   = static_cast<float *>(scratch);
    float *      c_dev   = h_dev + H * cols;
    float *      out_dev = c_dev + H * cols;
    const size_t state   = sizeof(float) * (size_t) (H * cols);
    const size_t shared  = sizeof(float) * (size_t) (5 * H);
    if (h) {
        check(cudaMemcpyAsync(h_dev, h, state, cudaMemcpyHostToDevice, s), "state upload");
        check(cudaMemcpyAsync(c_dev, c, state, cudaMemcpyHostToDevice, s), "state upload");
    } else {
        check(cudaMemsetAsync(h_dev, 0, 2 * state, s), "state reset");  // h_dev and c_dev, adjacent
    }
    if (cluster_supported(device, type, H)) {
        if (type == GGML_TYPE_F16) {
            launch_cluster<half>(s, gx, w_hh, n, stride, cols, D, h_dev, c_dev, out_dev);
        } else {
            launch_cluster<float>(s, gx, w_hh, n, stride, cols, D, h_dev, c_dev, out_dev);
        }
    } else if (type == GGML_TYPE_F16) {
        lstm_kernel<half><<<(unsigned) cols, LSTM_THREADS, shared, s>>>(gx, static_cast<const half *>(w_hh), (int) H,
                                                                        (int) n, (int) stride, (int) cols, (int) D,
                                                                        h_dev, c_dev, out_dev);
    } else {
        lstm_kernel<float><<<(unsigned) cols, LSTM_THREADS, shared, s>>>(gx, static_cast<const float *>(w_hh), (int) H,
                                                                         (int) n, (int) stride, (int) cols, (int) D,
                                                                         h_dev, c_dev, out_dev);
    }
    check(cudaGetLastError(), "LSTM kernel launch");
    if (h) {
        check(cudaMemcpyAsync(h, h_dev, state, cudaMemcpyDeviceToHost, s), "state download");
        check(cudaMemcpyAsync(c, c_dev, state, cudaMemcpyDeviceToHost, s), "state download");
    }
    if (out) {
        check(cudaMemcpyAsync(out, out_dev, state * n, cudaMemcpyDeviceToHost, s), "LSTM output download");
    }
    if (out || h) {  // something to read on the host
        check(cudaStreamSynchronize(s), "LSTM kernel");
    }
    return out_dev;
}

void lstm_gather(int device, const float * out, int64_t H, int64_t cols, int64_t D, const lstm_span * spans,
                 size_t n_spans) {
    GGML_ASSERT(D >= 1 && D <= 2);
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    for (size_t i = 0; i < n_spans; i += GATHER_SPANS) {
        gather_spans a{};
        const int    n    = (int) std::min<size_t>(GATHER_SPANS, n_spans - i);
        int64_t      most = 1;
        for (int k = 0; k < n; ++k) {
            a.s[k] = spans[i + (size_t) k];
            GGML_ASSERT(a.s[k].steps <= a.s[k].frames && a.s[k].column + D <= cols);
            most = std::max(most, a.s[k].frames);
        }
        const dim3 grid((unsigned) std::min<int64_t>(most, MAX_GRID_Y), (unsigned) n);
        lstm_gather_kernel<<<grid, 256, 0, cudaStreamPerThread>>>(out, (int) H, cols, (int) D, a);
        check(cudaGetLastError(), "LSTM gather launch");
    }
}

}  // namespace vs::cuda
