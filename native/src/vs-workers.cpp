// Workers: a batch's chunks divided between contexts on one device, a thread each, and their audio joined.
#include <algorithm>
#include <cstring>
#include <exception>
#include <system_error>
#include <thread>

#include "vs-context.h"
#include "vs-cuda.h"

namespace vs {

std::vector<size_t> split_runs(const std::vector<size_t> & work, size_t n_workers) {
    const size_t n = work.size(), n_runs = std::min(n, std::max<size_t>(n_workers, 1));
    // Runs of at most `most` each, closed early only where each run left needs one of the
    // chunks left.
    auto divide = [&](size_t most) {
        std::vector<size_t> start = { 0 };
        size_t              run   = 0;
        for (size_t k = 0; k < n; ++k) {
            const size_t left_runs = n_runs - start.size();
            if (k > start.back() && left_runs > 0 && (run + work[k] > most || n - k == left_runs)) {
                start.push_back(k);
                run = 0;
            }
            run += work[k];
        }
        start.push_back(n);
        return start;
    };
    auto fits = [&](size_t most) {  // whether n_runs runs of at most `most` each hold every chunk
        size_t runs = 1, run = 0;
        for (size_t w : work) {
            if (w > most) {
                return false;
            }
            if (run + w > most) {
                ++runs;
                run = 0;
            }
            run += w;
        }
        return runs <= n_runs;
    };
    size_t lo = 0, hi = 0;  // the least largest run is in (lo, hi]
    for (size_t w : work) {
        hi += w;
    }
    while (hi - lo > 1) {
        const size_t mid      = lo + (hi - lo) / 2;
        (fits(mid) ? hi : lo) = mid;
    }
    return divide(hi);
}

std::unique_ptr<float[]> join_parts(std::vector<std::vector<float>> & parts, size_t & n) {
    std::vector<size_t> at;
    n = 0;
    for (const auto & part : parts) {
        at.push_back(n);
        n += part.size();
    }
    std::unique_ptr<float[]> out(new float[std::max<size_t>(n, 1)]);
    const size_t             T =
        n < JOIN_PARALLEL_SAMPLES
                        ? 1
                        : std::min({ JOIN_MAX_THREADS, parts.size(), (size_t) std::max(1u, std::thread::hardware_concurrency()) });
    auto copy = [&](size_t t) {
        for (size_t k = t; k < parts.size(); k += T) {
            std::copy(parts[k].begin(), parts[k].end(), out.get() + at[k]);
            std::vector<float>().swap(parts[k]);
        }
    };
    std::vector<std::thread> threads;
    size_t                   started = 1;
    for (; started < T; ++started) {
        try {
            threads.emplace_back(copy, started);
        } catch (const std::system_error &) {  // no thread to be had: the rest on this one
            break;
        }
    }
    copy(0);
    for (size_t t = started; t < T; ++t) {
        copy(t);
    }
    for (std::thread & th : threads) {
        th.join();
    }
    return out;
}

}  // namespace vs

void vs_context::run_workers(size_t n, const std::function<void(size_t, vs_context &)> & fn) {
    n            = std::min(n, workers.size() + 1);
    workers_halt = false;
    halt         = &workers_halt;
    std::vector<std::exception_ptr> errors(n);
    auto                            body = [&](size_t i) {
        try {
            fn(i, i == 0 ? *this : *workers[i - 1]);
        } catch (...) {
            errors[i]    = std::current_exception();
            workers_halt = true;
        }
    };
    std::vector<std::thread> threads;
    try {
        for (size_t i = 1; i < n; ++i) {
            threads.emplace_back(body, i);
        }
    } catch (...) {  // no thread to be had: the ones started stop at their next poll
        errors[0]    = std::current_exception();
        workers_halt = true;
    }
    if (!errors[0]) {
        body(0);
    }
    for (std::thread & t : threads) {
        t.join();
    }
    halt = nullptr;
    // The first error that is not another's halt; all of them halts: the caller's abort.
    std::exception_ptr first;
    for (const std::exception_ptr & e : errors) {
        if (!e) {
            continue;
        }
        try {
            std::rethrow_exception(e);
        } catch (const vs::error & err) {
            if (err.status != VS_ERR_ABORTED) {
                throw;
            }
        } catch (...) {
            throw;
        }
        if (!first) {
            first = e;
        }
    }
    if (first) {
        std::rethrow_exception(first);
    }
}

void vs_context::absorb(vs_context & worker, bool last) {
    for (int s = 0; s < VS_STAGE_COUNT; ++s) {
        timings.stage_ms[s] += worker.timings.stage_ms[s];
        fallback_ops[s].insert(worker.fallback_ops[s].begin(), worker.fallback_ops[s].end());
    }
    timings.n_phoneme_ids += worker.timings.n_phoneme_ids;
    timings.n_frames += worker.timings.n_frames;
    timings.n_graphs_built += worker.timings.n_graphs_built;
    timings.n_graphs_reused += worker.timings.n_graphs_reused;
    timings.n_captures_replayed += worker.timings.n_captures_replayed;
    for (const auto & [key, st] : worker.op_profile) {
        op_profile[key].count += st.count;
        op_profile[key].ms += st.ms;
    }
    worker.op_profile.clear();
    for (auto & d : worker.chunk_durations) {
        chunk_durations.push_back(std::move(d));
    }
    worker.chunk_durations.clear();
    if (last) {
        // The worker's buffers are its own: its device outputs are copied on the device into
        // this context's kept_outputs (read back only if asked for, as this context's own),
        // and waited for, since another thread may ask.
        outputs = std::move(worker.outputs);
        device_outputs.clear();
        vs::scratch_layout  layout;
        std::vector<size_t> at;
        for (const auto & [name, d] : worker.device_outputs) {
            at.push_back(layout.reserve(sizeof(float) * (size_t) (d.rows * d.cols)));
        }
        if (layout.bytes > 0) {
            auto * dst = static_cast<uint8_t *>(vs::grown(*this, kept_outputs, layout.bytes, "named outputs"));
            size_t k   = 0;
            for (const auto & [name, d] : worker.device_outputs) {
                const auto * src = static_cast<const uint8_t *>(ggml_backend_buffer_get_base(d.buf->get()));
                vs::cuda::copy(cuda_device, dst + at[k], src + d.offset, sizeof(float) * (size_t) (d.rows * d.cols));
                set_device_output(name, kept_outputs, at[k++], d.rows, d.cols);
            }
            vs::cuda::synchronize(cuda_device);
        }
    }
    worker.clear_results();
}
