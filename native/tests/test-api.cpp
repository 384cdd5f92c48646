// The C API's contract at its boundary: status codes, error text, cancellation.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
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

// A take's chunks joined: every sample in order, each part emptied, below and above the size
// from which the join is divided between threads (parts of unlike lengths, some empty).
static void test_join_parts() {
    std::mt19937 rng(11);
    for (size_t total : { size_t(1000), vs::JOIN_PARALLEL_SAMPLES + 12345, 3 * vs::JOIN_PARALLEL_SAMPLES }) {
        for (size_t n_parts : { size_t(1), size_t(3), size_t(50) }) {
            std::vector<std::vector<float>> parts(n_parts);
            std::vector<float>              want;
            for (size_t k = 0; k < n_parts; ++k) {
                const size_t len =
                    k + 1 == n_parts ? total - want.size() : (k % 7 == 3 ? 0 : rng() % (2 * total / n_parts));
                for (size_t i = 0; i < len && want.size() < total; ++i) {
                    parts[k].push_back((float) rng());
                    want.push_back(parts[k].back());
                }
            }
            size_t                   n   = 0;
            std::unique_ptr<float[]> got = vs::join_parts(parts, n);
            bool                     ok  = n == want.size() && std::equal(want.begin(), want.end(), got.get());
            for (const auto & part : parts) {
                ok = ok && part.empty() && part.capacity() == 0;
            }
            EXPECT(ok);
        }
    }
}

// Graphs kept in shared memory (vs_context::stage_graph with `shared`): one buffer, the
// largest graph's, that each uses while it runs. Each graph must give its own results run
// after the others; one that needs more than the buffer drops the others first (their
// memory is about to be freed); one that needs more than a quarter of the kept limit is run
// in memory of its own and not kept; dropping the last frees the buffer.
static void test_shared_graphs() {
    vs_context c;
    c.backend.reset(ggml_backend_cpu_init());
    c.dev         = ggml_backend_get_device(c.backend.get());
    c.keep_graphs = true;
    // y = x * k + n for a graph of n values; x = 0, 1, 2, ...
    auto run = [&](const std::string & key, int64_t n, float k) {
        vs::stage_graph & sg = c.stage_graph(
            VS_STAGE_GENERATOR, key,
            [&](ggml_context * g, ggml_cgraph * gf) {
                ggml_tensor * x = ggml_new_tensor_1d(g, GGML_TYPE_F32, n);
                ggml_set_input(x);
                ggml_tensor * y = ggml_scale_bias(g, ggml_sqr(g, ggml_sqrt(g, x)), k, (float) n);
                ggml_set_output(y);
                ggml_build_forward_expand(gf, y);
                return std::vector<ggml_tensor *>{ x, y };
            },
            64, true);
        std::vector<float> x((size_t) n), y((size_t) n);
        for (int64_t i = 0; i < n; ++i) {
            x[(size_t) i] = (float) i;
        }
        c.set_input(sg.t[0], x.data());
        c.compute(sg);
        ggml_backend_tensor_get(sg.t[1], y.data(), 0, sizeof(float) * y.size());
        bool ok = true;
        for (int64_t i = 0; i < n; ++i) {
            ok = ok && std::fabs(y[(size_t) i] - ((float) i * k + (float) n)) <= 1e-3f * (float) (i + n);
        }
        return ok;
    };
    auto built = [&] { return c.timings.n_graphs_built; };

    EXPECT(run("a", 1000, 2.0f) && run("c", 500, 3.0f));
    const size_t one = c.shared_bytes;
    EXPECT(one > 0 && c.kept.count("a") && c.kept.count("c") && c.kept_bytes == one);
    int32_t before = built();
    EXPECT(run("a", 1000, 2.0f) && run("c", 500, 3.0f) && run("a", 1000, 2.0f));  // each again, in turn
    EXPECT(built() == before && c.shared_bytes == one && c.kept["a"]->shared && !c.kept["a"]->alloc);

    EXPECT(run("b", 8000, 0.5f));  // more than the buffer: the others dropped first
    EXPECT(c.kept.count("b") && !c.kept.count("a") && !c.kept.count("c"));
    EXPECT(c.shared_bytes > one && c.kept_bytes == c.shared_bytes);
    EXPECT(run("a", 1000, 2.0f) && run("b", 8000, 0.5f));  // built again, in the larger buffer
    EXPECT(c.shared_bytes > one && c.kept.size() == 2);

    c.kept_limit = 4 * (c.shared_bytes - 1);  // b is now over a quarter of it
    c.drop_shared_graphs();
    EXPECT(c.kept.empty() && !c.shared_alloc && c.shared_bytes == 0 && c.kept_bytes == 0);
    before = built();
    EXPECT(run("b", 8000, 0.5f) && run("b", 8000, 0.5f));  // too large to keep: built each time
    EXPECT(built() == before + 2 && c.kept.empty() && c.kept_bytes == 0);
    EXPECT(run("a", 1000, 2.0f) && c.kept.count("a"));
}

int main() {
    test_split_runs();
    test_join_parts();
    test_shared_graphs();

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
        cp.device = "cpu";
        for (int threads : { -5, 100000 }) {  // outside 0 .. the CPUs: refused, not a crash in the thread pool
            cp.n_threads = threads;
            EXPECT(vs_context_init(model, cp, &ctx) == VS_ERR_INVALID_ARG && ctx == nullptr);
        }
        cp.n_threads = 2;
        EXPECT(vs_context_init(model, cp, &ctx) == VS_OK);

        uint64_t digest = 0, again = 0;
        EXPECT(vs_file_digest(path, &digest) == VS_OK && vs_file_digest(path, &again) == VS_OK && digest == again);
        EXPECT(vs_file_digest("/no/such/file", &digest) == VS_ERR_IO);

        vs_audio * audio = nullptr;
        EXPECT(vs_synthesize(ctx, "hello", VS_INPUT_TEXT, vs_synth_default_params(), &audio) == VS_ERR_PHONEMIZER);
        EXPECT(vs_synthesize(ctx, "həlˈoʊ.", VS_INPUT_PHONEMES, vs_synth_default_params(), &audio) == VS_OK);
        EXPECT(audio && vs_audio_length(audio) > 0 && vs_audio_sample_rate(audio) == vs_model_sample_rate(model));
        vs_audio_free(audio);

        vs_synth_params nan_speed = vs_synth_default_params();
        nan_speed.length_scale    = NAN;
        EXPECT(vs_synthesize(ctx, "həlˈoʊ.", VS_INPUT_PHONEMES, nan_speed, &audio) == VS_ERR_INVALID_ARG);

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
