// S3Gen's speech tokenizer (S3TokenizerV2): 16 kHz audio to speech tokens, 25 a second. A
// Whisper-style log-mel (128 bands, 100 frames a second), two strided convolutions, transformer
// blocks whose attention has rotary positions and an FSMN memory (a depthwise convolution over
// the values), then finite scalar quantization: eight projections, each rounded to -1, 0 or 1,
// read as the digits of a base-3 code.
#include <cmath>

#include "../../graph/graph.h"
#include "chatterbox.h"

namespace vs::chatterbox {

s3tok_hparams read_s3tok_hparams(const vs_model & m) {
    s3tok_hparams     h;
    const std::string k = "chatterbox.s3tok.";
    h.sample_rate       = m.u32_in(k + "sample_rate", 1000, 192000);
    h.n_fft             = m.u32_in(k + "n_fft", 16, 8192);
    h.hop               = m.u32_in(k + "hop", 1, 8192);
    h.n_mels            = m.u32_in(k + "n_mels", 1, 1024);
    h.n_state           = m.u32_in(k + "n_state", 8, 16384);
    h.n_head            = m.u32_in(k + "n_head", 1, 256);
    h.n_layer           = m.u32_in(k + "n_layer", 0, 64);
    h.fsmn_kernel       = m.u32_in(k + "fsmn_kernel", 1, 255);
    h.levels            = m.u32_in(k + "levels", 2, 16);
    h.digits            = m.u32_in(k + "digits", 1, 16);
    h.rope_base         = m.f32_in(k + "rope_base", 1.0f, 1e9f);
    if (h.n_state % h.n_head || h.fsmn_kernel % 2 == 0 || h.n_fft % 2) {
        m.bad("metadata 'chatterbox.s3tok.*' describes no speech tokenizer this engine runs");
    }
    return h;
}

std::vector<tensor_spec> s3tok_layout(const s3tok_hparams & h) {
    const int64_t            C = h.n_state, bins = h.n_fft / 2 + 1;
    std::vector<tensor_spec> s = {
        { "s3tok.dft", { h.n_fft, 2 * bins, 1, 1 }, false },    { "s3tok.mel", { bins, h.n_mels, 1, 1 }, false },
        { "s3tok.conv1.weight", { h.n_mels, 3, C, 1 }, false }, { "s3tok.conv1.bias", { C, 1, 1, 1 }, false },
        { "s3tok.conv2.weight", { C, 3, C, 1 }, false },        { "s3tok.conv2.bias", { C, 1, 1, 1 }, false },
        { "s3tok.fsq.weight", { C, h.digits, 1, 1 }, false },   { "s3tok.fsq.bias", { h.digits, 1, 1, 1 }, false },
    };
    for (int64_t i = 0; i < h.n_layer; ++i) {
        const std::string p = "s3tok.blk." + std::to_string(i) + ".";
        for (const char * norm : { "attn_norm", "ffn_norm" }) {
            s.push_back({ p + norm + ".weight", { C, 1, 1, 1 }, false });
            s.push_back({ p + norm + ".bias", { C, 1, 1, 1 }, false });
        }
        for (const char * name : { "attn_q", "attn_k", "attn_v", "attn_out" }) {
            s.push_back({ p + name + ".weight", { C, C, 1, 1 }, true });
            if (std::string(name) != "attn_k") {
                s.push_back({ p + name + ".bias", { C, 1, 1, 1 }, false });
            }
        }
        s.push_back({ p + "fsmn", { C, h.fsmn_kernel, 1, 1 }, false });
        s.push_back({ p + "ffn_up.weight", { C, 4 * C, 1, 1 }, true });
        s.push_back({ p + "ffn_up.bias", { 4 * C, 1, 1, 1 }, false });
        s.push_back({ p + "ffn_down.weight", { 4 * C, C, 1, 1 }, true });
        s.push_back({ p + "ffn_down.bias", { C, 1, 1, 1 }, false });
    }
    return s;
}

namespace {

// The log-mel [n_mels, frames] of 16 kHz audio as S3Tokenizer.log_mel_spectrogram makes it: a
// centred STFT (reflected edges, its last frame dropped), power, mel filters, log10 floored
// 8 below its peak, then (x + 4) / 4.
std::vector<float> log_mel(vs_context & c, const s3tok_hparams & h, const float * audio, int64_t L) {
    const int64_t      F    = L / h.hop;  // frames after the last is dropped
    std::vector<float> out  = mel_energies(c, VS_STAGE_MEL, reflected_frames(audio, L, h.n_fft, h.hop, h.n_fft / 2, F),
                                           "s3tok.dft", "s3tok.mel");
    float              peak = -INFINITY;
    for (float & v : out) {
        v    = std::log10(std::max(v, 1e-10f));
        peak = std::max(peak, v);
    }
    for (float & v : out) {
        v = (std::max(v, peak - 8.0f) + 4.0f) / 4.0f;
    }
    return out;
}

}  // namespace

std::vector<int32_t> s3tok_tokens(vs_context & c, const s3tok_hparams & h, const float * audio, int64_t L,
                                  const vs_synth_params & p) {
    if (L <= h.n_fft / 2 || L / h.hop < 4) {
        throw error(VS_ERR_INVALID_ARG, "the recording is too short for the speech tokenizer: at least " +
                                            std::to_string(4 * h.hop) + " samples");
    }
    std::vector<float> mel;
    c.timed_stage(VS_STAGE_MEL, 0, p, [&] { mel = log_mel(c, h, audio, L); });
    const int64_t      F = (int64_t) mel.size() / h.n_mels, C = h.n_state, D = C / h.n_head;
    const int64_t      T1 = (F - 1) / 2 + 1, T = (T1 - 1) / 2 + 1;  // after the two strided convolutions
    std::vector<float> proj((size_t) (h.digits * T));
    c.timed_stage(VS_STAGE_ENCODER, 0, p, [&] {
        auto           gb  = c.new_graph((size_t) (h.n_layer * (4 * h.fsmn_kernel + 96) + 128));
        ggml_context * g   = gb.ctx.get();
        ggml_tensor *  x   = ggml_new_tensor_2d(g, GGML_TYPE_F32, h.n_mels, F);
        ggml_tensor *  pos = ggml_new_tensor_1d(g, GGML_TYPE_I32, T);
        ggml_set_input(x);
        ggml_set_input(pos);
        const graph_options o = c.graph_opts();
        ggml_tensor *       y =
            gelu_erf(c, g, conv1d_strided(o, g, x, c.w("s3tok.conv1.weight"), c.w("s3tok.conv1.bias"), 2, 1));
        y = gelu_erf(c, g, conv1d_strided(o, g, y, c.w("s3tok.conv2.weight"), c.w("s3tok.conv2.bias"), 2, 1));
        for (int64_t i = 0; i < h.n_layer; ++i) {
            const std::string p = "s3tok.blk." + std::to_string(i) + ".";
            ggml_tensor *     z = layer_norm(g, y, c.w(p + "attn_norm.weight"), c.w(p + "attn_norm.bias"), 1e-5f);
            ggml_tensor *     v = linear(c, g, z, p + "attn_v");
            auto rope           = [&](ggml_tensor * t) {  // rotary positions over a head's whole width, halves paired
                t = ggml_rope_ext(g, ggml_reshape_3d(g, t, D, h.n_head, T), pos, nullptr, (int) D, GGML_ROPE_TYPE_NEOX,
                                            0, h.rope_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
                return ggml_reshape_2d(g, t, C, T);
            };
            ggml_tensor * q = rope(linear(c, g, z, p + "attn_q"));
            ggml_tensor * k = rope(linear(c, g, z, p + "attn_k", false));
            ggml_tensor * a = self_attention(g, q, k, v, h.n_head, 1.0f / std::sqrt((float) D));
            // The FSMN memory: the values through a depthwise convolution, plus the values.
            ggml_tensor * m =
                ggml_add(g, conv1d_depthwise(g, v, c.w(p + "fsmn"), nullptr, 1, (int) (h.fsmn_kernel - 1) / 2), v);
            y = named(ggml_add(g, y, ggml_add(g, linear(c, g, a, p + "attn_out"), m)), "s3tok_attn", (int) i);
            z = layer_norm(g, y, c.w(p + "ffn_norm.weight"), c.w(p + "ffn_norm.bias"), 1e-5f);
            y = ggml_add(g, y, linear(c, g, gelu_erf(c, g, linear(c, g, z, p + "ffn_up")), p + "ffn_down"));
        }
        ggml_tensor * out = named(linear(c, g, y, "s3tok.fsq"), "s3tok_fsq");  // [digits, T]
        ggml_set_output(out);
        ggml_build_forward_expand(gb.gf, out);
        c.alloc(VS_STAGE_ENCODER, gb.gf);
        std::vector<int32_t> positions((size_t) T);
        for (int64_t t = 0; t < T; ++t) {
            positions[(size_t) t] = (int32_t) t;
        }
        c.set_input(x, mel.data());
        c.set_input(pos, positions.data());
        c.compute(gb.gf);
        ggml_backend_tensor_get(out, proj.data(), 0, ggml_nbytes(out));
    });
    // FSQ: each projection squashed (tanh, times 0.999), rounded to -1, 0 or 1 (ties to even, as
    // torch.round), shifted to a digit 0 .. levels - 1; digit i weighs levels^i.
    std::vector<int32_t> tokens((size_t) T);
    for (int64_t t = 0; t < T; ++t) {
        int64_t code = 0, weight = 1;
        for (int64_t i = 0; i < h.digits; ++i) {
            const float q = std::nearbyint(std::tanh(proj[(size_t) (t * h.digits + i)]) * 0.9990000128746033f);
            code += (int64_t) (q + 1.0f) * weight;
            weight *= h.levels;
        }
        tokens[(size_t) t] = (int32_t) code;
    }
    c.set_output("s3tok_mel", std::move(mel), F, h.n_mels);
    c.set_output("s3tok_fsq", std::move(proj), T, h.digits);
    return tokens;
}

}  // namespace vs::chatterbox
