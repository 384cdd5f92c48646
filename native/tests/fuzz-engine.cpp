// A bounded mutation fuzzer for what the engine reads from outside: model files (the GGUF
// loader and every architecture's checks) and the text front end (phonemes and text to the
// phoneme ids of bounded chunks). Inputs come from a seeded generator, so a run is
// reproducible; a crash ends the process (and, in the sanitizer build, any memory error).
//
//     fuzz-engine gguf MODEL.gguf [--seconds S] [--runs N] [--seed K]
//     fuzz-engine phonemes MODEL.gguf [...]
//     fuzz-engine text MODEL.gguf ESPEAK_LIBRARY ESPEAK_DATA [...]
//
// A crash writes the input it was trying to ./fuzz-crash-input; --replay FILE tries that
// input alone (phonemes and text).
//
// Prints the inputs tried and how the engine answered them.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "vs-context.h"

namespace {

// The input being tried, written out by a crash's signal handler (to reproduce it).
const std::string * g_current = nullptr;

extern "C" void on_crash(int sig) {
    if (g_current) {
        const int fd = ::open("fuzz-crash-input", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            (void) !::write(fd, g_current->data(), g_current->size());
            ::close(fd);
        }
        static const char msg[] = "fuzz-engine: crashed; the input is in ./fuzz-crash-input\n";
        (void) !::write(2, msg, sizeof msg - 1);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

struct options {
    std::string target, model, espeak_library, espeak_data, replay;
    double      seconds = 10.0;
    long long   runs    = -1;
    uint64_t    seed    = 1;
};

[[noreturn]] void usage() {
    std::fprintf(stderr,
                 "usage: fuzz-engine gguf|phonemes MODEL.gguf [--seconds S] [--runs N] [--seed K]\n"
                 "       fuzz-engine text MODEL.gguf ESPEAK_LIBRARY ESPEAK_DATA [...]\n");
    std::exit(2);
}

options parse(int argc, char ** argv) {
    options             o;
    std::vector<char *> positional;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--seconds" || a == "--runs" || a == "--seed" || a == "--replay") && i + 1 < argc) {
            const char * v = argv[++i];
            if (a == "--replay") {
                o.replay = v;
            } else if (a == "--seconds") {
                o.seconds = std::atof(v);
            } else if (a == "--runs") {
                o.runs = std::atoll(v);
            } else {
                o.seed = std::strtoull(v, nullptr, 10);
            }
        } else {
            positional.push_back(argv[i]);
        }
    }
    if (positional.size() < 2) {
        usage();
    }
    o.target = positional[0];
    o.model  = positional[1];
    if (o.target == "text") {
        if (positional.size() < 4) {
            usage();
        }
        o.espeak_library = positional[2];
        o.espeak_data    = positional[3];
    } else if (o.target != "gguf" && o.target != "phonemes") {
        usage();
    }
    return o;
}

std::vector<uint8_t> read_file(const std::string & path) {
    std::vector<uint8_t> data;
    FILE *               f = std::fopen(path.c_str(), "rb");
    if (!f) {
        std::perror(path.c_str());
        std::exit(2);
    }
    uint8_t buf[1 << 16];
    size_t  n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
        data.insert(data.end(), buf, buf + n);
    }
    std::fclose(f);
    return data;
}

// Bytes past the tensor infos are weights: mutations go where the loader parses.
size_t header_bytes(const std::string & path, size_t size) {
    gguf_init_params p{ true, nullptr };
    gguf_context *   g = gguf_init_from_file(path.c_str(), p);
    if (!g) {
        std::fprintf(stderr, "%s: not a GGUF file\n", path.c_str());
        std::exit(2);
    }
    const size_t at = gguf_get_data_offset(g);
    gguf_free(g);
    return std::min(at, size);
}

struct runner {
    options                               opt;
    std::mt19937_64                       rng;
    std::map<std::string, long long>      answers;  // how each input ended
    long long                             inputs = 0;
    std::chrono::steady_clock::time_point t0     = std::chrono::steady_clock::now();

    explicit runner(options o) : opt(std::move(o)), rng(opt.seed) {}

    bool more() const {
        if (opt.runs >= 0) {
            return inputs < opt.runs;
        }
        return vs::ms_since(t0) < opt.seconds * 1000.0;
    }

    uint64_t below(uint64_t n) { return n ? rng() % n : 0; }

    void report() const {
        std::printf("fuzz %s: %lld inputs in %.1f s, 0 crashes;", opt.target.c_str(), inputs,
                    vs::ms_since(t0) / 1000.0);
        for (const auto & [answer, count] : answers) {
            std::printf(" %s %lld;", answer.c_str(), count);
        }
        std::printf("\n");
    }
};

const uint64_t INTERESTING[] = { 0,          1,          2,          3,          7,          0x7f,       0x80,
                                 0xff,       0x100,      0x7fff,     0x8000,     0xffff,     0x7fffffff, 0x80000000,
                                 0xfffffffe, 0xffffffff, 1ull << 32, 1ull << 40, ~0ull >> 1, ~0ull };

// Mutations of the header region written over a copy of the file, then undone.
void fuzz_gguf(runner & r) {
    const std::vector<uint8_t> seed   = read_file(r.opt.model);
    const size_t               header = header_bytes(r.opt.model, seed.size());
    char                       path[] = "/tmp/vs-fuzz-XXXXXX.gguf";
    const int                  fd     = mkstemps(path, 5);
    if (fd < 0 || write(fd, seed.data(), seed.size()) != (ssize_t) seed.size()) {
        std::perror("temporary copy");
        std::exit(2);
    }
    while (r.more()) {
        std::vector<std::pair<size_t, std::vector<uint8_t>>> undo;
        auto                                                 put = [&](size_t at, const void * bytes, size_t n) {
            n = std::min(n, header - at);
            undo.emplace_back(at, std::vector<uint8_t>(seed.begin() + at, seed.begin() + at + n));
            if (pwrite(fd, bytes, n, (off_t) at) != (ssize_t) n) {
                std::perror("pwrite");
                std::exit(2);
            }
        };
        const int n_mutations = 1 + (int) r.below(4);
        for (int m = 0; m < n_mutations; ++m) {
            const size_t at = (size_t) r.below(header);
            switch (r.below(4)) {
                case 0: {  // a bit flipped
                    uint8_t b = (uint8_t) (seed[at] ^ (1u << r.below(8)));
                    put(at, &b, 1);
                    break;
                }
                case 1: {  // a random byte
                    uint8_t b = (uint8_t) r.rng();
                    put(at, &b, 1);
                    break;
                }
                default: {  // an interesting 32- or 64-bit value at a 4-byte boundary (counts, dims, types)
                    const uint64_t v     = INTERESTING[r.below(std::size(INTERESTING))];
                    const size_t   width = r.below(2) ? 4 : 8;
                    put(at & ~size_t(3), &v, width);
                    break;
                }
            }
        }
        const bool   truncated = r.below(64) == 0;
        const size_t cut       = truncated ? (size_t) r.below(seed.size()) : seed.size();
        if (truncated && ftruncate(fd, (off_t) cut) != 0) {
            std::perror("ftruncate");
            std::exit(2);
        }
        vs_model * model  = nullptr;
        const int  status = vs_model_load(path, vs_model_default_params(), &model);
        r.answers[status == VS_OK ? "loaded" : "refused(" + std::to_string(status) + ")"]++;
        vs_model_free(model);
        r.inputs++;
        if (truncated &&
            (ftruncate(fd, (off_t) seed.size()) != 0 ||
             pwrite(fd, seed.data() + cut, seed.size() - cut, (off_t) cut) != (ssize_t) (seed.size() - cut))) {
            std::perror("restore");
            std::exit(2);
        }
        for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
            if (pwrite(fd, it->second.data(), it->second.size(), (off_t) it->first) != (ssize_t) it->second.size()) {
                std::perror("pwrite");
                std::exit(2);
            }
        }
    }
    close(fd);
    unlink(path);
}

// Strings built from the voice's own symbols, punctuation, white space, other scripts and
// broken UTF-8, in runs of every length up to tens of thousands of bytes.
std::string random_text(runner & r, const std::vector<std::string> & symbols) {
    static const char * extra[] = { ".",        ",",
                                    ";",        ":",
                                    "!",        "?",
                                    " ",        " ",
                                    " ",        "\n",
                                    "\t",       "\r",
                                    "...",      "—",
                                    "“",        "”",
                                    "'",        "(",
                                    ")",        "1",
                                    "2024",     "$5.00",
                                    "Dr.",      "e.g.",
                                    "😀",       "👩‍👩‍👧",
                                    "ä",        "ß",
                                    "日本語",   "русский",
                                    "\u202e",   "\u2028",
                                    "\xff",     "\xc3",
                                    "\xe2\x82", "\xf0\x9f\x98",
                                    "a",        "the",
                                    "Hello",    "supercalifragilistic" };
    const size_t        length  = r.below(16) == 0 ? 2000 + r.below(60000) : r.below(600);
    std::string         s;
    while (s.size() < length) {
        const size_t        run = 1 + r.below(r.below(8) == 0 ? 5000 : 12);
        const bool          own = !symbols.empty() && r.below(2);
        const std::string & piece =
            own ? symbols[r.below(symbols.size())] : std::string(extra[r.below(std::size(extra))]);
        for (size_t k = 0; k < run && s.size() < length; ++k) {
            s += piece;
        }
    }
    return s;
}

void fuzz_front_end(runner & r, bool text) {
    vs_model * model = nullptr;
    if (vs_model_load(r.opt.model.c_str(), vs_model_default_params(), &model) != VS_OK) {
        std::fprintf(stderr, "%s: %s\n", r.opt.model.c_str(), vs_last_error());
        std::exit(2);
    }
    vs_context_params cp = vs_context_default_params();
    cp.device            = "cpu";
    cp.n_threads         = 1;
    cp.espeak_library    = text ? r.opt.espeak_library.c_str() : nullptr;
    cp.espeak_data       = text ? r.opt.espeak_data.c_str() : nullptr;
    vs_context * ctx     = nullptr;
    if (vs_context_init(model, cp, &ctx) != VS_OK || !ctx->voice) {
        std::fprintf(stderr, "%s: not a voice (%s)\n", r.opt.model.c_str(), vs_last_error());
        std::exit(2);
    }
    std::vector<std::string> symbols;
    const auto               key = model->arch == "piper" ? "piper.phonemes" : "kokoro.vocab_symbols";
    for (const auto & s : model->str_array(key)) {
        symbols.push_back(s);
    }
    // The most ids a chunk may hold: Piper's 500 phonemes (each and a pad, then BOS, pad, EOS),
    // Kokoro's 510 tokens.
    const size_t  limit   = model->arch == "piper" ? 2 * 500 + 3 : 510;
    const int64_t n_vocab = model->arch == "piper" ? model->tensor("enc_p.emb.weight")->ne[1]
                                                   : model->tensor("text_encoder.embedding.weight")->ne[1];
    while (r.more()) {
        const std::string input   = r.opt.replay.empty() ? random_text(r, symbols) : [&] {
            const auto bytes = read_file(r.opt.replay);
            r.opt.runs       = 1;
            return std::string(bytes.begin(), bytes.end());
        }();
        int               skipped = 0;
        g_current                 = &input;
        try {
            const auto chunks =
                text ? ctx->voice->ids_from_text(*ctx, input, skipped) : ctx->voice->ids_from_phonemes(input, skipped);
            for (const auto & chunk : chunks) {
                if (chunk.empty() || chunk.size() > limit) {
                    std::fprintf(stderr, "a chunk of %zu ids (at most %zu) from an input of %zu bytes\n", chunk.size(),
                                 limit, input.size());
                    std::abort();
                }
                for (int32_t id : chunk) {
                    if (id < 0 || id >= n_vocab) {
                        std::fprintf(stderr, "id %d outside the vocabulary of %lld\n", id, (long long) n_vocab);
                        std::abort();
                    }
                }
            }
            r.answers[chunks.empty() ? "nothing to speak" : "chunks"]++;
        } catch (const vs::error & e) {
            r.answers["refused(" + std::to_string(e.status) + ")"]++;
        }
        r.inputs++;
    }
    vs_context_free(ctx);
    vs_model_free(model);
}

}  // namespace

int main(int argc, char ** argv) {
    runner r(parse(argc, argv));
    for (int sig : { SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL }) {
        signal(sig, on_crash);
    }
    vs_set_log_callback([](int, const char *, void *) {}, nullptr);
    ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);  // gguf's reasons for each refusal
    if (r.opt.target == "gguf") {
        fuzz_gguf(r);
    } else {
        fuzz_front_end(r, r.opt.target == "text");
    }
    r.report();
    return 0;
}
