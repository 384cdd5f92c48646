// The reference's logits processors (Hugging Face's warpers as Chatterbox-Turbo and Multilingual
// chain them) and the draw of one token.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "chatterbox.h"

namespace vs::chatterbox {

namespace {

// RepetitionPenaltyLogitsProcessor: a token seen before has its logit divided by the penalty
// where positive, multiplied where negative.
void penalize(std::vector<float> & logits, const std::vector<int32_t> & history, float penalty) {
    if (penalty == 1.0f) {
        return;
    }
    std::vector<int32_t> seen = history;
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) {
        if (id >= 0 && (size_t) id < logits.size()) {
            float & x = logits[(size_t) id];
            x         = x < 0.0f ? x * penalty : x / penalty;
        }
    }
}

int32_t argmax(const std::vector<float> & v) {
    return (int32_t) (std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

int32_t sample_token(std::vector<float> & logits, const std::vector<int32_t> & history, const sampling & s, double u) {
    const size_t V = logits.size();
    if (s.temperature <= 0.0f) {
        penalize(logits, history, s.repetition_penalty);
        return argmax(logits);
    }
    if (s.penalty_first) {
        penalize(logits, history, s.repetition_penalty);
    }
    if (s.temperature != 1.0f) {  // TemperatureLogitsWarper
        for (float & x : logits) {
            x /= s.temperature;
        }
    }
    if (s.top_k > 0 && (size_t) s.top_k < V) {  // TopKLogitsWarper: below the k-th largest goes
        std::vector<float> sorted = logits;
        std::nth_element(sorted.begin(), sorted.begin() + (s.top_k - 1), sorted.end(), std::greater<float>());
        const float kth = sorted[(size_t) (s.top_k - 1)];
        for (float & x : logits) {
            if (x < kth) {
                x = -INFINITY;
            }
        }
    }
    if (s.min_p > 0.0f) {  // MinPLogitsWarper: below min_p times the likeliest token's probability goes
        const float mx    = *std::max_element(logits.begin(), logits.end());
        const float floor = mx + std::log(s.min_p);  // p_i < min_p p_max  <=>  x_i < x_max + log(min_p)
        for (float & x : logits) {
            if (x < floor) {
                x = -INFINITY;
            }
        }
    }
    if (s.top_p < 1.0f) {  // TopPLogitsWarper: the least likely tokens whose mass is <= 1 - top_p go
        std::vector<size_t> order(V);
        std::iota(order.begin(), order.end(), size_t(0));
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] < logits[b]; });
        const float mx  = logits[order.back()];
        double      sum = 0.0;
        for (float x : logits) {
            sum += std::exp((double) x - mx);
        }
        double cum = 0.0;
        for (size_t i = 0; i + 1 < V; ++i) {  // the most likely token always stays
            float & x = logits[order[i]];
            cum += std::exp((double) x - mx) / sum;
            if (cum <= 1.0 - (double) s.top_p) {
                x = -INFINITY;
            } else {
                break;
            }
        }
    }
    if (!s.penalty_first) {
        penalize(logits, history, s.repetition_penalty);
    }
    const float mx  = *std::max_element(logits.begin(), logits.end());
    double      sum = 0.0;
    for (float x : logits) {
        sum += std::exp((double) x - mx);
    }
    const double target = u * sum;
    double       cum    = 0.0;
    int32_t      last   = argmax(logits);
    for (size_t i = 0; i < V; ++i) {
        const double w = std::exp((double) logits[i] - mx);
        if (w == 0.0) {
            continue;
        }
        cum += w;
        last = (int32_t) i;
        if (cum > target) {
            break;
        }
    }
    return last;
}

}  // namespace vs::chatterbox
