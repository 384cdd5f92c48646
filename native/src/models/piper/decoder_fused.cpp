// Piper's decoder on CUDA: its residual blocks and output layer in the engine's kernels.
#include "piper.h"

namespace vs::piper {

// The decoder's residual blocks in the engine's CUDA kernels: on a CUDA device, with every
// residual convolution's weights F16 or F32 (F32 ones are read as F16 copies made once:
// vs_context::weight_as) and its biases F32 on it.
bool piper_voice::fused_decoder(const vs_context & c) const {
    if (fused_ >= 0) {
        return fused_ == 1;
    }
    bool ok = c.cuda_device >= 0 && hp_.res_kernels.size() > 1;
    for (size_t i = 0; ok && i < hp_.ups_rates.size() * hp_.res_kernels.size(); ++i) {
        const int K = hp_.res_kernels[i % hp_.res_kernels.size()];
        for (int cv = 0; ok && cv < hp_.res_convs; ++cv) {
            const std::string   w  = "dec.resblocks." + std::to_string(i) + ".convs." + std::to_string(cv) + ".";
            const ggml_tensor * wt = c.w(w + "weight");
            const ggml_tensor * bt = c.w(w + "bias");
            ok = (wt->type == GGML_TYPE_F16 || wt->type == GGML_TYPE_F32) && bt->type == GGML_TYPE_F32 &&
                 ggml_is_contiguous(wt) && wt->buffer && !ggml_backend_buffer_is_host(wt->buffer) && bt->buffer &&
                 !ggml_backend_buffer_is_host(bt->buffer) && wt->ne[1] == K && wt->ne[0] == wt->ne[2] &&
                 vs::cuda::snake_supported(wt->ne[0], K);
        }
    }
    fused_ = ok ? 1 : 0;
    return ok;
}

// As run_decoder, each upsampling stage's residual blocks in the engine's CUDA kernels
// between graphs: conv_pre (masked) and the first upsampling; each later upsampling; the
// output. They hand activations over in the device scratch:
//   mask[i]  stage i's frames: 1 on the sentences, 0 in the gaps (packed batches only)
//   x, r, s  a stage's upsampled input, a block's copy, and the blocks' mean
//   work     leaky_stack's own
// The blocks leave the gaps holding what their convolutions spill; each graph masks what it
// reads.
std::vector<float> piper_voice::run_decoder_fused(vs_context & c, const std::vector<float> & z, const packing & pk) {
    const int     dev      = c.cuda_device;
    const int64_t F        = pk.total;
    const size_t  n_stages = hp_.ups_rates.size(), n_res = hp_.res_kernels.size();
    auto          dils = [&](size_t j) { return &hp_.res_dilations[j * (size_t) hp_.res_convs]; };

    // The scratch, sized for every stage's channels and frames (with room for the frames
    // each kernel size's GEMMs write).
    vs::scratch_layout   scratch;
    std::vector<int64_t> Cs, Ts;
    std::vector<size_t>  mask_at;
    size_t               stage_bytes = 0, work_bytes = 0;
    for (size_t i = 0; i < n_stages; ++i) {
        const std::string u = "dec.ups." + std::to_string(i) + ".";
        Cs.push_back(c.w(u + "weight")->ne[1]);
        Ts.push_back((i == 0 ? F : Ts.back()) * hp_.ups_rates[i]);
        int64_t frames = Ts[i];
        for (size_t j = 0; j < n_res; ++j) {
            frames     = std::max(frames, vs::cuda::snake_frames(Ts[i], hp_.res_kernels[j], dils(j), hp_.res_convs));
            work_bytes = std::max(
                work_bytes, vs::cuda::leaky_scratch_bytes(Cs[i], Ts[i], hp_.res_kernels[j], dils(j), hp_.res_convs));
        }
        stage_bytes = std::max(stage_bytes, sizeof(float) * (size_t) (Cs[i] * frames));
        mask_at.push_back(pk.packed() ? scratch.reserve(sizeof(float) * (size_t) Ts[i]) : 0);
    }
    const size_t x_at = scratch.reserve(stage_bytes), r_at = scratch.reserve(stage_bytes),
                 s_at     = scratch.reserve(stage_bytes);
    const size_t work_at  = scratch.reserve(work_bytes);
    const size_t lmask_at = pk.packed() ? scratch.reserve(sizeof(float) * (size_t) F) : 0;  // the latent frames'
    // The output layer in a kernel of its own where it takes the last stage's channels.
    const ggml_tensor * post = c.w("dec.conv_post.weight");
    const bool post_kernel   = (post->type == GGML_TYPE_F32 || post->type == GGML_TYPE_F16) && post->ne[2] == 1 &&
                             post->ne[0] == Cs.back() &&
                             vs::cuda::leaky_conv_tanh_supported(Cs.back(), hp_.dec_kernel_post);
    const size_t audio_at = post_kernel ? scratch.reserve(sizeof(float) * (size_t) Ts.back()) : 0;
    auto * const base     = static_cast<uint8_t *>(c.device_scratch(scratch.bytes));
    auto         ptr      = [&](size_t at) { return reinterpret_cast<float *>(base + at); };

    float *            result = nullptr;  // the last stage's mean, in the scratch
    std::vector<float> audio;
    for (size_t i = 0; i <= n_stages; ++i) {
        // Graph i: the previous stage's result (conv_pre's output first), masked, then the
        // next upsampling into x (or, after the last stage, the output).
        auto           gb = c.new_graph();
        ggml_context * g  = gb.ctx.get();
        host_inputs    in;
        // The latent frames' mask goes up once (graph 0) and stays in the scratch; stage i's,
        // each latent frame's value repeated at its rate, is made there by graph i, where
        // the graph, the kernels and the next graph read it.
        auto stage_mask   = [&](size_t k) { return pk.packed() ? c.scratch_tensor(g, mask_at[k], 1, Ts[k]) : nullptr; };
        ggml_tensor *z_in = nullptr, *x, *latent_mask = nullptr;
        if (i == 0) {
            z_in = ggml_new_tensor_2d(g, GGML_TYPE_F32, hp_.inter, F);
            ggml_set_input(z_in);
            if (pk.packed()) {
                latent_mask = ggml_cpy(g, in.add(g, 1, F, pk.mask()), c.scratch_tensor(g, lmask_at, 1, F));
            }
            x = masked(g,
                       conv1d(c.graph_opts(), g, z_in, c.w("dec.conv_pre.weight"), c.w("dec.conv_pre.bias"), 1,
                              hp_.dec_kernel_pre / 2),
                       latent_mask);
        } else {
            latent_mask = pk.packed() ? c.scratch_tensor(g, lmask_at, 1, F) : nullptr;
            x           = masked(g,
                                 c.scratch_tensor(g, (size_t) (reinterpret_cast<uint8_t *>(result) - base), Cs[i - 1], Ts[i - 1]),
                                 stage_mask(i - 1));
        }
        ggml_tensor * out = nullptr;
        if (i < n_stages) {
            const std::string u = "dec.ups." + std::to_string(i) + ".";
            const int         s = hp_.ups_rates[i];
            x = conv_transpose1d(g, ggml_leaky_relu(g, x, 0.1f, false), c.w(u + "weight"), c.w(u + "bias"), s,
                                 (hp_.ups_kernels[i] - s) / 2);
            GGML_ASSERT(x->ne[0] == Cs[i] && x->ne[1] == Ts[i]);
            ggml_tensor * mask = nullptr;
            if (latent_mask) {
                const int64_t rate = Ts[i] / F;
                mask = ggml_cpy(g, ggml_reshape_2d(g, ggml_repeat_4d(g, latent_mask, rate, F, 1, 1), 1, Ts[i]),
                                stage_mask(i));
            }
            ggml_build_forward_expand(gb.gf, ggml_cpy(g, masked(g, x, mask), c.scratch_tensor(g, x_at, Cs[i], Ts[i])));
        } else {
            out = ggml_tanh(g, conv1d(c.graph_opts(), g, ggml_leaky_relu(g, x, 0.01f, false),
                                      c.w("dec.conv_post.weight"), nullptr, 1,
                                      hp_.dec_kernel_post / 2));  // [1, N]
            ggml_set_name(out, "audio");
            ggml_set_output(out);
            ggml_build_forward_expand(gb.gf, out);
        }
        c.alloc(VS_STAGE_DECODER, gb.gf);
        if (z_in) {
            ggml_backend_tensor_set(z_in, z.data(), 0, ggml_nbytes(z_in));
        }
        in.set();
        c.compute(gb.gf);
        if (out) {
            audio.resize((size_t) ggml_nelements(out));
            ggml_backend_tensor_get(out, audio.data(), 0, ggml_nbytes(out));
            return audio;
        }

        // Stage i's residual blocks: the first in s, the middle ones in r, the last in x
        // itself; s becomes their mean.
        const auto    t0 = std::chrono::steady_clock::now();
        const int64_t C = Cs[i], T = Ts[i], n = C * T;
        const float * frames_mask = pk.packed() ? ptr(mask_at[i]) : nullptr;
        for (size_t j = 0; j < n_res; ++j) {
            const bool last = j + 1 == n_res;
            float *    buf  = last ? ptr(x_at) : j == 0 ? ptr(s_at) : ptr(r_at);
            if (!last) {
                vs::cuda::copy(dev, buf, ptr(x_at), sizeof(float) * (size_t) n);
            }
            std::vector<vs::cuda::leaky_conv> cv((size_t) hp_.res_convs);
            for (int k = 0; k < hp_.res_convs; ++k) {
                const std::string w =
                    "dec.resblocks." + std::to_string(i * n_res + j) + ".convs." + std::to_string(k) + ".";
                cv[(size_t) k].w        = c.weight_as(w + "weight", GGML_TYPE_F16)->data;
                cv[(size_t) k].bias     = static_cast<const float *>(c.w(w + "bias")->data);
                cv[(size_t) k].dilation = dils(j)[k];
            }
            vs::cuda::leaky_stack(dev, c.blas(), buf, C, T, hp_.res_kernels[j], cv.data(), hp_.res_convs, 0.1f,
                                  frames_mask, ptr(work_at));
            if (j > 0) {
                vs::cuda::accumulate(dev, ptr(s_at), buf, n, last ? 1.0f / (float) n_res : 1.0f);
            }
        }
        result = ptr(s_at);
        if (post_kernel && i + 1 == n_stages) {
            // The output: LeakyReLU, the mask, conv_post and tanh in one kernel, weights F32.
            const ggml_tensor * w32 = c.weight_as("dec.conv_post.weight", GGML_TYPE_F32);
            vs::cuda::leaky_conv_tanh(dev, result, C, T, hp_.dec_kernel_post, 0.01f, frames_mask,
                                      static_cast<const float *>(w32->data), ptr(audio_at));
            audio.resize((size_t) T);
            vs::cuda::download(dev, audio.data(), ptr(audio_at), sizeof(float) * (size_t) T);
            c.profile_op("residual blocks (engine's CUDA kernels)", vs::ms_since(t0));
            return audio;
        }
        vs::cuda::synchronize(dev);
        c.profile_op("residual blocks (engine's CUDA kernels)", vs::ms_since(t0));
        c.check_abort();
    }
    return audio;
}

}  // namespace vs::piper
