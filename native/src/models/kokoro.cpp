// Kokoro-82M: StyleTTS 2 with an iSTFTNet vocoder.
//
// PL-BERT (ALBERT, one layer applied 12 times) -> duration encoder (bi-LSTMs with
// AdaLayerNorm from the prosody half of the style) -> durations -> F0 and energy
// (shared bi-LSTM, AdaIN residual blocks) -> text encoder (convs, bi-LSTM) -> decoder
// (AdaIN residual blocks from the acoustic half) -> generator (harmonic source from
// F0, its STFT, upsampling, Snake residual blocks, iSTFT).
//
// Every stage is ggml graphs on the context's device. The host only rounds the
// durations (they decide the later graphs' shapes) and moves activations between
// graphs: LSTMs run as a recurrence over chunks of steps, one graph per chunk (on a
// CUDA device, the input projections in a graph and the steps in one kernel).
// Matches the int8 ONNX export of the model (kokoro-v1.0.int8.onnx), which differs
// from the PyTorch code in its harmonic source (no random phase or noise) and its
// iSTFT gain.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "../vs-context.h"
#include "../vs-cuda.h"
#include "../vs-graph.h"

namespace vs {

namespace {

constexpr int     STYLE_DIM           = 128;  // each half of a 256-value style row
constexpr int     MAX_TOKENS          = 510;  // phonemes per chunk (the BERT has 512 positions)
constexpr int     BERT_HEAD_DIM       = 64;
constexpr int64_t BERT_BATCH_TOKENS   = 1024;        // tokens of jobs sharing a BERT graph (off the CPU)
constexpr int     LSTM_CHUNK          = 256;         // recurrence steps per graph
constexpr int     LSTM_CHUNK_FUSED    = 1024;        // steps per kernel of the engine's own (vs-cuda.h)
constexpr size_t  MAX_IM2COL_TC_BYTES = 512u << 20;  // largest [T, C] im2col matrix
constexpr int     N_FFT               = 20;
constexpr int     HOP                 = 5;
constexpr int     N_HARMONICS         = 9;
constexpr float   VOICED_F0           = 10.0f;
constexpr float   SINE_AMP            = 0.1f;
constexpr int64_t MAX_PACKED_FRAMES   = 1 << 14;  // frames (40 a second) of sentences packed in a graph
// Bytes per packed frame of the largest packed tensor: the decoder's upsampling block's
// im2col matrix (1090 channels, 3 taps, 2 frames after the upsampling, F16) is 13 KB.
constexpr int64_t PACKED_FRAME_BYTES = 16 << 10;
constexpr int64_t PACK_GAP           = 2;  // frames after each: kernels of 3 pad by 1, at either rate
// The most frames of an F0/N or decoder graph kept between calls (vs_context::stage_graph):
// about 25 and 42 KB of graph memory a frame; a larger one runs on the scheduler's memory.
constexpr int64_t KEPT_MAX_FRAMES = 2048;
constexpr int64_t SAMPLES_PER_F0  = 300;  // generator upsampling (10 * 6) times the iSTFT hop
// Sentences in a pass of the generator's CUDA kernels: frames (40 a second) and count; the
// device scratch such a pass holds, per frame (its last stage: 128 channels at 120 frames
// a frame, in 5 buffers of F32 and the F16 convolution input), rounded up.
constexpr int64_t GEN_PACKED_FRAMES    = 1024;
constexpr size_t  GEN_PACKED_SENTENCES = 16;
constexpr size_t  GEN_FRAME_BYTES      = 512 << 10;

// Tensor names: the PyTorch module names without their wrappers (convert_kokoro.py).
const std::string BERT  = "bert.";
const std::string PRED  = "predictor.";
const std::string TEXT  = "text_encoder.";
const std::string DEC   = "decoder.";
const std::string GEN   = "generator.";
const std::string LAYER = "bert.layer.";

struct kokoro_hparams {
    int                            sample_rate   = 24000;
    int                            n_bert_layers = 12;
    int64_t                        bert_hidden   = 768;
    std::map<std::string, int32_t> vocab;  // symbol (one code point, UTF-8) -> id
    std::vector<std::string>       voices;
    std::vector<int32_t>           gen_rates, gen_kernels;
    std::vector<int32_t>           res_kernels   = { 3, 7, 11 };
    std::vector<int32_t>           res_dilations = { 1, 3, 5 };
};

kokoro_hparams read_hparams(const vs_model & m) {
    kokoro_hparams h;
    h.sample_rate = m.u32_in("kokoro.sample_rate", 1000, 384000);
    auto symbols  = m.str_array("kokoro.vocab_symbols");
    auto ids      = m.i32_array("kokoro.vocab_ids");
    if (symbols.size() != ids.size()) {
        m.bad("metadata 'kokoro.vocab_symbols' and 'kokoro.vocab_ids' differ in length");
    }
    for (size_t i = 0; i < symbols.size(); ++i) {
        h.vocab[symbols[i]] = ids[i];
    }
    h.voices      = m.str_array("kokoro.voices");
    h.bert_hidden = m.tensor(LAYER + "attention.query.weight")->ne[0];
    for (int i = 0;; ++i) {
        auto it = m.host.tensors.find(GEN + "ups." + std::to_string(i) + ".weight");
        if (it == m.host.tensors.end()) {
            break;
        }
        const int K = (int) it->second->ne[2];
        h.gen_kernels.push_back(K);
        h.gen_rates.push_back(K / 2);
    }
    int64_t up = HOP;
    for (int r : h.gen_rates) {
        up *= r;
    }
    if (h.voices.empty() || h.bert_hidden % BERT_HEAD_DIM != 0 || up != SAMPLES_PER_F0) {
        throw error(VS_ERR_FORMAT, "hyperparameters of '" + m.path + "' are not Kokoro-82M's");
    }
    return h;
}

// Host-side [C, T] activation (channels fastest).
struct act {
    std::vector<float> v;
    int64_t            C = 0, T = 0;
};

// A recurrence's output left on a CUDA device (vs::cuda::lstm's [H, cols, steps], sequence
// b's columns D b + d) for its consumers to gather into their graphs' inputs: set where
// run_lstm was asked for it and ran the sequences in one kernel, its acts left empty.
struct lstm_device_out {
    const float * out = nullptr;
    int64_t       H = 0, cols = 0, D = 0, steps = 0;
};

// Frames [at, at + frames) of graph input t [C, ...] from sequence `seq` of a recurrence's
// output: its frames, then zeros.
struct lstm_dest {
    size_t        seq = 0;
    ggml_tensor * t   = nullptr;
    int64_t       at = 0, frames = 0;
};

// A recurrence's input computed by its projections' graph itself (run_lstm on a CUDA device,
// one kernel call): build() adds the ops that make it, [in, N + 1] with column N zeros and
// sequence b's frame t at column first[b] + t, and appends the tensors fill() sets (after
// the graph's allocation, before each compute); key names its shapes.
struct lstm_graph_input {
    std::string                                                                               key;
    int64_t                                                                                   N = 0;
    std::vector<int64_t>                                                                      first;
    std::function<ggml_tensor *(ggml_context *, ggml_cgraph *, std::vector<ggml_tensor *> &)> build;
    std::function<void(const std::vector<ggml_tensor *> &)>                                   fill;

    // Sequence b's frames[b] columns one after another.
    void lay_out(const std::vector<int64_t> & frames) {
        for (int64_t f : frames) {
            first.push_back(N);
            N += f;
        }
    }

    // The input from the sequences' [in, frames[b]] parts: joined, then column N of zeros.
    static ggml_tensor * join(ggml_context * g, std::vector<ggml_tensor *> parts) {
        return ggml_pad(g, concat_all(g, std::move(parts), 1), 0, 1, 0, 0);
    }
};

// A graph's [C, T] that set_from_lstm fills before each compute, not flagged as an input:
// ggml's scheduler files an input in host memory and copies it to the device as the graph
// runs, where this one it places with its consumers, on the device, for the engine's
// kernels to write.
ggml_tensor * lstm_input_2d(ggml_context * g, int64_t C, int64_t T, const char * name) {
    ggml_tensor * t = ggml_new_tensor_2d(g, GGML_TYPE_F32, C, T);
    ggml_set_name(t, name);
    return t;
}

ggml_tensor * input_2d(ggml_context * g, int64_t C, int64_t T, const char * name) {
    ggml_tensor * t = lstm_input_2d(g, C, T, name);
    ggml_set_input(t);
    return t;
}

act read_act(ggml_tensor * t) {
    act a;
    a.C = t->ne[0];
    a.T = ggml_nelements(t) / t->ne[0];
    a.v.resize(ggml_nelements(t));
    ggml_backend_tensor_get(t, a.v.data(), 0, ggml_nbytes(t));
    return a;
}

// The first T frames of an output [C, T' >= T] (a graph's rounded-up shapes).
act read_frames(ggml_tensor * t, int64_t T) {
    act a = read_act(t);
    a.T   = T;
    a.v.resize((size_t) (a.C * T));
    return a;
}

void set_input(vs_context & c, ggml_tensor * t, const void * data) {
    c.set_input(t, data);
}

// One chunk's way through the stages.
struct kokoro_job {
    std::vector<int32_t> tokens;  // ids with the padding token at both ends
    std::vector<float>   style;   // its style row: acoustic half, then prosody half
    act                  d_en, d_in, d, t_en, dec, har;
    std::vector<float>   logits, dur, f0, n, audio;
    std::vector<int32_t> frame_to_token;
    int64_t              dec_at   = -1;  // dec's bytes into the device handoff, where it was left there (dec.v empty)
    bool                 har_kept = false;  // har named as an output where it is, on the device (har.v empty)
};

// Where the decoder leaves each job's output on the device for the generator's kernels: the
// frames of all of them (2 F each), and the next job's byte offset.
struct dec_handoff {
    int64_t frames = 0;
    size_t  at     = 0;
};

// The segment length of the jobs' tokens side by side in a graph: the most tokens of any
// job, rounded up to shape_bucket's lengths where graphs are kept by their shapes (the
// frames added are zeros in, dropped out), then, with more than one job, `gap` frames of
// zeros. The job count and the length are appended to the graph's key.
int64_t token_segments(const vs_context & c, const std::vector<kokoro_job> & jobs, int64_t gap, std::string & key) {
    int64_t T = 0;
    for (const auto & j : jobs) {
        T = std::max(T, (int64_t) j.tokens.size());
    }
    const int64_t L = (c.rounds_shapes() ? shape_bucket(T) : T) + (jobs.size() > 1 ? gap : 0);
    key += " " + std::to_string(jobs.size()) + "x" + std::to_string(L);
    return L;
}

// Off the CPU, the style affines of every AdaIN of a graph as one matmul: the fc layers
// under a prefix concatenated ([128, sum of 2C]) with 1 added to each gamma half's bias.
struct style_table {
    ggml_tensor *                  w = nullptr, *b = nullptr;
    std::map<std::string, int64_t> offset;  // fc module -> its first row
};

class kokoro_voice final : public voice {
  public:
    explicit kokoro_voice(vs_model & model) : model_(model), hp_(read_hparams(model)) {}

    std::vector<std::vector<int32_t>> ids_from_text(vs_context & ctx, const std::string & text,
                                                    int & skipped) override {
        std::vector<std::vector<int32_t>> out;
        for (const auto & ipa : sentences(ctx, text)) {
            for (auto & ids : chunks(to_ids(ipa, skipped))) {
                out.push_back(std::move(ids));
            }
        }
        return out;
    }

    std::vector<std::vector<int32_t>> ids_from_phonemes(const std::string & ipa, int & skipped) override {
        std::vector<std::vector<int32_t>> out;
        for (const auto & line : split_lines(ipa)) {
            for (auto & ids : chunks(to_ids(line, skipped))) {
                out.push_back(std::move(ids));
            }
        }
        return out;
    }

    // On a device with F16 or F32 weights, conv1d_phases' GEMMs: voice::prewarm_lengths.
    std::vector<std::string> prewarm_phonemes(const vs_context & ctx) const override {
        auto it = ctx.weights->tensors.find(GEN + "resblocks.0.convs1.0.weight");
        if (!ctx.device_graphs || it == ctx.weights->tensors.end() ||
            (it->second->type != GGML_TYPE_F16 && it->second->type != GGML_TYPE_F32)) {
            return voice::prewarm_phonemes(ctx);
        }
        return prewarm_lengths();
    }

    std::string phonemize(vs_context & ctx, const std::string & text) override {
        std::string out;
        for (const auto & s : sentences(ctx, text)) {
            out += (out.empty() ? "" : "\n") + s;
        }
        return out;
    }

    std::vector<float> synthesize(vs_context & ctx, const std::vector<int32_t> & ids, const vs_synth_params & p,
                                  int chunk) override {
        return synthesize_batch(ctx, { ids }, p, chunk)[0];
    }
    std::vector<std::vector<float>> synthesize_batch(vs_context & ctx, const std::vector<std::vector<int32_t>> & ids,
                                                     const vs_synth_params & p, int first_chunk) override;

  private:
    vs_model &                                 model_;
    kokoro_hparams                             hp_;
    mutable std::map<std::string, style_table> tables_;      // by prefix, made on first use
    mutable int                                fused_ = -1;  // fused_generator()'s answer, once asked
    // A sentence's residual stacks captured by its stages' buckets (run_generator_fused), for
    // the device scratch at captures_base_ (dropped when it moves).
    mutable vs::cuda::launch_cache captures_;
    mutable const void *           captures_base_ = nullptr;

    // Off the CPU, the AdaINs of k's graph under `prefix` read their affines from its table.
    void use_style_table(vs_context & c, ggml_context * g, struct cond & k, const std::string & prefix) const;
    // The style table of the AdaINs under `prefix`, made on first use; null on the CPU or where
    // their layers cannot share one.
    const style_table * style_table_for(vs_context & c, const std::string & prefix) const;
    // Whether n_jobs jobs' AdaIN graphs under `prefix` run packed: off the CPU in a batch, or
    // for a job alone where graphs are kept by their shapes (its frames rounded up as a gap).
    bool runs_packed(vs_context & c, size_t n_jobs, const std::string & prefix) const {
        return (n_jobs > 1 || c.rounds_shapes()) && style_table_for(c, prefix);
    }

    std::vector<std::string> sentences(vs_context & ctx, const std::string & text) const;
    std::vector<int32_t>     to_ids(const std::string & ipa, int & skipped) const;
    // Splits a sentence longer than MAX_TOKENS at its last clause break (else word
    // break, else hard) before the limit.
    std::vector<std::vector<int32_t>> chunks(std::vector<int32_t> ids) const;
    std::vector<float>                style_row(const vs_synth_params & p, size_t n_phonemes) const;

    std::vector<act> run_lstm(vs_context & c, int stage, const std::string & prefix,
                              const std::vector<const act *> &                  xs,
                              const std::vector<const std::vector<int32_t> *> & rows = {},
                              lstm_device_out * on_device = nullptr, const lstm_graph_input * in_graph = nullptr) const;
    // Sets graph inputs from a recurrence's output: gathered on the device where it was
    // left there and every destination is in that device's memory, else from ys (filled
    // from the device first where it was left there).
    void set_from_lstm(vs_context & c, lstm_device_out & o, std::vector<act> & ys,
                       const std::vector<lstm_dest> & dests) const;
    // Each job's BERT projection d_en [512, T] and, with the prosody style appended, the
    // duration encoder's input d_in [640, T]; jobs [first, last) in one graph.
    void run_bert(vs_context & c, std::vector<kokoro_job> & jobs) const;
    void run_bert_group(vs_context & c, std::vector<kokoro_job> & jobs, size_t first, size_t last) const;
    // The attention's query, key and value weights [Hd, 3 Hd] and biases concatenated (made
    // once); null where the three differ in type.
    void qkv_weights(vs_context & c, ggml_tensor *& w, ggml_tensor *& b) const;
    // Duration encoder output d [640, T], the logits and the (unrounded) frames per token.
    void run_duration(vs_context & c, std::vector<kokoro_job> & jobs, float speed) const;
    void run_prosody(vs_context & c, std::vector<kokoro_job> & jobs) const;  // F0 and N
    void run_text_encoder(vs_context & c, std::vector<kokoro_job> & jobs) const;
    // One graph; packed (packs) off the CPU in a batch or where graphs are kept by their shapes.
    // With `handoff`, each job's output stays on the device (kokoro_job::dec_at).
    void run_decoder(vs_context & c, const std::vector<kokoro_job *> & group, bool packs, dec_handoff * handoff) const;
    std::vector<float> run_generator(vs_context & c, const act & x, const std::vector<float> & f0,
                                     const std::vector<float> & style, act & har) const;
    bool               fused_generator(vs_context & c) const;
    bool               fused_generator_applies(vs_context & c) const;
    void               run_generator_fused(vs_context & c, const std::vector<kokoro_job *> & group) const;
    ggml_tensor *      gen_noise_conv(vs_context & c, ggml_context * g, ggml_tensor * har, size_t i) const;
    ggml_tensor *      gen_upsample(vs_context & c, ggml_context * g, ggml_tensor * x, size_t i) const;
    ggml_tensor *      gen_output(vs_context & c, ggml_context * g, ggml_tensor * x, int64_t L,
                                  ggml_tensor * mask = nullptr) const;
    ggml_tensor *      gen_frames(vs_context & c, ggml_context * g, ggml_tensor * x, ggml_tensor * mask,
                                  bool fine_columns) const;
    // Each generator stage's frames for F0 frames F2 (its upsamplings' transposed
    // convolutions; the last stage's reflection pad adds one).
    std::vector<int64_t> gen_stage_frames(int64_t F2) const;
    // For a sentence alone of F2 F0 frames, where its generator runs at its buckets' lengths
    // (run_generator_fused): each stage's bucket, and the most F0 frames whose stages fit them.
    int64_t gen_bucket(int64_t F2, std::vector<int64_t> & total) const;
    // The dilations of a residual block's six convolutions (each pair's second is 1).
    std::array<int, 6> res_dilations() const {
        return { hp_.res_dilations[0], 1, hp_.res_dilations[1], 1, hp_.res_dilations[2], 1 };
    }
    // The noise branch's residual block kernel at stage i; the name of stage i's j-th block.
    int         noise_kernel(size_t i) const { return i + 1 == hp_.gen_rates.size() ? 11 : 7; }
    std::string res_prefix(size_t stage, size_t j) const;

    ggml_tensor * adain_res_block(vs_context & c, ggml_context * g, ggml_tensor * x, const struct cond & k,
                                  const std::string & pre, bool upsample) const;
    ggml_tensor * snake_res_block(vs_context & c, ggml_context * g, ggml_tensor * x, const struct cond & k,
                                  const std::string & pre, int kernel) const;
};

// ---------------------------------------------------------------- text

// espeak-ng's IPA with '^' tying multi-letter phonemes, rewritten into Kokoro's
// symbols (its English set: A = eɪ, I = aɪ, W = aʊ, Y = ɔɪ, O = oʊ, ʤ, ʧ, ᵊ, ...).
// Longest match first; symbols still unknown to the vocabulary are dropped and counted.
const std::vector<std::pair<std::string, std::string>> & espeak_to_kokoro() {
    static const std::vector<std::pair<std::string, std::string>> table = [] {
        std::vector<std::pair<std::string, std::string>> t = {
            { "ʔˌn\u0329", "tᵊn" },
            { "ʔn\u0329", "tᵊn" },
            { "ʔn", "tᵊn" },
            { "ʔ", "t" },
            { "a^ɪ", "I" },
            { "a^ʊ", "W" },
            { "d^ʒ", "ʤ" },
            { "e^ɪ", "A" },
            { "e", "A" },
            { "t^ʃ", "ʧ" },
            { "ɔ^ɪ", "Y" },
            { "o^ʊ", "O" },
            { "ə^ʊ", "O" },
            { "ə^l", "ᵊl" },
            { "r", "ɹ" },
            { "x", "k" },
            { "ç", "k" },
            { "ɐ", "ə" },
            { "ɚ", "əɹ" },
            { "ɬ", "l" },
            { "ʲ", "" },
            { "ɜːɹ", "ɜɹ" },
            { "ɜː", "ɜɹ" },
            { "ɪə", "iə" },
            { "ː", "" },
            { "^", "" },
        };
        std::stable_sort(t.begin(), t.end(),
                         [](const auto & a, const auto & b) { return a.first.size() > b.first.size(); });
        return t;
    }();
    return table;
}

std::string to_kokoro_symbols(const std::string & ipa) {
    std::string out;
    for (size_t i = 0; i < ipa.size();) {
        bool matched = false;
        for (const auto & [from, to] : espeak_to_kokoro()) {
            if (ipa.compare(i, from.size(), from) == 0) {
                out += to;
                i += from.size();
                matched = true;
                break;
            }
        }
        if (!matched) {
            out += ipa[i++];
        }
    }
    // A syllabic consonant (combining U+0329 after it) is spoken with a schwa before it.
    std::string           res;
    std::vector<char32_t> cps = utf8_decode(out);
    for (size_t i = 0; i < cps.size(); ++i) {
        if (cps[i] == 0x329) {
            continue;
        }
        if (i + 1 < cps.size() && cps[i + 1] == 0x329) {
            res += "ᵊ";
        }
        res += utf8_encode(cps[i]);
    }
    return res;
}

std::vector<std::string> kokoro_voice::sentences(vs_context & ctx, const std::string & text) const {
    if (!ctx.phonemizer) {
        throw error(VS_ERR_PHONEMIZER, "this context has no espeak-ng; pass phonemes instead of text");
    }
    std::vector<std::string> out;
    for (const auto & s : ctx.phonemizer->phonemize(text, "en-us", phonemizer::IPA_TIED)) {
        std::string k = to_kokoro_symbols(s.ipa);
        if (!k.empty()) {
            out.push_back(std::move(k));
        }
    }
    return out;
}

std::vector<int32_t> kokoro_voice::to_ids(const std::string & ipa, int & skipped) const {
    std::vector<int32_t> ids;
    bool                 speakable = false;
    for (char32_t c : utf8_decode(ipa)) {
        if (c == U'\r' || c == U'\n') {
            continue;
        }
        auto it = hp_.vocab.find(utf8_encode(c));
        if (it == hp_.vocab.end()) {
            ++skipped;
            continue;
        }
        ids.push_back(it->second);
        speakable |= c != U' ' && !std::ispunct((int) (c < 0x80 ? c : 0));
    }
    return speakable ? ids : std::vector<int32_t>{};
}

std::vector<std::vector<int32_t>> kokoro_voice::chunks(std::vector<int32_t> ids) const {
    auto id_of = [&](const char * s) {
        auto it = hp_.vocab.find(s);
        return it == hp_.vocab.end() ? -1 : it->second;
    };
    const int32_t space = id_of(" "), comma = id_of(","), semi = id_of(";"), colon = id_of(":");
    return split_long(
        ids, (size_t) MAX_TOKENS, [&](int32_t id) { return id == comma || id == semi || id == colon; },
        [&](int32_t id) { return id == space; });
}

std::vector<float> kokoro_voice::style_row(const vs_synth_params & p, size_t n_phonemes) const {
    const float * pack = nullptr;
    int64_t       rows = 0;
    if (p.style) {
        if (p.style_rows <= 0) {
            throw error(VS_ERR_INVALID_ARG, "a style pack needs at least one row");
        }
        pack = p.style;
        rows = p.style_rows;
    } else {
        std::string name = p.voice && *p.voice ? p.voice : hp_.voices.front();
        if (std::find(hp_.voices.begin(), hp_.voices.end(), name) == hp_.voices.end()) {
            std::string known;
            for (const auto & v : hp_.voices) {
                known += (known.empty() ? "" : ", ") + v;
            }
            throw error(VS_ERR_INVALID_ARG, "the model has no voice '" + name + "' (it has: " + known + ")");
        }
        ggml_tensor * t = model_.tensor("voice." + name);
        if (t->type != GGML_TYPE_F32 || t->ne[0] != 2 * STYLE_DIM) {
            throw error(VS_ERR_FORMAT, "voice '" + name + "' is not a [510, 256] F32 pack");
        }
        pack = (const float *) t->data;
        rows = t->ne[1];
    }
    // The reference styles a sentence of n phonemes with row n - 1.
    const int64_t row = std::clamp<int64_t>((int64_t) n_phonemes - 1, 0, rows - 1);
    return std::vector<float>(pack + row * 2 * STYLE_DIM, pack + (row + 1) * 2 * STYLE_DIM);
}

// ---------------------------------------------------------------- shared blocks

// Linear layer: w [in, out] (ggml), x [in, T] -> [out, T].
ggml_tensor * linear(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & module) {
    return ggml_add(g, ggml_mul_mat(g, c.w(module + ".weight"), x), c.w(module + ".bias"));
}

// Per-channel (1 + gamma) and beta from the style, for AdaIN and AdaLayerNorm.
void style_affine(vs_context & c, ggml_context * g, ggml_tensor * s, const std::string & fc, int64_t C,
                  ggml_tensor *& scale, ggml_tensor *& shift) {
    ggml_tensor * h = linear(c, g, s, fc);  // [2C, 1]
    scale           = ggml_scale_bias(g, ggml_view_2d(g, h, C, 1, h->nb[1], 0), 1.0f, 1.0f);
    shift           = ggml_view_2d(g, h, C, 1, h->nb[1], C * ggml_element_size(h));
}

style_table make_style_table(vs_context & c, const vs_model & m, const std::string & prefix) {
    const std::string                                  suffix = ".fc.weight";
    std::vector<std::pair<std::string, ggml_tensor *>> fcs;
    for (const auto & [name, t] : m.host.tensors) {
        if (name.rfind(prefix, 0) == 0 && name.size() > suffix.size() &&
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            fcs.emplace_back(name.substr(0, name.size() - 7), t);  // the module: without ".weight"
        }
    }
    style_table tab;
    int64_t     rows = 0;
    for (const auto & [module, t] : fcs) {
        const ggml_tensor * b = m.tensor(module + ".bias");
        if (t->type != fcs[0].second->type || t->ne[0] != STYLE_DIM || b->type != GGML_TYPE_F32 ||
            b->ne[0] != t->ne[1]) {
            return {};  // the graphs keep one matmul per layer
        }
        tab.offset[module] = rows;
        rows += t->ne[1];
    }
    if (fcs.empty()) {
        return {};
    }
    tab.w =
        c.derived_tensor(prefix + "fc.all.weight", fcs[0].second->type, { STYLE_DIM, rows, 1, 1 }, [&](uint8_t * out) {
            for (const auto & [module, t] : fcs) {
                std::memcpy(out, t->data, ggml_nbytes(t));
                out += ggml_nbytes(t);
            }
        });
    tab.b = c.derived_tensor(prefix + "fc.all.bias", GGML_TYPE_F32, { rows, 1, 1, 1 }, [&](uint8_t * out) {
        auto * dst = reinterpret_cast<float *>(out);
        for (const auto & [module, t] : fcs) {
            const ggml_tensor * b   = m.tensor(module + ".bias");
            const int64_t       C   = b->ne[0] / 2;
            const auto *        src = static_cast<const float *>(b->data);
            for (int64_t i = 0; i < 2 * C; ++i) {
                *dst++ = src[i] + (i < C ? 1.0f : 0.0f);
            }
        }
    });
    return tab;
}

// Off the CPU, a batch's sentences packed along time so that one graph's convolutions serve
// them all: B segments of L frames, each a sentence's frames then zeros, at least as many as
// the widest convolution pads. A convolution over the whole is then each sentence's own
// wherever its input's gaps are zero, and AdaIN's statistics are taken per segment, over
// its sentence's frames only (packed_adain). The decoder and the F0/N blocks run so. The
// generator's ggml graphs do not (at its rates the gaps' frames cost more than their
// launches); on a CUDA device its residual stacks pack a batch in the engine's kernels, and
// the graphs after them run over that packing (run_generator_fused).
struct packing {
    int64_t       B = 0, L = 0;
    ggml_tensor * mask    = nullptr;  // [L, B, 1]: 1 on a sentence's frames, 0 in its gap
    ggml_tensor * mask_t  = nullptr;  // the same as [B * L, 1], for activations [T, C]
    ggml_tensor * inv_len = nullptr;  // [1, B, 1]: 1 / the sentence's frames
    ggml_tensor * styles  = nullptr;  // [B, rows]: the style table's rows, transposed
};

// What a graph's AdaIN layers share: the style half they read and a row of ones (their
// statistics over time are products with it: no transposes of long activations); off the
// CPU, the graph's style table and its product with the style.
struct cond {
    ggml_tensor *       s      = nullptr;  // [128, B]: a column a sentence (B = 1 but in a packing)
    ggml_tensor *       ones   = nullptr;  // [1, n]
    const style_table * table  = nullptr;
    ggml_tensor *       styles = nullptr;  // [rows, B]
    const packing *     pack   = nullptr;  // off the CPU, in a batch: its sentences packed
    const packing *     pack2  = nullptr;  // the same at twice the rate (after an upsampling)
};

const style_table * kokoro_voice::style_table_for(vs_context & c, const std::string & prefix) const {
    if (!c.device_graphs) {
        return nullptr;
    }
    auto it = tables_.find(prefix);
    if (it == tables_.end()) {
        it = tables_.emplace(prefix, make_style_table(c, model_, prefix)).first;
    }
    return it->second.w ? &it->second : nullptr;
}

// A packing's inputs: B segments of L frames reading the style table's rows styles_t [B, rows].
packing make_packing(ggml_context * g, int64_t B, int64_t L, ggml_tensor * styles_t) {
    packing p;
    p.B       = B;
    p.L       = L;
    p.mask    = ggml_new_tensor_3d(g, GGML_TYPE_F32, L, B, 1);
    p.inv_len = ggml_new_tensor_3d(g, GGML_TYPE_F32, 1, B, 1);
    p.styles  = styles_t;
    ggml_set_input(p.mask);
    ggml_set_input(p.inv_len);
    p.mask_t = ggml_reshape_2d(g, p.mask, B * L, 1);
    return p;
}

// A packing's mask [L, B] and lengths [B] (after the graph's allocation), for sentences of
// rate * lens[b] frames in segments of L.
void fill_packing(vs_context & c, ggml_tensor * mask_t, ggml_tensor * inv_len_t, int64_t B, int64_t L,
                  const std::vector<int64_t> & lens, int64_t rate = 1) {
    std::vector<float> mask((size_t) (B * L), 0.0f), inv((size_t) B);
    for (int64_t b = 0; b < B; ++b) {
        std::fill_n(mask.begin() + b * L, rate * lens[(size_t) b], 1.0f);
        inv[(size_t) b] = 1.0f / (float) (rate * lens[(size_t) b]);
    }
    set_input(c, mask_t, mask.data());
    set_input(c, inv_len_t, inv.data());
}

// The jobs, of frames[b] frames, in graphs [first, last): packed, as many consecutive jobs
// as keep B * (longest + gap) within MAX_PACKED_FRAMES and the device's largest tensor; else
// one a graph.
std::vector<std::pair<size_t, size_t>> pack_groups(const std::vector<int64_t> & frames, bool packed, int64_t gap,
                                                   size_t max_tensor_bytes) {
    const int64_t max_frames =
        (int64_t) std::min<size_t>(MAX_PACKED_FRAMES, max_tensor_bytes / (size_t) PACKED_FRAME_BYTES);
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t first = 0; first < frames.size();) {
        size_t  last    = first + 1;
        int64_t longest = frames[first];
        while (packed && last < frames.size() &&
               (int64_t) (last + 1 - first) * (std::max(longest, frames[last]) + gap) <= max_frames) {
            longest = std::max(longest, frames[last++]);
        }
        out.emplace_back(first, last);
        first = last;
    }
    return out;
}

// The segment length of jobs of lens[b] frames in a graph: the longest, in a packing with
// its gap after it (more than one job); rounded up to shape_bucket's lengths where graphs
// are kept by their shapes and the frames added are a packing's gap.
int64_t packed_length(const vs_context & c, const std::vector<int64_t> & lens, bool packed) {
    const int64_t L = *std::max_element(lens.begin(), lens.end()) + (lens.size() > 1 ? PACK_GAP : 0);
    return packed && c.rounds_shapes() ? shape_bucket(L) : L;
}

// Segment b (its first T frames) of a packed [C, B * L] read back from the device.
act unpack_host(const act & packed, int64_t L, int64_t b, int64_t T) {
    act a;
    a.C = packed.C;
    a.T = T;
    a.v.assign(packed.v.begin() + b * L * a.C, packed.v.begin() + (b * L + T) * a.C);
    return a;
}

// k's AdaINs on B > 1 sentences packed in segments of L frames (pk), and of 2L after an
// upsampling (pk2); their affines from k's style table, all sentences' rows transposed once.
void pack_cond(ggml_context * g, cond & k, int64_t B, int64_t L, packing & pk, packing & pk2) {
    if (!k.table) {
        throw error(VS_ERR_COMPUTE, "sentences cannot be packed without a style table");
    }
    ggml_tensor * styles_t = ggml_cont(g, ggml_transpose(g, k.styles));
    pk                     = make_packing(g, B, L, styles_t);
    pk2                    = make_packing(g, B, 2 * L, styles_t);
    k.pack                 = &pk;
    k.pack2                = &pk2;
}

void kokoro_voice::use_style_table(vs_context & c, ggml_context * g, cond & k, const std::string & prefix) const {
    if (const style_table * tab = style_table_for(c, prefix)) {
        k.table  = tab;
        k.styles = ggml_add(g, ggml_mul_mat(g, tab->w, k.s), tab->b);
    }
}

// scale and shift of AdaIN `fc` from the graph's style table, if it has one.
bool table_affine(ggml_context * g, const cond & k, const std::string & fc, int64_t C, ggml_tensor *& scale,
                  ggml_tensor *& shift) {
    if (!k.table) {
        return false;
    }
    auto it = k.table->offset.find(fc);
    if (it == k.table->offset.end()) {
        return false;
    }
    const size_t es = ggml_element_size(k.styles);
    scale           = ggml_view_2d(g, k.styles, C, 1, k.styles->nb[1], it->second * es);
    shift           = ggml_view_2d(g, k.styles, C, 1, k.styles->nb[1], (it->second + C) * es);
    return true;
}

cond make_cond(ggml_context * g, int64_t max_frames, int64_t B = 1) {
    cond k;
    k.s    = input_2d(g, STYLE_DIM, B, "style");  // one half of the style row, a column a sentence
    k.ones = input_2d(g, 1, std::max<int64_t>(max_frames, 1024), "ones");
    return k;
}

// A cond's inputs: its style column(s) s and its row of ones.
void fill_cond(vs_context & c, ggml_tensor * s, ggml_tensor * ones, const float * style) {
    set_input(c, s, style);  // B style halves one after another
    if (ones->buffer) {      // a graph whose AdaINs are all adain_tc reads no ones
        std::vector<float> v((size_t) ggml_nelements(ones), 1.0f);
        set_input(c, ones, v.data());
    }
}

void fill_cond(vs_context & c, const cond & k, const float * style) {
    fill_cond(c, k.s, k.ones, style);
}

// AdaIN (instance norm over time per channel, then the style's affine) as one per-channel
// affine y = a x + b: mean and variance from sums of x and x^2 over time.
void adain_affine(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                  ggml_tensor *& a, ggml_tensor *& b) {
    ggml_tensor *scale, *shift;
    style_affine(c, g, k.s, fc, x->ne[0], scale, shift);
    const int64_t T    = x->ne[1];
    ggml_tensor * ones = ggml_view_2d(g, k.ones, 1, T, k.ones->nb[1], 0);
    ggml_tensor * mean = ggml_scale(g, ggml_out_prod(g, x, ones), 1.0f / (float) T);  // [C, 1]
    // Two passes (E[(x - mean)^2], not E[x^2] - mean^2): some channels' means dwarf their spread.
    ggml_tensor * var = ggml_scale(g, ggml_out_prod(g, ggml_sqr(g, ggml_sub(g, x, mean)), ones), 1.0f / (float) T);
    a                 = ggml_div(g, scale, ggml_sqrt(g, ggml_scale_bias(g, var, 1.0f, 1e-5f)));
    b                 = ggml_sub(g, shift, ggml_mul(g, mean, a));
}

ggml_tensor * adain(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc) {
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(g, x);
    }
    ggml_tensor *a, *b;
    adain_affine(c, g, x, k, fc, a, b);
    return ggml_add(g, ggml_mul(g, x, a), b);
}

// AdaIN then Snake (y + sin^2(alpha y) / alpha, alpha per channel, [1, C, 1] in the file).
// With u = alpha y, a per-channel affine of x: Snake(y) = (u + sin^2 u) / alpha.
ggml_tensor * adain_snake(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                          ggml_tensor * alpha) {
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(g, x);
    }
    const int64_t C = x->ne[0];
    ggml_tensor * a, *b;
    adain_affine(c, g, x, k, fc, a, b);
    ggml_tensor * al  = ggml_reshape_2d(g, alpha, C, 1);
    ggml_tensor * inv = ggml_div(g, ggml_view_2d(g, k.ones, C, 1, C * sizeof(float), 0), al);  // 1 / alpha
    ggml_tensor * u   = ggml_add(g, ggml_mul(g, x, ggml_mul(g, a, al)), ggml_mul(g, b, al));
    return ggml_mul(g, ggml_add(g, u, ggml_sqr(g, ggml_sin(g, u))), inv);
}

// Off the CPU, where a graph's cost is its kernel launches, AdaIN (then Snake) of x [C, T]
// with time along ne0, returned as [T, C]. That layout has both as few kernels: the
// instance norm is ggml's group norm with a group a channel (two passes over each), and
// the chain mul, sin, sqr, mul, add (1 / alpha a leaf, made once) is one kernel in
// ggml's CUDA backend.

// AdaIN of x [C, T] as [T, C]: a group norm with a group a channel, then the style's affine.
ggml_tensor * adain_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc) {
    const int64_t C = x->ne[0], T = x->ne[1];
    ggml_tensor * xt = ggml_cont(g, ggml_transpose(g, x));  // [T, C]
    ggml_tensor * n  = ggml_group_norm(g, ggml_reshape_4d(g, xt, T, 1, C, 1), (int) C, 1e-5f);
    ggml_tensor * scale, *shift;
    if (!table_affine(g, k, fc, C, scale, shift)) {
        style_affine(c, g, k.s, fc, C, scale, shift);
    }
    return ggml_add(g, ggml_mul(g, ggml_reshape_2d(g, n, T, C), ggml_reshape_2d(g, scale, 1, C)),
                    ggml_reshape_2d(g, shift, 1, C));
}

// AdaIN of a packing's x [C, B * L] -> [L, B, C]: each segment's mean and variance over
// its sentence's frames (the mask), its style's affine. The gaps hold the shift.
ggml_tensor * packed_adain(ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc) {
    const packing & p    = *k.pack;
    const int64_t   C    = x->ne[0];
    ggml_tensor *   x3   = ggml_reshape_3d(g, ggml_cont(g, ggml_transpose(g, x)), p.L, p.B, C);  // [L, B, C]
    ggml_tensor *   mean = ggml_mul(g, ggml_sum_rows(g, ggml_mul(g, x3, p.mask)), p.inv_len);    // [1, B, C]
    ggml_tensor *   d    = ggml_mul(g, ggml_sub(g, x3, mean), p.mask);
    ggml_tensor *   var  = ggml_mul(g, ggml_sum_rows(g, ggml_sqr(g, d)), p.inv_len);
    const int64_t   off  = k.table->offset.at(fc);
    const size_t    es = ggml_element_size(p.styles), nb = p.styles->nb[1];
    ggml_tensor *   scale = ggml_view_3d(g, p.styles, 1, p.B, C, es, nb, off * nb);
    ggml_tensor *   shift = ggml_view_3d(g, p.styles, 1, p.B, C, es, nb, (off + C) * nb);
    ggml_tensor *   a     = ggml_div(g, scale, ggml_sqrt(g, ggml_scale_bias(g, var, 1.0f, 1e-5f)));
    return ggml_add(g, ggml_mul(g, d, a), shift);
}

// The same of a packing's x [C, B * L] in its own layout, then LeakyReLU, -> [C, B * L] zero
// in the gaps: each segment's sums over its sentence's frames are products with the mask
// over time (out_prod), its affine the style table's column of its sentence. No transposes
// (where the device has out_prod: device_limits).
ggml_tensor * packed_adain_leaky_ct(ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                                    float slope) {
    const packing & p    = *k.pack;
    const int64_t   C    = x->ne[0];
    ggml_tensor *   x3   = ggml_reshape_3d(g, ggml_is_contiguous(x) ? x : ggml_cont(g, x), C, p.L, p.B);
    ggml_tensor *   m    = ggml_reshape_3d(g, p.mask, 1, p.L, p.B);
    ggml_tensor *   il   = ggml_reshape_3d(g, p.inv_len, 1, 1, p.B);
    ggml_tensor *   mean = ggml_mul(g, ggml_out_prod(g, x3, m), il);  // [C, 1, B]
    ggml_tensor *   d    = ggml_sub(g, x3, mean);
    ggml_tensor *   var  = ggml_mul(g, ggml_out_prod(g, ggml_sqr(g, d), m), il);
    const int64_t   off  = k.table->offset.at(fc);
    const size_t    es = ggml_element_size(k.styles), nb = k.styles->nb[1];
    ggml_tensor *   scale = ggml_view_3d(g, k.styles, C, 1, p.B, nb, nb, off * es);
    ggml_tensor *   shift = ggml_view_3d(g, k.styles, C, 1, p.B, nb, nb, (off + C) * es);
    ggml_tensor *   a     = ggml_div(g, scale, ggml_sqrt(g, ggml_scale_bias(g, var, 1.0f, 1e-5f)));
    ggml_tensor *   y     = ggml_leaky_relu(g, ggml_add(g, ggml_mul(g, d, a), shift), slope, false);
    return ggml_reshape_2d(g, ggml_mul(g, y, m), C, p.B * p.L);
}

// y [L, B, C] zeroed in a packing's gaps, as [B * L, C]: a convolution's input.
ggml_tensor * packed_masked(ggml_context * g, ggml_tensor * y, const packing & p) {
    return ggml_reshape_2d(g, ggml_mul(g, y, p.mask), p.B * p.L, y->ne[2]);
}

// AdaIN then LeakyReLU of x [C, T] as [T, C] (see adain_tc); in a packing, zero in its gaps.
ggml_tensor * adain_leaky_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                             float slope) {
    if (k.pack) {
        return packed_masked(g, ggml_leaky_relu(g, packed_adain(g, x, k, fc), slope, false), *k.pack);
    }
    return ggml_leaky_relu(g, adain_tc(c, g, x, k, fc), slope, false);
}

ggml_tensor * adain_snake_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                             const std::string & alpha_name) {
    const int64_t C   = x->ne[0];
    ggml_tensor * y   = adain_tc(c, g, x, k, fc);
    ggml_tensor * a   = ggml_reshape_2d(g, c.w(alpha_name), 1, C);
    ggml_tensor * inv = c.derived_tensor(alpha_name + ".inv", GGML_TYPE_F32, { 1, C, 1, 1 }, [&](uint8_t * out) {
        const std::vector<float> alpha = host_floats(c.model->tensor(alpha_name));  // 1 / alpha, made once
        for (int64_t i = 0; i < C; ++i) {
            reinterpret_cast<float *>(out)[i] = 1.0f / alpha[(size_t) i];
        }
    });
    ggml_tensor * s2  = ggml_sqr(g, ggml_sin(g, ggml_mul(g, y, a)));
    return ggml_add(g, y, ggml_mul(g, s2, inv));
}

// Conv1d (PyTorch semantics) of xt [T, IC] (time along ne0) -> [OC, T']: with F16 weights
// conv1d_phases (no im2col matrix; the weights' input channels padded to a multiple of 8;
// `fine_columns` for a batch's packing: phase_columns), else ggml's im2col in the layout
// it was made for, padding and dilation inside the op, against the weights with their
// first two axes swapped ([K, IC, OC], made once per context). Where that copy cannot be
// made or the matrix would be too large, conv1d of a transposed copy.
ggml_tensor * conv1d_tc(vs_context & c, ggml_context * g, ggml_tensor * xt, const std::string & w_name, ggml_tensor * b,
                        int dilation, int padding, bool fine_columns = false) {
    ggml_tensor * w  = c.w(w_name);
    const int64_t IC = w->ne[0], K = w->ne[1], OC = w->ne[2];
    const int64_t T_out = xt->ne[0] + 2 * padding - dilation * (K - 1);
    if (phases_apply(c.graph_opts(), w, dilation)) {  // its rows a multiple of 8 halves (channel_padded_weight)
        return conv1d_phases(g, xt, padding, T_out, c.channel_padded_weight(w_name), b, dilation, fine_columns);
    }
    ggml_tensor * ws =
        (size_t) (IC * K * T_out) * sizeof(uint16_t) <= std::min(MAX_IM2COL_TC_BYTES, c.limits.max_tensor_bytes)
            ? c.swapped_weight(w_name)
            : nullptr;
    if (!ws) {
        return conv1d(c.graph_opts(), g, ggml_cont(g, ggml_transpose(g, xt)), w, b, dilation, padding);
    }
    const ggml_type type = ws->type == GGML_TYPE_F16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    ggml_tensor *   cols = ggml_im2col(g, ws, xt, 1, 0, padding, 0, dilation, 0, false, type);  // [IC * K, T']
    ggml_tensor *   y    = ggml_mul_mat(g, ggml_reshape_2d(g, ws, K * IC, OC), ggml_reshape_2d(g, cols, IC * K, T_out));
    return b ? ggml_add(g, y, b) : y;
}

// Conv1d (PyTorch semantics, undilated, "same" padding) of x [IC, T] -> [OC, T]: with F16 or
// F32 weights conv1d_phases_ct (no im2col matrix, no transposes; the weights' input channels
// padded to a multiple of 8), else conv1d.
ggml_tensor * conv1d_ct(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & w_name, ggml_tensor * b,
                        bool fine_columns) {
    ggml_tensor * w   = c.w(w_name);
    const int     pad = (int) (w->ne[1] - 1) / 2;
    if (phases_apply(c.graph_opts(), w, 1)) {
        return conv1d_phases_ct(g, x, pad, x->ne[1], c.channel_padded_weight(w_name), b, fine_columns);
    }
    return conv1d(c.graph_opts(), g, x, w, b, 1, pad);
}

// Frames repeated twice: [C, T] -> [C, 2T].
ggml_tensor * upsample2(ggml_context * g, ggml_tensor * x) {
    ggml_tensor * x3 = ggml_reshape_3d(g, ggml_cont(g, x), x->ne[0], 1, x->ne[1]);
    return ggml_reshape_2d(g, ggml_concat(g, x3, x3, 1), x->ne[0], 2 * x->ne[1]);
}

// Depthwise ConvTranspose1d (kernel 3, stride 2, padding 1, output padding 1): w [C, 3].
// Even output frames take tap 1 of frame t; odd ones tap 2 of t and tap 0 of t + 1.
ggml_tensor * depthwise_upsample(ggml_context * g, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b) {
    const int64_t C = x->ne[0], T = x->ne[1];
    auto          tap  = [&](int k) { return ggml_view_1d(g, w, C, k * w->nb[1]); };
    ggml_tensor * even = ggml_add(g, ggml_mul(g, x, tap(1)), b);
    ggml_tensor * next = ggml_view_2d(g, pad_time(g, x, 0, 1), C, T, x->ne[0] * sizeof(float), C * sizeof(float));
    ggml_tensor * odd  = ggml_add(g, ggml_add(g, ggml_mul(g, x, tap(2)), ggml_mul(g, next, tap(0))), b);
    ggml_tensor * y    = ggml_concat(g, ggml_reshape_3d(g, even, C, 1, T), ggml_reshape_3d(g, odd, C, 1, T), 1);
    return ggml_reshape_2d(g, y, C, 2 * T);
}

// The same of xt [T, C] (time along ne0) -> [2T, C]: even and odd frames side by side
// along ne0, then read as one row a channel.
ggml_tensor * depthwise_upsample_tc(ggml_context * g, ggml_tensor * xt, ggml_tensor * w, ggml_tensor * b) {
    const int64_t T = xt->ne[0], C = xt->ne[1];
    auto          tap  = [&](int k) { return ggml_reshape_2d(g, ggml_view_1d(g, w, C, k * w->nb[1]), 1, C); };
    ggml_tensor * bt   = ggml_reshape_2d(g, b, 1, C);
    ggml_tensor * even = ggml_add(g, ggml_mul(g, xt, tap(1)), bt);
    ggml_tensor * xp   = ggml_pad_ext(g, xt, 0, 1, 0, 0, 0, 0, 0, 0);  // [T + 1, C]: frame T zeros
    ggml_tensor * next = ggml_view_2d(g, xp, T, C, xp->nb[1], sizeof(float));
    ggml_tensor * odd  = ggml_add(g, ggml_add(g, ggml_mul(g, xt, tap(2)), ggml_mul(g, next, tap(0))), bt);
    ggml_tensor * y    = ggml_concat(g, ggml_reshape_3d(g, even, 1, T, C), ggml_reshape_3d(g, odd, 1, T, C), 0);
    return ggml_reshape_2d(g, y, 2 * T, C);
}

// StyleTTS 2's AdainResBlk1d (LeakyReLU 0.2, optional 2x upsampling), scaled by 1/sqrt(2).
ggml_tensor * kokoro_voice::adain_res_block(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k,
                                            const std::string & pre, bool upsample) const {
    ggml_tensor * r = nullptr;
    if (c.device_graphs && k.pack && c.limits.out_prod) {  // packed, in [C, T] throughout
        const bool    fine = k.pack->B > 1;                // a batch's shapes (phase_columns)
        ggml_tensor * t    = packed_adain_leaky_ct(g, x, k, pre + "norm1.fc", 0.2f);
        cond          k2   = k;  // after the upsampling: its twice as long segments
        if (upsample) {
            k2.pack = k.pack2;
            t       = depthwise_upsample(g, t, c.w(pre + "pool.weight"), c.w(pre + "pool.bias"));
            t       = ggml_mul(g, t, ggml_reshape_2d(g, k2.pack->mask, 1, k2.pack->B * k2.pack->L));
        }
        r = conv1d_ct(c, g, t, pre + "conv1.weight", c.w(pre + "conv1.bias"), fine);
        t = packed_adain_leaky_ct(g, r, k2, pre + "norm2.fc", 0.2f);
        r = conv1d_ct(c, g, t, pre + "conv2.weight", c.w(pre + "conv2.bias"), fine);
    } else if (c.device_graphs) {                      // in [T, C] in between (see adain_tc)
        const bool    fine = k.pack && k.pack->B > 1;  // a batch's shapes (phase_columns)
        ggml_tensor * t    = adain_leaky_tc(c, g, x, k, pre + "norm1.fc", 0.2f);
        cond          k2   = k;  // after the upsampling, in a packing: its twice as long segments
        if (upsample) {
            t = depthwise_upsample_tc(g, t, c.w(pre + "pool.weight"), c.w(pre + "pool.bias"));
            if (k.pack) {
                k2.pack = k.pack2;
                t       = ggml_mul(g, t, k2.pack->mask_t);
            }
        }
        r = conv1d_tc(c, g, t, pre + "conv1.weight", c.w(pre + "conv1.bias"), 1, 1, fine);
        t = adain_leaky_tc(c, g, r, k2, pre + "norm2.fc", 0.2f);
        r = conv1d_tc(c, g, t, pre + "conv2.weight", c.w(pre + "conv2.bias"), 1, 1, fine);
    } else {
        r = ggml_leaky_relu(g, adain(c, g, x, k, pre + "norm1.fc"), 0.2f, false);
        if (upsample) {
            r = depthwise_upsample(g, r, c.w(pre + "pool.weight"), c.w(pre + "pool.bias"));
        }
        r = conv1d(c.graph_opts(), g, r, c.w(pre + "conv1.weight"), c.w(pre + "conv1.bias"), 1, 1);
        r = ggml_leaky_relu(g, adain(c, g, r, k, pre + "norm2.fc"), 0.2f, false);
        r = conv1d(c.graph_opts(), g, r, c.w(pre + "conv2.weight"), c.w(pre + "conv2.bias"), 1, 1);
    }

    // The shortcut: the 1x1 convolution (no bias) before the frames are repeated, on half
    // as many frames as after.
    ggml_tensor * sc = x;
    auto          it = c.weights->tensors.find(pre + "conv1x1.weight");
    if (it != c.weights->tensors.end()) {
        sc = conv1d(c.graph_opts(), g, sc, it->second, nullptr, 1, 0);
    }
    sc = upsample ? upsample2(g, sc) : sc;
    return ggml_scale(g, ggml_add(g, r, sc), 1.0f / std::sqrt(2.0f));
}

// iSTFTNet's AdaINResBlock1: three (AdaIN, Snake, dilated conv, AdaIN, Snake, conv) residuals.
ggml_tensor * kokoro_voice::snake_res_block(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k,
                                            const std::string & pre, int kernel) const {
    for (int i = 0; i < 3; ++i) {
        const std::string n  = std::to_string(i);
        const int         d  = hp_.res_dilations[i];
        const std::string a1 = pre + "adain1." + n + ".fc", a2 = pre + "adain2." + n + ".fc";
        const std::string s1 = pre + "alpha1." + n, s2 = pre + "alpha2." + n;
        const std::string c1 = pre + "convs1." + n, c2 = pre + "convs2." + n;
        ggml_tensor *     y = nullptr;
        if (c.device_graphs) {  // AdaIN and Snake in [T, C] (see adain_tc)
            y = conv1d_tc(c, g, adain_snake_tc(c, g, x, k, a1, s1), c1 + ".weight", c.w(c1 + ".bias"), d,
                          (kernel * d - d) / 2);
            y = conv1d_tc(c, g, adain_snake_tc(c, g, y, k, a2, s2), c2 + ".weight", c.w(c2 + ".bias"), 1,
                          (kernel - 1) / 2);
        } else {
            y = conv1d(c.graph_opts(), g, adain_snake(c, g, x, k, a1, c.w(s1)), c.w(c1 + ".weight"), c.w(c1 + ".bias"),
                       d, (kernel * d - d) / 2);
            y = conv1d(c.graph_opts(), g, adain_snake(c, g, y, k, a2, c.w(s2)), c.w(c2 + ".weight"), c.w(c2 + ".bias"),
                       1, (kernel - 1) / 2);
        }
        x = ggml_add(g, x, y);
    }
    return x;
}

// ---------------------------------------------------------------- LSTM

// Steps t0 .. t0 + n - 1 of a recurrence's output o [H, cols, n] into each sequence's frames
// (ys[b] [D H, T_b]: direction 0's step t at frame t, direction 1's at frame T_b - 1 - t).
void scatter_steps(const float * o, int64_t t0, int64_t n, int64_t cols, int64_t D, int64_t H, std::vector<act> & ys) {
    for (size_t b = 0; b < ys.size(); ++b) {
        act & y = ys[b];
        for (int64_t d = 0; d < D; ++d) {
            for (int64_t j = 0; j < n && t0 + j < y.T; ++j) {
                const int64_t t = d == 0 ? t0 + j : y.T - 1 - (t0 + j);
                std::copy_n(o + (j * cols + (int64_t) b * D + d) * H, H, y.v.data() + t * y.C + d * H);
            }
        }
    }
}

// (Bi)LSTMs over several sequences at once: x[b] [in, T_b] -> [dirs * H, T_b] (forward
// channels first), as a recurrence of ggml ops, LSTM_CHUNK steps per graph (on CUDA, the
// engine's kernel); the state moves between chunks on the host. Each sequence and direction
// is one column of the batched step [H, dirs * B]: direction 0 reads its steps forward,
// direction 1 backward from its own last step, and steps past a sequence's end read zeros
// and are dropped (they come after its real ones in both directions), so each sequence gets
// exactly what it would get alone while the steps of all of them share each step's kernels.
// The input goes to the device once, every sequence's frames back to back; each step's
// projections are gathered from the frames' (no copy of a frame per direction or padding).
// With `rows`, sequence b has rows[b]->size() steps, step t reading frame (*rows[b])[t] of
// xs[b]: the prosody's frames read their tokens' rows, which are projected once a token.
// With `on_device`, where the recurrence is one kernel call, its output stays on the device
// (see lstm_device_out) and the acts returned have their shapes alone. With `in_graph`
// (only where the recurrence is one kernel call), the projections' graph computes the input
// itself (lstm_graph_input) and xs give its shapes alone.
std::vector<act> kokoro_voice::run_lstm(vs_context & c, int stage, const std::string & prefix,
                                        const std::vector<const act *> &                  xs,
                                        const std::vector<const std::vector<int32_t> *> & rows,
                                        lstm_device_out * on_device, const lstm_graph_input * in_graph) const {
    ggml_tensor *    w_ih_h = model_.tensor(prefix + ".weight_ih");
    const int64_t    in = w_ih_h->ne[0], H4 = w_ih_h->ne[1], D = w_ih_h->ne[2], H = H4 / 4;
    const int64_t    B = (int64_t) xs.size();
    int64_t          T = 0;
    std::vector<act> ys(xs.size());
    GGML_ASSERT(rows.empty() || rows.size() == xs.size());
    for (int64_t b = 0; b < B; ++b) {
        if (xs[b]->C != in) {
            throw error(VS_ERR_COMPUTE, prefix + ": input has " + std::to_string(xs[b]->C) + " channels, expected " +
                                            std::to_string(in));
        }
        ys[b].C = D * H;
        ys[b].T = rows.empty() ? xs[b]->T : (int64_t) rows[(size_t) b]->size();
        T       = std::max(T, ys[b].T);
        for (int64_t i = 0; !rows.empty() && i < ys[b].T; ++i) {
            GGML_ASSERT((*rows[(size_t) b])[(size_t) i] >= 0 && (*rows[(size_t) b])[(size_t) i] < xs[b]->T);
        }
    }
    // Row of xs[b] that sequence b's step t reads.
    auto row = [&](int64_t b, int64_t t) { return rows.empty() ? t : (int64_t) (*rows[(size_t) b])[(size_t) t]; };
    const int64_t cols = D * B;  // (direction, sequence) columns, direction fastest
    // Every sequence's frames one after another, then columns of zeros: Np >= N + 1 columns.
    std::vector<int64_t> first;
    std::vector<float>   frames;
    for (const act * x : xs) {
        first.push_back((int64_t) frames.size() / in);
        frames.insert(frames.end(), x->v.begin(), x->v.end());
    }
    if (in_graph) {
        first = in_graph->first;
    }
    const int64_t      N = in_graph ? in_graph->N : (int64_t) frames.size() / in;
    std::vector<float> h((size_t) (H * cols), 0.0f), cs((size_t) (H * cols), 0.0f);
    // On a CUDA device the recurrence is one kernel of the engine's own per chunk (the
    // graph computes only the input projections); elsewhere ggml ops, step by step.
    ggml_tensor * w_hh  = c.w(prefix + ".weight_hh");
    const bool    fused = c.fused_lstm(w_hh, H);
    const int64_t chunk = fused ? LSTM_CHUNK_FUSED : LSTM_CHUNK;
    const bool    kept  = on_device && fused && T <= chunk;  // output left on the device
    GGML_ASSERT(!in_graph || (fused && T <= chunk));
    for (int64_t b = 0; !kept && b < B; ++b) {
        ys[b].v.assign((size_t) (D * H * ys[b].T), 0.0f);
    }

    // On CUDA, where graphs are kept by their shapes, the frames and steps of a chunk's graph
    // are rounded up (shape_bucket); the steps added gather the zeros and are not run.
    const bool    rounds = fused && c.rounds_shapes() && !in_graph;  // (in_graph's key has its shapes)
    const int64_t Np     = rounds ? shape_bucket(N + 1) : N + 1;
    if (!in_graph) {
        frames.resize((size_t) (Np * in), 0.0f);
    }

    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        c.check_abort();
        const int64_t     n   = std::min<int64_t>(chunk, T - t0);
        const int64_t     np  = rounds ? std::min<int64_t>(shape_bucket(n), chunk) : n;
        const std::string key = fused ? "lstm " + prefix + " " + std::to_string(Np) + " " + std::to_string(np) + "x" +
                                            std::to_string(B) + (in_graph ? " of " + in_graph->key : std::string())
                                      : std::string();
        vs::stage_graph & sg  = c.stage_graph(
            stage, key,
            [&](ggml_context * g, ggml_cgraph * gf) {
                // Input projections of every sequence's frames at once, each direction's [4H, Np]
                // (x's column N and after zeros), side by side; the chunk's steps gathered from
                // them in the batched step's layout [4H, np, D, B] (steps past a sequence's end:
                // the zeros').
                std::vector<ggml_tensor *> made;  // in_graph's tensors to fill
                ggml_tensor *              xt = in_graph ? in_graph->build(g, gf, made) : input_2d(g, in, Np, "x");
                GGML_ASSERT(xt->ne[0] == in && xt->ne[1] == Np);
                ggml_tensor * at = ggml_new_tensor_1d(g, GGML_TYPE_I32, np * cols);
                ggml_set_input(at);
                ggml_tensor *              w_ih = c.w(prefix + ".weight_ih"), *bias = c.w(prefix + ".bias");
                const bool                 by_seq = B > 1 && !c.limits.matmul_4d;  // for the recurrence below
                std::vector<ggml_tensor *> dirs;
                for (int64_t d = 0; d < D; ++d) {
                    ggml_tensor * w = ggml_view_2d(g, w_ih, in, H4, w_ih->nb[1], d * w_ih->nb[2]);
                    dirs.push_back(ggml_add(g, ggml_mul_mat(g, w, xt),
                                             ggml_view_1d(g, bias, H4, d * H4 * ggml_element_size(bias))));
                }
                ggml_tensor * gx =
                    ggml_reshape_4d(g, ggml_get_rows(g, concat_all(g, std::move(dirs), 1), at), H4, np, D, B);
                if (fused) {
                    ggml_set_output(gx);
                    ggml_build_forward_expand(gf, gx);
                    made.insert(made.begin(), { xt, at, gx });
                    return made;
                }
                ggml_tensor * h0 = ggml_new_tensor_2d(g, GGML_TYPE_F32, H, cols);
                ggml_tensor * c0 = ggml_new_tensor_2d(g, GGML_TYPE_F32, H, cols);
                ggml_set_input(h0);
                ggml_set_input(c0);
                std::vector<ggml_tensor *> steps;
                ggml_tensor *              hs = h0, *cc = c0;
                for (int64_t j = 0; j < n; ++j) {
                    ggml_tensor * gj = ggml_view_4d(g, gx, H4, 1, D, B, gx->nb[1], gx->nb[2], gx->nb[3], j * gx->nb[1]);
                    ggml_tensor * rec = nullptr;
                    if (by_seq) {  // the sequences as one matrix's columns: [H, B, D] -> [4H, B, D]
                        ggml_tensor * hb = ggml_permute(g, ggml_reshape_3d(g, hs, H, D, B), 0, 2, 1, 3);
                        rec              = ggml_permute(g, ggml_mul_mat(g, w_hh, hb), 0, 2, 1, 3);  // [4H, D, B] view
                        rec              = ggml_reshape_4d(g, ggml_cont(g, rec), H4, 1, D, B);
                    } else {
                        rec = ggml_mul_mat(g, w_hh, ggml_reshape_4d(g, hs, H, 1, D, B));  // [4H, 1, D, B]
                    }
                    ggml_tensor * z = ggml_reshape_2d(g, ggml_add(g, rec, gj), H4, cols);
                    // Gates i, f, g, o: sigmoid and tanh of all four rows (two kernels, no copies).
                    ggml_tensor * sg   = ggml_sigmoid(g, z);
                    ggml_tensor * th   = ggml_tanh(g, z);
                    auto          gate = [&](ggml_tensor * t, int k) {
                        return ggml_view_2d(g, t, H, cols, t->nb[1], k * H * sizeof(float));
                    };
                    cc = ggml_add(g, ggml_mul(g, gate(sg, 1), cc), ggml_mul(g, gate(sg, 0), gate(th, 2)));
                    hs = ggml_mul(g, gate(sg, 3), ggml_tanh(g, cc));
                    steps.push_back(ggml_reshape_3d(g, hs, H, cols, 1));
                }
                ggml_tensor * out = concat_all(g, std::move(steps), 2);  // the steps' hidden states, [H, cols, n]
                for (ggml_tensor * t : { out, hs, cc }) {
                    ggml_set_output(t);
                    ggml_build_forward_expand(gf, t);
                }
                return std::vector<ggml_tensor *>{ xt, at, gx, h0, c0, out, hs, cc };
            },
            fused ? 64 + (in_graph ? 128 * (size_t) B : 0) : 32 * (size_t) n + 64);

        if (in_graph) {
            in_graph->fill(std::vector<ggml_tensor *>(sg.t.begin() + 3, sg.t.end()));
        } else {
            set_input(c, sg.t[0], frames.data());
        }
        std::vector<int32_t> cols_of_steps((size_t) (np * cols), (int32_t) N);  // each step's column
        for (int64_t b = 0; b < B; ++b) {
            const int64_t Tb = ys[b].T;
            for (int64_t d = 0; d < D; ++d) {
                for (int64_t j = 0; j < n; ++j) {
                    const int64_t t = d == 0 ? t0 + j : Tb - 1 - (t0 + j);
                    cols_of_steps[(size_t) ((b * D + d) * np + j)] =
                        (int32_t) (d * Np + (t >= 0 && t < Tb ? first[(size_t) b] + row(b, t) : N));
                }
            }
        }
        set_input(c, sg.t[1], cols_of_steps.data());
        std::vector<float> o(kept ? 0 : (size_t) (H * cols * n));
        if (fused) {
            c.compute(sg);
            // A recurrence of one call starts from zeros and its last state is not needed.
            const bool    one_call = T <= chunk;
            const float * out      = c.lstm(sg.t[2], w_hh, H, n, cols, D, one_call ? nullptr : h.data(),
                                       one_call ? nullptr : cs.data(), kept ? nullptr : o.data());
            if (kept) {
                *on_device = { out, H, cols, D, n };
                return ys;
            }
        } else {
            set_input(c, sg.t[3], h.data());
            set_input(c, sg.t[4], cs.data());
            c.compute(sg);
            ggml_backend_tensor_get(sg.t[5], o.data(), 0, ggml_nbytes(sg.t[5]));
            ggml_backend_tensor_get(sg.t[6], h.data(), 0, ggml_nbytes(sg.t[6]));
            ggml_backend_tensor_get(sg.t[7], cs.data(), 0, ggml_nbytes(sg.t[7]));
        }
        scatter_steps(o.data(), t0, n, cols, D, H, ys);
    }
    return ys;
}

void kokoro_voice::set_from_lstm(vs_context & c, lstm_device_out & o, std::vector<act> & ys,
                                 const std::vector<lstm_dest> & dests) const {
    bool gather = o.out != nullptr;
    for (const lstm_dest & d : dests) {
        GGML_ASSERT(d.t->ne[0] == ys[d.seq].C && d.frames >= ys[d.seq].T);
        gather = gather && in_device_memory(c, d.t);
    }
    if (gather) {
        std::vector<vs::cuda::lstm_span> spans;
        for (const lstm_dest & d : dests) {
            spans.push_back(
                { (int64_t) d.seq * o.D, ys[d.seq].T, d.frames, static_cast<float *>(d.t->data) + d.at * d.t->ne[0] });
        }
        vs::cuda::lstm_gather(c.cuda_device, o.out, o.H, o.cols, o.D, spans.data(), spans.size());
        return;
    }
    if (o.out) {  // to the host once, for this and any later consumer
        std::vector<float> v((size_t) (o.H * o.cols * o.steps));
        vs::cuda::download(c.cuda_device, v.data(), o.out, sizeof(float) * v.size());
        for (act & y : ys) {
            y.v.assign((size_t) (y.C * y.T), 0.0f);
        }
        scatter_steps(v.data(), 0, o.steps, o.cols, o.D, o.H, ys);
        o.out = nullptr;
    }
    // Each tensor's frames from its first destination's to its last's, in one upload.
    std::map<ggml_tensor *, std::pair<int64_t, int64_t>> extent;
    for (const lstm_dest & d : dests) {
        auto [it, fresh] = extent.try_emplace(d.t, d.at, d.at + d.frames);
        it->second       = { std::min(it->second.first, d.at), std::max(it->second.second, d.at + d.frames) };
    }
    for (const auto & [t, ext] : extent) {
        const int64_t      C = t->ne[0];
        std::vector<float> v((size_t) (C * (ext.second - ext.first)), 0.0f);
        for (const lstm_dest & d : dests) {
            const act & y = ys[d.seq];
            if (d.t == t) {
                std::copy_n(y.v.begin(), std::min(y.T, d.frames) * C, v.begin() + (d.at - ext.first) * C);
            }
        }
        c.set_input(t, v.data(), sizeof(float) * (size_t) (ext.first * C), sizeof(float) * v.size());
    }
}

// ---------------------------------------------------------------- stages

void kokoro_voice::run_bert(vs_context & c, std::vector<kokoro_job> & jobs) const {
    // Off the CPU (where a stage's cost is its kernel launches), jobs share a graph: their
    // tokens concatenated, attention kept within each job by a block-diagonal mask, up to
    // BERT_BATCH_TOKENS tokens (the scores are quadratic in them). On the CPU, a job a graph.
    const bool on_cpu = !c.device_graphs;
    for (size_t first = 0; first < jobs.size();) {
        size_t  last  = first + 1;
        int64_t total = (int64_t) jobs[first].tokens.size();
        while (!on_cpu && last < jobs.size() && total + (int64_t) jobs[last].tokens.size() <= BERT_BATCH_TOKENS) {
            total += (int64_t) jobs[last++].tokens.size();
        }
        run_bert_group(c, jobs, first, last);
        first = last;
    }
}

void kokoro_voice::qkv_weights(vs_context & c, ggml_tensor *& w, ggml_tensor *& b) const {
    const char *       parts[3] = { "query", "key", "value" };
    const ggml_tensor *ws[3], *bs[3];
    for (int i = 0; i < 3; ++i) {
        ws[i] = model_.tensor(LAYER + "attention." + parts[i] + ".weight");
        bs[i] = model_.tensor(LAYER + "attention." + parts[i] + ".bias");
        if (ws[i]->type != ws[0]->type || !ggml_are_same_shape(ws[i], ws[0]) || bs[i]->type != GGML_TYPE_F32) {
            w = b = nullptr;
            return;
        }
    }
    const int64_t in = ws[0]->ne[0], out = ws[0]->ne[1];
    w = c.derived_tensor(LAYER + "attention.qkv.weight", ws[0]->type, { in, 3 * out, 1, 1 }, [&](uint8_t * dst) {
        for (const ggml_tensor * t : ws) {
            std::memcpy(dst, t->data, ggml_nbytes(t));
            dst += ggml_nbytes(t);
        }
    });
    b = c.derived_tensor(LAYER + "attention.qkv.bias", GGML_TYPE_F32, { 3 * out, 1, 1, 1 }, [&](uint8_t * dst) {
        for (const ggml_tensor * t : bs) {
            std::memcpy(dst, t->data, ggml_nbytes(t));
            dst += ggml_nbytes(t);
        }
    });
}

void kokoro_voice::run_bert_group(vs_context & c, std::vector<kokoro_job> & jobs, size_t first, size_t last) const {
    std::vector<int32_t> ids, pos;
    std::vector<float>   styles;
    for (size_t b = first; b < last; ++b) {
        const auto & t = jobs[b].tokens;
        ids.insert(ids.end(), t.begin(), t.end());
        for (size_t i = 0; i < t.size(); ++i) {
            pos.push_back((int32_t) i);
            const float * s = jobs[b].style.data() + STYLE_DIM;  // the prosody half
            styles.insert(styles.end(), s, s + STYLE_DIM);
        }
    }
    const int64_t T = (int64_t) ids.size(), Hd = hp_.bert_hidden, nh = Hd / BERT_HEAD_DIM;
    // Where graphs are kept by their shapes (on CUDA), the tokens are rounded up to
    // shape_bucket's lengths: the added ones, padding tokens each attending only to itself,
    // change no job's tokens (BERT mixes tokens only in its masked attention).
    const int64_t Tg     = c.rounds_shapes() ? shape_bucket(T) : T;
    const bool    masked = last - first > 1 || Tg > T;
    ids.resize((size_t) Tg, 0);
    pos.resize((size_t) Tg, 0);
    styles.resize((size_t) (Tg * STYLE_DIM), 0.0f);
    // On a CUDA device, more than one job: the attention job by job, each padded to the
    // longest's La tokens (the scores B La^2, not T^2 with most of them masked): the
    // projections' columns gathered into [3 Hd, La, B], the outputs gathered back.
    const int64_t B  = (int64_t) (last - first);
    int64_t       La = 0;
    for (size_t b = first; b < last; ++b) {
        La = std::max<int64_t>(La, (int64_t) jobs[b].tokens.size());
    }
    La                       = c.rounds_shapes() ? shape_bucket(La) : La;
    const bool        by_job = B > 1 && c.cuda_device >= 0;
    const std::string key    = "bert " + std::to_string(Tg) + (masked ? " masked" : "") +
                            (by_job ? " by job " + std::to_string(B) + "x" + std::to_string(La) : "");
    vs::stage_graph & sg = c.stage_graph(VS_STAGE_BERT, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * idt = ggml_new_tensor_1d(g, GGML_TYPE_I32, Tg);
        ggml_tensor * pst = ggml_new_tensor_1d(g, GGML_TYPE_I32, Tg);
        ggml_tensor * sty = input_2d(g, STYLE_DIM, Tg, "styles");  // each token's job's style
        ggml_tensor * msk = nullptr, *gather = nullptr, *scatter = nullptr;
        if (by_job) {  // the keys past each job's tokens masked; its columns' places and back
            msk = ggml_new_tensor_4d(g, GGML_TYPE_F32, La, La, 1, B);
            ggml_set_input(msk);
            gather  = ggml_new_tensor_1d(g, GGML_TYPE_I32, La * B);
            scatter = ggml_new_tensor_1d(g, GGML_TYPE_I32, Tg);
            ggml_set_input(gather);
            ggml_set_input(scatter);
        } else if (masked) {
            msk = input_2d(g, Tg, Tg, "mask");
        }
        ggml_set_input(idt);
        ggml_set_input(pst);

        ggml_tensor * typ = c.w(BERT + "embeddings.token_type_embeddings.weight");
        ggml_tensor * x   = ggml_get_rows(g, c.w(BERT + "embeddings.word_embeddings.weight"), idt);  // [128, T]
        x                 = ggml_add(g, x, ggml_get_rows(g, c.w(BERT + "embeddings.position_embeddings.weight"), pst));
        x                 = ggml_add(g, x, ggml_view_1d(g, typ, typ->ne[0], 0));
        x = layer_norm(g, x, c.w(BERT + "embeddings.LayerNorm.weight"), c.w(BERT + "embeddings.LayerNorm.bias"),
                       1e-12f);
        x = linear(c, g, x, BERT + "embedding_hidden_mapping_in");  // [768, T]

        const float gelu_c = std::sqrt(2.0f / (float) M_PI);
        // Off the CPU, the query, key and value projections as one matmul (their weights
        // concatenated once), and the GELU as ggml's op (exact tanh form there; the CPU's uses
        // a table, so the CPU keeps the formula).
        ggml_tensor *qkv_w = nullptr, *qkv_b = nullptr;
        if (c.device_graphs) {
            qkv_weights(c, qkv_w, qkv_b);
        }
        const bool gelu_op = ggml_backend_dev_type(c.dev) != GGML_BACKEND_DEVICE_TYPE_CPU;
        for (int il = 0; il < hp_.n_bert_layers; ++il) {
            // q, k, v [d, h, S, n]: n groups of S tokens attending within their group (by job:
            // a job's columns gathered; else all tokens, masked as `msk` says).
            const int64_t S = by_job ? La : Tg, n = by_job ? B : 1;
            ggml_tensor * q, *k, *v;
            if (qkv_w) {
                ggml_tensor * qkv = ggml_add(g, ggml_mul_mat(g, qkv_w, x), qkv_b);  // [3 * Hd, T]
                if (by_job) {
                    qkv = ggml_get_rows(g, qkv, gather);  // [3 * Hd, La * B]
                }
                auto part = [&](int i) {
                    return ggml_view_4d(g, qkv, BERT_HEAD_DIM, nh, S, n, BERT_HEAD_DIM * sizeof(float), qkv->nb[1],
                                        S * qkv->nb[1], i * Hd * sizeof(float));
                };
                q = part(0);
                k = part(1);
                v = part(2);
            } else {
                q = ggml_reshape_4d(g, linear(c, g, x, LAYER + "attention.query"), BERT_HEAD_DIM, nh, S, n);
                k = ggml_reshape_4d(g, linear(c, g, x, LAYER + "attention.key"), BERT_HEAD_DIM, nh, S, n);
                v = ggml_reshape_4d(g, linear(c, g, x, LAYER + "attention.value"), BERT_HEAD_DIM, nh, S, n);
            }
            q                = ggml_permute(g, q, 0, 2, 1, 3);                // [d, S, h, n]
            k                = ggml_permute(g, k, 0, 2, 1, 3);                // [d, S, h, n]
            v                = ggml_cont(g, ggml_permute(g, v, 1, 2, 0, 3));  // [S, d, h, n]
            ggml_tensor * kq = ggml_mul_mat(g, k, q);                         // [Sk, Sq, h, n]
            kq               = ggml_soft_max_ext(g, kq, msk, 1.0f / std::sqrt((float) BERT_HEAD_DIM), 0.0f);
            ggml_tensor * o  = ggml_mul_mat(g, v, kq);  // [d, Sq, h, n]
            o                = ggml_reshape_2d(g, ggml_cont(g, ggml_permute(g, o, 0, 2, 1, 3)), Hd, S * n);
            if (by_job) {
                o = ggml_get_rows(g, o, scatter);  // [Hd, Tg]
            }
            o = linear(c, g, o, LAYER + "attention.dense");
            x = layer_norm(g, ggml_add(g, x, o), c.w(LAYER + "attention.LayerNorm.weight"),
                           c.w(LAYER + "attention.LayerNorm.bias"), 1e-12f);
            // FFN with the tanh GELU ("gelu_new").
            ggml_tensor * f = linear(c, g, x, LAYER + "ffn");
            if (gelu_op) {
                f = ggml_gelu(g, f);
            } else {
                ggml_tensor * f3 = ggml_mul(g, ggml_sqr(g, f), f);
                ggml_tensor * th = ggml_tanh(g, ggml_scale(g, ggml_add(g, f, ggml_scale(g, f3, 0.044715f)), gelu_c));
                f                = ggml_mul(g, ggml_scale(g, f, 0.5f), ggml_scale_bias(g, th, 1.0f, 1.0f));
            }
            f = linear(c, g, f, LAYER + "ffn_output");
            x = layer_norm(g, ggml_add(g, x, f), c.w(LAYER + "full_layer_layer_norm.weight"),
                           c.w(LAYER + "full_layer_layer_norm.bias"), 1e-12f);
        }
        x                = linear(c, g, x, "bert_encoder");  // [512, T]
        ggml_tensor * xs = ggml_concat(g, x, sty, 0);        // [640, T]
        ggml_set_output(x);
        ggml_set_output(xs);
        ggml_build_forward_expand(gf, x);
        ggml_build_forward_expand(gf, xs);
        return std::vector<ggml_tensor *>{ idt, pst, sty, msk, x, xs, gather, scatter };
    });
    set_input(c, sg.t[0], ids.data());
    set_input(c, sg.t[1], pos.data());
    set_input(c, sg.t[2], styles.data());
    if (by_job) {  // job b's token l at column b La + l; a padding column reads its job's first
        std::vector<float>   m((size_t) (La * La * B), -INFINITY);
        std::vector<int32_t> ga((size_t) (La * B)), sc((size_t) Tg, 0);
        int64_t              t0 = 0;
        for (int64_t b = 0; b < B; ++b) {
            const int64_t n = (int64_t) jobs[first + (size_t) b].tokens.size();
            for (int64_t q = 0; q < La; ++q) {
                std::fill_n(m.begin() + (b * La + q) * La, n, 0.0f);
                ga[(size_t) (b * La + q)] = (int32_t) (t0 + (q < n ? q : 0));
            }
            for (int64_t l = 0; l < n; ++l) {
                sc[(size_t) (t0 + l)] = (int32_t) (b * La + l);
            }
            t0 += n;
        }
        set_input(c, sg.t[3], m.data());
        set_input(c, sg.t[6], ga.data());
        set_input(c, sg.t[7], sc.data());
    } else if (masked) {  // each job's tokens attend to that job's; each added token to itself
        std::vector<float> m((size_t) (Tg * Tg), -INFINITY);
        int64_t            t0 = 0;
        for (size_t b = first; b < last; ++b) {
            const int64_t n = (int64_t) jobs[b].tokens.size();
            for (int64_t q = t0; q < t0 + n; ++q) {
                std::fill_n(m.begin() + q * Tg + t0, n, 0.0f);
            }
            t0 += n;
        }
        for (int64_t q = T; q < Tg; ++q) {
            m[(size_t) (q * Tg + q)] = 0.0f;
        }
        set_input(c, sg.t[3], m.data());
    }
    c.compute(sg);
    const act d_en = read_act(sg.t[4]), d_in = read_act(sg.t[5]);
    int64_t   t0 = 0;
    for (size_t b = first; b < last; ++b) {
        const int64_t n     = (int64_t) jobs[b].tokens.size();
        auto          slice = [&](const act & a) {
            act out;
            out.C = a.C;
            out.T = n;
            out.v.assign(a.v.begin() + t0 * a.C, a.v.begin() + (t0 + n) * a.C);
            return out;
        };
        jobs[b].d_en = slice(d_en);
        jobs[b].d_in = slice(d_in);
        t0 += n;
    }
}

// Every job in the same graphs: the recurrences, the steps between them and the projection.
void kokoro_voice::run_duration(vs_context & c, std::vector<kokoro_job> & jobs, float speed) const {
    // The steps between recurrences are frame by frame: every job's in one graph, their
    // tokens side by side in segments of L frames (token_segments; the frames past a job's
    // tokens, zeros in, are dropped).
    const int64_t B = (int64_t) jobs.size();
    std::string   shapes;
    const int64_t L = token_segments(c, jobs, 0, shapes);
    // Each job's frames of a recurrence's output into its segment of graph input x [C, B L].
    auto set_lstm_input = [&](lstm_device_out & o, std::vector<act> & hs, ggml_tensor * x) {
        std::vector<lstm_dest> dests;
        for (int64_t b = 0; b < B; ++b) {
            dests.push_back({ (size_t) b, x, b * L, L });
        }
        set_from_lstm(c, o, hs, dests);
    };
    // Job b's frames of a graph's output [C, B L].
    auto job_frames = [&](ggml_tensor * y, const std::vector<act> & hs) {
        const act a = read_act(y);
        for (int64_t b = 0; b < B; ++b) {
            jobs[(size_t) b].d = unpack_host(a, L, b, hs[(size_t) b].T);
        }
    };
    // AdaLayerNorm (module `norm`) of x [C, B L], each segment's affine from its job's
    // style, then the style appended to each frame: d [C + 128, L, B]. Its x, styles, ones
    // and d appended to t.
    auto styled_ops = [&](ggml_context * g, ggml_cgraph * gf, const std::string & norm, int64_t C,
                          std::vector<ggml_tensor *> & t) {
        ggml_tensor * x = lstm_input_2d(g, C, B * L, "x");
        cond          k = make_cond(g, 1, B);
        // [2C, 1, B]: a matrix-vector product a job, the products of its sentence alone.
        ggml_tensor * h = linear(c, g, ggml_reshape_3d(g, k.s, k.s->ne[0], 1, B), norm);
        ggml_tensor * scale =
            ggml_scale_bias(g, ggml_cont(g, ggml_view_3d(g, h, C, 1, B, h->nb[1], h->nb[2], 0)), 1.0f, 1.0f);
        ggml_tensor * shift = ggml_view_3d(g, h, C, 1, B, h->nb[1], h->nb[2], C * ggml_element_size(h));
        ggml_tensor * n     = ggml_reshape_3d(g, ggml_norm(g, x, 1e-5f), C, L, B);
        ggml_tensor * y     = ggml_add(g, ggml_mul(g, n, scale), shift);
        ggml_tensor * s     = ggml_repeat_4d(g, ggml_reshape_3d(g, k.s, k.s->ne[0], 1, B), k.s->ne[0], L, B, 1);
        ggml_tensor * d     = ggml_concat(g, y, s, 0);  // [C + 128, L, B] (an output, not a view of one)
        ggml_set_output(d);
        ggml_build_forward_expand(gf, d);
        t.insert(t.end(), { x, k.s, k.ones, d });
    };
    std::vector<float> styles;  // each job's prosody half
    for (const auto & j : jobs) {
        styles.insert(styles.end(), j.style.begin() + STYLE_DIM, j.style.begin() + 2 * STYLE_DIM);
    }
    // That of hs in a graph of its own -> jobs[b].d.
    auto styled = [&](std::vector<act> hs, lstm_device_out o, const std::string & norm) {
        const int64_t     C = hs[0].C;
        vs::stage_graph & sg =
            c.stage_graph(VS_STAGE_DURATION, "duration " + norm + shapes, [&](ggml_context * g, ggml_cgraph * gf) {
                std::vector<ggml_tensor *> t;
                styled_ops(g, gf, norm, C, t);
                return t;
            });
        fill_cond(c, sg.t[1], sg.t[2], styles.data());
        set_lstm_input(o, hs, sg.t[0]);
        c.compute(sg);
        job_frames(sg.t[3], hs);
    };
    auto inputs = [&]() {
        std::vector<const act *> xs;
        for (const auto & j : jobs) {
            xs.push_back(&j.d);
        }
        return xs;
    };
    // Where a recurrence's output stays on the device, the next one's projections graph
    // computes the AdaLayerNorm between them itself (styled_input): one graph, and d stays
    // on the device, but for the last layer's read back (the prosody's input).
    ggml_tensor * d_out        = nullptr;  // that graph's d
    auto          styled_input = [&](std::vector<act> & hs, lstm_device_out & o, const std::string & norm) {
        lstm_graph_input gin;
        gin.key = norm + shapes;
        gin.lay_out(std::vector<int64_t>((size_t) B, L));
        const int64_t C = hs[0].C;
        gin.build       = [&, C](ggml_context * g, ggml_cgraph * gf, std::vector<ggml_tensor *> & t) {
            styled_ops(g, gf, norm, C, t);
            return lstm_graph_input::join(g, { ggml_reshape_2d(g, t[3], t[3]->ne[0], B * L) });
        };
        gin.fill = [&](const std::vector<ggml_tensor *> & t) {
            fill_cond(c, t[1], t[2], styles.data());
            set_lstm_input(o, hs, t[0]);
            d_out = t[3];
        };
        return gin;
    };
    for (auto & j : jobs) {
        j.d = j.d_in;
    }
    const std::string base = PRED + "text_encoder.lstms.";
    lstm_device_out   o;
    std::vector<act>  hs = run_lstm(c, VS_STAGE_DURATION, base + "0", inputs(), {}, &o);
    for (int l = 0; l < 3; ++l) {
        const std::string norm   = base + std::to_string(2 * l + 1) + ".fc";
        const std::string next   = l < 2 ? base + std::to_string(2 * l + 2) : PRED + "lstm";
        const int64_t     H_next = model_.tensor(next + ".weight_ih")->ne[1] / 4;
        if (o.out && c.fused_lstm(c.w(next + ".weight_hh"), H_next)) {
            std::vector<act> shapes_in;  // d's shapes: the recurrence's output and the style
            for (const act & h : hs) {
                shapes_in.push_back({ {}, h.C + STYLE_DIM, h.T });
            }
            std::vector<const act *> ins;
            for (const act & a : shapes_in) {
                ins.push_back(&a);
            }
            const lstm_graph_input gin = styled_input(hs, o, norm);
            lstm_device_out        o2;
            std::vector<act>       hs2 = run_lstm(c, VS_STAGE_DURATION, next, ins, {}, &o2, &gin);
            if (l == 2) {  // d, read back from that graph
                job_frames(d_out, hs);
            }
            hs = std::move(hs2);
            o  = o2;
        } else {
            styled(std::move(hs), o, norm);
            o  = {};
            hs = run_lstm(c, VS_STAGE_DURATION, next, inputs(), {}, &o);
        }
    }
    vs::stage_graph & sg = c.stage_graph(
        VS_STAGE_DURATION, "duration projection" + shapes + " " + std::to_string(speed),
        [&](ggml_context * g, ggml_cgraph * gf) {
            ggml_tensor * x  = lstm_input_2d(g, hs[0].C, B * L, "x");
            ggml_tensor * lg = linear(c, g, x, PRED + "duration_proj.linear_layer");                // [50, B L]
            ggml_tensor * du = ggml_scale(g, ggml_sum_rows(g, ggml_sigmoid(g, lg)), 1.0f / speed);  // [1, B L]
            for (ggml_tensor * y : { lg, du }) {
                ggml_set_output(y);
                ggml_build_forward_expand(gf, y);
            }
            return std::vector<ggml_tensor *>{ x, lg, du };
        });
    set_lstm_input(o, hs, sg.t[0]);
    c.compute(sg);
    const act lg = read_act(sg.t[1]), du = read_act(sg.t[2]);
    for (int64_t b = 0; b < B; ++b) {
        jobs[(size_t) b].logits = unpack_host(lg, L, b, hs[(size_t) b].T).v;
        jobs[(size_t) b].dur    = unpack_host(du, L, b, hs[(size_t) b].T).v;
    }
}

void kokoro_voice::run_prosody(vs_context & c, std::vector<kokoro_job> & jobs) const {
    // The shared LSTM over each frame's token's d (the alignment's product, one token a frame).
    std::vector<const act *>                  xs;
    std::vector<const std::vector<int32_t> *> rows;
    for (const kokoro_job & j : jobs) {
        xs.push_back(&j.d);
        rows.push_back(&j.frame_to_token);
    }
    lstm_device_out  kept;
    std::vector<act> shared = run_lstm(c, VS_STAGE_PROSODY, PRED + "shared", xs, rows, &kept);

    // F0 and N: one graph a job, or off the CPU the jobs packed. Where graphs are kept by
    // their shapes, a job alone is packed too (one segment, its frames rounded up to
    // shape_bucket's lengths: the added ones are a gap).
    std::vector<int64_t> frames;
    for (const act & x : shared) {
        frames.push_back(x.T);
    }
    const bool packs = runs_packed(c, jobs.size(), PRED);
    for (auto [first, last] : pack_groups(frames, packs, PACK_GAP, c.limits.max_tensor_bytes)) {
        const int64_t            B = (int64_t) (last - first);
        const int64_t            C = shared[first].C;
        std::vector<int64_t>     lens;
        std::vector<const act *> in;
        for (int64_t b = 0; b < B; ++b) {
            in.push_back(&shared[first + (size_t) b]);
            lens.push_back(in.back()->T);
        }
        const int64_t      L   = packed_length(c, lens, packs);
        const std::string  key = B * L > KEPT_MAX_FRAMES ? std::string()
                                                         : "prosody " + std::to_string(B) + "x" + std::to_string(L) +
                                                              (packs ? " packed" : "");
        vs::stage_graph &  sg  = c.stage_graph(VS_STAGE_PROSODY, key, [&](ggml_context * g, ggml_cgraph * gf) {
            ggml_tensor * xi = lstm_input_2d(g, C, B * L, "x");
            cond          k  = make_cond(g, 2 * B * L, B);
            use_style_table(c, g, k, PRED);
            packing pk, pk2;
            if (packs) {
                pack_cond(g, k, B, L, pk, pk2);
            }
            cond k_up                            = k;  // after block 1's upsampling
            k_up.pack                            = k.pack2;
            std::vector<ggml_tensor *> t         = { xi, k.s, k.ones, pk.mask, pk.inv_len, pk2.mask, pk2.inv_len };
            const char *               branch[2] = { "F0", "N" };
            for (int r = 0; r < 2; ++r) {
                ggml_tensor * y = xi;
                for (int i = 0; i < 3; ++i) {
                    y = adain_res_block(c, g, y, i < 2 ? k : k_up, PRED + branch[r] + "." + std::to_string(i) + ".",
                                          i == 1);
                }
                y = conv1d(c.graph_opts(), g, y, c.w(PRED + branch[r] + "_proj.weight"),
                             c.w(PRED + branch[r] + "_proj.bias"), 1, 0);
                ggml_set_output(y);
                ggml_build_forward_expand(gf, y);
                t.push_back(y);
            }
            return t;
        });
        std::vector<float> styles;
        for (int64_t b = 0; b < B; ++b) {
            const float * s = jobs[first + (size_t) b].style.data() + STYLE_DIM;
            styles.insert(styles.end(), s, s + STYLE_DIM);
        }
        fill_cond(c, sg.t[1], sg.t[2], styles.data());
        if (packs) {
            fill_packing(c, sg.t[3], sg.t[4], B, L, lens);
            fill_packing(c, sg.t[5], sg.t[6], B, 2 * L, lens, 2);
        }
        std::vector<lstm_dest> dests;
        for (int64_t b = 0; b < B; ++b) {
            dests.push_back({ first + (size_t) b, sg.t[0], b * L, L });
        }
        set_from_lstm(c, kept, shared, dests);
        c.compute(sg);
        const act f0 = read_act(sg.t[7]), n = read_act(sg.t[8]);
        for (int64_t b = 0; b < B; ++b) {
            jobs[first + (size_t) b].f0 = unpack_host(f0, 2 * L, b, 2 * lens[(size_t) b]).v;
            jobs[first + (size_t) b].n  = unpack_host(n, 2 * L, b, 2 * lens[(size_t) b]).v;
        }
    }
}

void kokoro_voice::run_text_encoder(vs_context & c, std::vector<kokoro_job> & jobs) const {
    // Every job's convolutions as one: their tokens side by side in segments of L frames (see
    // token_segments), zeroed outside each job's tokens after every layer (a mask), so that
    // each job's convolutions read the zeros they read alone. Where the LSTM is one kernel
    // call, its projections graph computes them itself (lstm_graph_input): one graph, and
    // they stay on the device.
    const int64_t       B     = (int64_t) jobs.size();
    const ggml_tensor * w_ih  = model_.tensor(TEXT + "lstm.weight_ih");
    int64_t             T_max = 0, pad = 0;
    for (const auto & j : jobs) {
        T_max = std::max(T_max, (int64_t) j.tokens.size());
    }
    for (int i = 0; i < 3; ++i) {
        pad = std::max(pad, (model_.tensor(TEXT + "cnn." + std::to_string(i) + ".0.weight")->ne[1] - 1) / 2);
    }
    std::string   key      = "text_encoder";
    const int64_t L        = token_segments(c, jobs, pad, key);
    const bool    masked   = B > 1 || c.rounds_shapes();  // else L is the job's own length
    const bool    in_graph = c.fused_lstm(c.w(TEXT + "lstm.weight_hh"), w_ih->ne[1] / 4) && T_max <= LSTM_CHUNK_FUSED;
    // The convolutions; their ids, mask (or null) and output appended to t.
    auto convs_of = [&](ggml_context * g, ggml_cgraph * gf, std::vector<ggml_tensor *> & t) {
        ggml_tensor * ids = ggml_new_tensor_1d(g, GGML_TYPE_I32, B * L);
        ggml_set_input(ids);
        ggml_tensor * mask = masked ? input_2d(g, 1, B * L, "mask") : nullptr;
        auto          mk   = [&](ggml_tensor * x) { return mask ? ggml_mul(g, x, mask) : x; };
        ggml_tensor * x    = mk(ggml_get_rows(g, c.w(TEXT + "embedding.weight"), ids));  // [512, B L]
        for (int i = 0; i < 3; ++i) {
            const std::string l = TEXT + "cnn." + std::to_string(i) + ".";
            ggml_tensor *     w = c.w(l + "0.weight");
            x                   = conv1d(c.graph_opts(), g, x, w, c.w(l + "0.bias"), 1, (int) (w->ne[1] - 1) / 2);
            x                   = layer_norm(g, x, c.w(l + "1.gamma"), c.w(l + "1.beta"), 1e-5f);
            x                   = mk(ggml_leaky_relu(g, x, 0.2f, false));
        }
        ggml_set_output(x);
        ggml_build_forward_expand(gf, x);
        t.insert(t.end(), { ids, mask, x });
    };
    auto fill = [&](const std::vector<ggml_tensor *> & t) {
        std::vector<int32_t> ids((size_t) (B * L), 0);
        std::vector<float>   mask((size_t) (B * L), 0.0f);
        for (int64_t b = 0; b < B; ++b) {
            const std::vector<int32_t> & tok = jobs[(size_t) b].tokens;
            std::copy(tok.begin(), tok.end(), ids.begin() + b * L);
            std::fill_n(mask.begin() + b * L, tok.size(), 1.0f);
        }
        set_input(c, t[0], ids.data());
        if (t[1]) {
            set_input(c, t[1], mask.data());
        }
    };
    std::vector<act>         convs;
    std::vector<const act *> xs;
    lstm_graph_input         gin;
    if (in_graph) {
        gin.key = key;
        gin.lay_out(std::vector<int64_t>((size_t) B, L));
        for (const auto & j : jobs) {
            convs.push_back({ {}, w_ih->ne[0], (int64_t) j.tokens.size() });  // their shapes
        }
        gin.build = [&](ggml_context * g, ggml_cgraph * gf, std::vector<ggml_tensor *> & t) {
            convs_of(g, gf, t);
            return lstm_graph_input::join(g, { t[2] });
        };
        gin.fill = fill;
    } else {
        vs::stage_graph & sg = c.stage_graph(VS_STAGE_TEXT_ENCODER, key, [&](ggml_context * g, ggml_cgraph * gf) {
            std::vector<ggml_tensor *> t;
            convs_of(g, gf, t);
            return t;
        });
        fill(sg.t);
        c.compute(sg);
        const act x = read_act(sg.t[2]);
        for (int64_t b = 0; b < B; ++b) {
            convs.push_back(unpack_host(x, L, b, (int64_t) jobs[(size_t) b].tokens.size()));
        }
    }
    for (const auto & x : convs) {
        xs.push_back(&x);
    }
    std::vector<act> t_en =
        run_lstm(c, VS_STAGE_TEXT_ENCODER, TEXT + "lstm", xs, {}, nullptr, in_graph ? &gin : nullptr);
    for (size_t b = 0; b < jobs.size(); ++b) {
        jobs[b].t_en = std::move(t_en[b]);
    }
}

void kokoro_voice::run_decoder(vs_context & c, const std::vector<kokoro_job *> & group, bool packs,
                               dec_handoff * handoff) const {
    // Packed (more than one job, or one where graphs are kept by their shapes): the tokens'
    // rows of every job in one table whose row `rows` is zeros, for the gaps' frames to read.
    const int64_t        B = (int64_t) group.size();
    std::vector<int64_t> lens;
    int64_t              rows = 0;
    for (const kokoro_job * j : group) {
        lens.push_back((int64_t) j->frame_to_token.size());
        rows += j->t_en.T;
    }
    const int64_t     L   = packed_length(c, lens, packs);
    const int64_t     R   = packs && c.rounds_shapes() ? shape_bucket(rows + 1) : rows + 1;  // the table's rows
    const int64_t     C   = group[0]->t_en.C;
    const std::string key = B * L > KEPT_MAX_FRAMES ? std::string()
                                                    : "decoder " + std::to_string(B) + "x" + std::to_string(L) + " " +
                                                          std::to_string(R) + (packs ? " packed" : "");
    vs::stage_graph & sg  = c.stage_graph(VS_STAGE_DECODER, key, [&](ggml_context * g, ggml_cgraph * gf) {
        ggml_tensor * te = input_2d(g, C, R, "t_en");
        ggml_tensor * fr = ggml_new_tensor_1d(g, GGML_TYPE_I32, B * L);
        ggml_tensor * fi = input_2d(g, 1, 2 * B * L, "f0");
        ggml_tensor * ni = input_2d(g, 1, 2 * B * L, "n");
        cond          k  = make_cond(g, 2 * B * L, B);
        use_style_table(c, g, k, DEC);
        ggml_set_input(fr);
        packing pk, pk2;
        if (packs) {
            pack_cond(g, k, B, L, pk, pk2);
        }

        ggml_tensor * asr = ggml_get_rows(g, te, fr);  // [512, B * L]: each token's frames
        ggml_tensor * f0d =
            conv1d_strided(c.graph_opts(), g, fi, c.w(DEC + "F0_conv.weight"), c.w(DEC + "F0_conv.bias"), 2, 1);
        ggml_tensor * nd =
            conv1d_strided(c.graph_opts(), g, ni, c.w(DEC + "N_conv.weight"), c.w(DEC + "N_conv.bias"), 2, 1);
        ggml_tensor * x = ggml_concat(g, ggml_concat(g, asr, f0d, 0), nd, 0);  // [514, B * L]
        x               = adain_res_block(c, g, x, k, DEC + "encode.", false);
        ggml_tensor * res =
            conv1d(c.graph_opts(), g, asr, c.w(DEC + "asr_res.0.weight"), c.w(DEC + "asr_res.0.bias"), 1, 0);
        // The channels every decode block appends to its input, concatenated once.
        ggml_tensor * tail = ggml_concat(g, ggml_concat(g, res, f0d, 0), nd, 0);  // [66, B * L]
        for (int i = 0; i < 4; ++i) {
            x = ggml_concat(g, x, tail, 0);  // [1090, B * L]
            x = adain_res_block(c, g, x, k, DEC + "decode." + std::to_string(i) + ".", i == 3);
        }
        ggml_set_output(x);
        ggml_build_forward_expand(gf, x);
        return std::vector<ggml_tensor *>{ te, fr, fi, ni, k.s, k.ones, pk.mask, pk.inv_len, pk2.mask, pk2.inv_len, x };
    });

    std::vector<float>   tv((size_t) (C * R), 0.0f), f0v((size_t) (2 * B * L), 0.0f), nv(f0v.size(), 0.0f);
    std::vector<int32_t> frv((size_t) (B * L), (int32_t) rows);
    std::vector<float>   styles;
    int64_t              row = 0;
    for (int64_t b = 0; b < B; ++b) {
        const kokoro_job & j = *group[(size_t) b];
        std::copy(j.t_en.v.begin(), j.t_en.v.end(), tv.begin() + row * C);
        for (int64_t f = 0; f < lens[(size_t) b]; ++f) {
            frv[(size_t) (b * L + f)] = (int32_t) (row + j.frame_to_token[(size_t) f]);
        }
        std::copy(j.f0.begin(), j.f0.end(), f0v.begin() + 2 * b * L);
        std::copy(j.n.begin(), j.n.end(), nv.begin() + 2 * b * L);
        styles.insert(styles.end(), j.style.begin(), j.style.begin() + STYLE_DIM);
        row += j.t_en.T;
    }
    set_input(c, sg.t[0], tv.data());
    set_input(c, sg.t[1], frv.data());
    set_input(c, sg.t[2], f0v.data());
    set_input(c, sg.t[3], nv.data());
    fill_cond(c, sg.t[4], sg.t[5], styles.data());
    if (packs) {
        fill_packing(c, sg.t[6], sg.t[7], B, L, lens);
        fill_packing(c, sg.t[8], sg.t[9], B, 2 * L, lens, 2);
    }
    c.compute(sg);
    ggml_tensor * out = sg.t[10];
    if (handoff && in_device_memory(c, out)) {  // each job's frames copied on the device
        const int64_t C_out = out->ne[0];
        const size_t  bytes = sizeof(float) * (size_t) (C_out * handoff->frames);  // the same for every group
        auto *        base  = static_cast<uint8_t *>(c.device_handoff(bytes));
        for (int64_t b = 0; b < B; ++b) {
            kokoro_job & j   = *group[(size_t) b];
            const size_t len = sizeof(float) * (size_t) (C_out * 2 * lens[(size_t) b]);
            GGML_ASSERT(handoff->at + len <= bytes);
            j.dec    = { {}, C_out, 2 * lens[(size_t) b] };
            j.dec_at = (int64_t) handoff->at;
            vs::cuda::copy(c.cuda_device, base + handoff->at,
                           static_cast<const uint8_t *>(out->data) + sizeof(float) * (size_t) (2 * b * L * C_out), len);
            handoff->at += len;
        }
        return;  // the generator's graphs wait for the copies (vs_context::after_engine)
    }
    const act o = read_act(out);
    for (int64_t b = 0; b < B; ++b) {
        group[(size_t) b]->dec = unpack_host(o, 2 * L, b, 2 * lens[(size_t) b]);
    }
}

// atan(z) for any finite z: two half-angle reductions bring |z| under tan(pi/8), then
// a Taylor series (error < 1e-6 there).
ggml_tensor * atan_all(ggml_context * g, ggml_tensor * z) {
    z = ggml_clamp(g, z, -1e18f, 1e18f);
    for (int i = 0; i < 2; ++i) {
        ggml_tensor * den =
            ggml_scale_bias(g, ggml_sqrt(g, ggml_scale_bias(g, ggml_sqr(g, z), 1.0f, 1.0f)), 1.0f, 1.0f);
        z = ggml_div(g, z, den);
    }
    ggml_tensor * z2  = ggml_sqr(g, z);
    ggml_tensor * acc = ggml_scale_bias(g, z2, -1.0f / 11.0f, 1.0f / 9.0f);
    for (int k : { 7, 5, 3 }) {
        acc = ggml_scale_bias(g, ggml_mul(g, acc, z2), -1.0f, 1.0f / (float) k);
    }
    acc = ggml_scale_bias(g, ggml_mul(g, acc, z2), -1.0f, 1.0f);
    return ggml_scale(g, ggml_mul(g, acc, z), 4.0f);
}

// Per harmonic h (rows of [F2, 9]) the running sum over F0 frames of frac(h f0 / sr), the
// phase increments in cycles, in the export's float arithmetic and order. A running sum is
// no op of every backend (Vulkan's needs subgroup features), and it is 9 rows of F0 frames.
std::vector<float> harmonic_cycles(const std::vector<float> & f0, float sample_rate) {
    const size_t       F2 = f0.size();
    std::vector<float> out(F2 * N_HARMONICS);
    for (int k = 0; k < N_HARMONICS; ++k) {
        float sum = 0.0f;
        for (size_t t = 0; t < F2; ++t) {
            float r = f0[t] * (float) (k + 1) / sample_rate;
            sum += r - std::floor(r);
            out[(size_t) k * F2 + t] = sum;
        }
    }
    return out;
}

// The forward DFT basis over the Hann window [N_FFT, 2 bins] (rows re_0..re_10, im_0..im_10)
// and the iSTFT's gain on its first N_FFT / 2 samples: constants on c's device, made once.
ggml_tensor * stft_basis(vs_context & c, const vs_model & model) {
    const int64_t bins = N_FFT / 2 + 1;
    return c.derived_tensor("kokoro.stft_basis", GGML_TYPE_F32, { N_FFT, 2 * bins, 1, 1 }, [&](uint8_t * out) {
        const float * wv = (const float *) model.tensor(GEN + "stft.window")->data;
        auto *        bv = reinterpret_cast<float *>(out);
        for (int64_t k = 0; k < bins; ++k) {
            for (int t = 0; t < N_FFT; ++t) {
                const double a             = 2.0 * M_PI * (double) (k * t) / N_FFT;
                bv[k * N_FFT + t]          = (float) (wv[t] * std::cos(a));
                bv[(bins + k) * N_FFT + t] = (float) (-wv[t] * std::sin(a));
            }
        }
    });
}

// The export scales by 4, dividing its first N_FFT samples by one frame's squared window:
// the gain of a sentence's first N_FFT / 2 samples (those after, 4).
std::vector<float> istft_head_gain(const vs_model & model) {
    const float *      wsv = (const float *) model.tensor(GEN + "stft.istft.stft.window_sum")->data;
    std::vector<float> gv(N_FFT / 2);
    for (int j = 0; j < N_FFT / 2; ++j) {
        const float w  = wsv[N_FFT / 2 + j];
        gv[(size_t) j] = w > 1.1754944e-38f ? 4.0f / w : 4.0f;
    }
    return gv;
}

// The same on c's device, made once.
ggml_tensor * istft_gain(vs_context & c, const vs_model & model) {
    return c.derived_tensor("kokoro.istft_gain", GGML_TYPE_F32, { N_FFT / 2, 1, 1, 1 }, [&](uint8_t * out) {
        const std::vector<float> gv = istft_head_gain(model);
        std::copy(gv.begin(), gv.end(), reinterpret_cast<float *>(out));
    });
}

// The inverse STFT's overlap-add of frames cols [N_FFT, n] (frame f's samples from f HOP on)
// -> [(n - 1) HOP + N_FFT].
ggml_tensor * overlap_add(ggml_context * g, ggml_tensor * cols) {
    const int64_t n_frames = cols->ne[1];
    const int64_t raw_len  = (n_frames - 1) * HOP + N_FFT;
    ggml_tensor * wav      = nullptr;
    for (int q = 0; q < N_FFT / HOP; ++q) {
        ggml_tensor * part = ggml_cont(g, ggml_view_2d(g, cols, HOP, n_frames, cols->nb[1], q * HOP * sizeof(float)));
        part               = ggml_reshape_1d(g, part, HOP * n_frames);
        if (!wav) {
            wav = ggml_pad_ext(g, part, q * HOP, (int) (raw_len - HOP * n_frames - q * HOP), 0, 0, 0, 0, 0, 0);
        } else {
            wav = ggml_acc(g, wav, part, wav->nb[1], wav->nb[2], wav->nb[3], q * HOP * sizeof(float));
        }
    }
    return wav;
}

// Magnitude and phase (atan of im/re, moved to the quadrant) of STFT frames [22, n] (rows
// re_0..re_10, im_0..im_10) -> har [22, n]: frame by frame, so one chain serves any number
// of sentences' frames side by side.
ggml_tensor * har_of(ggml_context * g, ggml_tensor * frames) {
    const int64_t bins = N_FFT / 2 + 1;
    ggml_tensor * re   = channels(g, frames, 0, bins);
    ggml_tensor * im   = channels(g, frames, bins, bins);
    ggml_tensor * mag  = ggml_sqrt(g, ggml_add(g, ggml_sqr(g, re), ggml_sqr(g, im)));
    ggml_tensor * at   = atan_all(g, ggml_div(g, im, re));
    // re < 0: + pi if im > 0, else - pi.
    ggml_tensor * quad = ggml_mul(g, step_above_zero(g, ggml_neg(g, re)),
                                  ggml_scale_bias(g, step_above_zero(g, im), 2.0f * (float) M_PI, -(float) M_PI));
    return ggml_concat(g, mag, ggml_add(g, at, quad), 0);
}

// The generator's harmonic source and its STFT, har [22, n_frames], in graph g for F0 frames
// F2; its inputs are filled by fill() after the graph's allocation. `gap`: for F0 frames up
// to F2, those past a sentence's a gap whose results are not its own. `with_har` false: the
// STFT's frames only (`frames`), for har_of over a batch's at once.
struct gen_source {
    ggml_tensor *fi = nullptr, *cyc = nullptr, *edges = nullptr, *edges_at = nullptr, *frames = nullptr, *har = nullptr;
    int64_t      F2 = 0, L = 0, n_frames = 0;

    gen_source() = default;  // a kept graph's, its tensors set from the graph's
    gen_source(vs_context & c, const vs_model & model, ggml_context * g, int64_t f0_frames, bool gap = false,
               bool with_har = true) :
        F2(f0_frames), L(f0_frames * SAMPLES_PER_F0), n_frames(L / HOP + 1) {
        fi    = input_2d(g, F2, 1, "f0");
        cyc   = input_2d(g, F2, N_HARMONICS, "harmonic_cycles");
        edges = ggml_new_tensor_1d(g, GGML_TYPE_I32, N_FFT);  // see below
        ggml_set_input(edges);

        // Harmonic source, as the export computes it: per harmonic its running phase in cycles
        // (harmonic_cycles, from the host), scaled to radians per upsampled sample, linearly
        // interpolated to the sample rate; sin, gated by voicing.
        ggml_tensor * ph = ggml_scale(g, ggml_scale(g, ggml_scale(g, cyc, 2.0f), (float) M_PI), (float) SAMPLES_PER_F0);
        ph               = ggml_interpolate(g, ph, L, N_HARMONICS, 1, 1, GGML_SCALE_MODE_BILINEAR);  // [L, 9]
        ggml_tensor * uv = step_above_zero(g, ggml_scale_bias(g, fi, 1.0f, -VOICED_F0));             // [F2, 1]
        uv               = ggml_interpolate(g, uv, L, 1, 1, 1, GGML_SCALE_MODE_NEAREST);             // [L, 1]
        ggml_tensor * sine = ggml_mul(g, ggml_scale(g, ggml_sin(g, ph), SINE_AMP), uv);
        sine               = ggml_cont(g, ggml_transpose(g, sine));                        // [9, L]
        ggml_tensor * src  = ggml_tanh(g, linear(c, g, sine, GEN + "m_source.l_linear"));  // [1, L]

        // Its STFT (reflect-padded, Hann window): a DFT basis over windows of N_FFT samples
        // every HOP samples, then magnitude and phase (har_of). The padding's samples are
        // gathered, which every backend can: the first N_FFT / 2 are
        // src[N_FFT / 2 .. 1], the last src[len - 2 .. len - 1 - N_FFT / 2] for the sentence's
        // own length len. With a gap they are also written right after its samples (their
        // places, edges_at, an input), the gap's past them (unvoiced, as a pause is).
        ggml_tensor * pad   = ggml_get_rows(g, src, edges);  // [1, N_FFT]: the two paddings
        ggml_tensor * right = ggml_view_2d(g, pad, 1, N_FFT / 2, pad->nb[1], (N_FFT / 2) * pad->nb[1]);
        ggml_tensor * padded =
            ggml_concat(g, ggml_concat(g, ggml_view_2d(g, pad, 1, N_FFT / 2, pad->nb[1], 0), src, 1), right, 1);
        if (gap) {
            edges_at = ggml_new_tensor_1d(g, GGML_TYPE_I32, N_FFT / 2);
            ggml_set_input(edges_at);
            padded = ggml_set_rows(g, padded, right, edges_at);  // [1, L + N_FFT]
        }
        ggml_tensor * basis = stft_basis(c, model);
        frames = conv1d_strided(c.graph_opts(), g, padded, ggml_reshape_3d(g, basis, 1, N_FFT, basis->ne[1]), nullptr,
                                HOP, 0);
        if (with_har) {
            har = har_of(g, frames);  // [22, n_frames]
            ggml_set_output(har);
        }
    }

    void fill(vs_context & c, const std::vector<float> & f0, float sample_rate) const {
        const int64_t n = (int64_t) f0.size(), len = n * SAMPLES_PER_F0;
        GGML_ASSERT(n >= 1 && n <= F2 && (n == F2 || edges_at));
        std::vector<float> f0v(f0);
        f0v.resize((size_t) F2, 0.0f);  // unvoiced
        set_input(c, fi, f0v.data());
        // Each harmonic's phases, the last one repeated: the interpolation reads it where it
        // would clamp at the sentence's end.
        const std::vector<float> phases = harmonic_cycles(f0, sample_rate);
        std::vector<float>       cv((size_t) (F2 * N_HARMONICS));
        for (int k = 0; k < N_HARMONICS; ++k) {
            std::copy_n(phases.begin() + k * n, n, cv.begin() + k * F2);
            std::fill(cv.begin() + k * F2 + n, cv.begin() + (k + 1) * F2, phases[(size_t) ((k + 1) * n - 1)]);
        }
        set_input(c, cyc, cv.data());
        std::vector<int32_t> idx(N_FFT), at(N_FFT / 2);
        for (int i = 0; i < N_FFT / 2; ++i) {
            idx[i]             = N_FFT / 2 - i;
            idx[N_FFT / 2 + i] = (int32_t) (len - 2 - i);
            at[i]              = (int32_t) (N_FFT / 2 + len + i);
        }
        set_input(c, edges, idx.data());
        if (edges_at) {
            set_input(c, edges_at, at.data());
        }
    }
};

// Stage i's noise convolution of the harmonics [22, n_frames] to its rate.
ggml_tensor * kokoro_voice::gen_noise_conv(vs_context & c, ggml_context * g, ggml_tensor * har, size_t i) const {
    const std::string n  = std::to_string(i);
    ggml_tensor *     nw = c.w(GEN + "noise_convs." + n + ".weight");
    ggml_tensor *     nb = c.w(GEN + "noise_convs." + n + ".bias");
    if (i + 1 == hp_.gen_rates.size()) {
        return conv1d(c.graph_opts(), g, har, nw, nb, 1, 0);
    }
    int stride = 1;
    for (size_t j = i + 1; j < hp_.gen_rates.size(); ++j) {
        stride *= hp_.gen_rates[j];
    }
    return conv1d_strided(c.graph_opts(), g, har, nw, nb, stride, (stride + 1) / 2);
}

// Stage i's upsampling of x: LeakyReLU, the transposed convolution and, on the last stage,
// a reflection pad of one frame on the left (frame 1 repeated before frame 0).
ggml_tensor * kokoro_voice::gen_upsample(vs_context & c, ggml_context * g, ggml_tensor * x, size_t i) const {
    const std::string n = std::to_string(i);
    const int         r = hp_.gen_rates[i];
    x                   = ggml_leaky_relu(g, x, 0.1f, false);
    x                   = conv_transpose1d(g, x, c.w(GEN + "ups." + n + ".weight"), c.w(GEN + "ups." + n + ".bias"), r,
                                           (hp_.gen_kernels[i] - r) / 2);
    if (i + 1 == hp_.gen_rates.size()) {
        ggml_tensor * f1 = ggml_view_2d(g, x, x->ne[0], 1, x->nb[1], x->nb[1]);
        x                = ggml_concat(g, ggml_cont(g, f1), x, 1);
    }
    return x;
}

// The generator's last steps but the overlap-add: conv_post to magnitude and phase, each
// frame's N_FFT samples from the synthesis basis -> [N_FFT, n_frames]. With `mask`
// [1, n_frames], the frames it zeroes add nothing to the audio. `fine_columns`: conv_post's
// GEMM rounded as a batch's (phase_columns).
ggml_tensor * kokoro_voice::gen_frames(vs_context & c, ggml_context * g, ggml_tensor * x, ggml_tensor * mask,
                                       bool fine_columns) const {
    const int64_t bins   = N_FFT / 2 + 1;
    x                    = ggml_leaky_relu(g, x, 0.01f, false);
    ggml_tensor * w_post = c.w(GEN + "conv_post.weight");
    ggml_tensor * b_post = c.w(GEN + "conv_post.bias");
    x = phases_apply(c.graph_opts(), w_post, 1) ? conv1d_phases_ct(g, x, 3, x->ne[1], w_post, b_post, fine_columns)
                                                : conv1d(c.graph_opts(), g, x, w_post, b_post, 1, 3);  // [22, n_frames]
    ggml_tensor * spec  = ggml_exp(g, channels(g, x, 0, bins));
    ggml_tensor * phase = ggml_sin(g, channels(g, x, bins, bins));
    ggml_tensor * cplx =
        ggml_concat(g, ggml_mul(g, spec, ggml_cos(g, phase)), ggml_mul(g, spec, ggml_sin(g, phase)), 0);
    if (mask) {
        cplx = ggml_mul(g, cplx, mask);
    }
    return ggml_mul_mat(g, c.w(GEN + "stft.istft.stft.inverse_basis"), cplx);  // [N_FFT, n_frames]
}

// The generator's last steps -> audio [L] (gen_frames, then the overlap-add).
ggml_tensor * kokoro_voice::gen_output(vs_context & c, ggml_context * g, ggml_tensor * x, int64_t L,
                                       ggml_tensor * mask) const {
    ggml_tensor * wav = overlap_add(g, gen_frames(c, g, x, mask, false));
    // The export scales by 4, dividing its first N_FFT samples by one frame's squared
    // window (a constant it traced); then drops N_FFT / 2 samples at each end.
    ggml_tensor * head = ggml_mul(g, ggml_view_1d(g, wav, N_FFT / 2, N_FFT / 2 * sizeof(float)), istft_gain(c, model_));
    ggml_tensor * body = ggml_scale(g, ggml_view_1d(g, wav, L - N_FFT / 2, N_FFT * sizeof(float)), 4.0f);
    ggml_tensor * audio = ggml_concat(g, head, body, 0);  // [L]
    ggml_set_output(audio);
    return audio;
}

std::vector<float> kokoro_voice::run_generator(vs_context & c, const act & xin, const std::vector<float> & f0,
                                               const std::vector<float> & style, act & har_out) const {
    auto           gb   = c.new_graph(16384);
    ggml_context * g    = gb.ctx.get();
    ggml_tensor *  x_in = input_2d(g, xin.C, xin.T, "x");
    ggml_tensor *  x    = x_in;
    gen_source     src(c, model_, g, (int64_t) f0.size());
    cond           k = make_cond(g, src.n_frames);
    use_style_table(c, g, k, GEN);
    for (size_t i = 0; i < hp_.gen_rates.size(); ++i) {
        ggml_tensor * xs  = gen_noise_conv(c, g, src.har, i);
        xs                = snake_res_block(c, g, xs, k, GEN + "noise_res." + std::to_string(i) + ".", noise_kernel(i));
        x                 = ggml_add(g, gen_upsample(c, g, x, i), xs);
        ggml_tensor * sum = nullptr;
        for (size_t j = 0; j < hp_.res_kernels.size(); ++j) {
            ggml_tensor * y = snake_res_block(c, g, x, k, res_prefix(i, j), hp_.res_kernels[j]);
            sum             = sum ? ggml_add(g, sum, y) : y;
        }
        x = ggml_scale(g, sum, 1.0f / (float) hp_.res_kernels.size());
    }
    ggml_tensor * audio = gen_output(c, g, x, src.L);
    ggml_build_forward_expand(gb.gf, src.har);
    ggml_build_forward_expand(gb.gf, audio);
    c.alloc(VS_STAGE_GENERATOR, gb.gf);

    set_input(c, x_in, xin.v.data());
    src.fill(c, f0, (float) hp_.sample_rate);
    fill_cond(c, k, style.data());
    c.compute(gb.gf);
    har_out = read_act(src.har);
    return read_act(audio).v;
}

std::string kokoro_voice::res_prefix(size_t stage, size_t j) const {
    return GEN + "resblocks." + std::to_string(stage * hp_.res_kernels.size() + j) + ".";
}

// The residual stacks of the generator's stages on a CUDA device, each in the engine's
// kernels (vs::cuda::snake_stack); where any of their weights is not F16 on the device, or
// the AdaINs have no style table, the ggml graph. Asked once (a voice has one context).
bool kokoro_voice::fused_generator(vs_context & c) const {
    if (fused_ < 0) {
        fused_ = fused_generator_applies(c) ? 1 : 0;
    }
    return fused_ == 1;
}

bool kokoro_voice::fused_generator_applies(vs_context & c) const {
    if (c.cuda_device < 0 || !style_table_for(c, GEN) || hp_.res_kernels.size() < 2 || hp_.res_dilations.size() != 3) {
        return false;
    }
    auto on_device = [&](const std::string & name, ggml_type type) {
        const ggml_tensor * t = c.w(name);
        return t->type == type && t->buffer && !ggml_backend_buffer_is_host(t->buffer) && ggml_is_contiguous(t);
    };
    for (size_t i = 0; i < hp_.gen_rates.size(); ++i) {
        std::vector<std::pair<std::string, int>> blocks = { { GEN + "noise_res." + std::to_string(i) + ".",
                                                              noise_kernel(i) } };
        for (size_t j = 0; j < hp_.res_kernels.size(); ++j) {
            blocks.emplace_back(res_prefix(i, j), hp_.res_kernels[j]);
        }
        for (const auto & [pre, K] : blocks) {
            for (int n = 0; n < 3; ++n) {
                for (const char * conv : { "convs1.", "convs2." }) {
                    const std::string   w  = pre + conv + std::to_string(n);
                    const ggml_tensor * wt = c.w(w + ".weight");
                    if (!on_device(w + ".weight", GGML_TYPE_F16) || !on_device(w + ".bias", GGML_TYPE_F32) ||
                        wt->ne[1] != K || wt->ne[0] != wt->ne[2] || !vs::cuda::snake_supported(wt->ne[0], K)) {
                        return false;
                    }
                }
                for (const char * alpha : { "alpha1.", "alpha2." }) {
                    if (!on_device(pre + alpha + std::to_string(n), GGML_TYPE_F32)) {
                        return false;
                    }
                }
            }
        }
    }
    return true;
}

std::vector<int64_t> kokoro_voice::gen_stage_frames(int64_t F2) const {
    std::vector<int64_t> T;
    int64_t              n = F2;
    for (size_t i = 0; i < hp_.gen_rates.size(); ++i) {
        const int r = hp_.gen_rates[i], K = hp_.gen_kernels[i];
        n = (n - 1) * r - 2 * ((K - r) / 2) + K + (i + 1 == hp_.gen_rates.size() ? 1 : 0);
        T.push_back(n);
    }
    return T;
}

int64_t kokoro_voice::gen_bucket(int64_t F2, std::vector<int64_t> & total) const {
    const std::array<int, 6>   dil = res_dilations();
    const std::vector<int64_t> T   = gen_stage_frames(F2);
    total.clear();
    for (size_t i = 0; i < T.size(); ++i) {
        std::vector<int> Ks = hp_.res_kernels;
        Ks.push_back(noise_kernel(i));
        total.push_back(vs::cuda::snake_bucket(T[i], Ks.data(), (int) Ks.size(), dil.data(), 6));
    }
    auto fits = [&](int64_t n) {
        const std::vector<int64_t> Tn = gen_stage_frames(n);
        for (size_t i = 0; i < Tn.size(); ++i) {
            if (Tn[i] > total[i]) {
                return false;
            }
        }
        return true;
    };
    int64_t n = F2;
    for (int64_t step = std::max<int64_t>(1, F2); step > 0; step /= 2) {
        while (fits(n + step)) {
            n += step;
        }
    }
    return n;
}

// A pointer as text, for the keys of graphs that read or write that memory.
std::string address(const void * p) {
    char s[32];
    std::snprintf(s, sizeof(s), "%p", p);
    return s;
}

// [1, n]: 1 on the first `len` frames (element `at` of the graph's input lens), else 0.
ggml_tensor * frame_mask(ggml_context * g, ggml_tensor * lens, int at, int64_t n) {
    ggml_tensor * len = ggml_view_1d(g, lens, 1, (size_t) at * sizeof(float));
    ggml_tensor * pos = ggml_arange(g, 0.5f, (float) n + 0.5f, 1.0f);  // the frames' middles
    return ggml_reshape_2d(g, step_above_zero(g, ggml_neg(g, ggml_sub(g, pos, len))), 1, n);
}

// As run_generator, for the jobs of `group` at once, their residual stacks in the engine's
// CUDA kernels between three graphs: every sentence's source, noise convolutions and first
// upsampling; each later upsampling; the outputs. Where the group has several sentences,
// each stage's kernels take them packed along time (vs::cuda::snake_segments): sentence b's
// frames, then a gap as wide as the stage's widest convolution pads. The first graph reads
// and writes each sentence's frames alone; the later ones run over the packing, its gaps
// zeroed (a mask), and gather the next stage's packing (or cut each sentence's audio) from
// their result. The graphs and the kernels hand activations over in
// the device scratch, laid out once per group:
//   styles   each sentence's style table rows (the AdaINs' affines), `rows` floats apart
//   xs32[i]  stage i's noise branches as the first graph writes them (F32)
//   up32     a stage's upsampled input as a graph writes it (F32)
//   xs[i]    the noise branches as the stacks take them (F16), their residual stack run in place
//   x, r, s  a stage's input (up32 + xs), a stack's copy, and the stacks' sum (F16)
//   out      the stacks' mean, which the next graph reads (F32)
//   segs[i]  stage i's segments: first frame and count each, then each frame's segment
//   work     snake_stack's own
// A sentence alone, where kept graphs are captured, runs at its length's buckets: its stacks
// at gen_bucket's, captured (captures_), and its graphs at its F0 frames rounded up as other
// stages' are (shape_bucket, within the stacks' buckets), kept in shared memory. Its own
// length is a graph input and device memory, the frames past it masked. Every sentence of
// those buckets then runs the same graphs and launches, replayed.
void kokoro_voice::run_generator_fused(vs_context & c, const std::vector<kokoro_job *> & group) const {
    const int                dev      = c.cuda_device;
    const size_t             n_stages = hp_.gen_rates.size(), B = group.size();
    const style_table &      tab      = *style_table_for(c, GEN);
    const std::array<int, 6> dil      = res_dilations();
    const bool               captured = B == 1 && c.tag_runs && c.keep_graphs && !c.profiling;

    // Each stage's packing: sentence b's first frame at[i][b], its frame count T[i][b]; the
    // kernels' frames total[i]. The graphs run F2g[b] F0 frames, Tg[i][b] at stage i: a
    // captured sentence's bucket, else its own.
    std::vector<int64_t>              Cs, total, F2g;
    std::vector<std::vector<int64_t>> at(n_stages), T(n_stages), Tg(n_stages);
    for (size_t i = 0; i < n_stages; ++i) {
        Cs.push_back(c.w(GEN + "noise_convs." + std::to_string(i) + ".bias")->ne[0]);
    }
    if (captured) {  // the graphs' frames rounded as other stages' (shape_bucket), within the stacks'
        const int64_t F2 = (int64_t) group[0]->f0.size();
        F2g.push_back(std::min(gen_bucket(F2, total), shape_bucket(F2)));
    }
    for (size_t b = 0; b < B; ++b) {
        const std::vector<int64_t> Tb = gen_stage_frames((int64_t) group[b]->f0.size());
        if (!captured) {
            F2g.push_back((int64_t) group[b]->f0.size());
        }
        const std::vector<int64_t> Tgb = gen_stage_frames(F2g[b]);
        for (size_t i = 0; i < n_stages; ++i) {
            T[i].push_back(Tb[i]);
            Tg[i].push_back(Tgb[i]);
        }
    }
    for (size_t i = 0; !captured && i < n_stages; ++i) {
        const int widest = std::max(noise_kernel(i), *std::max_element(hp_.res_kernels.begin(), hp_.res_kernels.end()));
        const int64_t gap    = (int64_t) *std::max_element(dil.begin(), dil.end()) * (widest - 1) / 2;
        int64_t       frames = 0;
        for (size_t b = 0; b < B; ++b) {
            at[i].push_back(frames);
            frames += T[i][b] + (B > 1 ? gap : 0);
        }
        total.push_back(frames);
    }
    for (size_t i = 0; captured && i < n_stages; ++i) {
        at[i].push_back(0);
    }

    // The scratch: stage i has C_i channels and total_i frames; its buffers have room for
    // the frames every kernel size's GEMMs write. The stacks' activations are F16 (xs, x, r
    // and s: see snake_stack); the graphs hand them over as F32 (xs32, up32: ggml's
    // conversion to F16 runs a thread an element, ten times slower than the engine's) and
    // take the mean of a stage's stacks as F32 (out).
    constexpr size_t    F16 = sizeof(uint16_t);
    vs::scratch_layout  scratch;
    const int64_t       rows      = tab.w->ne[1];
    const size_t        styles_at = scratch.reserve(sizeof(float) * (size_t) (rows * (int64_t) B));
    std::vector<size_t> xs_at, xs32_at, segs_at;
    size_t              stage_bytes = 0, work_bytes = 0;
    for (size_t i = 0; i < n_stages; ++i) {
        const int64_t C = Cs[i], F = total[i];
        int64_t       frames = vs::cuda::snake_frames(F, noise_kernel(i), dil.data(), 6, (int) B);
        work_bytes = std::max(work_bytes, vs::cuda::snake_scratch_bytes(C, F, noise_kernel(i), dil.data(), 6, (int) B));
        for (int K : hp_.res_kernels) {
            frames     = std::max(frames, vs::cuda::snake_frames(F, K, dil.data(), 6, (int) B));
            work_bytes = std::max(work_bytes, vs::cuda::snake_scratch_bytes(C, F, K, dil.data(), 6, (int) B));
        }
        xs_at.push_back(scratch.reserve(F16 * (size_t) (C * frames)));
        xs32_at.push_back(scratch.reserve(sizeof(float) * (size_t) (C * frames)));
        segs_at.push_back(B > 1 ? scratch.reserve(sizeof(int) * (size_t) (2 * (int64_t) B + F)) : 0);
        stage_bytes = std::max(stage_bytes, F16 * (size_t) (C * frames));
    }
    const size_t x_at = scratch.reserve(stage_bytes), r_at = scratch.reserve(stage_bytes),
                 s_at = scratch.reserve(stage_bytes), out_at = scratch.reserve(2 * stage_bytes),
                 up32_at = scratch.reserve(2 * stage_bytes);
    const size_t work_at = scratch.reserve(work_bytes);
    // A captured sentence's length at each stage (its segment's range), uploaded at once.
    const size_t ranges_at = captured ? scratch.reserve(sizeof(int) * 2 * n_stages) : 0;
    auto * const base      = static_cast<uint8_t *>(c.device_scratch(scratch.bytes));
    auto         ptr       = [&](size_t off) { return reinterpret_cast<float *>(base + off); };
    // Sentence b's frames of a stage's F32 buffer at `off` (the graphs' Tg), as a tensor of graph g.
    auto frames_of = [&](ggml_context * g, size_t off, size_t i, size_t b) {
        return c.scratch_tensor(g, off + sizeof(float) * (size_t) (at[i][b] * Cs[i]), Cs[i], Tg[i][b]);
    };
    // A captured sentence's graphs are kept by its buckets and the memory they read and write.
    auto key = [&](const std::string & what) {
        if (!captured) {
            return std::string();
        }
        std::string k = "generator " + what + " of " + std::to_string(F2g[0]) + " in";
        for (int64_t F : total) {
            k += " " + std::to_string(F);
        }
        return k + " at " + address(base);
    };

    // Graph 0; its results go to the scratch. Its tensors: the style, its ones, the lengths
    // (captured: each sentence's F0 frames and STFT frames), then per sentence its input x
    // (null where the decoder left it on the device), the source's f0, phases, padding's
    // samples and their places (or null), and har.
    const kokoro_job & j0      = *group[0];
    std::string        key0    = key("source");
    const size_t       per_job = 6;
    if (captured && j0.dec_at >= 0) {
        key0 +=
            " reading " + address(static_cast<uint8_t *>(ggml_backend_buffer_get_base(c.handoff.get())) + j0.dec_at);
    }
    vs::stage_graph & sg0 = c.stage_graph(
        VS_STAGE_GENERATOR, key0,
        [&](ggml_context * g0, ggml_cgraph * gf) {
            cond k = make_cond(g0, 1, (int64_t) B);
            use_style_table(c, g0, k, GEN);
            ggml_tensor *              lens = captured ? input_2d(g0, 2, 1, "lengths") : nullptr;
            std::vector<ggml_tensor *> t    = { k.s, k.ones, lens };
            ggml_build_forward_expand(gf, ggml_cpy(g0, k.styles, c.scratch_tensor(g0, styles_at, rows, (int64_t) B)));
            // Each sentence's source and STFT; in a batch, magnitude and phase once over
            // all their frames side by side (har_of: some forty kernels, not forty a sentence).
            std::vector<gen_source> srcs;
            ggml_tensor *           last_noise = nullptr;  // [C, frames]: a batch's, side by side
            std::vector<size_t>     first(B);              // sentence b's first frame there
            for (size_t b = 0; b < B; ++b) {
                srcs.emplace_back(c, model_, g0, F2g[b], captured, B == 1);
            }
            if (B > 1) {
                std::vector<ggml_tensor *> parts;
                for (const gen_source & src : srcs) {
                    parts.push_back(src.frames);
                }
                while (parts.size() > 1) {  // concatenated pairwise: each frame copied log2(B) times
                    std::vector<ggml_tensor *> next;
                    for (size_t i = 0; i < parts.size(); i += 2) {
                        next.push_back(i + 1 < parts.size() ? ggml_concat(g0, parts[i], parts[i + 1], 1) : parts[i]);
                    }
                    parts = std::move(next);
                }
                ggml_tensor * har_all = har_of(g0, parts[0]);  // [22, the sentences' frames]
                ggml_set_output(har_all);
                // The last stage's noise convolution, where it is frame by frame (one tap,
                // Kokoro's), over them all too.
                if (c.w(GEN + "noise_convs." + std::to_string(n_stages - 1) + ".weight")->ne[1] == 1) {
                    last_noise = gen_noise_conv(c, g0, har_all, n_stages - 1);
                }
                for (size_t b = 0; b < B; ++b) {
                    first[b]    = b == 0 ? 0 : first[b - 1] + (size_t) srcs[b - 1].n_frames;
                    srcs[b].har = ggml_view_2d(g0, har_all, har_all->ne[0], srcs[b].n_frames, har_all->nb[1],
                                               first[b] * har_all->nb[1]);
                }
            }
            for (size_t b = 0; b < B; ++b) {
                const kokoro_job & j    = *group[b];
                ggml_tensor *      x_in = j.dec_at >= 0 ? c.handoff_tensor(g0, (size_t) j.dec_at, j.dec.C, F2g[b])
                                                        : input_2d(g0, j.dec.C, F2g[b], "x");
                const gen_source & src  = srcs[b];
                ggml_tensor *      x = x_in, *har = src.har;
                if (captured) {
                    x   = ggml_mul(g0, x, frame_mask(g0, lens, 0, F2g[b]));
                    har = ggml_mul(g0, har, frame_mask(g0, lens, 1, src.n_frames));
                }
                ggml_build_forward_expand(gf, src.har);
                for (size_t i = 0; i < n_stages; ++i) {
                    ggml_tensor * xs = last_noise && i + 1 == n_stages
                                           ? ggml_view_2d(g0, last_noise, last_noise->ne[0], src.n_frames,
                                                          last_noise->nb[1], first[b] * last_noise->nb[1])
                                           : gen_noise_conv(c, g0, har, i);
                    GGML_ASSERT(xs->ne[0] == Cs[i] && xs->ne[1] == Tg[i][b]);
                    ggml_build_forward_expand(gf, ggml_cpy(g0, xs, frames_of(g0, xs32_at[i], i, b)));
                }
                ggml_tensor * up = gen_upsample(c, g0, x, 0);
                GGML_ASSERT(up->ne[0] == Cs[0] && up->ne[1] == Tg[0][b]);
                ggml_build_forward_expand(gf, ggml_cpy(g0, up, frames_of(g0, up32_at, 0, b)));
                t.insert(t.end(),
                         { j.dec_at >= 0 ? nullptr : x_in, src.fi, src.cyc, src.edges, src.edges_at, src.har });
            }
            return t;
        },
        4096 * B, true);
    std::vector<float> styles;
    for (size_t b = 0; b < B; ++b) {
        const kokoro_job &   j = *group[b];
        ggml_tensor ** const t = sg0.t.data() + 3 + per_job * b;
        if (t[0]) {
            std::vector<float> xv(j.dec.v);
            xv.resize((size_t) (j.dec.C * F2g[b]), 0.0f);
            set_input(c, t[0], xv.data());
        }
        gen_source src;
        src.fi = t[1], src.cyc = t[2], src.edges = t[3], src.edges_at = t[4], src.F2 = F2g[b];
        src.fill(c, j.f0, (float) hp_.sample_rate);
        styles.insert(styles.end(), j.style.begin(), j.style.begin() + STYLE_DIM);  // the acoustic half
    }
    fill_cond(c, sg0.t[0], sg0.t[1], styles.data());
    if (captured) {
        const float lens[2] = { (float) j0.f0.size(), (float) T.back()[0] };
        set_input(c, sg0.t[2], lens);
    }
    c.compute(sg0);
    // The named intermediate is a batch's last sentence's, read back only if asked for.
    if (ggml_tensor * har = sg0.t[3 + per_job * (B - 1) + 5]; in_device_memory(c, har)) {
        c.keep_output_on_device("har", har->data, T.back()[B - 1], har->ne[0]);
        group.back()->har_kept = true;
    } else {
        group.back()->har = read_frames(har, T.back()[B - 1]);
    }

    // Each stage's segments, for the kernels: a batch's, or a captured sentence's length.
    std::vector<vs::cuda::snake_segments> segs(n_stages);
    if (captured) {
        std::vector<int> ranges;
        for (size_t i = 0; i < n_stages; ++i) {
            ranges.insert(ranges.end(), { 0, (int) T[i][0] });
            segs[i] = { 1, reinterpret_cast<const int *>(base + ranges_at) + 2 * i, nullptr, rows };
        }
        vs::cuda::upload(dev, base + ranges_at, ranges.data(), sizeof(int) * ranges.size());
    }
    if (captured && captures_base_ != base) {
        captures_.clear();
        captures_base_ = base;
    }
    for (size_t i = 0; B > 1 && i < n_stages; ++i) {
        std::vector<int> v(2 * B + (size_t) total[i], -1);
        for (size_t b = 0; b < B; ++b) {
            v[2 * b]     = (int) at[i][b];
            v[2 * b + 1] = (int) T[i][b];
            std::fill_n(v.begin() + (std::ptrdiff_t) (2 * B + (size_t) at[i][b]), T[i][b], (int) b);
        }
        vs::cuda::upload(dev, base + segs_at[i], v.data(), sizeof(int) * v.size());
        const int * d = reinterpret_cast<const int *>(base + segs_at[i]);
        segs[i]       = { (int) B, d, d + 2 * B, rows };
    }

    // A residual block's six convolutions with their AdaINs' affines from the table.
    auto convs = [&](const std::string & pre, int64_t C) {
        std::array<vs::cuda::snake_conv, 6> cv;
        for (int n = 0; n < 3; ++n) {
            for (int h = 0; h < 2; ++h) {
                const std::string      sfx  = std::to_string(h + 1) + "." + std::to_string(n);
                const std::string      conv = pre + "convs" + sfx;
                vs::cuda::snake_conv & v    = cv[(size_t) (2 * n + h)];
                const int64_t          off  = tab.offset.at(pre + "adain" + sfx + ".fc");
                v.scale                     = ptr(styles_at) + off;
                v.shift                     = ptr(styles_at) + off + C;
                v.alpha                     = static_cast<const float *>(c.w(pre + "alpha" + sfx)->data);
                v.w                         = c.w(conv + ".weight")->data;
                v.bias                      = static_cast<const float *>(c.w(conv + ".bias")->data);
                v.dilation                  = dil[2 * n + h];
            }
        }
        return cv;
    };
    auto stack = [&](size_t x, const std::string & pre, size_t i, int K) {
        const auto cv = convs(pre, Cs[i]);
        vs::cuda::snake_stack(dev, c.blas(), base + x, Cs[i], total[i], K, cv.data(), 3, ptr(work_at), segs[i]);
    };

    const size_t n_res = hp_.res_kernels.size();
    for (size_t i = 0;; ++i) {
        const int64_t n  = Cs[i] * total[i];
        const auto    t0 = std::chrono::steady_clock::now();
        // x = upsampled + noise branch; then the mean of the residual stacks over x: the
        // first in s, the middle ones in r, the last in x itself; the mean into out. The
        // stacks' inputs are zero in the gaps (the graphs write the sentences' frames only).
        auto queue = [&] {
            vs::cuda::stack_input(dev, base + xs_at[i], ptr(xs32_at[i]), nullptr, Cs[i], total[i], segs[i]);
            stack(xs_at[i], GEN + "noise_res." + std::to_string(i) + ".", i, noise_kernel(i));
            vs::cuda::stack_input(dev, base + x_at, ptr(up32_at), base + xs_at[i], Cs[i], total[i], segs[i]);
            for (size_t j = 0; j < n_res; ++j) {
                const bool   last = j + 1 == n_res;
                const size_t buf  = last ? x_at : j == 0 ? s_at : r_at;
                if (buf != x_at) {
                    vs::cuda::copy(dev, base + buf, base + x_at, F16 * (size_t) n);
                }
                stack(buf, res_prefix(i, j), i, hp_.res_kernels[j]);
                if (j > 0 || n_res == 1) {
                    vs::cuda::accumulate_f16(dev, base + (n_res > 1 ? s_at : x_at), j > 0 ? base + buf : nullptr, n,
                                             last ? 1.0f / (float) n_res : 1.0f, last ? ptr(out_at) : nullptr);
                }
            }
        };
        if (captured) {
            std::string key = std::to_string(i) + " of";  // the stage, and every stage's bucket
            for (int64_t F : total) {
                key += " " + std::to_string(F);
            }
            c.timings.n_captures_replayed += captures_.run(dev, key, queue) ? 1 : 0;
        } else {
            queue();
        }
        if (c.profiling || !c.queue_graphs) {  // otherwise the next graph waits for them on the device
            vs::cuda::synchronize(dev);
        }
        c.profile_op("residual stacks (engine's CUDA kernels)", vs::ms_since(t0));
        c.check_abort();

        const bool last = i + 1 == n_stages;
        if (B > 1) {  // the batch's packing at once, its gaps zeroed (their frames hold what the stacks spilt)
            std::vector<float> mask((size_t) total[i], 0.0f);
            for (size_t b = 0; b < B; ++b) {
                std::fill_n(mask.begin() + at[i][b], T[i][b], 1.0f);
            }
            if (!last) {
                // The upsampling over the packing: each sentence's frames come out at its
                // first frame times the rate (its gap zeros, as wide as the kernel reaches),
                // then gathered into the next stage's packing (the last stage's reflection pad
                // too: its frame 0 is upsampled frame 1). The next stage's gaps read frame 0.
                const int            r       = hp_.gen_rates[i + 1];
                const bool           reflect = i + 2 == n_stages;
                std::vector<int32_t> rows((size_t) total[i + 1], 0);
                for (size_t b = 0; b < B; ++b) {
                    for (int64_t u = 0; u < T[i + 1][b]; ++u) {
                        const int64_t v                   = !reflect ? u : u == 0 ? 1 : u - 1;
                        rows[(size_t) (at[i + 1][b] + u)] = (int32_t) (at[i][b] * r + v);
                    }
                }
                vs::stage_graph & sg = c.stage_graph(VS_STAGE_GENERATOR, "", [&](ggml_context * g, ggml_cgraph * gf) {
                    ggml_tensor * m   = input_2d(g, 1, total[i], "mask");
                    ggml_tensor * idx = ggml_new_tensor_1d(g, GGML_TYPE_I32, total[i + 1]);
                    ggml_set_input(idx);
                    const std::string n = std::to_string(i + 1);
                    ggml_tensor *     x = ggml_mul(g, c.scratch_tensor(g, out_at, Cs[i], total[i]), m);
                    x = conv_transpose1d(g, ggml_leaky_relu(g, x, 0.1f, false), c.w(GEN + "ups." + n + ".weight"),
                                         c.w(GEN + "ups." + n + ".bias"), r, (hp_.gen_kernels[i + 1] - r) / 2);
                    x = ggml_get_rows(g, x, idx);  // [C, the next stage's frames]
                    ggml_build_forward_expand(gf,
                                              ggml_cpy(g, x, c.scratch_tensor(g, up32_at, Cs[i + 1], total[i + 1])));
                    return std::vector<ggml_tensor *>{ m, idx };
                });
                set_input(c, sg.t[0], mask.data());
                set_input(c, sg.t[1], rows.data());
                c.compute(sg);
                continue;
            }
            // The output over the packing: the gaps' frames add nothing to the audio, and are
            // wider than a frame's reach (N_FFT / HOP - 1 frames on), so sentence b's audio is
            // the packing's samples from its first frame's, N_FFT / 2 on. Its gain, applied as
            // each sentence's samples are read back: the head's on its first N_FFT / 2, 4 on
            // the others (the single product gen_output's graph takes).
            const int64_t     raw_len = (total[i] - 1) * HOP + N_FFT;
            vs::stage_graph & sg      = c.stage_graph(VS_STAGE_GENERATOR, "", [&](ggml_context * g, ggml_cgraph * gf) {
                ggml_tensor * m   = input_2d(g, 1, total[i], "mask");
                ggml_tensor * x   = ggml_mul(g, c.scratch_tensor(g, out_at, Cs[i], total[i]), m);
                ggml_tensor * wav = overlap_add(g, gen_frames(c, g, x, m, true));
                GGML_ASSERT(ggml_nelements(wav) == raw_len);
                ggml_set_output(wav);
                ggml_build_forward_expand(gf, wav);
                return std::vector<ggml_tensor *>{ m, wav };
            });
            set_input(c, sg.t[0], mask.data());
            c.compute(sg);
            const std::vector<float> head = istft_head_gain(model_);
            for (size_t b = 0; b < B; ++b) {
                std::vector<float> & audio = group[b]->audio;
                audio.resize(group[b]->f0.size() * SAMPLES_PER_F0);
                ggml_backend_tensor_get(sg.t[1], audio.data(), sizeof(float) * (size_t) (at[i][b] * HOP + N_FFT / 2),
                                        sizeof(float) * audio.size());
                for (size_t k = 0; k < audio.size(); ++k) {
                    audio[k] *= k < head.size() ? head[k] : 4.0f;
                }
            }
            return;
        }
        // The next graph reads each sentence's result where the kernels left it. Its tensors:
        // the lengths (captured: the sentence's frames at this stage), then each sentence's
        // audio on the last stage.
        vs::stage_graph & sg = c.stage_graph(
            VS_STAGE_GENERATOR, key(last ? "output" : "upsampling " + std::to_string(i + 1)),
            [&](ggml_context * g, ggml_cgraph * gf) {
                ggml_tensor *              lens = captured ? input_2d(g, 1, 1, "lengths") : nullptr;
                std::vector<ggml_tensor *> t    = { lens };
                for (size_t b = 0; b < B; ++b) {
                    ggml_tensor * x    = frames_of(g, out_at, i, b);
                    ggml_tensor * mask = captured ? frame_mask(g, lens, 0, Tg[i][b]) : nullptr;
                    x                  = mask ? ggml_mul(g, x, mask) : x;
                    if (!last) {
                        ggml_tensor * up = gen_upsample(c, g, x, i + 1);
                        GGML_ASSERT(up->ne[0] == Cs[i + 1] && up->ne[1] == Tg[i + 1][b]);
                        ggml_build_forward_expand(gf, ggml_cpy(g, up, frames_of(g, up32_at, i + 1, b)));
                    } else {
                        t.push_back(gen_output(c, g, x, F2g[b] * SAMPLES_PER_F0, mask));
                        ggml_build_forward_expand(gf, t.back());
                    }
                }
                return t;
            },
            1024 * B, true);
        if (captured) {
            const float len = (float) T[i][0];
            set_input(c, sg.t[0], &len);
        }
        c.compute(sg);
        if (last) {
            for (size_t b = 0; b < B; ++b) {
                std::vector<float> & audio = group[b]->audio;
                audio.resize(group[b]->f0.size() * SAMPLES_PER_F0);
                ggml_backend_tensor_get(sg.t[1 + b], audio.data(), 0, sizeof(float) * audio.size());
            }
            return;
        }
    }
}

std::vector<std::vector<float>> kokoro_voice::synthesize_batch(vs_context &                              c,
                                                               const std::vector<std::vector<int32_t>> & ids,
                                                               const vs_synth_params & p, int first_chunk) {
    const float             speed = p.length_scale > 0 ? 1.0f / p.length_scale : 1.0f;
    std::vector<kokoro_job> jobs(ids.size());
    for (size_t b = 0; b < ids.size(); ++b) {
        jobs[b].tokens.push_back(0);
        jobs[b].tokens.insert(jobs[b].tokens.end(), ids[b].begin(), ids[b].end());
        jobs[b].tokens.push_back(0);
        jobs[b].style = style_row(p, ids[b].size());
    }

    auto stage = [&](int id, auto && fn) { c.timed_stage(id, first_chunk, p, fn); };
    stage(VS_STAGE_BERT, [&] { run_bert(c, jobs); });
    stage(VS_STAGE_DURATION, [&] {
        run_duration(c, jobs, speed);
        for (auto & j : jobs) {
            const int64_t T = (int64_t) j.tokens.size();
            if (p.durations && (int64_t) p.n_durations != T) {
                throw error(VS_ERR_INVALID_ARG, "forced durations: " + std::to_string(p.n_durations) + " given for " +
                                                    std::to_string(T) + " tokens");
            }
            for (int64_t t = 0; t < T; ++t) {
                // Round half to even, as the export's Round; at least one frame a token.
                const int frames = p.durations ? p.durations[t] : std::max(1, (int) std::nearbyint(j.dur[t]));
                for (int k = 0; k < frames; ++k) {
                    j.frame_to_token.push_back((int32_t) t);
                }
            }
            if (j.frame_to_token.empty()) {
                throw error(VS_ERR_INVALID_ARG, "forced durations give no frames");
            }
        }
    });
    stage(VS_STAGE_PROSODY, [&] { run_prosody(c, jobs); });
    stage(VS_STAGE_TEXT_ENCODER, [&] { run_text_encoder(c, jobs); });
    stage(VS_STAGE_DECODER, [&] {
        std::vector<int64_t> frames;
        for (const auto & j : jobs) {
            frames.push_back((int64_t) j.frame_to_token.size());
        }
        const bool packs = runs_packed(c, jobs.size(), DEC);
        // The generator's kernels take the decoder's outputs where it leaves them on the
        // device (2 F frames a job).
        // A sentence alone reads it at its bucket's length (run_generator_fused): room for the
        // most frames past the last one's.
        dec_handoff handoff;
        int64_t     past = 0;
        for (int64_t F : frames) {
            handoff.frames += 2 * F;
            std::vector<int64_t> total;
            past = fused_generator(c) ? std::max(past, gen_bucket(2 * F, total) - 2 * F) : 0;
        }
        handoff.frames += past;
        for (auto [first, last] : pack_groups(frames, packs, PACK_GAP, c.limits.max_tensor_bytes)) {
            std::vector<kokoro_job *> group;
            for (size_t b = first; b < last; ++b) {
                group.push_back(&jobs[b]);
            }
            run_decoder(c, group, packs, fused_generator(c) ? &handoff : nullptr);
        }
    });
    stage(VS_STAGE_GENERATOR, [&] {
        if (!fused_generator(c)) {
            for (auto & j : jobs) {
                j.audio = run_generator(c, j.dec, j.f0, j.style, j.har);
            }
            return;
        }
        // Consecutive sentences in a pass of the kernels, up to GEN_PACKED_FRAMES frames (a
        // longer sentence alone) and GEN_PACKED_SENTENCES sentences.
        const int64_t cap =
            std::min<int64_t>(GEN_PACKED_FRAMES, (int64_t) (c.limits.max_tensor_bytes / GEN_FRAME_BYTES));
        for (size_t first = 0; first < jobs.size();) {
            std::vector<kokoro_job *> group  = { &jobs[first] };
            int64_t                   frames = (int64_t) jobs[first].frame_to_token.size();
            for (size_t b = first + 1; b < jobs.size() && group.size() < GEN_PACKED_SENTENCES; ++b) {
                frames += (int64_t) jobs[b].frame_to_token.size();
                if (frames > cap) {
                    break;
                }
                group.push_back(&jobs[b]);
            }
            run_generator_fused(c, group);
            first += group.size();
        }
    });

    std::vector<std::vector<float>> audio;
    for (auto & j : jobs) {
        const int64_t T = (int64_t) j.tokens.size(), F = (int64_t) j.frame_to_token.size();
        c.timings.n_phoneme_ids += (int32_t) T;
        c.timings.n_frames += (int32_t) F;
        audio.push_back(std::move(j.audio));
    }
    // The named intermediates are the last chunk's.
    kokoro_job &       j = jobs.back();
    const int64_t      T = (int64_t) j.tokens.size(), F = (int64_t) j.frame_to_token.size();
    std::vector<float> frames_f(T, 0.0f);
    for (int32_t t : j.frame_to_token) {
        frames_f[t] += 1.0f;
    }
    c.set_output("bert", std::move(j.d_en.v), T, j.d_en.C);
    c.set_output("duration_logits", std::move(j.logits), T, 50);
    c.set_output("durations", std::move(frames_f), T, 1);
    c.set_output("F0", std::move(j.f0), 2 * F, 1);
    c.set_output("N", std::move(j.n), 2 * F, 1);
    c.set_output("text_encoder", std::move(j.t_en.v), T, j.t_en.C);
    if (j.dec_at >= 0) {  // left on the device for the generator: read back if asked for
        c.set_device_output("decoder", c.handoff, (size_t) j.dec_at, j.dec.T, j.dec.C);
    } else {
        c.set_output("decoder", std::move(j.dec.v), j.dec.T, j.dec.C);
    }
    if (!j.har_kept) {
        c.set_output("har", std::move(j.har.v), j.har.T, j.har.C);
    }
    return audio;
}

}  // namespace

void kokoro_validate(const vs_model & model) {
    static const std::vector<tensor_spec> layout = {
#include "kokoro-layout.inc"
    };
    check_tensors(model, layout);
    const kokoro_hparams hp = read_hparams(model);
    if (hp.voices.size() > 4096) {
        model.bad("metadata 'kokoro.voices' names " + std::to_string(hp.voices.size()) + " voices; at most 4096");
    }
    std::vector<tensor_spec> packs;
    for (const auto & v : hp.voices) {
        packs.push_back({ "voice." + v, { 2 * STYLE_DIM, MAX_TOKENS, 1, 1 }, false });
    }
    check_tensors(model, packs);
    const int64_t n_vocab = std::min(model.tensor(BERT + "embeddings.word_embeddings.weight")->ne[1],
                                     model.tensor(TEXT + "embedding.weight")->ne[1]);
    for (const auto & [symbol, id] : hp.vocab) {
        if (id < 0 || id >= n_vocab) {
            model.bad("metadata 'kokoro.vocab_ids' maps '" + symbol + "' to " + std::to_string(id) +
                      "; the embeddings have " + std::to_string(n_vocab) + " rows");
        }
    }
}

std::unique_ptr<voice> make_kokoro_voice(vs_model & model) {
    return std::make_unique<kokoro_voice>(model);
}

}  // namespace vs
