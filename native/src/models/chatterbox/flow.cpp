// S3Gen's flow: speech tokens (25 a second) to a log-mel (50 frames a second) in a voice. The
// prompt's tokens and the new ones are embedded together and encoded by an upsampling conformer
// (espnet's relative positions) whose projection is the mean `mu`; a U-Net of causal residual
// blocks and transformer blocks (the estimator) gives the velocity of a flow from noise to the
// mel, conditioned on mu, the speaker's x-vector and the prompt's mel over its own frames; a few
// Euler steps over it (Turbo: mean-flow steps over a linear time span) give the mel, whose frames
// after the prompt's are the speech.
#include <cmath>

#include "../../cpu/kernels.h"
#include "../../graph/graph.h"
#include "chatterbox.h"

namespace vs::chatterbox {

flow_hparams read_flow_hparams(const vs_model & m) {
    flow_hparams      h;
    const std::string k = "chatterbox.flow.";
    h.vocab             = m.u32_in(k + "vocab", 1, 1 << 20);
    h.n_embd            = m.u32_in(k + "n_embd", 8, 8192);
    h.n_head            = m.u32_in(k + "n_head", 1, 256);
    h.ffn               = m.u32_in(k + "ffn", 1, 65536);
    h.n_layer           = m.u32_in(k + "n_layer", 0, 64);
    h.n_up_layer        = m.u32_in(k + "n_up_layer", 0, 64);
    h.lookahead         = m.u32_in(k + "lookahead", 0, 64);
    // Files converted before the key was written hold the reference's S3GEN_SIL.
    h.silence_token     = m.has(k + "silence_token") ? m.u32_in(k + "silence_token", 0, h.vocab - 1) : 4299;
    h.token_mel_ratio   = m.u32_in(k + "token_mel_ratio", 1, 8);
    h.n_mels            = m.u32_in(k + "n_mels", 1, 512);
    h.xvector           = m.u32_in(k + "xvector", 1, 4096);
    h.dec_channels      = m.u32_in(k + "dec_channels", 8, 8192);
    h.dec_n_head        = m.u32_in(k + "dec_n_head", 1, 256);
    h.dec_head_dim      = m.u32_in(k + "dec_head_dim", 1, 1024);
    h.dec_n_tfm         = m.u32_in(k + "dec_n_tfm", 0, 64);
    h.dec_n_mid         = m.u32_in(k + "dec_n_mid", 0, 64);
    h.dec_time_embed    = m.u32_in(k + "dec_time_embed", 1, 65536);
    h.dec_time_sinusoid = m.u32_in(k + "dec_time_sinusoid", 4, 65536);
    h.meanflow          = m.u32_in(k + "meanflow", 0, 1) == 1;
    h.steps             = m.u32_in(k + "steps", 1, 1000);
    h.cfg_rate          = m.f32_in(k + "cfg_rate", 0.0f, 100.0f);
    h.mel_sample_rate   = m.u32_in(k + "mel_sample_rate", 1000, 192000);
    h.mel_n_fft         = m.u32_in(k + "mel_n_fft", 16, 16384);
    h.mel_hop           = m.u32_in(k + "mel_hop", 1, 16384);
    if (h.n_embd % h.n_head || h.dec_time_sinusoid % 2 || h.token_mel_ratio != 2 || h.mel_n_fft % 2 ||
        h.mel_hop > h.mel_n_fft) {
        m.bad("metadata 'chatterbox.flow.*' describes no flow this engine runs");
    }
    if (h.meanflow && h.cfg_rate != 0.0f) {
        m.bad("metadata 'chatterbox.flow.*' asks for guidance with mean-flow steps, which this engine does not run");
    }
    return h;
}

std::vector<tensor_spec> flow_layout(const flow_hparams & h) {
    const int64_t            C = h.n_embd, M = h.n_mels, D = h.dec_channels, TE = h.dec_time_embed;
    const int64_t            inner = h.dec_n_head * h.dec_head_dim;
    std::vector<tensor_spec> s;
    auto                     linear = [&](const std::string & p, int64_t in, int64_t out, bool bias = true) {
        s.push_back({ p + ".weight", { in, out, 1, 1 }, true });
        if (bias) {
            s.push_back({ p + ".bias", { out, 1, 1, 1 }, false });
        }
    };
    auto norm = [&](const std::string & p, int64_t n) {
        s.push_back({ p + ".weight", { n, 1, 1, 1 }, false });
        s.push_back({ p + ".bias", { n, 1, 1, 1 }, false });
    };
    auto conv = [&](const std::string & p, int64_t in, int64_t out, int64_t k) {
        s.push_back({ p + ".weight", { in, k, out, 1 }, false });
        s.push_back({ p + ".bias", { out, 1, 1, 1 }, false });
    };
    s.push_back({ "flow.token_emb", { C, h.vocab, 1, 1 }, true });
    s.push_back({ "flow.mel_dft", { h.mel_n_fft, 2 * (h.mel_n_fft / 2 + 1), 1, 1 }, false });
    s.push_back({ "flow.mel_filters", { h.mel_n_fft / 2 + 1, M, 1, 1 }, false });
    linear("flow.spk_affine", h.xvector, M);
    for (const char * e : { "flow.enc.embed", "flow.enc.up_embed" }) {
        linear(e, C, C);
        norm(std::string(e) + "_norm", C);
    }
    conv("flow.enc.lookahead.conv1", C, C, h.lookahead + 1);
    conv("flow.enc.lookahead.conv2", C, C, 3);
    conv("flow.enc.up", C, C, 2 * h.token_mel_ratio + 1);
    norm("flow.enc.out_norm", C);
    linear("flow.enc.proj", C, M);
    for (const auto & [stack, n] : { std::pair<std::string, int64_t>{ "flow.enc.blk.", h.n_layer },
                                     std::pair<std::string, int64_t>{ "flow.enc.up_blk.", h.n_up_layer } }) {
        for (int64_t i = 0; i < n; ++i) {
            const std::string p = stack + std::to_string(i) + ".";
            for (const char * name : { "attn_q", "attn_k", "attn_v", "attn_out" }) {
                linear(p + name, C, C);
            }
            linear(p + "attn_pos", C, C, false);
            s.push_back({ p + "pos_bias_u", { C, 1, 1, 1 }, false });
            s.push_back({ p + "pos_bias_v", { C, 1, 1, 1 }, false });
            norm(p + "attn_norm", C);
            norm(p + "ffn_norm", C);
            linear(p + "ffn_up", C, h.ffn);
            linear(p + "ffn_down", h.ffn, C);
        }
    }
    linear("flow.dec.time.linear_1", h.dec_time_sinusoid, TE);
    linear("flow.dec.time.linear_2", TE, TE);
    if (h.meanflow) {
        linear("flow.dec.time_mixer", 2 * TE, TE, false);
    }
    auto block = [&](const std::string & p, int64_t in) {
        conv(p + "block1.conv", in, D, 3);
        norm(p + "block1.norm", D);
        conv(p + "block2.conv", D, D, 3);
        norm(p + "block2.norm", D);
        linear(p + "time", TE, D);
        linear(p + "res_conv", in, D);
        for (int64_t j = 0; j < h.dec_n_tfm; ++j) {
            const std::string q = p + "tfm." + std::to_string(j) + ".";
            norm(q + "norm1", D);
            linear(q + "attn_q", D, inner, false);
            linear(q + "attn_k", D, inner, false);
            linear(q + "attn_v", D, inner, false);
            linear(q + "attn_out", inner, D);
            norm(q + "norm3", D);
            linear(q + "ffn_up", D, 4 * D);
            linear(q + "ffn_down", 4 * D, D);
        }
    };
    block("flow.dec.down.", 4 * M);
    conv("flow.dec.down.conv", D, D, 3);
    for (int64_t i = 0; i < h.dec_n_mid; ++i) {
        block("flow.dec.mid." + std::to_string(i) + ".", D);
    }
    block("flow.dec.up.", 2 * D);
    conv("flow.dec.up.conv", D, D, 3);
    conv("flow.dec.final.conv", D, D, 3);
    norm("flow.dec.final.norm", D);
    linear("flow.dec.proj", D, M);
    return s;
}

namespace {

// espnet's relative positional encoding (EspnetRelPositionalEncoding) [d_model, 2T - 1]: rows for
// relative positions T - 1 down to 1 - T, sin on even channels and cos on odd ones, in float as
// PyTorch computes them.
std::vector<float> rel_positions(int64_t d_model, int64_t T) {
    std::vector<float> pe((size_t) (d_model * (2 * T - 1)));
    for (int64_t i = 0; i < d_model / 2; ++i) {
        const float div = std::exp((float) (2 * i) * -(std::log(10000.0f) / (float) d_model));
        for (int64_t r = 0; r < 2 * T - 1; ++r) {
            const float pos = (float) (T - 1 - r);
            const float a   = std::fabs(pos) * div;
            float *     row = pe.data() + r * d_model;
            row[2 * i]      = pos < 0 ? -std::sin(a) : std::sin(a);
            row[2 * i + 1]  = std::cos(a);
        }
    }
    return pe;
}

ggml_tensor * norm(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & module, float eps) {
    return layer_norm(g, x, c.w(module + ".weight"), c.w(module + ".bias"), eps);
}

// Mish: x tanh(softplus(x)), in the engine's CPU kernel where the context runs them.
ggml_tensor * mish(vs_context & c, ggml_context * g, ggml_tensor * x) {
    if (c.cpu_kernels && ggml_is_contiguous(x)) {
        return cpu::unary(g, x, cpu::unary_op::mish);
    }
    return ggml_mul(g, x, ggml_tanh(g, ggml_softplus(g, x)));
}

// A convolution that sees only the past: K - 1 zero frames before x [IC, T], or before each of
// n_seq sequences of equal length side by side in time.
ggml_tensor * causal_conv(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & module,
                          int64_t n_seq = 1) {
    ggml_tensor * w = c.w(module + ".weight");
    const int64_t K = w->ne[1];
    if (n_seq == 1) {
        return conv1d(c.graph_opts(), g, pad_time(g, x, K - 1, 0), w, c.w(module + ".bias"), 1, 0);
    }
    // Each sequence padded on its own, then one convolution over them all: the outputs whose
    // taps straddle two sequences are dropped.
    const int64_t C = x->ne[0], T = x->ne[1] / n_seq, L = T + K - 1;
    ggml_tensor * xp = ggml_reshape_3d(g, ggml_cont(g, x), C, T, n_seq);
    xp               = ggml_pad_ext(g, xp, 0, 0, (int) (K - 1), 0, 0, 0, 0, 0);  // [C, L, n_seq]
    ggml_tensor * y  = conv1d(c.graph_opts(), g, ggml_reshape_2d(g, xp, C, L * n_seq), w, c.w(module + ".bias"), 1, 0);
    y                = ggml_view_3d(g, y, y->ne[0], T, n_seq, y->nb[1], L * y->nb[1], 0);
    return ggml_reshape_2d(g, ggml_cont(g, y), y->ne[0], T * n_seq);
}

// A conformer layer (pre-norm, no convolution module): self-attention with relative positions,
// then a SiLU feed-forward, each added to the input.
ggml_tensor * conformer_layer(vs_context & c, ggml_context * g, ggml_tensor * x, ggml_tensor * pos,
                              const flow_hparams & h, const std::string & p, int il) {
    const float   eps = 1e-12f;
    ggml_tensor * y   = norm(c, g, x, p + "attn_norm", eps);
    ggml_tensor * q   = linear(c, g, y, p + "attn_q");
    ggml_tensor * k   = linear(c, g, y, p + "attn_k");
    ggml_tensor * v   = linear(c, g, y, p + "attn_v");
    ggml_tensor * pe  = ggml_mul_mat(g, c.w(p + "attn_pos.weight"), pos);
    y                 = rel_pos_attention(g, q, k, v, pe, c.w(p + "pos_bias_u"), c.w(p + "pos_bias_v"), h.n_head);
    x                 = named(ggml_add(g, x, linear(c, g, y, p + "attn_out")), "flow_enc_attn", il);
    y                 = ggml_silu(g, linear(c, g, norm(c, g, x, p + "ffn_norm", eps), p + "ffn_up"));
    return ggml_add(g, x, linear(c, g, y, p + "ffn_down"));
}

// The embedding layer of a conformer stack: a linear layer and its norm, scaled by sqrt(width).
ggml_tensor * conformer_embed(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & p, int64_t C) {
    x = norm(c, g, linear(c, g, x, p), p + "_norm", 1e-5f);
    return ggml_scale(g, x, std::sqrt((float) C));
}

// A transformer block of the estimator (diffusers' BasicTransformerBlock): self-attention,
// then a GELU feed-forward, each after a layer norm and added to the input.
ggml_tensor * transformer_block(vs_context & c, ggml_context * g, ggml_tensor * x, const flow_hparams & h,
                                const std::string & p, int64_t n_seq) {
    ggml_tensor * y  = norm(c, g, x, p + "norm1", 1e-5f);
    ggml_tensor * q  = linear(c, g, y, p + "attn_q", false);
    ggml_tensor * k  = linear(c, g, y, p + "attn_k", false);
    ggml_tensor * v  = linear(c, g, y, p + "attn_v", false);
    const float   sc = 1.0f / std::sqrt((float) h.dec_head_dim);
    // On the CPU the engine's kernel (F32 throughout), elsewhere ggml's flash attention.
    y = c.cpu_kernels && cpu::attention_fits(h.dec_head_dim)
            ? cpu::attention(g, q, k, v, h.dec_n_head, sc, n_seq)
            : self_attention(g, q, k, v, h.dec_n_head, sc, true, n_seq);
    x = ggml_add(g, x, linear(c, g, y, p + "attn_out"));
    y = gelu_erf(c, g, linear(c, g, norm(c, g, x, p + "norm3", 1e-5f), p + "ffn_up"));
    return ggml_add(g, x, linear(c, g, y, p + "ffn_down"));
}

// CausalBlock1D: a causal convolution, a layer norm over channels, Mish.
ggml_tensor * causal_block(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & p, int64_t n_seq) {
    return mish(c, g, norm(c, g, causal_conv(c, g, x, p + ".conv", n_seq), p + ".norm", 1e-5f));
}

// A level of the U-Net: a causal residual block that adds the time embedding, then its
// transformer blocks.
ggml_tensor * unet_block(vs_context & c, ggml_context * g, ggml_tensor * x, ggml_tensor * temb, const flow_hparams & h,
                         const std::string & p, int64_t n_seq) {
    ggml_tensor * y = causal_block(c, g, x, p + "block1", n_seq);
    y               = ggml_add(g, y, linear(c, g, mish(c, g, temb), p + "time"));
    y               = causal_block(c, g, y, p + "block2", n_seq);
    x               = ggml_add(g, y, linear(c, g, x, p + "res_conv"));
    for (int64_t j = 0; j < h.dec_n_tfm; ++j) {
        x = transformer_block(c, g, x, h, p + "tfm." + std::to_string(j) + ".", n_seq);
    }
    return x;
}

// The sinusoidal embedding of a time in [0, 1] (SinusoidalPosEmb, scale 1000): sin then cos.
std::vector<float> time_sinusoid(int64_t dim, float t) {
    const int64_t      half = dim / 2;
    const float        step = std::log(10000.0f) / (float) (half - 1);
    std::vector<float> e((size_t) dim);
    for (int64_t i = 0; i < half; ++i) {
        const float a          = 1000.0f * t * std::exp((float) i * -step);
        e[(size_t) i]          = std::sin(a);
        e[(size_t) (i + half)] = std::cos(a);
    }
    return e;
}

}  // namespace

std::vector<float> flow_encode(vs_context & c, const flow_hparams & h, const std::vector<int32_t> & tokens) {
    const int64_t N = (int64_t) tokens.size(), C = h.n_embd, T = N * h.token_mel_ratio;
    for (int32_t id : tokens) {
        if (id < 0 || id >= h.vocab) {
            throw error(VS_ERR_INVALID_ARG, "speech token " + std::to_string(id) + " is not one of the flow's 0 to " +
                                                std::to_string(h.vocab - 1));
        }
    }
    const std::vector<float> pos1 = rel_positions(C, N), pos2 = rel_positions(C, T);
    auto                     gb  = c.new_graph((size_t) ((h.n_layer + h.n_up_layer) * 64 + 128));
    ggml_context *           g   = gb.ctx.get();
    ggml_tensor *            ids = ggml_new_tensor_1d(g, GGML_TYPE_I32, N);
    ggml_tensor *            p1  = ggml_new_tensor_2d(g, GGML_TYPE_F32, C, 2 * N - 1);
    ggml_tensor *            p2  = ggml_new_tensor_2d(g, GGML_TYPE_F32, C, 2 * T - 1);
    for (ggml_tensor * t : { ids, p1, p2 }) {
        ggml_set_input(t);
    }
    const graph_options o = c.graph_opts();
    ggml_tensor *       x = conformer_embed(c, g, ggml_get_rows(g, c.w("flow.token_emb"), ids), "flow.enc.embed", C);
    // PreLookaheadLayer: each token sees the next `lookahead` ones, then two before it.
    ggml_tensor * y = conv1d(o, g, pad_time(g, x, 0, h.lookahead), c.w("flow.enc.lookahead.conv1.weight"),
                             c.w("flow.enc.lookahead.conv1.bias"), 1, 0);
    y               = causal_conv(c, g, ggml_leaky_relu(g, y, 0.01f, false), "flow.enc.lookahead.conv2");
    x               = named(ggml_add(g, x, y), "flow_enc_lookahead");
    for (int64_t i = 0; i < h.n_layer; ++i) {
        x = conformer_layer(c, g, x, p1, h, "flow.enc.blk." + std::to_string(i) + ".", (int) i);
    }
    // Upsample1D: each frame repeated token_mel_ratio times, then a causal convolution.
    ggml_tensor * x3 = ggml_reshape_3d(g, x, C, 1, N);
    x                = ggml_reshape_2d(g, ggml_concat(g, x3, x3, 1), C, T);
    x                = causal_conv(c, g, x, "flow.enc.up");
    x                = conformer_embed(c, g, x, "flow.enc.up_embed", C);
    for (int64_t i = 0; i < h.n_up_layer; ++i) {
        x = conformer_layer(c, g, x, p2, h, "flow.enc.up_blk." + std::to_string(i) + ".", (int) (h.n_layer + i));
    }
    x                = norm(c, g, x, "flow.enc.out_norm", 1e-5f);
    ggml_tensor * mu = named(linear(c, g, x, "flow.enc.proj"), "flow_mu");  // [M, T]
    ggml_set_output(mu);
    ggml_build_forward_expand(gb.gf, mu);
    c.alloc(VS_STAGE_ENCODER, gb.gf);
    c.set_input(ids, tokens.data());
    c.set_input(p1, pos1.data());
    c.set_input(p2, pos2.data());
    c.compute(gb.gf);
    std::vector<float> out((size_t) (h.n_mels * T));
    ggml_backend_tensor_get(mu, out.data(), 0, ggml_nbytes(mu));
    return out;
}

std::vector<float> flow_velocity(vs_context & c, const flow_hparams & h, const std::vector<float> & state,
                                 const std::vector<float> & mu, const std::vector<float> & spk,
                                 const std::vector<float> & cond, float t, float r, bool guided) {
    const int64_t            M = h.n_mels, T = (int64_t) mu.size() / M, S = guided ? 2 : 1;
    const int64_t            n_times = h.meanflow ? 2 : 1;
    const std::vector<float> et = time_sinusoid(h.dec_time_sinusoid, t), er = time_sinusoid(h.dec_time_sinusoid, r);
    auto                     gb = c.new_graph((size_t) ((h.dec_n_mid + 2) * (h.dec_n_tfm * 48 + 64) + 256));
    ggml_context *           g  = gb.ctx.get();
    // Guided: the conditional sequence, then the unconditional one (its mu, condition and speaker
    // zeros), side by side in time from the same state.
    ggml_tensor * xs = ggml_new_tensor_2d(g, GGML_TYPE_F32, M, T);
    ggml_tensor * ms = ggml_new_tensor_2d(g, GGML_TYPE_F32, M, T);
    ggml_tensor * cs = ggml_new_tensor_2d(g, GGML_TYPE_F32, M, T);
    ggml_tensor * sp = ggml_new_tensor_2d(g, GGML_TYPE_F32, h.xvector, 1);
    ggml_tensor * ts = ggml_new_tensor_2d(g, GGML_TYPE_F32, h.dec_time_sinusoid, n_times);
    for (ggml_tensor * in : { xs, ms, cs, sp, ts }) {
        ggml_set_input(in);
    }
    // The time embedding of t (mean flow: of t and r, one MLP over both, mixed into one).
    ggml_tensor * temb =
        linear(c, g, ggml_silu(g, linear(c, g, ts, "flow.dec.time.linear_1")), "flow.dec.time.linear_2");
    if (h.meanflow) {
        temb = linear(c, g, ggml_reshape_2d(g, temb, 2 * h.dec_time_embed, 1), "flow.dec.time_mixer", false);
    }
    // The speaker: its x-vector (normalized on the host) projected, the same at every frame.
    ggml_tensor * s = linear(c, g, sp, "flow.spk_affine");  // [M, 1]
    ggml_tensor * x = concat_all(g, { xs, ms, ggml_repeat(g, s, xs), cs }, 0);
    if (guided) {
        ggml_tensor * zeros = ggml_scale(g, ms, 0.0f);
        x                   = ggml_concat(g, x, concat_all(g, { xs, zeros, zeros, zeros }, 0), 1);  // [4M, 2T]
    }
    x                  = unet_block(c, g, x, temb, h, "flow.dec.down.", S);
    ggml_tensor * skip = x;
    x                  = causal_conv(c, g, x, "flow.dec.down.conv", S);
    for (int64_t i = 0; i < h.dec_n_mid; ++i) {
        x = named(unet_block(c, g, x, temb, h, "flow.dec.mid." + std::to_string(i) + ".", S), "flow_dec_mid", (int) i);
    }
    x               = unet_block(c, g, ggml_concat(g, x, skip, 0), temb, h, "flow.dec.up.", S);
    x               = causal_conv(c, g, x, "flow.dec.up.conv", S);
    x               = causal_block(c, g, x, "flow.dec.final", S);
    ggml_tensor * v = named(linear(c, g, x, "flow.dec.proj"), "flow_velocity");  // [M, S T]
    ggml_set_output(v);
    ggml_build_forward_expand(gb.gf, v);
    c.alloc(VS_STAGE_FLOW, gb.gf);
    std::vector<float> times(et);
    if (h.meanflow) {
        times.insert(times.end(), er.begin(), er.end());
    }
    c.set_input(xs, state.data());
    c.set_input(ms, mu.data());
    c.set_input(cs, cond.data());
    c.set_input(sp, spk.data());
    c.set_input(ts, times.data());
    c.compute(gb.gf);
    std::vector<float> out((size_t) (M * T * S));
    ggml_backend_tensor_get(v, out.data(), 0, ggml_nbytes(v));
    return out;
}

std::vector<float> flow_prompt_mel(vs_context & c, const flow_hparams & h, const float * audio, int64_t L) {
    const int64_t N = h.mel_n_fft, hop = h.mel_hop, pad = (N - hop) / 2;
    if (L <= pad) {
        throw error(VS_ERR_INVALID_ARG,
                    "the recording is too short for S3Gen's mel: at least " + std::to_string(pad + 1) + " samples");
    }
    const int64_t      F   = (L + 2 * pad - N) / hop + 1;
    std::vector<float> out = mel_energies(c, VS_STAGE_MEL, reflected_frames(audio, L, N, hop, pad, F), "flow.mel_dft",
                                          "flow.mel_filters", 1e-9f);
    for (float & v : out) {
        v = std::log(std::max(v, 1e-5f));
    }
    return out;
}

}  // namespace vs::chatterbox
