// Internal types shared by the engine's translation units.
#pragma once

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml.h>
#include <gguf.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "voicestudio.h"

#if defined(__CUDACC__)
#define VS_HOST_DEVICE __host__ __device__
#else
#define VS_HOST_DEVICE
#endif

namespace vs {

// splitmix64's finalizer.
VS_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Values 2 p and 2 p + 1 of stream `key` of standard normal noise times `scale`: a
// counter-based generator (Box-Muller over one hash a pair), so that any value depends on
// its stream and place alone, drawn the same on the host and in a CUDA kernel (the same
// float functions; they may differ in their last bits).
VS_HOST_DEVICE inline void gaussian_pair(uint64_t key, uint64_t p, float scale, float & a, float & b) {
    const uint64_t h  = mix64(key ^ mix64(p));
    const float    u1 = (float) ((h >> 40) + 1) * (1.0f / 16777216.0f);  // (0, 1]
    const float    u2 = (float) (h & 0xFFFFFF) * (1.0f / 16777216.0f);   // [0, 1)
    const float    r  = scale * sqrtf(-2.0f * logf(u1));
    const float    th = 6.28318530718f * u2;
    a                 = r * cosf(th);
    b                 = r * sinf(th);
}

// Thrown inside the engine; the C boundary turns it into a status code.
struct error : std::runtime_error {
    int status;
    error(int status, const std::string & what) : std::runtime_error(what), status(status) {}
};

void log(int level, const std::string & text);

inline double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct ggml_ctx_deleter {
    void operator()(ggml_context * c) const { ggml_free(c); }
};
struct gguf_ctx_deleter {
    void operator()(gguf_context * c) const { gguf_free(c); }
};
struct buffer_deleter {
    void operator()(ggml_backend_buffer_t b) const { ggml_backend_buffer_free(b); }
};
struct backend_deleter {
    void operator()(ggml_backend_t b) const { ggml_backend_free(b); }
};
struct sched_deleter {
    void operator()(ggml_backend_sched_t s) const { ggml_backend_sched_free(s); }
};
struct gallocr_deleter {
    void operator()(ggml_gallocr_t a) const { ggml_gallocr_free(a); }
};
struct event_deleter {
    void operator()(ggml_backend_event_t e) const { ggml_backend_event_free(e); }
};
using ggml_ctx_ptr = std::unique_ptr<ggml_context, ggml_ctx_deleter>;
using gguf_ctx_ptr = std::unique_ptr<gguf_context, gguf_ctx_deleter>;
using buffer_ptr   = std::unique_ptr<ggml_backend_buffer, buffer_deleter>;
using backend_ptr  = std::unique_ptr<ggml_backend, backend_deleter>;
using sched_ptr    = std::unique_ptr<ggml_backend_sched, sched_deleter>;
using gallocr_ptr  = std::unique_ptr<ggml_gallocr, gallocr_deleter>;
using event_ptr    = std::unique_ptr<ggml_backend_event, event_deleter>;

// ---------------------------------------------------------------- devices (vs-devices.cpp)

struct device_entry {
    ggml_backend_dev_t dev;
    vs_device_info     info;
};
const std::vector<device_entry> & devices();
// Resolves "auto", "cpu" or an id; throws VS_ERR_DEVICE for an unknown one.
ggml_backend_dev_t resolve_device(const std::string & request);
std::string        device_id(ggml_backend_dev_t dev);
void               refresh_memory(device_entry & e);

// ---------------------------------------------------------------- weights (vs-model-loader.cpp)

// One copy of the weights in one buffer type.
struct weight_set {
    ggml_ctx_ptr                         ctx;
    buffer_ptr                           buffer;
    std::map<std::string, ggml_tensor *> tensors;
};

struct model_file;  // the mapped GGUF file

// Weights re-laid out for one device (vs_context::derived_tensor), each made once, by the first
// context that asks, and shared by every context on that device (a context's workers
// included); freed with the model.
struct derived_weights {
    std::recursive_mutex                 mutex;  // held while one is made
    std::map<std::string, ggml_tensor *> tensors;
    std::vector<ggml_ctx_ptr>            ctx;
    std::vector<buffer_ptr>              buffers;
};

}  // namespace vs

struct vs_model {
    std::string                        path;
    std::string                        arch;
    std::string                        name;
    int                                sample_rate = 0;
    vs::gguf_ctx_ptr                   meta;
    std::shared_ptr<vs::model_file>    file;
    vs::weight_set                     host;  // tensors in the mapped file
    std::map<std::string, std::string> strings;
    std::vector<std::string>           voices;  // style packs (Kokoro)

    // Copies of the weights on other devices, made on first use by a context, and weights
    // re-laid out for each device a context runs on.
    std::mutex                                                         device_mutex;
    std::map<ggml_backend_dev_t, std::shared_ptr<vs::weight_set>>      on_device;
    std::map<ggml_backend_dev_t, std::unique_ptr<vs::derived_weights>> derived;

    ggml_tensor *            tensor(const std::string & name) const;  // throws if absent
    bool                     has(const std::string & key) const;      // a metadata key
    uint32_t                 u32(const std::string & key) const;
    float                    f32(const std::string & key) const;
    std::vector<int32_t>     i32_array(const std::string & key) const;
    std::vector<std::string> str_array(const std::string & key) const;

    // Metadata checked against what the architecture can run: each throws VS_ERR_FORMAT
    // naming the key unless the value (every element of an array, of n_min to n_max
    // elements) lies in [lo, hi] (and is finite).
    int                  u32_in(const std::string & key, int lo, int hi) const;
    float                f32_in(const std::string & key, float lo, float hi) const;
    std::vector<int32_t> i32_array_in(const std::string & key, size_t n_min, size_t n_max, int32_t lo,
                                      int32_t hi) const;
    [[noreturn]] void    bad(const std::string & what) const;  // VS_ERR_FORMAT: "'<path>': <what>"
};

namespace vs {

// A tensor an architecture reads: its shape (ggml's ne; dimensions left out are 1), and
// whether it may be stored in a reduced type (F16 or Q8_0: a matrix that feeds a matmul)
// or must be F32.
struct tensor_spec {
    std::string            name;
    std::array<int64_t, 4> ne;
    bool                   reducible;
};
// Throws VS_ERR_FORMAT naming the first tensor of `specs` that the model lacks or holds
// in another shape or type; `q4_0`: a reducible one may be Q4_0 too (Chatterbox's token model).
void check_tensors(const vs_model & model, const std::vector<tensor_spec> & specs, bool q4_0 = false);

// Weights for `dev`: the host copy for CPU devices, else an uploaded copy.
std::shared_ptr<weight_set> weights_for(vs_model & model, ggml_backend_dev_t dev);
// The weights re-laid out for `dev`, shared by the model's contexts on it.
derived_weights & derived_for(vs_model & model, ggml_backend_dev_t dev);

// ---------------------------------------------------------------- phonemizer (vs-phonemizer.cpp)

struct phonemized_sentence {
    std::string ipa;  // clauses joined with their punctuation, as piper-phonemize does
};

class phonemizer {
  public:
    // espeak-ng phoneme modes: IPA, or IPA with '^' tying the letters of one phoneme ("a^ɪ").
    static constexpr int IPA      = 0x02;
    static constexpr int IPA_TIED = 0x02 | 0x80 | ('^' << 8);

    phonemizer(const std::string & library, const std::string & data_dir);
    // Sentences of `text` in voice `voice` (an espeak-ng voice name).
    std::vector<phonemized_sentence> phonemize(const std::string & text, const std::string & voice,
                                               int mode = IPA) const;

    struct api;  // the loaded library (shared by every phonemizer using it)

  private:
    std::shared_ptr<api> api_;
};

// UTF-8 <-> code points
std::vector<char32_t> utf8_decode(const std::string & s);
std::string           utf8_encode(char32_t c);

// The lines of phoneme input (one sentence a line), without their newlines.
std::vector<std::string> split_lines(const std::string & s);

// A sentence cut into pieces of at most `max` symbols, so that no chunk's graphs grow past
// what a sentence of that length needs (attention is quadratic in it): each cut after the
// last clause break (is_clause) before the limit where that keeps at least a quarter of it,
// else after the last word break (is_space), else at the limit. Word breaks at either end
// of a piece are dropped, and pieces left empty.
template <typename T, typename IsClause, typename IsSpace>
std::vector<std::vector<T>> split_long(const std::vector<T> & seq, size_t max, IsClause is_clause, IsSpace is_space) {
    std::vector<std::vector<T>> out;
    auto                        emit = [&](size_t begin, size_t end) {
        while (begin < end && is_space(seq[begin])) {
            ++begin;
        }
        while (end > begin && is_space(seq[end - 1])) {
            --end;
        }
        if (begin < end) {
            out.emplace_back(seq.begin() + begin, seq.begin() + end);
        }
    };
    size_t start = 0;
    while (start < seq.size() && is_space(seq[start])) {
        ++start;
    }
    while (seq.size() - start > max) {
        size_t clause = 0, word = 0;
        for (size_t i = start + 1; i < start + max; ++i) {
            if (is_clause(seq[i])) {
                clause = i + 1;
            } else if (is_space(seq[i])) {
                word = i + 1;
            }
        }
        const size_t end = clause > start + max / 4 ? clause : word > start ? word : start + max;
        emit(start, end);
        start = end;
        while (start < seq.size() && is_space(seq[start])) {
            ++start;
        }
    }
    emit(start, seq.size());
    return out;
}

}  // namespace vs
