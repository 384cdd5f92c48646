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
//
// This folder: text.cpp (the front end), bert.cpp, duration.cpp, prosody.cpp,
// text_encoder.cpp, decoder.cpp, generator.cpp (ggml graphs) and generator_fused.cpp (its
// residual stacks in the engine's CUDA kernels), the blocks they share (blocks.cpp, lstm.cpp)
// and voice.cpp (a batch's way through the stages). This header holds what they share.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "../../graph/graph.h"
#include "../../vs-context.h"
#include "../../vs-cuda.h"

namespace vs::kokoro {

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

// Tensor names: the PyTorch module names without their wrappers (app/models/convert/kokoro.py).
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
// Off the CPU, the style affines of every AdaIN of a graph as one matmul: the fc layers
// under a prefix concatenated ([128, sum of 2C]) with 1 added to each gamma half's bias.
struct style_table {
    ggml_tensor *                  w = nullptr, *b = nullptr;
    std::map<std::string, int64_t> offset;  // fc module -> its first row
};
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

kokoro_hparams read_hparams(const vs_model & m);

// A graph's [C, T] that set_from_lstm fills before each compute, not flagged as an input:
// ggml's scheduler files an input in host memory and copies it to the device as the graph
// runs, where this one it places with its consumers, on the device, for the engine's
// kernels to write.
ggml_tensor * lstm_input_2d(ggml_context * g, int64_t C, int64_t T, const char * name);

ggml_tensor * input_2d(ggml_context * g, int64_t C, int64_t T, const char * name);

act read_act(ggml_tensor * t);

// The first T frames of an output [C, T' >= T] (a graph's rounded-up shapes).
act read_frames(ggml_tensor * t, int64_t T);

void set_input(vs_context & c, ggml_tensor * t, const void * data);

// The segment length of the jobs' tokens side by side in a graph: the most tokens of any
// job, rounded up to shape_bucket's lengths where graphs are kept by their shapes (the
// frames added are zeros in, dropped out), then, with more than one job, `gap` frames of
// zeros. The job count and the length are appended to the graph's key.
int64_t token_segments(const vs_context & c, const std::vector<kokoro_job> & jobs, int64_t gap, std::string & key);

// Linear layer: w [in, out] (ggml), x [in, T] -> [out, T].
ggml_tensor * linear(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & module);

// Per-channel (1 + gamma) and beta from the style, for AdaIN and AdaLayerNorm.
void style_affine(vs_context & c, ggml_context * g, ggml_tensor * s, const std::string & fc, int64_t C,
                  ggml_tensor *& scale, ggml_tensor *& shift);

style_table make_style_table(vs_context & c, const vs_model & m, const std::string & prefix);

// A packing's inputs: B segments of L frames reading the style table's rows styles_t [B, rows].
packing make_packing(ggml_context * g, int64_t B, int64_t L, ggml_tensor * styles_t);

// A packing's mask [L, B] and lengths [B] (after the graph's allocation), for sentences of
// rate * lens[b] frames in segments of L.
void fill_packing(vs_context & c, ggml_tensor * mask_t, ggml_tensor * inv_len_t, int64_t B, int64_t L,
                  const std::vector<int64_t> & lens, int64_t rate = 1);

// The jobs, of frames[b] frames, in graphs [first, last): packed, as many consecutive jobs
// as keep B * (longest + gap) within MAX_PACKED_FRAMES and the device's largest tensor; else
// one a graph.
std::vector<std::pair<size_t, size_t>> pack_groups(const std::vector<int64_t> & frames, bool packed, int64_t gap,
                                                   size_t max_tensor_bytes);

// The segment length of jobs of lens[b] frames in a graph: the longest, in a packing with
// its gap after it (more than one job); rounded up to shape_bucket's lengths where graphs
// are kept by their shapes and the frames added are a packing's gap.
int64_t packed_length(const vs_context & c, const std::vector<int64_t> & lens, bool packed);

// Segment b (its first T frames) of a packed [C, B * L] read back from the device.
act unpack_host(const act & packed, int64_t L, int64_t b, int64_t T);

// k's AdaINs on B > 1 sentences packed in segments of L frames (pk), and of 2L after an
// upsampling (pk2); their affines from k's style table, all sentences' rows transposed once.
void pack_cond(ggml_context * g, cond & k, int64_t B, int64_t L, packing & pk, packing & pk2);

// scale and shift of AdaIN `fc` from the graph's style table, if it has one.
bool table_affine(ggml_context * g, const cond & k, const std::string & fc, int64_t C, ggml_tensor *& scale,
                  ggml_tensor *& shift);

cond make_cond(ggml_context * g, int64_t max_frames, int64_t B = 1);

// A cond's inputs: its style column(s) s and its row of ones.
void fill_cond(vs_context & c, ggml_tensor * s, ggml_tensor * ones, const float * style);

void fill_cond(vs_context & c, const cond & k, const float * style);

// AdaIN (instance norm over time per channel, then the style's affine) as one per-channel
// affine y = a x + b: mean and variance from sums of x and x^2 over time.
void adain_affine(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                  ggml_tensor *& a, ggml_tensor *& b);

ggml_tensor * adain(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc);

// AdaIN then Snake (y + sin^2(alpha y) / alpha, alpha per channel, [1, C, 1] in the file).
// With u = alpha y, a per-channel affine of x: Snake(y) = (u + sin^2 u) / alpha.
ggml_tensor * adain_snake(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                          ggml_tensor * alpha);

// AdaIN of x [C, T] as [T, C]: a group norm with a group a channel, then the style's affine.
ggml_tensor * adain_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc);

// AdaIN of a packing's x [C, B * L] -> [L, B, C]: each segment's mean and variance over
// its sentence's frames (the mask), its style's affine. The gaps hold the shift.
ggml_tensor * packed_adain(ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc);

// The same of a packing's x [C, B * L] in its own layout, then LeakyReLU, -> [C, B * L] zero
// in the gaps: each segment's sums over its sentence's frames are products with the mask
// over time (out_prod), its affine the style table's column of its sentence. No transposes
// (where the device has out_prod: device_limits).
ggml_tensor * packed_adain_leaky_ct(ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                                    float slope);

// y [L, B, C] zeroed in a packing's gaps, as [B * L, C]: a convolution's input.
ggml_tensor * packed_masked(ggml_context * g, ggml_tensor * y, const packing & p);

// AdaIN then LeakyReLU of x [C, T] as [T, C] (see adain_tc); in a packing, zero in its gaps.
ggml_tensor * adain_leaky_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                             float slope);

ggml_tensor * adain_snake_tc(vs_context & c, ggml_context * g, ggml_tensor * x, const cond & k, const std::string & fc,
                             const std::string & alpha_name);

// Conv1d (PyTorch semantics) of xt [T, IC] (time along ne0) -> [OC, T']: with F16 weights
// conv1d_phases (no im2col matrix; the weights' input channels padded to a multiple of 8;
// `fine_columns` for a batch's packing: phase_columns), else ggml's im2col in the layout
// it was made for, padding and dilation inside the op, against the weights with their
// first two axes swapped ([K, IC, OC], made once per context). Where that copy cannot be
// made or the matrix would be too large, conv1d of a transposed copy.
ggml_tensor * conv1d_tc(vs_context & c, ggml_context * g, ggml_tensor * xt, const std::string & w_name, ggml_tensor * b,
                        int dilation, int padding, bool fine_columns = false);

// Conv1d (PyTorch semantics, undilated, "same" padding) of x [IC, T] -> [OC, T]: with F16 or
// F32 weights conv1d_phases_ct (no im2col matrix, no transposes; the weights' input channels
// padded to a multiple of 8), else conv1d.
ggml_tensor * conv1d_ct(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & w_name, ggml_tensor * b,
                        bool fine_columns);

// Frames repeated twice: [C, T] -> [C, 2T].
ggml_tensor * upsample2(ggml_context * g, ggml_tensor * x);

// Depthwise ConvTranspose1d (kernel 3, stride 2, padding 1, output padding 1): w [C, 3].
// Even output frames take tap 1 of frame t; odd ones tap 2 of t and tap 0 of t + 1.
ggml_tensor * depthwise_upsample(ggml_context * g, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b);

// The same of xt [T, C] (time along ne0) -> [2T, C]: even and odd frames side by side
// along ne0, then read as one row a channel.
ggml_tensor * depthwise_upsample_tc(ggml_context * g, ggml_tensor * xt, ggml_tensor * w, ggml_tensor * b);

// espeak-ng's IPA with '^' tying multi-letter phonemes, rewritten into Kokoro's
// symbols (its English set: A = eɪ, I = aɪ, W = aʊ, Y = ɔɪ, O = oʊ, ʤ, ʧ, ᵊ, ...; British:
// Q = əʊ, long vowels kept). Longest match first; symbols still unknown to the vocabulary
// are dropped and counted.
const std::vector<std::pair<std::string, std::string>> & espeak_to_kokoro(bool british);

// The languages Kokoro reads text in (vs_context_params.language), each with the espeak-ng
// voice that phonemizes it ("en" is espeak-ng's English of Great Britain).
struct kokoro_language {
    std::string code;
    std::string espeak_voice;
};

const std::vector<kokoro_language> & kokoro_languages();

// IPA of `language` (a kokoro_languages() code) into Kokoro's symbols.
std::string to_kokoro_symbols(const std::string & ipa, const std::string & language);

// Steps t0 .. t0 + n - 1 of a recurrence's output o [H, cols, n] into each sequence's frames
// (ys[b] [D H, T_b]: direction 0's step t at frame t, direction 1's at frame T_b - 1 - t).
void scatter_steps(const float * o, int64_t t0, int64_t n, int64_t cols, int64_t D, int64_t H, std::vector<act> & ys);

// atan(z) for any finite z: two half-angle reductions bring |z| under tan(pi/8), then
// a Taylor series (error < 1e-6 there).
ggml_tensor * atan_all(ggml_context * g, ggml_tensor * z);

// Per harmonic h (rows of [F2, 9]) the running sum over F0 frames of frac(h f0 / sr), the
// phase increments in cycles, in the export's float arithmetic and order. A running sum is
// no op of every backend (Vulkan's needs subgroup features), and it is 9 rows of F0 frames.
std::vector<float> harmonic_cycles(const std::vector<float> & f0, float sample_rate);

// The forward DFT basis over the Hann window [N_FFT, 2 bins] (rows re_0..re_10, im_0..im_10)
// and the iSTFT's gain on its first N_FFT / 2 samples: constants on c's device, made once.
ggml_tensor * stft_basis(vs_context & c, const vs_model & model);

// The export scales by 4, dividing its first N_FFT samples by one frame's squared window:
// the gain of a sentence's first N_FFT / 2 samples (those after, 4).
std::vector<float> istft_head_gain(const vs_model & model);

// The same on c's device, made once.
ggml_tensor * istft_gain(vs_context & c, const vs_model & model);

// The inverse STFT's overlap-add of frames cols [N_FFT, n] (frame f's samples from f HOP on)
// -> [(n - 1) HOP + N_FFT].
ggml_tensor * overlap_add(ggml_context * g, ggml_tensor * cols);

// Magnitude and phase (atan of im/re, moved to the quadrant) of STFT frames [22, n] (rows
// re_0..re_10, im_0..im_10) -> har [22, n]: frame by frame, so one chain serves any number
// of sentences' frames side by side.
ggml_tensor * har_of(ggml_context * g, ggml_tensor * frames);

// A pointer as text, for the keys of graphs that read or write that memory.
std::string address(const void * p);

// [1, n]: 1 on the first `len` frames (element `at` of the graph's input lens), else 0.
ggml_tensor * frame_mask(ggml_context * g, ggml_tensor * lens, int at, int64_t n);

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

}  // namespace vs::kokoro
