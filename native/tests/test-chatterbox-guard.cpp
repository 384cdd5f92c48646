// Chatterbox Multilingual's sampling pieces on made-up inputs: the alignment guard (holding the
// stop token back before the text's end, forcing it on a runaway) and the logits processors'
// order and min-p.
#include <cmath>
#include <cstdio>
#include <vector>

#include "models/chatterbox/chatterbox.h"

namespace {

int failures = 0;

void check(bool ok, const char * what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what);
        ++failures;
    }
}

constexpr int32_t kStop = 9;
constexpr int64_t kText = 10;

// Attention [S] all on text position `at`.
std::vector<float> on(int64_t at) {
    std::vector<float> row(kText, 0.0f);
    row[(size_t) at] = 1.0f;
    return row;
}

using vs::chatterbox::alignment_guard;

void test_stop_held_back_until_the_end() {
    alignment_guard    guard(kText, kStop);
    std::vector<float> logits(16, 0.0f);
    guard.step(on(0), 100, logits);
    check(logits[kStop] < -30000.0f, "the stop token is held back at the text's start");
    for (int64_t t = 1; t <= kText - 3; ++t) {  // one text token a frame, to the text's end
        logits.assign(16, 0.0f);
        guard.step(on(t), (int32_t) (100 + t), logits);
    }
    check(logits[kStop] == 0.0f, "the stop token is free at the text's end");
}

void test_long_tail_forces_the_stop() {
    alignment_guard    guard(kText, kStop);
    std::vector<float> logits(16, 0.0f);
    int64_t            t = 0;
    for (; t <= kText - 3; ++t) {
        logits.assign(16, 0.0f);
        guard.step(on(t), (int32_t) (100 + t), logits);
    }
    check(logits[kStop] != 32768.0f, "no stop forced on reaching the end");
    // Attention staying on the last tokens for 5 more frames: a long tail.
    bool forced = false;
    for (int i = 0; i < 6 && !forced; ++i, ++t) {
        logits.assign(16, 0.0f);
        guard.step(on(kText - 3), (int32_t) (100 + t), logits);
        forced = logits[kStop] == 32768.0f && logits[0] == -32768.0f;
    }
    check(forced, "a long tail on the last tokens forces the stop token");
}

void test_repeated_token_forces_the_stop() {
    alignment_guard    guard(kText, kStop);
    std::vector<float> logits(16, 0.0f);
    guard.step(on(0), 100, logits);
    guard.step(on(1), 7, logits);
    logits.assign(16, 0.0f);
    guard.step(on(2), 7, logits);  // the same token fed twice in a row
    check(logits[kStop] == 32768.0f, "a token repeated forces the stop token");
}

void test_penalty_first_and_min_p() {
    vs::chatterbox::sampling s;
    s.temperature        = 1.0f;
    s.top_k              = 0;
    s.top_p              = 1.0f;
    s.min_p              = 0.5f;
    s.repetition_penalty = 4.0f;
    s.penalty_first      = true;
    // Token 0 leads until its penalty (seen before); then token 1 leads and min-p (half the
    // likeliest's probability) leaves only it: every draw is token 1.
    for (double u : { 0.0, 0.5, 0.999 }) {
        std::vector<float> logits{ 4.0f, 3.0f, 0.0f, -1.0f };
        check(vs::chatterbox::sample_token(logits, { 0 }, s, u) == 1, "penalty before min-p keeps token 1 alone");
    }
    s.penalty_first = false;  // Turbo's order: min-p first keeps token 0, which the penalty then lowers
    std::vector<float> logits{ 4.0f, 3.0f, 0.0f, -1.0f };
    check(vs::chatterbox::sample_token(logits, { 0 }, s, 0.0) == 0, "min-p before the penalty keeps token 0");
}

}  // namespace

int main() {
    test_stop_held_back_until_the_end();
    test_long_tail_forces_the_stop();
    test_repeated_token_forces_the_stop();
    test_penalty_first_and_min_p();
    if (failures) {
        std::fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    std::puts("chatterbox guard: ok");
    return 0;
}
