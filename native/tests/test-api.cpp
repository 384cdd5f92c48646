// The C API's contract at its boundary: status codes, error text, cancellation.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "voicestudio.h"

static int failures = 0;

#define EXPECT(cond)                                         \
    do {                                                     \
        if (!(cond)) {                                       \
            printf("FAILED line %d: %s\n", __LINE__, #cond); \
            ++failures;                                      \
        }                                                    \
    } while (0)

int main() {
    vs_model * model = nullptr;
    EXPECT(vs_model_load("/nonexistent/voice.gguf", vs_model_default_params(), &model) == VS_ERR_IO);
    EXPECT(model == nullptr);
    EXPECT(std::strstr(vs_last_error(), "/nonexistent/voice.gguf") != nullptr);
    EXPECT(vs_model_load(nullptr, vs_model_default_params(), &model) == VS_ERR_INVALID_ARG);

    EXPECT(vs_device_count() >= 1);
    vs_device_info info;
    EXPECT(vs_device_get(0, &info) == VS_OK);
    EXPECT(vs_device_get(-1, &info) == VS_ERR_INVALID_ARG);
    EXPECT(std::strcmp(vs_stage_name(VS_STAGE_DECODER), "decoder") == 0);

    // With a real voice (VS_TEST_MODEL), loading can be cancelled and phonemes synthesized.
    const char * path = std::getenv("VS_TEST_MODEL");
    if (path) {
        vs_model_params mp = vs_model_default_params();
        mp.progress        = [](float, void *) { return false; };
        EXPECT(vs_model_load(path, mp, &model) == VS_ERR_ABORTED);
        EXPECT(vs_model_load(path, vs_model_default_params(), &model) == VS_OK);

        vs_context_params cp = vs_context_default_params();
        cp.device            = "no-such-device";
        vs_context * ctx     = nullptr;
        EXPECT(vs_context_init(model, cp, &ctx) == VS_ERR_DEVICE);
        cp.device    = "cpu";
        cp.n_threads = 2;
        EXPECT(vs_context_init(model, cp, &ctx) == VS_OK);

        vs_audio * audio = nullptr;
        EXPECT(vs_synthesize(ctx, "hello", VS_INPUT_TEXT, vs_synth_default_params(), &audio) == VS_ERR_PHONEMIZER);
        EXPECT(vs_synthesize(ctx, "həlˈoʊ.", VS_INPUT_PHONEMES, vs_synth_default_params(), &audio) == VS_OK);
        EXPECT(audio && vs_audio_length(audio) > 0 && vs_audio_sample_rate(audio) == vs_model_sample_rate(model));
        vs_audio_free(audio);

        vs_synth_params sp = vs_synth_default_params();
        sp.abort           = [](void *) { return true; };
        EXPECT(vs_synthesize(ctx, "həlˈoʊ.", VS_INPUT_PHONEMES, sp, &audio) == VS_ERR_ABORTED);
        vs_context_free(ctx);
        vs_model_free(model);
    } else {
        printf("VS_TEST_MODEL not set: model checks skipped\n");
    }
    printf("%s\n", failures == 0 ? "api ok" : "api FAILED");
    return failures == 0 ? 0 : 1;
}
