// The C API's contract at its boundary: status codes, error text, cancellation.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "voicestudio.h"
#include "vs-context.h"

static int failures = 0;

#define EXPECT(cond)                                         \
    do {                                                     \
        if (!(cond)) {                                       \
            printf("FAILED line %d: %s\n", __LINE__, #cond); \
            ++failures;                                      \
        }                                                    \
    } while (0)

// The least largest run of any division of `work` into `runs` non-empty consecutive runs,
// by trying every one.
static size_t best_largest_run(const std::vector<size_t> & work, size_t first, size_t runs) {
    size_t best = SIZE_MAX, run = 0;
    if (runs == 1) {
        for (size_t k = first; k < work.size(); ++k) {
            run += work[k];
        }
        return run;
    }
    for (size_t end = first + 1; work.size() - end >= runs - 1; ++end) {  // the first run is [first, end)
        run += work[end - 1];
        best = std::min(best, std::max(run, best_largest_run(work, end, runs - 1)));
    }
    return best;
}

// A batch divided between workers: every chunk in one non-empty run, in order, and the
// largest run as small as any division makes it.
static void test_split_runs() {
    EXPECT((vs::split_runs({ 5 }, 4) == std::vector<size_t>{ 0, 1 }));
    EXPECT((vs::split_runs({ 3, 3, 3 }, 1) == std::vector<size_t>{ 0, 3 }));
    // Closing each run once it held its share (a third: 33) gave runs of 60, 10 and 30.
    EXPECT((vs::split_runs({ 10, 10, 40, 10, 10, 10, 10 }, 3) == std::vector<size_t>{ 0, 2, 3, 7 }));
    std::mt19937 rng(7);
    for (int trial = 0; trial < 2000; ++trial) {
        std::vector<size_t> work(1 + rng() % 9);
        for (size_t & w : work) {
            w = rng() % 4 == 0 ? 0 : 1 + rng() % 60;
        }
        const size_t        workers = 1 + rng() % 5, runs = std::min(work.size(), workers);
        std::vector<size_t> start   = vs::split_runs(work, workers);
        bool                ok      = start.size() == runs + 1 && start.front() == 0 && start.back() == work.size();
        size_t              largest = 0;
        for (size_t r = 0; ok && r < runs; ++r) {
            ok         = start[r] < start[r + 1];
            size_t run = 0;
            for (size_t k = start[r]; k < start[r + 1]; ++k) {
                run += work[k];
            }
            largest = std::max(largest, run);
        }
        EXPECT(ok && largest == best_largest_run(work, 0, runs));
        if (!ok || largest != best_largest_run(work, 0, runs)) {
            break;
        }
    }
}

int main() {
    test_split_runs();

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
