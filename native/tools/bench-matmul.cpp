// How fast ggml's CPU backend multiplies matrices of the shapes the vocoders use, per
// weight type and src1 layout (contiguous, or the overlapping-row im2col view the
// engine's convolutions pass). It bounds the convolution stages on the CPU.
//
//     build/native/bench-matmul [M K N [threads]]     (default: Kokoro's last stage)
#include <ggml-cpu.h>
#include <ggml.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

int main(int argc, char ** argv) {
    const int64_t M         = argc > 3 ? atoll(argv[1]) : 128;    // output channels
    const int64_t K         = argc > 3 ? atoll(argv[2]) : 1408;   // input channels * taps
    const int64_t N         = argc > 3 ? atoll(argv[3]) : 20000;  // frames
    const int     n_threads = argc > 4 ? atoi(argv[4]) : 2;
    const int64_t taps      = 11;  // the overlapping view starts a row every K / taps elements
    printf("M %lld  K %lld  N %lld  threads %d\n", (long long) M, (long long) K, (long long) N, n_threads);
    for (ggml_type type : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0 }) {
        for (bool overlap : { false, true }) {
            // Weights, src1, the result, and ggml_graph_compute_with_ctx's work buffers (taken
            // from this context too): sized with room to spare.
            ggml_init_params ip{ (size_t) (4 * M * K + 6 * K * N + 2 * M * N) * sizeof(float) + (256 << 20), nullptr,
                                 false };
            ggml_context *   ctx = ggml_init(ip);
            ggml_tensor *    w32 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
            ggml_tensor *    x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
            std::mt19937     rng(1);
            std::normal_distribution<float> dist;
            for (int64_t i = 0; i < ggml_nelements(w32); ++i) {
                ((float *) w32->data)[i] = dist(rng);
            }
            for (int64_t i = 0; i < ggml_nelements(x); ++i) {
                ((float *) x->data)[i] = dist(rng);
            }
            ggml_tensor * w    = ggml_new_tensor_2d(ctx, type, K, M);
            ggml_cgraph * conv = ggml_new_graph(ctx);
            ggml_build_forward_expand(conv, ggml_cpy(ctx, w32, w));
            ggml_graph_compute_with_ctx(ctx, conv, n_threads);
            ggml_tensor * src1 = x;
            if (overlap) {
                src1        = ggml_view_2d(ctx, x, K, 1, (K / taps) * sizeof(float), 0);
                src1->ne[1] = N;  // rows overlap: row n starts K / taps elements after row n - 1
            }
            ggml_cgraph * g = ggml_new_graph(ctx);
            ggml_build_forward_expand(g, ggml_mul_mat(ctx, w, src1));
            ggml_graph_compute_with_ctx(ctx, g, n_threads);  // warm-up
            const int runs = 5;
            auto      t0   = std::chrono::steady_clock::now();
            for (int r = 0; r < runs; ++r) {
                ggml_graph_compute_with_ctx(ctx, g, n_threads);
            }
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / runs;
            printf("%-5s %-11s %7.1f ms  %6.1f GMAC/s\n", ggml_type_name(type), overlap ? "overlapping" : "contiguous",
                   s * 1e3, (double) M * K * N / s / 1e9);
            ggml_free(ctx);
        }
    }
    return 0;
}
