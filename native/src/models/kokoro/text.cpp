// Kokoro-82M's text front end: espeak-ng's IPA into Kokoro's symbols, ids, chunks and style rows.
#include "kokoro.h"

namespace vs::kokoro {

// ---------------------------------------------------------------- text

// espeak-ng's IPA (ties as '^') into Kokoro's symbols, as the model's own espeak fallback maps it:
// the mappings both Englishes share, then the American ones (long vowels dropped, "oʊ" as O) or
// the British ones (long vowels kept, "əʊ" as Q, "eə" as ɛː, "iə" as ɪə). Longest match first.
using symbol_map = std::vector<std::pair<std::string, std::string>>;

static symbol_map longest_first(symbol_map t) {
    std::stable_sort(t.begin(), t.end(),
                     [](const auto & a, const auto & b) { return a.first.size() > b.first.size(); });
    return t;
}

// The mappings both Englishes share, then `own`, longest first.
static symbol_map english_symbols(std::initializer_list<std::pair<std::string, std::string>> own) {
    symbol_map t = {
        { "ʔˌn\u0329", "tᵊn" }, { "ʔn\u0329", "tᵊn" }, { "ʔn", "tᵊn" }, { "ʔ", "t" }, { "a^ɪ", "I" },
        { "a^ʊ", "W" },         { "d^ʒ", "ʤ" },        { "e^ɪ", "A" },  { "e", "A" }, { "t^ʃ", "ʧ" },
        { "ɔ^ɪ", "Y" },         { "ə^l", "ᵊl" },       { "r", "ɹ" },    { "x", "k" }, { "ç", "k" },
        { "ɐ", "ə" },           { "ɚ", "əɹ" },         { "ɬ", "l" },    { "ʲ", "" },  { "^", "" },
    };
    t.insert(t.end(), own);
    return longest_first(t);
}

const std::vector<std::pair<std::string, std::string>> & espeak_to_kokoro(bool british) {
    static const symbol_map american    = english_symbols({
        { "o^ʊ", "O" },
        { "ə^ʊ", "O" },
        { "ɜːɹ", "ɜɹ" },
        { "ɜː", "ɜɹ" },
        { "ɪə", "iə" },
        { "ː", "" },
    });
    static const symbol_map british_map = english_symbols({
        { "ə^ʊ", "Q" },
        { "e^ə", "ɛː" },
        { "i^ə", "ɪə" },
        { "iə", "ɪə" },
    });
    return british ? british_map : american;
}

// Kokoro's other languages (Spanish, French, Hindi, Italian, Brazilian Portuguese): espeak-ng's
// IPA with its tied affricates and diphthongs as Kokoro's single symbols, ties and hyphens
// dropped, as the model's own espeak front end for them maps it.
static const symbol_map & espeak_other_to_kokoro() {
    static const symbol_map table = longest_first({
        { "a^ɪ", "I" },
        { "a^ʊ", "W" },
        { "d^z", "ʣ" },
        { "d^ʒ", "ʤ" },
        { "e^ɪ", "A" },
        { "o^ʊ", "O" },
        { "ə^ʊ", "Q" },
        { "s^s", "S" },
        { "t^s", "ʦ" },
        { "t^ʃ", "ʧ" },
        { "ɔ^ɪ", "Y" },
        { "^", "" },
        { "-", "" },
    });
    return table;
}

static std::string replaced(const std::string & ipa, const symbol_map & table) {
    std::string out;
    for (size_t i = 0; i < ipa.size();) {
        bool matched = false;
        for (const auto & [from, to] : table) {
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
    return out;
}

const std::vector<kokoro_language> & kokoro_languages() {
    static const std::vector<kokoro_language> languages = {
        { "en-us", "en-us" }, { "en-gb", "en" }, { "es", "es" },       { "fr-fr", "fr" },
        { "hi", "hi" },       { "it", "it" },    { "pt-br", "pt-BR" },
    };
    return languages;
}

std::string to_kokoro_symbols(const std::string & ipa, const std::string & language) {
    if (language != "en-us" && language != "en-gb") {
        return replaced(ipa, espeak_other_to_kokoro());
    }
    const std::string out = replaced(ipa, espeak_to_kokoro(language == "en-gb"));
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
    const std::string        language = ctx.language.empty() ? "en-us" : ctx.language;
    const auto &             known    = kokoro_languages();
    const auto it = std::find_if(known.begin(), known.end(), [&](const auto & l) { return l.code == language; });
    if (it == known.end()) {
        throw error(VS_ERR_INVALID_ARG, "Kokoro reads no language '" + language + "'");
    }
    for (const auto & s : ctx.phonemizer->phonemize(text, it->espeak_voice, phonemizer::IPA_TIED)) {
        std::string k = to_kokoro_symbols(s.ipa, language);
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

}  // namespace vs::kokoro
