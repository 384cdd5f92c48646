// Text to IPA with libespeak-ng, loaded at run time from the path the caller gives
// (the espeakng-loader wheel ships the library and its data).
//
// Conventions follow piper-phonemize: espeak-ng phonemizes clause by clause; each
// clause's punctuation is kept after its phonemes, clauses of a sentence are joined
// by a space, and a sentence ends at '.', '?' or '!'.
#include <dlfcn.h>

#include <cctype>
#include <cstring>

#include "vs-impl.h"

namespace vs {

namespace {
// The handful of espeak-ng entry points used, declared from its public ABI.
constexpr int espeak_AUDIO_OUTPUT_SYNCHRONOUS = 2;
constexpr int espeak_CHARS_UTF8               = 1;
constexpr int espeak_PHONEMES_IPA             = 0x02;
constexpr int espeak_INITIALIZE_DONT_EXIT     = 0x8000;

using fn_initialize    = int (*)(int output, int buflength, const char * path, int options);
using fn_set_voice     = int (*)(const char * name);
using fn_text_phonemes = const char * (*) (const void ** textptr, int textmode, int phonememode);
}  // namespace

struct phonemizer::api {
    void *           handle = nullptr;
    fn_initialize    initialize{};
    fn_set_voice     set_voice{};
    fn_text_phonemes text_to_phonemes{};
    std::mutex       mutex;  // espeak-ng keeps global state
    std::string      voice;
};

static std::mutex                                            g_apis_mutex;
static std::map<std::string, std::weak_ptr<phonemizer::api>> g_apis;

phonemizer::phonemizer(const std::string & library, const std::string & data_dir) {
    std::lock_guard<std::mutex> lock(g_apis_mutex);
    auto                        cached = g_apis[library].lock();
    if (cached) {
        api_ = cached;
        return;
    }
    auto a    = std::make_shared<api>();
    a->handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!a->handle) {
        throw error(VS_ERR_PHONEMIZER, "cannot load espeak-ng from '" + library + "': " + dlerror());
    }
    a->initialize       = (fn_initialize) dlsym(a->handle, "espeak_Initialize");
    a->set_voice        = (fn_set_voice) dlsym(a->handle, "espeak_SetVoiceByName");
    a->text_to_phonemes = (fn_text_phonemes) dlsym(a->handle, "espeak_TextToPhonemes");
    if (!a->initialize || !a->set_voice || !a->text_to_phonemes) {
        throw error(VS_ERR_PHONEMIZER, "'" + library + "' is not an espeak-ng library");
    }
    if (a->initialize(espeak_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_dir.c_str(), espeak_INITIALIZE_DONT_EXIT) < 0) {
        throw error(VS_ERR_PHONEMIZER, "espeak-ng could not read its data from '" + data_dir + "'");
    }
    g_apis[library] = a;
    api_            = a;
}

static bool is_sentence_end(char32_t c) {
    return c == U'.' || c == U'?' || c == U'!';
}

static bool is_clause_punct(char32_t c) {
    return is_sentence_end(c) || c == U',' || c == U';' || c == U':';
}

static bool is_closing(char32_t c) {
    return c == U' ' || c == U'\t' || c == U'\n' || c == U'\r' || c == U'"' || c == U'\'' || c == U')' || c == U']' ||
           c == U'\u201d' || c == U'\u2019' || c == U'\u00bb';
}

// Words whose trailing period espeak-ng reads as part of the word, not a sentence end.
static bool is_abbreviation(const std::vector<char32_t> & cps, size_t dot) {
    static const char * known[] = { "mr", "mrs", "ms",  "dr",  "st", "jr",  "sr", "prof", "vs",   "etc", "mt",
                                    "ft", "no",  "inc", "ltd", "co", "gen", "lt", "col",  "capt", "sgt", "approx" };
    size_t              start   = dot;
    while (start > 0 && cps[start - 1] < 0x80 && std::isalpha((int) cps[start - 1])) {
        --start;
    }
    std::string word;
    for (size_t i = start; i < dot; ++i) {
        word += (char) std::tolower((int) cps[i]);
    }
    for (const char * k : known) {
        if (word == k) {
            return true;
        }
    }
    return false;
}

// The punctuation that ended the clause espeak-ng consumed from [begin, end).
// espeak-ng reads one code point of the next clause ahead, unless the text ended.
static char32_t clause_terminator(const char * begin, const char * end, bool text_ended) {
    std::vector<char32_t> cps = utf8_decode(std::string(begin, end));
    size_t                n   = cps.size();
    if (!text_ended && n > 0) {
        --n;
    }
    while (n > 0 && is_closing(cps[n - 1])) {
        --n;
    }
    if (n == 0 || !is_clause_punct(cps[n - 1])) {
        return 0;
    }
    if (cps[n - 1] == U'.' && is_abbreviation(cps, n - 1)) {
        return 0;
    }
    return cps[n - 1];
}

// Language-switch marks such as "(en)" or "(fr)" that espeak-ng inserts.
static std::string strip_language_flags(const std::string & s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '(') {
            size_t close = s.find(')', i);
            if (close != std::string::npos && close - i <= 8) {
                i = close;
                continue;
            }
        }
        out += s[i];
    }
    return out;
}

static bool is_space(char32_t c) {
    return c == U' ' || c == U'\t' || c == U'\n' || c == U'\r' || c == U'\f' || c == U'\v' || c == 0xA0 ||
           c == 0x2028 || c == 0x2029;
}

// Text cut into pieces that espeak-ng takes safely, each phonemized on its own: valid UTF-8
// (each invalid byte a U+FFFD) of at most MAX_PIECE code points. espeak-ng overflows a
// buffer of its own on a long clause of many short words (a hundred letters each followed by
// a dot, "a.a.a.…", is enough), so a longer stretch is cut after its last clause punctuation
// past half the limit, else at its last white space past a quarter, else at the limit.
static std::vector<std::string> espeak_pieces(const std::string & text) {
    constexpr size_t            MAX_PIECE = 160;
    const std::vector<char32_t> cps       = utf8_decode(text);
    std::vector<std::string>    pieces;
    for (size_t begin = 0; begin < cps.size();) {
        size_t end = cps.size();
        if (end - begin > MAX_PIECE) {
            size_t clause = 0, space = 0;
            for (size_t k = begin + MAX_PIECE / 4; k < begin + MAX_PIECE; ++k) {
                if (is_space(cps[k])) {
                    space = k + 1;
                    if (k >= begin + MAX_PIECE / 2 && is_clause_punct(cps[k - 1])) {
                        clause = k + 1;
                    }
                }
            }
            end = clause ? clause : space ? space : begin + MAX_PIECE;
        }
        std::string piece;
        for (size_t k = begin; k < end; ++k) {
            piece += utf8_encode(cps[k]);
        }
        pieces.push_back(std::move(piece));
        begin = end;
    }
    return pieces;
}

std::vector<phonemized_sentence> phonemizer::phonemize(const std::string & input, const std::string & voice,
                                                       int mode) const {
    const std::vector<std::string> pieces = espeak_pieces(input);
    std::lock_guard<std::mutex>    lock(api_->mutex);
    if (api_->voice != voice) {
        if (api_->set_voice(voice.c_str()) != 0) {
            throw error(VS_ERR_PHONEMIZER, "espeak-ng has no voice '" + voice + "'");
        }
        api_->voice = voice;
    }
    std::vector<phonemized_sentence> sentences;
    std::string                      current;
    for (size_t p = 0; p < pieces.size(); ++p) {
        const std::string & text      = pieces[p];
        const bool          last      = p + 1 == pieces.size();
        const char *        cursor    = text.c_str();
        const char *        end       = cursor + text.size();
        const char *        lookahead = cursor;  // start of the code point espeak-ng read ahead last time
        while (cursor && cursor < end) {
            const char * before = lookahead;
            const void * ptr    = cursor;
            const char * clause = api_->text_to_phonemes(&ptr, espeak_CHARS_UTF8, mode);
            cursor              = (const char *) ptr;
            if (cursor) {
                lookahead = cursor - 1;
                while (lookahead > text.c_str() && (((unsigned char) *lookahead) & 0xC0) == 0x80) {
                    --lookahead;
                }
            }
            char32_t    punct = clause_terminator(before, cursor ? cursor : end, !cursor);
            std::string ipa   = strip_language_flags(clause ? clause : "");
            if (!ipa.empty()) {
                if (!current.empty()) {
                    current += ' ';
                }
                current += ipa;
            }
            if (punct && !current.empty()) {
                current += utf8_encode(punct);
            }
            // A piece's end ends no sentence: the next piece goes on with it.
            if ((punct && is_sentence_end(punct)) || (!cursor && last)) {
                if (!current.empty()) {
                    sentences.push_back({ current });
                }
                current.clear();
            }
        }
    }
    if (!current.empty()) {
        sentences.push_back({ current });
    }
    return sentences;
}

std::vector<char32_t> utf8_decode(const std::string & s) {
    std::vector<char32_t> out;
    for (size_t i = 0; i < s.size();) {
        unsigned char c = (unsigned char) s[i];
        int           n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > s.size()) {
            out.push_back(0xFFFD);  // invalid byte: replacement character
            ++i;
            continue;
        }
        char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (int k = 1; k < n; ++k) {
            cp = (cp << 6) | ((unsigned char) s[i + k] & 0x3F);
        }
        out.push_back(cp);
        i += n;
    }
    return out;
}

std::string utf8_encode(char32_t c) {
    std::string out;
    if (c < 0x80) {
        out += (char) c;
    } else if (c < 0x800) {
        out += (char) (0xC0 | (c >> 6));
        out += (char) (0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        out += (char) (0xE0 | (c >> 12));
        out += (char) (0x80 | ((c >> 6) & 0x3F));
        out += (char) (0x80 | (c & 0x3F));
    } else {
        out += (char) (0xF0 | (c >> 18));
        out += (char) (0x80 | ((c >> 12) & 0x3F));
        out += (char) (0x80 | ((c >> 6) & 0x3F));
        out += (char) (0x80 | (c & 0x3F));
    }
    return out;
}

std::vector<std::string> split_lines(const std::string & s) {
    std::vector<std::string> lines;
    size_t                   start = 0;
    while (true) {
        const size_t nl = s.find('\n', start);
        lines.push_back(s.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
        if (nl == std::string::npos) {
            return lines;
        }
        start = nl + 1;
    }
}

}  // namespace vs
