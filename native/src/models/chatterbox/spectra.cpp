// What Chatterbox's stages share: linear layers and GELU, and the spectral front ends of its encoders
// (frames cut from audio with reflected edges, their mel filterbank energies through a DFT basis
// and a filterbank stored in the model).
#include "../../cpu/kernels.h"
#include "../../graph/graph.h"
#include "chatterbox.h"

namespace vs::chatterbox {

ggml_tensor * linear(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & module, bool bias) {
    ggml_tensor * y = ggml_mul_mat(g, c.w(module + ".weight"), x);
    return bias ? ggml_add(g, y, c.w(module + ".bias")) : y;
}

ggml_tensor * gelu_erf(vs_context & c, ggml_context * g, ggml_tensor * x) {
    return c.cpu_kernels && ggml_is_contiguous(x) ? cpu::unary(g, x, cpu::unary_op::gelu_erf) : ggml_gelu_erf(g, x);
}

std::vector<float> reflected_frames(const float * audio, int64_t L, int64_t n, int64_t hop, int64_t pad,
                                    int64_t frames) {
    std::vector<float> out((size_t) (n * frames));
    for (int64_t f = 0; f < frames; ++f) {
        for (int64_t i = 0; i < n; ++i) {
            int64_t s                 = f * hop + i - pad;
            s                         = s < 0 ? -s : s >= L ? 2 * (L - 1) - s : s;
            out[(size_t) (f * n + i)] = audio[std::min(std::max<int64_t>(s, 0), L - 1)];
        }
    }
    return out;
}

std::vector<float> mel_energies(vs_context & c, int stage, const std::vector<float> & frames, const char * dft,
                                const char * filters, float magnitude_eps) {
    ggml_tensor *  basis = c.w(dft);
    const int64_t  N = basis->ne[0], bins = basis->ne[1] / 2, F = (int64_t) frames.size() / N;
    const int64_t  n_mels = c.w(filters)->ne[1];
    auto           gb     = c.new_graph(64);
    ggml_context * g      = gb.ctx.get();
    ggml_tensor *  x      = ggml_new_tensor_2d(g, GGML_TYPE_F32, N, F);
    ggml_set_input(x);
    ggml_tensor * spec = ggml_mul_mat(g, basis, x);  // [2 bins, F]: cos rows, then -sin rows
    ggml_tensor * re   = ggml_cont(g, ggml_view_2d(g, spec, bins, F, spec->nb[1], 0));
    ggml_tensor * im   = ggml_cont(g, ggml_view_2d(g, spec, bins, F, spec->nb[1], bins * sizeof(float)));
    ggml_tensor * s    = ggml_add(g, ggml_sqr(g, re), ggml_sqr(g, im));
    if (magnitude_eps >= 0.0f) {
        s = ggml_sqrt(g, ggml_scale_bias(g, s, 1.0f, magnitude_eps));
    }
    ggml_tensor * mel = named(ggml_mul_mat(g, c.w(filters), s), "mel_energies");  // [n_mels, F]
    ggml_set_output(mel);
    ggml_build_forward_expand(gb.gf, mel);
    c.alloc(stage, gb.gf);
    c.set_input(x, frames.data());
    c.compute(gb.gf);
    std::vector<float> out((size_t) (n_mels * F));
    ggml_backend_tensor_get(mel, out.data(), 0, ggml_nbytes(mel));
    return out;
}

}  // namespace vs::chatterbox
