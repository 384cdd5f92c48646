// A call's inputs through a context's voice: their chunks batched, divided between the
// context's workers, each take's audio joined.
#pragma once

#include <memory>
#include <vector>

#include "vs-context.h"

// A take's samples: its one chunk's vector, moved in, or its chunks joined (vs::join_parts).
struct vs_audio {
    std::vector<float>       samples;
    std::unique_ptr<float[]> joined;
    size_t                   n_joined    = 0;
    int                      sample_rate = 0;

    const float * data() const { return joined ? joined.get() : samples.data(); }

    size_t size() const { return joined ? n_joined : samples.size(); }
};

namespace vs {

// Every input's chunks (sentences) through the voice, `params.batch` at a time across the
// inputs; audio[i] gets input i's. Chunks are numbered across all inputs, in order.
void synthesize_inputs(vs_context * ctx, const std::vector<const char *> & inputs, int kind,
                       const vs_synth_params & params, std::vector<std::unique_ptr<vs_audio>> & audio);

}  // namespace vs
