// Piper's voice: hyperparameters and their checks, the tensors' layout, noise, and a batch's way through the stages.
#include "piper.h"

namespace vs::piper {

ggml_tensor * new_input(ggml_context * g, ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    ggml_tensor * t = ggml_new_tensor_4d(g, type, ne0, ne1, ne2, ne3);
    ggml_set_input(t);
    return t;
}

ggml_tensor * masked(ggml_context * g, ggml_tensor * x, ggml_tensor * mask) {
    return mask ? ggml_mul(g, x, mask) : x;
}

piper_hparams read_hparams(const vs_model & m) {
    piper_hparams     h;
    const std::string p = "piper.";
    h.sample_rate       = m.u32_in(p + "sample_rate", 1000, 384000);
    h.hidden            = m.u32_in(p + "hidden_channels", 1, 4096);
    h.inter             = m.u32_in(p + "inter_channels", 2, 4096);
    h.n_heads           = m.u32_in(p + "n_heads", 1, 64);
    h.n_layers          = m.u32_in(p + "n_layers", 1, 64);
    h.window            = m.u32_in(p + "window_size", 1, 256);
    h.ffn_kernel        = m.u32_in(p + "ffn_kernel", 1, 31);
    h.ups_rates         = m.i32_array_in(p + "dec_upsample_rates", 1, 8, 1, 64);
    h.ups_kernels       = m.i32_array_in(p + "dec_upsample_kernels", 1, 8, 2, 128);
    h.res_kernels       = m.i32_array_in(p + "dec_resblock_kernels", 1, 8, 1, 31);
    h.res_convs         = m.u32_in(p + "dec_resblock_convs", 1, 8);
    h.res_dilations     = m.i32_array_in(p + "dec_resblock_dilations", 1, 64, 1, 64);
    h.dec_kernel_pre    = (int) m.tensor("dec.conv_pre.weight")->ne[1];
    h.dec_kernel_post   = (int) m.tensor("dec.conv_post.weight")->ne[1];
    h.flow_ids          = m.i32_array_in(p + "flow_ids", 1, 16, 0, 63);
    h.wn_layers         = m.u32_in(p + "flow_wn_layers", 1, 64);
    h.wn_kernel         = m.u32_in(p + "flow_wn_kernel", 1, 31);
    h.wn_dilation_rate  = m.u32_in(p + "flow_wn_dilation_rate", 1, 8);
    h.dp_flow_ids       = m.i32_array_in(p + "dp_flow_ids", 1, 16, 1, 63);
    h.dp_layers         = m.u32_in(p + "dp_layers", 1, 16);
    h.dp_kernel         = m.u32_in(p + "dp_kernel", 1, 31);
    h.dp_bins           = m.u32_in(p + "dp_num_bins", 1, 64);
    h.dp_tail_bound     = m.f32_in(p + "dp_tail_bound", 1e-3f, 1e3f);
    h.noise_scale       = m.f32_in(p + "noise_scale", 0.0f, 10.0f);
    h.length_scale      = m.f32_in(p + "length_scale", 0.05f, 20.0f);
    h.noise_w           = m.f32_in(p + "noise_w", 0.0f, 10.0f);
    auto it             = m.strings.find(p + "espeak_voice");
    h.espeak_voice      = it == m.strings.end() ? "en-us" : it->second;

    if (h.hidden % h.n_heads != 0) {
        m.bad("metadata 'piper.n_heads' (" + std::to_string(h.n_heads) + ") does not divide 'piper.hidden_channels' (" +
              std::to_string(h.hidden) + ")");
    }
    if (h.inter % 2 != 0) {
        m.bad("metadata 'piper.inter_channels' (" + std::to_string(h.inter) + ") is odd; the flow halves it");
    }
    if (h.ups_kernels.size() != h.ups_rates.size()) {
        m.bad("metadata 'piper.dec_upsample_kernels' and 'piper.dec_upsample_rates' differ in length");
    }
    int64_t hop = 1;
    for (size_t i = 0; i < h.ups_rates.size(); ++i) {
        if (h.ups_kernels[i] != 2 * h.ups_rates[i]) {  // conv_transpose1d's overlap-add of two halves
            m.bad("metadata 'piper.dec_upsample_kernels'[" + std::to_string(i) + "] is " +
                  std::to_string(h.ups_kernels[i]) + "; this engine runs kernels of twice the rate (" +
                  std::to_string(2 * h.ups_rates[i]) + ")");
        }
        hop *= h.ups_rates[i];
    }
    if (hop > 4096) {
        m.bad("metadata 'piper.dec_upsample_rates' upsample " + std::to_string(hop) + " times; at most 4096");
    }
    if (h.res_dilations.size() != h.res_kernels.size() * (size_t) h.res_convs) {
        m.bad("metadata 'piper.dec_resblock_dilations' has " + std::to_string(h.res_dilations.size()) +
              " values, not one for each of 'piper.dec_resblock_convs' convolutions of each kernel");
    }
    const std::pair<const char *, int> odd[] = { { "ffn_kernel", h.ffn_kernel },
                                                 { "flow_wn_kernel", h.wn_kernel },
                                                 { "dp_kernel", h.dp_kernel },
                                                 { "dec.conv_pre.weight's kernel", h.dec_kernel_pre },
                                                 { "dec.conv_post.weight's kernel", h.dec_kernel_post } };
    for (const auto & [what, k] : odd) {
        if (k % 2 == 0 || k > 31) {
            m.bad(std::string(what) + " is " + std::to_string(k) + "; this engine runs odd kernels up to 31");
        }
    }
    for (int k : h.res_kernels) {
        if (k % 2 == 0) {
            m.bad("metadata 'piper.dec_resblock_kernels' holds " + std::to_string(k) +
                  "; this engine runs odd kernels");
        }
    }
    // Dilations grow by the rate (the kernel, in the duration predictor) a layer: bounded so
    // that a padding stays within a few thousand frames.
    if (std::pow((double) h.wn_dilation_rate, h.wn_layers - 1) > 4096 ||
        std::pow((double) h.dp_kernel, h.dp_layers - 1) > 4096) {
        m.bad("metadata 'piper.flow_wn_dilation_rate' or 'piper.dp_kernel' gives dilations past 4096");
    }

    auto phonemes = m.str_array(p + "phonemes");
    auto ids      = m.i32_array(p + "phoneme_ids");
    if (phonemes.size() != ids.size()) {
        m.bad("metadata 'piper.phonemes' and 'piper.phoneme_ids' differ in length");
    }
    const int64_t n_vocab = m.tensor("enc_p.emb.weight")->ne[1];
    for (size_t i = 0; i < phonemes.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            m.bad("metadata 'piper.phoneme_ids'[" + std::to_string(i) + "] is " + std::to_string(ids[i]) +
                  "; the embedding has " + std::to_string(n_vocab) + " rows");
        }
        auto cps = utf8_decode(phonemes[i]);
        if (cps.size() == 1) {
            h.phoneme_ids[cps[0]] = ids[i];
        }
    }
    for (char32_t special : { U'^', U'$', U'_', U' ' }) {
        if (!h.phoneme_ids.count(special)) {
            m.bad("metadata 'piper.phonemes' lacks BOS, EOS, pad or space ('^', '$', '_', ' ')");
        }
    }
    return h;
}

std::vector<tensor_spec> piper_layout(const vs_model & m, const piper_hparams & h) {
    const int64_t            H = h.hidden, I = h.inter, V = m.tensor("enc_p.emb.weight")->ne[1];
    const int64_t            FF = m.tensor("enc_p.encoder.ffn_layers.0.conv_1.bias")->ne[0];
    const int64_t            DP = m.tensor("dp.pre.bias")->ne[0];
    const int64_t            C0 = m.tensor("dec.conv_pre.bias")->ne[0];
    std::vector<tensor_spec> s;
    auto                     add = [&](const std::string & name, std::array<int64_t, 4> ne, bool reducible = false) {
        s.push_back({ name, ne, reducible });
    };
    auto conv = [&](const std::string & name, int64_t ic, int64_t k, int64_t oc, bool reducible, bool bias = true) {
        add(name + ".weight", { ic, k, oc, 1 }, reducible && ic * k * oc >= 64);
        if (bias) {
            add(name + ".bias", { oc, 1, 1, 1 });
        }
    };
    add("enc_p.emb.weight", { H, V, 1, 1 });
    for (int l = 0; l < h.n_layers; ++l) {
        const std::string a = "enc_p.encoder.attn_layers." + std::to_string(l) + ".";
        for (const char * qkvo : { "conv_q", "conv_k", "conv_v", "conv_o" }) {
            conv(a + qkvo, H, 1, H, false);
        }
        add(a + "emb_rel_k", { H / h.n_heads, 2 * h.window + 1, 1, 1 });
        add(a + "emb_rel_v", { H / h.n_heads, 2 * h.window + 1, 1, 1 });
        const std::string f = "enc_p.encoder.ffn_layers." + std::to_string(l) + ".";
        conv(f + "conv_1", H, h.ffn_kernel, FF, false);
        conv(f + "conv_2", FF, h.ffn_kernel, H, false);
        for (const char * norm : { "norm_layers_1.", "norm_layers_2." }) {
            add("enc_p.encoder." + std::string(norm) + std::to_string(l) + ".gamma", { H, 1, 1, 1 });
            add("enc_p.encoder." + std::string(norm) + std::to_string(l) + ".beta", { H, 1, 1, 1 });
        }
    }
    conv("enc_p.proj", H, 1, 2 * I, false);
    auto dds = [&](const std::string & prefix) {
        for (int l = 0; l < h.dp_layers; ++l) {
            const std::string n = std::to_string(l);
            add(prefix + "convs_sep." + n + ".weight", { DP, h.dp_kernel, 1, 1 });
            add(prefix + "convs_sep." + n + ".bias", { DP, 1, 1, 1 });
            conv(prefix + "convs_1x1." + n, DP, 1, DP, false);
            for (const char * norm : { "norms_1.", "norms_2." }) {
                add(prefix + norm + n + ".gamma", { DP, 1, 1, 1 });
                add(prefix + norm + n + ".beta", { DP, 1, 1, 1 });
            }
        }
    };
    conv("dp.pre", H, 1, DP, false);
    conv("dp.proj", DP, 1, DP, false);
    dds("dp.convs.");
    add("dp.flows.0.m", { 1, 2, 1, 1 });
    add("dp.flows.0.exp_neg_logs", { 1, 2, 1, 1 });
    for (int id : h.dp_flow_ids) {
        const std::string f = "dp.flows." + std::to_string(id) + ".";
        conv(f + "pre", 1, 1, DP, false);
        dds(f + "convs.");
        conv(f + "proj", DP, 1, 3 * h.dp_bins - 1, false);
    }
    for (int id : h.flow_ids) {
        const std::string f = "flow.flows." + std::to_string(id) + ".";
        conv(f + "pre", I / 2, 1, H, true);
        for (int l = 0; l < h.wn_layers; ++l) {
            const std::string n = std::to_string(l);
            conv(f + "enc.in_layers." + n, H, h.wn_kernel, 2 * H, true);
            conv(f + "enc.res_skip_layers." + n, H, 1, l + 1 < h.wn_layers ? 2 * H : H, true);
        }
        conv(f + "post", H, 1, I / 2, true);
    }
    conv("dec.conv_pre", I, h.dec_kernel_pre, C0, true);
    int64_t C = C0;
    for (size_t i = 0; i < h.ups_rates.size(); ++i) {
        if (C % 2 != 0) {
            m.bad("the decoder's channels (" + std::to_string(C0) + ") cannot be halved at each upsampling");
        }
        const std::string u = "dec.ups." + std::to_string(i) + ".";
        add(u + "weight", { C, C / 2, h.ups_kernels[i], 1 }, true);
        add(u + "bias", { C / 2, 1, 1, 1 });
        C /= 2;
        for (size_t j = 0; j < h.res_kernels.size(); ++j) {
            const std::string r = "dec.resblocks." + std::to_string(i * h.res_kernels.size() + j) + ".convs.";
            for (int cv = 0; cv < h.res_convs; ++cv) {
                conv(r + std::to_string(cv), C, h.res_kernels[j], C, true);
            }
        }
    }
    conv("dec.conv_post", C, h.dec_kernel_post, 1, true, false);
    return s;
}

void gaussian_fill(uint64_t key, float * out, size_t n, float scale, int n_threads) {
    auto pairs = [&](size_t p0, size_t p1) {
        for (size_t p = p0; p < p1; ++p) {
            float a = 0.0f, b = 0.0f;
            gaussian_pair(key, p, scale, a, b);
            out[2 * p] = a;
            if (2 * p + 1 < n) {
                out[2 * p + 1] = b;
            }
        }
    };
    const size_t n_pairs = (n + 1) / 2;
    const size_t parts   = std::min<size_t>((size_t) std::max(1, n_threads), n_pairs / 16384 + 1);
    if (parts <= 1) {
        pairs(0, n_pairs);
        return;
    }
    std::vector<std::thread> workers;
    const size_t             per = (n_pairs + parts - 1) / parts;
    for (size_t k = 1; k < parts; ++k) {
        workers.emplace_back(pairs, std::min(n_pairs, k * per), std::min(n_pairs, (k + 1) * per));
    }
    pairs(0, std::min(n_pairs, per));
    for (auto & w : workers) {
        w.join();
    }
}

std::vector<std::vector<float>> piper_voice::synthesize_batch(vs_context &                              c,
                                                              const std::vector<std::vector<int32_t>> & ids,
                                                              const vs_synth_params & p, int first_chunk) {
    std::vector<job> jobs(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        jobs[i].ids = ids[i];
        // A sentence's noise depends on the seed and its phonemes, not on where it stands:
        // the same sentence sounds the same alone, in a longer text or in another batch.
        uint64_t key = mix64(p.seed * 0x9E3779B97F4A7C15ull);
        for (int32_t id : ids[i]) {
            key = mix64(key ^ (uint32_t) id);
        }
        jobs[i].key = key;
    }
    // Off the CPU, where a stage costs its kernel launches more than its arithmetic, the
    // sentences share graphs (packing, a slot of the longest one's length each); on the CPU
    // each has its own.
    const int64_t gap = token_gap();
    for (size_t first = 0; first < jobs.size();) {
        size_t  last    = first + 1;
        int64_t longest = (int64_t) jobs[first].ids.size();
        while (c.device_graphs && last < jobs.size()) {
            const int64_t l = std::max(longest, (int64_t) jobs[last].ids.size());
            if ((int64_t) (last + 1 - first) * (l + gap) > PACK_TOKENS) {
                break;
            }
            longest = l;
            ++last;
        }
        run_group(c, jobs, first, last, p, first_chunk);
        first = last;
    }

    std::vector<std::vector<float>> audio;
    for (auto & j : jobs) {
        c.timings.n_phoneme_ids += (int32_t) j.ids.size();
        c.timings.n_frames += (int32_t) j.frame_to_token.size();
        audio.push_back(std::move(j.audio));
        c.chunk_durations.push_back(vs::token_frames(j.frame_to_token, (int64_t) j.ids.size()));
    }
    // The named intermediates are the last chunk's.
    job &         j = jobs.back();
    const int64_t T = (int64_t) j.ids.size(), F = (int64_t) j.frame_to_token.size();
    c.set_output("m_p", std::move(j.m_p), T, hp_.inter);
    c.set_output("logs_p", std::move(j.logs_p), T, hp_.inter);
    c.set_output("logw", std::move(j.logw), T, 1);
    c.set_output("z", std::move(j.z), F, hp_.inter);
    c.set_output("durations", c.chunk_durations.back(), T, 1);
    return audio;
}

void piper_voice::run_group(vs_context & c, std::vector<job> & jobs, size_t first, size_t last,
                            const vs_synth_params & p, int first_chunk) {
    const float  noise_scale  = p.noise_scale < 0 ? hp_.noise_scale : p.noise_scale;
    const float  length_scale = p.length_scale <= 0 ? hp_.length_scale : p.length_scale;
    const float  noise_w      = p.noise_w < 0 ? hp_.noise_w : p.noise_w;
    const size_t n            = last - first;
    auto         stage        = [&](int id, auto && fn) { c.timed_stage(id, first_chunk + (int) first, p, fn); };

    std::vector<int64_t> lens;
    for (size_t i = first; i < last; ++i) {
        lens.push_back((int64_t) jobs[i].ids.size());
    }
    // Where graphs are kept by their shapes (on CUDA), lengths are rounded up so that other
    // sentences of about the same lengths run the same graphs.
    const bool           bucketed = c.rounds_shapes();
    const packing        tok(lens, token_gap(), true, bucketed);
    std::vector<int32_t> ids((size_t) tok.total, hp_.phoneme_ids.at(U'_'));  // the gaps' tokens are masked
    for (size_t i = 0; i < n; ++i) {
        std::copy(jobs[first + i].ids.begin(), jobs[first + i].ids.end(), ids.begin() + tok.start[i]);
    }

    std::vector<float> hidden, m_p, logs_p;
    stage(VS_STAGE_ENCODER, [&] { run_encoder(c, ids, tok, hidden, m_p, logs_p); });
    stage(VS_STAGE_DURATION, [&] {
        std::vector<float> noise((size_t) (2 * tok.total), 0.0f);  // [T, 2]: a row a channel
        for (size_t i = 0; noise_w != 0.0f && i < n; ++i) {
            for (int64_t ch = 0; ch < 2; ++ch) {
                gaussian_fill(mix64(jobs[first + i].key ^ (uint64_t) (1 + ch)),
                              noise.data() + ch * tok.total + tok.start[i], (size_t) tok.len[i], noise_w, 1);
            }
        }
        const std::vector<float> logw = run_duration(c, hidden, tok, noise);
        for (size_t i = 0; i < n; ++i) {
            job & j = jobs[first + i];
            j.logw  = tok.slice(logw, 1, i);
            for (int64_t t = 0; t < tok.len[i]; ++t) {
                const int frames = (int) std::ceil(std::exp(j.logw[t]) * length_scale);
                for (int k = 0; k < frames; ++k) {
                    j.frame_to_token.push_back((int32_t) t);
                }
            }
            if (j.frame_to_token.empty()) {
                j.frame_to_token.push_back(0);  // the reference clamps the length to one frame
            }
        }
    });
    stage(VS_STAGE_FLOW, [&] {
        const int64_t        C = hp_.inter;
        std::vector<int64_t> frames_of;
        for (size_t i = first; i < last; ++i) {
            frames_of.push_back((int64_t) jobs[i].frame_to_token.size());
        }
        const packing           frm(frames_of, flow_gap(), false, bucketed);
        std::vector<int32_t>    frame_to_token((size_t) frm.total, 0);  // gap frames are masked
        std::vector<noise_span> eps;
        for (size_t i = 0; i < n; ++i) {
            const job & j = jobs[first + i];
            for (int64_t f = 0; f < frm.len[i]; ++f) {
                frame_to_token[frm.start[i] + f] = (int32_t) tok.start[i] + j.frame_to_token[f];
            }
            if (noise_scale != 0.0f) {  // else z is the means: no noise to draw
                eps.push_back({ mix64(j.key ^ 3u), frm.start[i] * C, C * frm.len[i] });
            }
        }
        const std::vector<float> z = run_flow(c, m_p, logs_p, frame_to_token, eps, noise_scale, tok.total, frm);
        for (size_t i = 0; i < n; ++i) {
            jobs[first + i].z = frm.slice(z, C, i);
        }
    });
    if (last == jobs.size()) {  // the named intermediates are the last chunk's
        jobs.back().m_p    = tok.slice(m_p, hp_.inter, n - 1);
        jobs.back().logs_p = tok.slice(logs_p, hp_.inter, n - 1);
    }
    const int64_t tile = p.decoder_tile_frames != 0 ? p.decoder_tile_frames : decoder_tile(c);
    stage(VS_STAGE_DECODER, [&] { decode(c, jobs, first, last, tile); });
}

// Sentences that fit a tile share one (packed); a longer one goes alone, in tiles.
void piper_voice::decode(vs_context & c, std::vector<job> & jobs, size_t first, size_t last, int64_t tile) {
    const int64_t C = hp_.inter, gap = decoder_gap(), hop = decoder_hop();
    auto          frames = [&](size_t i) { return (int64_t) jobs[i].frame_to_token.size(); };
    for (size_t a = first; a < last;) {
        c.check_abort();
        if (tile >= 0 && frames(a) > tile) {
            jobs[a].audio = run_decoder_tiled(c, jobs[a].z, frames(a), tile);
            ++a;
            continue;
        }
        size_t  b     = a + 1;
        int64_t total = frames(a);
        while (b < last && (tile < 0 || total + gap + frames(b) <= tile)) {
            total += gap + frames(b++);
        }
        std::vector<int64_t> lens;
        for (size_t i = a; i < b; ++i) {
            lens.push_back(frames(i));
        }
        const packing      pk(lens, gap);
        std::vector<float> z((size_t) (C * pk.total), 0.0f);
        for (size_t i = a; i < b; ++i) {
            std::copy(jobs[i].z.begin(), jobs[i].z.end(), z.begin() + pk.start[i - a] * C);
        }
        const std::vector<float> audio = run_decoder(c, z, pk);
        for (size_t i = a; i < b; ++i) {
            jobs[i].audio.assign(audio.begin() + pk.start[i - a] * hop,
                                 audio.begin() + (pk.start[i - a] + pk.len[i - a]) * hop);
        }
        a = b;
    }
}

}  // namespace vs::piper

namespace vs {

using namespace piper;

void piper_validate(const vs_model & model) {
    check_tensors(model, piper_layout(model, read_hparams(model)));
}

std::unique_ptr<voice> make_piper_voice(vs_model & model) {
    return std::make_unique<piper_voice>(model);
}

}  // namespace vs
