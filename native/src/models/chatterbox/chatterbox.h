// Chatterbox (Resemble AI): T3, the token model that turns text tokens into speech tokens
// conditioned on a voice. Hyperparameters come from the GGUF's metadata; tensor layouts:
// app/models/convert/chatterbox.py.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../vs-context.h"

namespace vs::chatterbox {

using token_callback = std::function<void(const std::vector<int32_t> & tokens)>;

struct t3_hparams {
    std::string variant;   // "turbo" or "multilingual"
    std::string backbone;  // "gpt2": GPT-2 blocks, learned positions; "llama": Llama blocks, rotary positions
    int64_t     n_layer = 0, n_embd = 0, n_head = 0, n_positions = 0;
    int64_t     text_vocab = 0, speech_vocab = 0, start_speech = 0, stop_speech = 0;
    int64_t     speaker_embed_size = 0, prompt_tokens = 0;
    float       norm_eps = 1e-5f;
    // Llama: the feed-forward width, the learned positions added to the text and the speech
    // embeddings, the rotary base, the text's start and stop tokens, the conditioning encoder's
    // perceiver (queries, heads), and the (layer, head) pairs whose attention over the text the
    // alignment guard watches.
    int64_t              ffn = 0, text_positions = 0, speech_positions = 0, start_text = -1, stop_text = -1;
    int64_t              perceiver_queries = 0, perceiver_heads = 0;
    float                rope_base = 10000.0f;
    std::vector<int32_t> alignment_heads;
    // The variant's defaults (ChatterboxTurboTTS.generate's, ChatterboxMultilingualTTS.generate's).
    float temperature = 0.8f, top_p = 0.95f, min_p = 0.0f, repetition_penalty = 1.2f;
    int   top_k        = 1000;
    float cfg_weight   = 0.0f;  // classifier-free guidance (Multilingual): cond and uncond as a batch of two
    float exaggeration = 0.0f;  // the emotion projection's input (Multilingual)

    bool llama() const { return backbone == "llama"; }

    // Conditioning positions ahead of the text: the speaker, the prompt (Llama: the perceiver's
    // queries), Llama's emotion.
    int64_t n_cond(int64_t n_prompt) const {
        return llama() ? 1 + (n_prompt ? perceiver_queries : 0) + 1 : 1 + n_prompt;
    }
};

t3_hparams               read_t3_hparams(const vs_model & m);
std::vector<tensor_spec> t3_layout(const t3_hparams & h);

// The reference's logits processors and draw, on one row of logits. Chatterbox-Turbo's order:
// temperature, top-k, top-p, then the repetition penalty over `history`; with penalty_first
// (Multilingual's): the penalty, temperature, min-p, top-p. temperature 0: the most likely token
// after the penalty. `u` in [0, 1) picks the token from the distribution.
struct sampling {
    float temperature        = 0.8f;
    int   top_k              = 1000;
    float top_p              = 0.95f;
    float min_p              = 0.0f;
    float repetition_penalty = 1.2f;
    bool  penalty_first      = false;
};

// Multilingual T3's AlignmentStreamAnalyzer: from the alignment heads' attention of each new
// speech token over the text, whether speech has started, reached the text's end, or runs on
// (a long tail on the last tokens, attention back on earlier text, a token repeated); it holds
// the stop token back before the end and forces it on a runaway.
class alignment_guard {
  public:
    explicit alignment_guard(int64_t n_text, int32_t stop) : S_(n_text), stop_(stop) {}

    // One step: `rows` the attention [rows, S] of the newest positions (the prefix's speech
    // positions, then one a step), `last` the last token fed.
    void step(std::vector<float> rows, int32_t last, std::vector<float> & logits);

    const std::vector<float> & alignment() const { return a_; }  // [T, S] row-major

  private:
    int64_t              S_;
    int32_t              stop_;
    std::vector<float>   a_;
    int64_t              frame_ = 0, text_pos_ = 0, started_at_ = -1, completed_at_ = -1;
    bool                 started_ = false, complete_ = false;
    std::vector<int32_t> recent_;
};
int32_t sample_token(std::vector<float> & logits, const std::vector<int32_t> & history, const sampling & s, double u);

// A linear layer of `module`: its ".weight" [in, out] times x, plus its ".bias" where `bias`.
ggml_tensor * linear(vs_context & c, ggml_context * g, ggml_tensor * x, const std::string & module, bool bias = true);

// GELU with erf: the engine's CPU kernel where the context runs them, else ggml's op.
ggml_tensor * gelu_erf(vs_context & c, ggml_context * g, ggml_tensor * x);

// Spectral front ends (spectra.cpp). `frames` frames of n samples every hop from audio of L samples,
// the first starting `pad` samples before it, the edges reflected (as torch.stft pads): [frames, n]
// row-major.
std::vector<float> reflected_frames(const float * audio, int64_t L, int64_t n, int64_t hop, int64_t pad,
                                    int64_t frames);
// The mel filterbank energies [frames, n_mels] (row-major) of `frames` ([F, N] row-major) as a graph
// for `stage`: the model's DFT basis `dft` [N, 2 bins] (cos rows, then -sin rows), power, or with
// magnitude_eps >= 0 the magnitude sqrt(power + magnitude_eps), then the filterbank `filters`
// [bins, n_mels].
std::vector<float> mel_energies(vs_context & c, int stage, const std::vector<float> & frames, const char * dft,
                                const char * filters, float magnitude_eps = -1.0f);

// HiFT, S3Gen's vocoder (hift.cpp).
struct hift_hparams {
    int64_t              n_mels = 80, channels = 512, n_fft = 16, hop = 4, harmonics = 8, f0_layers = 5;
    int64_t              sample_rate = 24000;
    float                nsf_alpha = 0.1f, nsf_sigma = 0.003f, voiced_threshold = 10.0f, lrelu_slope = 0.1f;
    float                audio_limit = 0.99f;
    std::vector<int64_t> rates, kernels, res_kernels, dilations, source_kernels;
};

hift_hparams             read_hift_hparams(const vs_model & m);
std::vector<tensor_spec> hift_layout(const hift_hparams & h);
int64_t                  hift_samples_per_frame(const hift_hparams & h);
// Per upsampling stage, the source STFT's frames to one of the stage's (its source_downs' stride):
// the product of the later stages' rates.
std::vector<int64_t> hift_source_strides(const hift_hparams & h);
// F0 in Hz [T] of a mel [n_mels, T] (its F0 predictor).
std::vector<float> hift_f0(vs_context & c, const hift_hparams & h, const float * mel, int64_t T);
// The excitation's running state through the pieces of one stream: each harmonic's cycles so
// far and the samples made, so that a piece's sines and noise go on from the last piece's.
struct source_state {
    std::vector<double> cycles;
    int64_t             samples = 0;
};
// The neural source filter's excitation, hift_samples_per_frame samples a frame of f0: its
// harmonics' sines where voiced, noise (times noise_scale; 0: none, and no random phases); from
// `state` and advancing it where given, else from the start.
std::vector<float> hift_source(vs_context & c, const hift_hparams & h, const std::vector<float> & f0, float noise_scale,
                               uint64_t seed, source_state * state = nullptr);
// Audio of a mel [n_mels, T] and its source.
std::vector<float> hift_vocode(vs_context & c, const hift_hparams & h, const float * mel, int64_t T,
                               const std::vector<float> & source);

// S3Gen's flow (flow.cpp): speech tokens to a mel.
struct flow_hparams {
    int64_t vocab = 0, n_embd = 0, n_head = 0, ffn = 0, n_layer = 0, n_up_layer = 0, lookahead = 0;
    int64_t silence_token   = 0;  // what closes a run of tokens, three times: a silent ending
    int64_t token_mel_ratio = 2, n_mels = 80, xvector = 0;
    int64_t dec_channels = 0, dec_n_head = 0, dec_head_dim = 0, dec_n_tfm = 0, dec_n_mid = 0;
    int64_t dec_time_embed = 0, dec_time_sinusoid = 0;
    bool    meanflow        = true;  // mean-flow steps over a linear time span (Turbo's distilled decoder)
    int64_t steps           = 2;     // else Euler steps over a cosine span, guided by cfg_rate (Multilingual's)
    float   cfg_rate        = 0.0f;
    int64_t mel_sample_rate = 24000, mel_n_fft = 1920, mel_hop = 480;  // a voice's mel (its condition)
};

flow_hparams             read_flow_hparams(const vs_model & m);
std::vector<tensor_spec> flow_layout(const flow_hparams & h);
// S3Gen's log-mel [frames, n_mels] (row-major) of L samples at mel_sample_rate: a voice's prompt mel.
std::vector<float> flow_prompt_mel(vs_context & c, const flow_hparams & h, const float * audio, int64_t L);
// The encoder's projection mu [n_mels, token_mel_ratio * tokens] of the prompt's tokens and the
// new ones, in that order.
std::vector<float> flow_encode(vs_context & c, const flow_hparams & h, const std::vector<int32_t> & tokens);
// The estimator's velocity [n_mels, T] at flow state `state` [n_mels, T] at time t (mean flow:
// from t towards r), given mu, the speaker's normalized x-vector and the condition `cond` (the
// prompt's mel over its frames, zeros after); `guided`: [n_mels, 2T], that velocity and then
// guidance's estimate without them (mu, speaker and condition zeros), as one batch.
std::vector<float> flow_velocity(vs_context & c, const flow_hparams & h, const std::vector<float> & state,
                                 const std::vector<float> & mu, const std::vector<float> & spk,
                                 const std::vector<float> & cond, float t, float r, bool guided = false);

// A voice as S3Gen speaks it: the conditionals' S3Gen part (or the model's stock voice's), checked,
// its x-vector normalized.
struct s3gen_voice {
    std::vector<int32_t> prompt;      // the prompt's speech tokens
    std::vector<float>   prompt_mel;  // [prompt_frames, n_mels]
    std::vector<float>   xvector;     // normalized
    int64_t              prompt_frames = 0;
};
s3gen_voice read_s3gen_voice(const vs_model & m, const flow_hparams & h, const vs_conditionals * cond);

// S3Gen on a run of speech tokens as it grows (chatterbox.cpp): each feed, given every token so
// far, returns the audio that follows the earlier feeds'. A feed runs the flow over the voice's
// prompt, the last `context_tokens` tokens already spoken (their mel as its condition, as the
// prompt's is; output "flow_cond") and the new ones, the last `lookahead` of which only a final
// feed finishes (the reference's finalize: their frames wait for the tokens after them); then the
// vocoder over the new frames after `context_frames` already vocoded, its excitation going on
// from theirs, the last `hold_frames` waiting for the frames after them. One final feed of every
// token is vs_decode_tokens.
class s3gen_stream {
  public:
    static constexpr int64_t context_tokens = 25, context_frames = 24, hold_frames = 16;

    // `voice`: one read for several streams (else the conditionals' of `p`).
    s3gen_stream(vs_context & c, const vs_synth_params & p, std::shared_ptr<const s3gen_voice> voice = nullptr);
    std::vector<float> feed(const std::vector<int32_t> & tokens, bool final);
    // The vocoder alone over `n_frames` frames of a given mel [frames, n_mels] (vs_vocode).
    static std::vector<float> vocode_mel(vs_context & c, const vs_synth_params & p, const float * mel, size_t n_frames);

    int64_t tokens_done() const { return tokens_done_; }  // tokens whose frames are made
    int64_t frames() const { return (int64_t) (mel_.size() / (size_t) h_.n_mels); }

  private:
    void               flow(const std::vector<int32_t> & tokens, bool final);
    std::vector<float> vocode(bool final);

    vs_context &                       c_;
    const vs_synth_params &            p_;
    flow_hparams                       h_;
    hift_hparams                       vh_;
    std::shared_ptr<const s3gen_voice> voice_;
    std::vector<float>                 mel_;  // the speech's frames made [frames, n_mels]
    int64_t                            tokens_done_ = 0, vocoded_ = 0, samples_ = 0;
    std::vector<float>                 source_;  // the excitation of the last context_frames vocoded
    source_state                       source_state_;
    bool                               ended_ = false, fade_ = true;
};

// S3Gen's speech tokenizer (s3tok.cpp): 16 kHz audio to speech tokens.
struct s3tok_hparams {
    int64_t sample_rate = 16000, n_fft = 400, hop = 160, n_mels = 128;
    int64_t n_state = 1280, n_head = 20, n_layer = 6, fsmn_kernel = 31, levels = 3, digits = 8;
    float   rope_base = 10000.0f;
};

s3tok_hparams            read_s3tok_hparams(const vs_model & m);
std::vector<tensor_spec> s3tok_layout(const s3tok_hparams & h);
// The speech tokens of L samples of 16 kHz audio (25 a second); outputs "s3tok_mel" (the log-mel,
// [frames, bands]) and "s3tok_fsq" (the projections before rounding, [tokens, digits]).
std::vector<int32_t> s3tok_tokens(vs_context & c, const s3tok_hparams & h, const float * audio, int64_t L,
                                  const vs_synth_params & p);

// S3Gen's speaker encoder (xvector.cpp): 16 kHz audio to an x-vector.
struct xvector_hparams {
    int64_t              sample_rate = 16000, frame = 400, hop = 160, n_fft = 512, n_mels = 80;
    int64_t              channels = 32, init_channels = 128, growth = 32, bn_channels = 128, seg_len = 100;
    int64_t              embedding   = 192;
    float                preemphasis = 0.97f;
    std::vector<int64_t> block_layers, block_dilations;
};

xvector_hparams          read_xvector_hparams(const vs_model & m);
std::vector<tensor_spec> xvector_layout(const xvector_hparams & h);
// The x-vector of L samples of 16 kHz audio; output "xvec_fbank" ([frames, n_mels]).
std::vector<float> xvector_embed(vs_context & c, const xvector_hparams & h, const float * audio, int64_t L,
                                 const vs_synth_params & p);

// T3's state in one context: its key/value cache on the context's device (a row a sequence:
// Llama's guidance runs the conditional and the unconditional sequence as a batch of two).
class t3_state : public model_state {
  public:
    explicit t3_state(const t3_hparams & h) : h_(h) {}

    // Speech tokens for `text` (text tokenizer ids) spoken by the voice of `cond`: the
    // speaker embedding and the prompt's speech tokens. With params.speech_tokens, those
    // tokens are taken in place of draws (teacher forcing) and the logits at each speech
    // position are left in output "t3_logits" (Llama with guidance: the unconditional
    // sequence's in "t3_logits_uncond"). At most `max_tokens` tokens; the stop token ends the
    // run and is not returned. Llama leaves the alignment guard's rows in "t3_alignment".
    // `on_token`, where given, is called with the tokens so far after each one drawn.
    std::vector<int32_t> generate(vs_context & c, const std::vector<int32_t> & text, const float * speaker,
                                  const std::vector<int32_t> & prompt, const vs_synth_params & p, size_t max_tokens,
                                  const token_callback & on_token = {});
    // Runs for several texts in the one voice at once, text i at most max_tokens[i] tokens drawn
    // from seeds[i] (as generate draws from params.seed): their prefixes one after another, then
    // their steps together, a sequence a text (two with guidance) in one graph, so that a step's
    // matmuls read the weights once for all of them. A text's tokens are those it gets alone.
    // `on_token` sees the first text's.
    std::vector<std::vector<int32_t>> generate_many(vs_context & c, const std::vector<std::vector<int32_t>> & texts,
                                                    const float * speaker, const std::vector<int32_t> & prompt,
                                                    const vs_synth_params & p, const std::vector<size_t> & max_tokens,
                                                    const std::vector<uint64_t> & seeds,
                                                    const token_callback &        on_token = {});

  private:
    struct step_out {
        std::vector<float> logits;  // [n_logits, Vs] a sequence, the sequences in turn
        std::vector<float> align;   // Llama: the alignment heads' mean attention [n_align, S] over the text
    };
    // Runs the backbone over `n` new positions from `pos` whose embeddings a graph makes
    // from the inputs; returns the speech head's logits of the last `n_logits` positions.
    // `speech_pos`: the speech tokens' learned positions (Llama).
    // `slot0`: the cache row of its first sequence.
    step_out forward(vs_context & c, int64_t pos, const std::vector<int32_t> & text,
                     const std::vector<int32_t> & speech, const float * speaker, const std::vector<int32_t> & prompt,
                     int64_t n_logits, const std::vector<int32_t> & speech_pos, float emotion, int64_t batch,
                     int64_t n_text, int64_t n_align, int64_t slot0 = 0);
    // One step of several sequences at once: row r feeds token tok[r] at cache position pos[r]
    // (Llama: speech position speech_pos[r]) into cache row slot[r]; its logits, and (Llama,
    // where align_text[r] > 0) the alignment heads' mean attention over its first align_text[r]
    // text positions.
    std::vector<step_out> advance(vs_context & c, const std::vector<int32_t> & tok,
                                  const std::vector<int32_t> & speech_pos, const std::vector<int64_t> & pos,
                                  const std::vector<int64_t> & slot, const std::vector<int64_t> & align_text);
    // The conditioning's keys and values (its first n_cond positions) of cache rows [0, per)
    // copied to rows [per, n_seq), row b from row b % per.
    void copy_conditioning(vs_context & c, int64_t n_cond, int64_t per, int64_t n_seq);
    void reserve(vs_context & c, int64_t n_ctx, int64_t batch);

    t3_hparams                 h_;
    ggml_ctx_ptr               cache_ctx_;
    buffer_ptr                 cache_buf_;
    std::vector<ggml_tensor *> k_, v_;  // per layer and sequence: K [C, n_ctx], V transposed [n_ctx, C]
    int64_t                    n_ctx_ = 0, batch_ = 0;
    uint64_t                   cache_gen_ = 0;  // a number for each cache reserve makes (kept step graphs' key)
    int64_t                    text_at_   = 0;  // the cache position of the text's first token
    // The voice whose conditioning the cache's first positions hold (a digest of its speaker
    // embedding and prompt tokens; 0: none): the next call in that voice starts after them.
    uint64_t cond_key_ = 0;
};

}  // namespace vs::chatterbox
