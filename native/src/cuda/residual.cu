// Residual stacks in the engine's kernels: Kokoro's AdaIN + Snake blocks and Piper's LeakyReLU blocks (elementwise
// kernels around cuBLAS GEMMs), and Piper's output layer.
#include "common.cuh"

namespace vs::cuda {

namespace {

// ---------------------------------------------------------------- Snake residual stacks

constexpr int SNAKE_CH    = 32;   // channels a stack's C is a multiple of
constexpr int SNAKE_ROWS  = 8;    // frames a block row (its warps)
constexpr int STAT_GROUPS = 128;  // partial sums a channel (a grid row each), summed in order

constexpr int ROW_BLOCKS = 4096;  // most blocks of a row kernel (they stride on)
constexpr int VEC_ROWS   = 4;     // rows whose float4s a thread of a row kernel loads at once

// One convolution's layout: per dilation phase, J windows of K frames (S input frames,
// the last window's K - 1 following ones included); the GEMMs write d * K * J frames. J is
// rounded as conv1d_phases' (phase_columns): cuBLAS's first call of a shape is slow, and so
// a sentence's shapes are few and the prewarm's sentences have called them. A packed batch
// (`fine`) rounds J up to a sixteenth of its power of two instead: its frames are a sum of
// sentences', its throughput what counts, and a power of two computes up to twice its
// windows.
struct conv_geom {
    int64_t J = 0, S = 0, pad = 0, T_in = 0, frames = 0;
};

conv_geom geom(int64_t T, int K, int d, bool fine = false) {
    conv_geom     g;
    const int64_t per_phase = (T + d - 1) / d, n = (per_phase + K - 1) / K, octave = phase_columns(n);
    const int64_t step = fine && octave >= 64 ? octave / 16 : octave;
    g.J                = (n + step - 1) / step * step;
    g.S                = g.J * K + K - 1;
    g.pad              = (int64_t) d * (K - 1) / 2;
    g.T_in             = d * g.S;
    g.frames           = (int64_t) d * K * g.J;
    return g;
}

size_t aligned(size_t bytes) {
    return (bytes + 255) & ~(size_t) 255;
}

// The AdaIN statistics' block columns: 32 float4s (128 channels) each.
int64_t stat_columns(int64_t C) {
    return (C / 4 + 31) / 32;
}

// Channels c4 * 4 .. c4 * 4 + 3 of a row (16-byte aligned: C is a multiple of 4).
__device__ __forceinline__ float4 ld4(const float * row, int c4) {
    return reinterpret_cast<const float4 *>(row)[c4];
}

// Four F16 channels (8-byte aligned: C is a multiple of 4) as floats.
__device__ __forceinline__ float4 ld4(const half * row, int c4) {
    const uint2  u = reinterpret_cast<const uint2 *>(row)[c4];
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ float4 ldcg4(const float * row, int c4) {
    return __ldcg(reinterpret_cast<const float4 *>(row) + c4);
}

__device__ __forceinline__ void st4(float * row, int c4, float4 v) {
    reinterpret_cast<float4 *>(row)[c4] = v;
}

// As F16, rounded to nearest (as __float2half), in one 8-byte store.
__device__ __forceinline__ void st4(half * row, int c4, float4 v) {
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    uint2         u;
    u.x                                = *reinterpret_cast<const unsigned *>(&a);
    u.y                                = *reinterpret_cast<const unsigned *>(&b);
    reinterpret_cast<uint2 *>(row)[c4] = u;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ float4 sub4(float4 a, float4 b) {
    return make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w);
}

__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
    return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

// Snake of u with its channel's alpha: u + sin^2(alpha u) / alpha (the sine's fast intrinsic).
__device__ __forceinline__ float snake(float u, float al) {
    const float sn = __sinf(al * u);
    return fmaf(sn * sn, 1.0f / al, u);
}

__device__ __forceinline__ float leaky(float u, float slope) {
    return u > 0.0f ? u : slope * u;
}

// The AdaIN's device scratch: partial sums [segments][STAT_GROUPS][C] of v and v^2, the
// coefficients [segments][2 C] and a counter [segments][stat_columns(C)] of each column's
// blocks done (zero between launches).
struct adain_scratch {
    float *    sums       = nullptr;
    float *    squares    = nullptr;
    float *    coef       = nullptr;
    unsigned * done       = nullptr;
    size_t     done_bytes = 0;
};

// Its bytes for C channels and `segments` segments; with `st`, its parts laid out from `base`.
size_t adain_layout(int64_t C, int segments, uint8_t * base = nullptr, adain_scratch * st = nullptr) {
    const size_t partial = aligned(sizeof(float) * STAT_GROUPS * C * segments);
    const size_t coef    = aligned(sizeof(float) * 2 * C * segments);
    const size_t done    = sizeof(unsigned) * stat_columns(C) * segments;
    if (st) {
        st->sums       = reinterpret_cast<float *>(base);
        st->squares    = reinterpret_cast<float *>(base + partial);
        st->coef       = reinterpret_cast<float *>(base + 2 * partial);
        st->done       = reinterpret_cast<unsigned *>(base + 2 * partial + coef);
        st->done_bytes = done;
    }
    return 2 * partial + coef + aligned(done);
}

// A channel's statistics and the AdaIN as y = a x + b in one launch. A thread takes four
// channels (a float4), a block row of 32 lanes 128 of them. Block (bx, g, seg) sums, over
// frames g * ROWS + r (r < ROWS), then every STAT_GROUPS * ROWS frames on, v and v^2 with
// v = x[t][c] - x[0][c] (shifted by the channel's first value, so that v^2's sum does not lose
// the variance to a large mean), over segment seg's frames (see snake_segments). The last of a
// column's STAT_GROUPS blocks to finish (counted in `done`, which it sets back to zero) adds
// their partial sums in order and writes coef [a_0..a_C-1, b_0..b_C-1], segment seg's 2 C values
// on from the previous one's, with its style's scale and shift `stride` floats on.
__global__ void adain_stats(const half * __restrict__ x, int64_t T, int C, const int * __restrict__ range,
                            float * __restrict__ sums, float * __restrict__ squares, unsigned * __restrict__ done,
                            const float * __restrict__ scale, const float * __restrict__ shift, int64_t stride,
                            float * __restrict__ coef) {
    __shared__ float4 rows[2][SNAKE_ROWS][32];
    __shared__ bool   last;
    const int         c4 = blockIdx.x * 32 + threadIdx.x, grp = blockIdx.y, seg = blockIdx.z;
    const bool        on = c4 < C / 4;
    if (range) {
        x += (int64_t) range[2 * seg] * C;
        T = range[2 * seg + 1];
    }
    const float4 first = on ? ld4(x, c4) : float4{};
    float4       acc = {}, acc2 = {};
    if (on) {
#pragma unroll 4
        for (int64_t t = (int64_t) grp * SNAKE_ROWS + threadIdx.y; t < T; t += (int64_t) STAT_GROUPS * SNAKE_ROWS) {
            const float4 v = sub4(ld4(x + t * C, c4), first);
            acc            = add4(acc, v);
            acc2           = add4(acc2, mul4(v, v));
        }
    }
    rows[0][threadIdx.y][threadIdx.x] = acc;
    rows[1][threadIdx.y][threadIdx.x] = acc2;
    __syncthreads();
    sums += (size_t) seg * STAT_GROUPS * C;
    squares += (size_t) seg * STAT_GROUPS * C;
    if (threadIdx.y < 2 && on) {
        float4 s = {};
        for (int r = 0; r < SNAKE_ROWS; ++r) {
            s = add4(s, rows[threadIdx.y][r][threadIdx.x]);
        }
        st4(threadIdx.y == 0 ? sums + (size_t) grp * C : squares + (size_t) grp * C, c4, s);
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        unsigned * counter = done + (size_t) seg * gridDim.x + blockIdx.x;
        last               = atomicAdd(counter, 1u) == STAT_GROUPS - 1;
        if (last) {
            *counter = 0;
        }
    }
    __syncthreads();
    if (!last) {
        return;
    }
    // The last block: each row adds STAT_GROUPS / ROWS groups in order, then row 0 the rows.
    __threadfence();
    constexpr int per = STAT_GROUPS / SNAKE_ROWS;
    float4        s = {}, q = {};
    if (on) {
        for (int i = threadIdx.y * per; i < (threadIdx.y + 1) * per; ++i) {
            s = add4(s, ldcg4(sums + (size_t) i * C, c4));
            q = add4(q, ldcg4(squares + (size_t) i * C, c4));
        }
    }
    rows[0][threadIdx.y][threadIdx.x] = s;
    rows[1][threadIdx.y][threadIdx.x] = q;
    __syncthreads();
    if (threadIdx.y != 0 || !on) {
        return;
    }
    s = q = float4{};
    for (int r = 0; r < SNAKE_ROWS; ++r) {
        s = add4(s, rows[0][r][threadIdx.x]);
        q = add4(q, rows[1][r][threadIdx.x]);
    }
    const float sv[4] = { s.x, s.y, s.z, s.w }, qv[4] = { q.x, q.y, q.z, q.w };
    const float fv[4] = { first.x, first.y, first.z, first.w };
    for (int j = 0; j < 4; ++j) {
        const int   c = 4 * c4 + j;
        const float d = sv[j] / (float) T, var = fmaxf(qv[j] / (float) T - d * d, 0.0f), mean = fv[j] + d;
        const float a                      = scale[seg * stride + c] * rsqrtf(var + 1e-5f);
        coef[(size_t) seg * 2 * C + c]     = a;
        coef[(size_t) seg * 2 * C + C + c] = shift[seg * stride + c] - mean * a;
    }
}

// How a row kernel's threads take rows of C floats, four channels (a float4) a thread: a
// warp's lanes go `lanes` to a row (C / 4 where that divides 32, else 32; a lane takes
// channels lane, lane + lanes, ... of the row's float4s) and so 32 / lanes rows at once,
// VEC_ROWS times over (their loads in flight together): rows r0 + k * rpw, k < VEC_ROWS,
// then `step` rows on.
struct row_split {
    int     C4, lanes, rpw, lane;
    int64_t r0, step;

    __device__ explicit row_split(int C) {
        C4                 = C / 4;
        lanes              = C4 < 32 && 32 % C4 == 0 ? C4 : 32;
        rpw                = 32 / lanes;
        const int64_t warp = ((int64_t) blockIdx.x * blockDim.x + threadIdx.x) / 32;
        lane               = (int) (threadIdx.x % 32) % lanes;
        r0                 = warp * VEC_ROWS * rpw + (int) (threadIdx.x % 32) / lanes;
        step               = (int64_t) gridDim.x * (blockDim.x / 32) * VEC_ROWS * rpw;
    }
};

// A row kernel's blocks for `rows` rows of C floats (at most ROW_BLOCKS: they stride on).
unsigned row_blocks(int64_t C, int64_t rows) {
    const int64_t C4 = C / 4, rpw = C4 < 32 && 32 % C4 == 0 ? 32 / C4 : 1;
    const int64_t per = (int64_t) (ELEMENTWISE / 32) * VEC_ROWS * rpw;
    return (unsigned) std::clamp<int64_t>((rows + per - 1) / per, 1, ROW_BLOCKS);
}

// Snake(AdaIN(x)) as F16 into the dilation's phases of the padded input (zeros around x):
// padded frame p = q + d i goes to phase q (blockIdx.y), position i. With segments (`frame`
// not null), each frame's AdaIN is its segment's and Snake's output is zero in the gaps;
// with one segment's range and no frame map, zero outside the range. The
// sine is the fast intrinsic: its error, which grows with the argument, stays below F16's
// rounding of the output (test-cuda-snake checks against the host's sin).
__global__ void __launch_bounds__(ELEMENTWISE, 4)
    snake_phases(const half * __restrict__ x, int64_t T, int C, const int * __restrict__ frame,
                 const int * __restrict__ range, const float * __restrict__ coef, const float * __restrict__ alpha,
                 int64_t pad, int d, int64_t S, half * __restrict__ out) {
    const row_split rs(C);
    const int       q  = blockIdx.y;
    half *          o  = out + (size_t) q * S * C;
    const int64_t   lo = !frame && range ? range[0] : 0, hi = !frame && range ? lo + range[1] : T;
    for (int64_t r0 = rs.r0; r0 < S; r0 += rs.step) {
        for (int c4 = rs.lane; c4 < rs.C4; c4 += rs.lanes) {
            float4 u[VEC_ROWS];
            int    seg[VEC_ROWS];
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t i = r0 + (int64_t) k * rs.rpw, t = q + d * i - pad;
                const bool    in = i < S && t >= 0 && t < T;
                u[k]             = in ? ld4(x + t * C, c4) : float4{};
                seg[k]           = in && t >= lo && t < hi ? (frame ? frame[t] : 0) : -1;
            }
            const float4 al = ld4(alpha, c4);
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t i = r0 + (int64_t) k * rs.rpw;
                if (i >= S) {
                    continue;
                }
                float4 v = {};
                if (seg[k] >= 0) {
                    const float * kc = coef + (size_t) seg[k] * 2 * C;
                    const float4  a = ld4(kc, c4), b = ld4(kc + C, c4);
                    v = make_float4(snake(fmaf(a.x, u[k].x, b.x), al.x), snake(fmaf(a.y, u[k].y, b.y), al.y),
                                    snake(fmaf(a.z, u[k].z, b.z), al.z), snake(fmaf(a.w, u[k].w, b.w), al.w));
                }
                st4(o + i * C, c4, v);
            }
        }
    }
}

// A stack's input: dst[t][c] = a[t][c] + b[t][c] (b null: a alone) as F16 on the frames of
// the segments (as snake_phases: a frame map, or one segment's range, or all T), zeros in
// the gaps, whatever a and b hold there.
__global__ void __launch_bounds__(ELEMENTWISE, 4)
    stack_input_kernel(half * __restrict__ dst, const float * __restrict__ a, const half * __restrict__ b, int64_t T,
                       int C, const int * __restrict__ frame, const int * __restrict__ range) {
    const row_split rs(C);
    const int64_t   lo = !frame && range ? range[0] : 0, hi = !frame && range ? lo + range[1] : T;
    for (int64_t r0 = rs.r0; r0 < T; r0 += rs.step) {
        for (int c4 = rs.lane; c4 < rs.C4; c4 += rs.lanes) {
            float4 u[VEC_ROWS];
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t t  = r0 + (int64_t) k * rs.rpw;
                const bool    in = t < T && t >= lo && t < hi && (!frame || frame[t] >= 0);
                u[k]             = in ? ld4(a + t * C, c4) : float4{};
                u[k]             = in && b ? add4(u[k], ld4(b + t * C, c4)) : u[k];
            }
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t t = r0 + (int64_t) k * rs.rpw;
                if (t < T) {
                    st4(dst + t * C, c4, u[k]);
                }
            }
        }
    }
}

// x[t][c] += b0[c] + b1[c] + b2[c] for t < T (null biases left out).
__global__ void __launch_bounds__(ELEMENTWISE, 4)
    add_biases(half * __restrict__ x, int64_t T, int C, const float * __restrict__ b0, const float * __restrict__ b1,
               const float * __restrict__ b2) {
    const row_split rs(C);
    for (int64_t r0 = rs.r0; r0 < T; r0 += rs.step) {
        for (int c4 = rs.lane; c4 < rs.C4; c4 += rs.lanes) {
            float4 sum = b0 ? ld4(b0, c4) : float4{};
            sum        = b1 ? add4(sum, ld4(b1, c4)) : sum;
            sum        = b2 ? add4(sum, ld4(b2, c4)) : sum;
            float4 u[VEC_ROWS];
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t t = r0 + (int64_t) k * rs.rpw;
                u[k]            = t < T ? ld4(x + t * C, c4) : float4{};
            }
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t t = r0 + (int64_t) k * rs.rpw;
                if (t < T) {
                    st4(x + t * C, c4, add4(u[k], sum));
                }
            }
        }
    }
}

// The convolution's GEMMs over the phases `ph`, onto beta times `out` (F32 or F16; beta 0:
// written; 1: the bias or the residual that it holds, accumulated). Output frame
// t = q + d (r + K j) is window j of tap phase r in dilation phase q: its input frames
// q + d (r + K j + k), k < K, are K C consecutive values of phase q.
void phase_gemms(cublasHandle_t h, const void * w, const half * ph, void * out, cudaDataType_t out_type, int64_t C,
                 int K, int d, const conv_geom & g, float beta) {
    const float  one = 1.0f;
    const int    KC  = (int) (K * C);
    const size_t es  = out_type == CUDA_R_16F ? sizeof(half) : sizeof(float);
    for (int q = 0; q < d; ++q) {
        check_blas(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int) C, (int) g.J, KC, &one, w, CUDA_R_16F,
                                              KC, 0, ph + (size_t) q * g.S * C, CUDA_R_16F, KC, (long long) C, &beta,
                                              static_cast<uint8_t *>(out) + es * (size_t) q * C, out_type, d * KC,
                                              (long long) d * C, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "convolution GEMM");
    }
}

// The grid of a phase kernel: a row kernel's blocks over a phase's positions, a grid row (y)
// a dilation phase.
dim3 phase_grid(int64_t C, const conv_geom & g, int d) {
    return dim3(row_blocks(C, g.S), (unsigned) d);
}

// One convolution of a pair without its bias: out = conv(Snake(AdaIN(in))), or out += that
// with `accumulate` (see snake_stack for the biases).
void snake_conv_step(cudaStream_t s, cublasHandle_t h, const half * in, half * out, bool accumulate, int64_t C,
                     int64_t T, int K, const snake_conv & cv, const snake_segments & seg, const adain_scratch & st,
                     half * ph) {
    const int       d = cv.dilation;
    const conv_geom g = geom(T, K, d, seg.n > 1);
    adain_stats<<<dim3((unsigned) stat_columns(C), STAT_GROUPS, (unsigned) seg.n), dim3(32, SNAKE_ROWS), 0, s>>>(
        in, T, (int) C, seg.range, st.sums, st.squares, st.done, cv.scale, cv.shift, seg.style_stride, st.coef);
    snake_phases<<<phase_grid(C, g, d), ELEMENTWISE, 0, s>>>(in, T, (int) C, seg.frame, seg.range, st.coef, cv.alpha,
                                                             g.pad, d, g.S, ph);
    check(cudaGetLastError(), "Snake kernels launch");
    phase_gemms(h, cv.w, ph, out, CUDA_R_16F, C, K, d, g, accumulate ? 1.0f : 0.0f);
}

// LeakyReLU(x) times the frame's mask as F16 into the dilation's phases of the padded input
// (as snake_phases), and the bias added to x where it has a frame: in place, each value
// read before it is written, by the same thread. Its loop is snake_phases' written out
// again: one loop for both, the per-channel loads in a lambda, made snake_phases slower
// (tools/kernel_profile.py --as-run).
__global__ void __launch_bounds__(ELEMENTWISE)
    leaky_phases(float * x, int64_t T, int C, float slope, const float * __restrict__ mask, int64_t pad, int d,
                 int64_t S, half * __restrict__ out, const float * __restrict__ bias) {
    const row_split rs(C);
    const int       q = blockIdx.y;
    half *          o = out + (size_t) q * S * C;
    for (int64_t r0 = rs.r0; r0 < S; r0 += rs.step) {
        for (int c4 = rs.lane; c4 < rs.C4; c4 += rs.lanes) {
            float4 u[VEC_ROWS];
            float  m[VEC_ROWS];
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t i = r0 + (int64_t) k * rs.rpw, t = q + d * i - pad;
                const bool    in = i < S && t >= 0 && t < T;
                u[k]             = in ? ld4(x + t * C, c4) : float4{};
                m[k]             = in ? (mask ? mask[t] : 1.0f) : 0.0f;
            }
            const float4 bc = ld4(bias, c4);
#pragma unroll
            for (int k = 0; k < VEC_ROWS; ++k) {
                const int64_t i = r0 + (int64_t) k * rs.rpw, t = q + d * i - pad;
                if (i >= S) {
                    continue;
                }
                float4 v = {};
                if (t >= 0 && t < T) {
                    const float4 w = u[k];
                    v = make_float4(leaky(w.x, slope) * m[k], leaky(w.y, slope) * m[k], leaky(w.z, slope) * m[k],
                                    leaky(w.w, slope) * m[k]);
                    st4(x + t * C, c4, add4(w, bc));
                }
                st4(o + i * C, c4, v);
            }
        }
    }
}

__global__ void accumulate_kernel(float4 * __restrict__ sum, const float4 * __restrict__ x, int64_t n4, float scale) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t) gridDim.x * blockDim.x) {
        const float4 u = sum[i], v = x[i];
        sum[i] = make_float4((u.x + v.x) * scale, (u.y + v.y) * scale, (u.z + v.z) * scale, (u.w + v.w) * scale);
    }
}

// accumulate_kernel over F16 values, four a thread (8 bytes), summed as floats: sum = (sum +
// x) * scale (x null: sum * scale), or that into out (F32).
__global__ void accumulate_f16_kernel(half * sum, const half * __restrict__ x, int64_t n4, float scale,
                                      float * __restrict__ out) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t) gridDim.x * blockDim.x) {
        float4 v = ld4(sum + 4 * i, 0);
        v        = x ? add4(v, ld4(x + 4 * i, 0)) : v;
        v        = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
        if (out) {
            st4(out + 4 * i, 0, v);
        } else {
            st4(sum + 4 * i, 0, v);
        }
    }
}

// HiFi-GAN's output layer (Piper's conv_post, C -> 1, no bias): out[t] = tanh(sum over taps k
// and channels c of w[k][c] * LeakyReLU(x[t + k - K/2][c]) * mask[t + k - K/2]), zeros past
// either end. A block takes POST_FRAMES outputs: their input frames, LeakyReLU'd and masked,
// in shared memory (rows padded by one against bank conflicts), then one thread an output.
constexpr int POST_FRAMES = 256;

size_t post_shared_bytes(int64_t C, int K) {
    return sizeof(float) * (size_t) ((POST_FRAMES + K - 1) * (C + 1) + K * C);
}

__global__ void leaky_conv_tanh_kernel(const float * __restrict__ x, int64_t T, int C, int K, float slope,
                                       const float * __restrict__ mask, const float * __restrict__ w,
                                       float * __restrict__ out) {
    extern __shared__ float sh[];
    const int               rows = POST_FRAMES + K - 1, stride = C + 1, pad = K / 2;
    float *                 tile = sh;
    float *                 ws   = sh + rows * stride;
    const int64_t           t0   = (int64_t) blockIdx.x * POST_FRAMES;
    for (int i = threadIdx.x; i < K * C; i += blockDim.x) {
        ws[i] = w[i];
    }
    for (int i = threadIdx.x; i < rows * C; i += blockDim.x) {
        const int     r = i / C, c = i % C;
        const int64_t t = t0 + r - pad;
        float         v = 0.0f;
        if (t >= 0 && t < T) {
            const float u = x[t * C + c];
            v             = (u > 0.0f ? u : slope * u) * (mask ? mask[t] : 1.0f);
        }
        tile[r * stride + c] = v;
    }
    __syncthreads();
    const int64_t t = t0 + threadIdx.x;
    if (t >= T) {
        return;
    }
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        const float * row = tile + (threadIdx.x + k) * stride;
        for (int c = 0; c < C; ++c) {
            acc = fmaf(ws[k * C + c], row[c], acc);
        }
    }
    out[t] = tanhf(acc);
}

}  // namespace

bool snake_supported(int64_t C, int K) {
    return C > 0 && C % SNAKE_CH == 0 && K > 1 && K % 2 == 1;
}

int64_t snake_frames(int64_t T, int K, const int * dilations, int n, int segments) {
    int64_t frames = T;
    for (int i = 0; i < n; ++i) {
        frames = std::max(frames, geom(T, K, dilations[i], segments > 1).frames);
    }
    return frames;
}

size_t snake_scratch_bytes(int64_t C, int64_t T, int K, const int * dilations, int n, int segments) {
    int64_t T_in = 0;
    for (int i = 0; i < n; ++i) {
        T_in = std::max(T_in, geom(T, K, dilations[i], segments > 1).T_in);
    }
    return adain_layout(C, segments) +
           aligned(sizeof(half) * (size_t) (C * snake_frames(T, K, dilations, n, segments))) +
           aligned(sizeof(half) * (size_t) (C * T_in));
}

void snake_stack(int device, void * blas, void * x_f16, int64_t C, int64_t T, int K, const snake_conv * convs,
                 int n_pairs, void * scratch, const snake_segments & seg) {
    GGML_ASSERT(snake_supported(C, K) && T > 0 && blas && seg.n >= 1 && (seg.n == 1 || (seg.range && seg.frame)));
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    std::vector<int> dil;
    for (int i = 0; i < 2 * n_pairs; ++i) {
        dil.push_back(convs[i].dilation);
    }
    auto * base  = static_cast<uint8_t *>(scratch);
    auto   carve = [&](size_t bytes) {
        uint8_t * p = base;
        base += aligned(bytes);
        return p;
    };
    adain_scratch st;
    carve(adain_layout(C, seg.n, base, &st));
    check(cudaMemsetAsync(st.done, 0, st.done_bytes, cudaStreamPerThread), "AdaIN counters");
    half * y = reinterpret_cast<half *>(
        carve(sizeof(half) * (size_t) (C * snake_frames(T, K, dil.data(), 2 * n_pairs, seg.n))));
    half * ph = reinterpret_cast<half *>(base);
    half * x  = static_cast<half *>(x_f16);
    auto   h  = static_cast<cublasHandle_t>(blas);
    // The biases are left out of the convolutions. A pair's first one only shifts each of y's
    // channels by a constant, which the next AdaIN's mean takes out. The second ones shift the
    // residual, which every later AdaIN's takes out too: they are added once, at the end.
    for (int i = 0; i < n_pairs; ++i) {
        snake_conv_step(cudaStreamPerThread, h, x, y, false, C, T, K, convs[2 * i], seg, st, ph);
        snake_conv_step(cudaStreamPerThread, h, y, x, true, C, T, K, convs[2 * i + 1], seg, st, ph);
    }
    for (int i = 0; i < n_pairs; i += 3) {
        add_biases<<<row_blocks(C, T), ELEMENTWISE, 0, cudaStreamPerThread>>>(
            x, T, (int) C, convs[2 * i + 1].bias, i + 1 < n_pairs ? convs[2 * i + 3].bias : nullptr,
            i + 2 < n_pairs ? convs[2 * i + 5].bias : nullptr);
    }
    check(cudaGetLastError(), "bias kernel launch");
}

size_t leaky_scratch_bytes(int64_t C, int64_t T, int K, const int * dilations, int n) {
    int64_t T_in = 0;
    for (int i = 0; i < n; ++i) {
        T_in = std::max(T_in, geom(T, K, dilations[i]).T_in);
    }
    return aligned(sizeof(half) * (size_t) (C * T_in));
}

void leaky_stack(int device, void * blas, float * x, int64_t C, int64_t T, int K, const leaky_conv * convs, int n,
                 float slope, const float * mask, void * scratch) {
    GGML_ASSERT(snake_supported(C, K) && T > 0 && blas);
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    auto   h  = static_cast<cublasHandle_t>(blas);
    half * ph = static_cast<half *>(scratch);
    for (int i = 0; i < n; ++i) {
        const int       d = convs[i].dilation;
        const conv_geom g = geom(T, K, d);
        leaky_phases<<<phase_grid(C, g, d), ELEMENTWISE, 0, cudaStreamPerThread>>>(x, T, (int) C, slope, mask, g.pad, d,
                                                                                   g.S, ph, convs[i].bias);
        check(cudaGetLastError(), "LeakyReLU kernel launch");
        phase_gemms(h, convs[i].w, ph, x, CUDA_R_32F, C, K, d, g, 1.0f);
    }
}

bool leaky_conv_tanh_supported(int64_t C, int K) {
    return C > 0 && K > 0 && K % 2 == 1 && post_shared_bytes(C, K) <= 48 * 1024;
}

void leaky_conv_tanh(int device, const float * x, int64_t C, int64_t T, int K, float slope, const float * mask,
                     const float * w, float * out) {
    GGML_ASSERT(leaky_conv_tanh_supported(C, K) && T > 0);
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    leaky_conv_tanh_kernel<<<(unsigned) ((T + POST_FRAMES - 1) / POST_FRAMES), POST_FRAMES, post_shared_bytes(C, K),
                             cudaStreamPerThread>>>(x, T, (int) C, K, slope, mask, w, out);
    check(cudaGetLastError(), "output kernel launch");
}

void accumulate(int device, float * sum, const float * x, int64_t n, float scale) {
    GGML_ASSERT(n % 4 == 0);
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    accumulate_kernel<<<elementwise_blocks(n / 4), ELEMENTWISE, 0, cudaStreamPerThread>>>(
        reinterpret_cast<float4 *>(sum), reinterpret_cast<const float4 *>(x), n / 4, scale);
    check(cudaGetLastError(), "accumulate kernel launch");
}

void stack_input(int device, void * dst, const float * a, const void * b, int64_t C, int64_t T,
                 const snake_segments & seg) {
    GGML_ASSERT(C % 4 == 0 && (seg.n == 1 || seg.frame));
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    stack_input_kernel<<<row_blocks(C, T), ELEMENTWISE, 0, cudaStreamPerThread>>>(
        static_cast<half *>(dst), a, static_cast<const half *>(b), T, (int) C, seg.n > 1 ? seg.frame : nullptr,
        seg.range);
    check(cudaGetLastError(), "stack input kernel launch");
}

void accumulate_f16(int device, void * sum, const void * x, int64_t n, float scale, float * out) {
    GGML_ASSERT(n % 4 == 0);
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    accumulate_f16_kernel<<<elementwise_blocks(n / 4), ELEMENTWISE, 0, cudaStreamPerThread>>>(
        static_cast<half *>(sum), static_cast<const half *>(x), n / 4, scale, out);
    check(cudaGetLastError(), "accumulate kernel launch");
}

int64_t snake_bucket(int64_t T, const int * Ks, int n_K, const int * dilations, int n) {
    int64_t most = std::numeric_limits<int64_t>::max();
    for (int k = 0; k < n_K; ++k) {
        for (int i = 0; i < n; ++i) {
            most = std::min(most, geom(T, Ks[k], dilations[i]).frames);
        }
    }
    return std::max(most, T);
}

}  // namespace vs::cuda
