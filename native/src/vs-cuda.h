// Kernels of the engine's own for CUDA devices, where ggml would run a stage as a long
// chain of tiny kernels: an LSTM's recurrence is one kernel for all of its steps, where
// as ggml ops it is about ten launches a step; a residual block's AdaIN, Snake and
// convolution are four kernels and cuBLAS, where as ggml ops they are about fifteen
// passes over the activation. Built when ggml has its CUDA backend; elsewhere
// vs::cuda::device_of() is -1 and the stages keep their ggml graphs.
#pragma once

#include <ggml-backend.h>
#include <ggml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace vs::chatterbox {
struct nsf_params;
}

namespace vs::cuda {

// The CUDA ordinal of `dev` when it is a CUDA device and this build has the kernels, else -1.
int device_of(ggml_backend_dev_t dev);

// Whether lstm() takes recurrent weights of this type and hidden size.
bool lstm_supported(ggml_type type, int64_t H);

// Whether lstm() on `device` runs one cluster of blocks a column (H = 256 on sm_90 and later,
// where the build has code for it: the weights in registers) rather than one block a column.
bool lstm_uses_clusters(int device, ggml_type type, int64_t H);

// Device memory lstm() needs for n steps over `cols` columns.
size_t lstm_scratch_bytes(int64_t H, int64_t n, int64_t cols);

// n steps of LSTMs over `cols` independent columns; column j uses direction j % D of the
// weights. Pointers marked (dev) are device memory of CUDA device `device`:
//   gx    (dev) [4H, stride, cols] F32: the steps' input projections plus bias, in step order
//         (a column's first n of its stride >= n steps)
//   w_hh  (dev) [H, 4H, D] F16 or F32: recurrent weights, gate rows i, f, g, o
//   h, c  (host) [H, cols]: the state before the first step, replaced by the one after the last;
//         both null: zeros before, and the state after is not read back (two transfers each
//         fewer, where a sequence's steps are one call's)
//   out   (host) [H, cols, n]: every step's hidden state; null: left in the scratch, where
//         the returned pointer (dev) has them, for lstm_gather
//   scratch (dev) lstm_scratch_bytes()
// Synchronous, except with `out`, h and c all null: then the kernel is queued on the calling
// thread's stream, as snake_stack(), for lstm_gather (called from the same thread). Throws
// vs::error(VS_ERR_COMPUTE) when CUDA reports an error.
const float * lstm(int device, const float * gx, const void * w_hh, ggml_type type, int64_t H, int64_t n,
                   int64_t stride, int64_t cols, int64_t D, float * h, float * c, float * out, void * scratch);

// A sequence's frames out of lstm()'s output left on the device, into a tensor [D * H, frames]
// (frame-major, device memory): frame t < steps holds direction 0's step t, then direction
// 1's step steps - 1 - t (a bidirectional LSTM's output); the frames after, zeros.
struct lstm_span {
    int64_t column = 0;  // the sequence's direction-0 column (direction d's is column + d)
    int64_t steps  = 0;
    int64_t frames = 0;  // >= steps
    float * dst    = nullptr;
};

// Writes each span from out (dev) [H, cols, n]; queued as snake_stack().
void lstm_gather(int device, const float * out, int64_t H, int64_t cols, int64_t D, const lstm_span * spans,
                 size_t n_spans);

// ---------------------------------------------------------------- Snake residual stacks
//
// iSTFTNet's AdaINResBlock1 (Kokoro's generator): for each pair of convolutions,
//   y = conv1(Snake1(AdaIN1(x))),  x += conv2(Snake2(AdaIN2(y)))
// with AdaIN an instance norm over time (per channel, eps 1e-5) and the style's affine,
// Snake(u) = u + sin^2(alpha u) / alpha, and C -> C convolutions of odd kernel K ("same"
// padding, dilation d). Activations are [T, C] F16 with the channel fastest (ggml's [C, T]):
// x, the residual, and y, each pair's middle; the statistics, the affine and Snake are taken
// in F32, and the GEMMs accumulate in F32 and round their sums onto x or into y once. Every
// pass over the activations is bound by memory bandwidth, and F16 halves its bytes.
// Snake's output goes to the GEMMs as F16 in the dilation's phases (frames q, q + d, ...
// of the padded input one after another), so that each tap window is a plain strided
// matrix and each of cuBLAS's batched GEMMs writes its outputs in time order (onto the
// residual for a pair's second convolution). The convolutions' biases are added once a stack
// (see snake_stack in the .cu).

struct snake_conv {
    const float * scale    = nullptr;  // (dev) [C]: the AdaIN's 1 + gamma
    const float * shift    = nullptr;  // (dev) [C]: its beta
    const float * alpha    = nullptr;  // (dev) [C]
    const void *  w        = nullptr;  // (dev) [C, K, C] F16: input channel fastest, then tap, then output channel
    const float * bias     = nullptr;  // (dev) [C]
    int           dilation = 1;
};

// A batch's sentences packed along time: n segments of x, segment s its frames
// [range[2 s], range[2 s] + range[2 s + 1]), each followed by frames of no segment (gaps),
// at least as many as the widest convolution pads. Each segment's AdaINs take their
// statistics over its own frames and their affines from its own style (scale and shift
// `style_stride` floats on from the previous segment's); Snake's output is zero in the gaps,
// so that each segment's convolutions read the zeros they read alone. The gaps end up
// holding what the convolutions spill there. The default: one segment, all of x. One
// segment with a range and no frame map: x's frames outside the range are a gap, so that
// a sentence's stacks can run at a length it is rounded up to (snake_bucket) while its
// length is device memory, set before each run.
struct snake_segments {
    int         n            = 1;
    const int * range        = nullptr;  // (dev) [n][2]: first frame, frame count
    const int * frame        = nullptr;  // (dev) [T]: each frame's segment, -1 in the gaps (n > 1)
    int64_t     style_stride = 0;
};

// Whether snake_stack() takes C channels and kernel size K.
bool snake_supported(int64_t C, int K);

// Frames the activations given to snake_stack() must have room for (T and more: the
// GEMMs write whole tap windows), and the device memory it needs as scratch, for that many
// segments (a packed batch rounds its windows more finely than one sentence).
int64_t snake_frames(int64_t T, int K, const int * dilations, int n, int segments = 1);
size_t  snake_scratch_bytes(int64_t C, int64_t T, int K, const int * dilations, int n, int segments = 1);

// The most frames that snake_stack() over one segment runs with the kernel shapes of T
// frames (the GEMMs' windows are rounded up to a power of two), for each of the kernel
// sizes Ks and dilations: a sentence's stacks run at that length, its own length masked
// (snake_segments), run the same launches as every other sentence of that bucket.
int64_t snake_bucket(int64_t T, const int * Ks, int n_K, const int * dilations, int n);

// cuBLAS for the calling context (made on first use; null until then), and its release.
void * blas_create(int device);
void   blas_destroy(void * blas);

// n_pairs pairs of convolutions (convs[2 i], convs[2 i + 1]) over x (dev) [T, C] F16, in place;
// x has room for snake_frames() frames; scratch has snake_scratch_bytes() for seg.n
// segments. Queued on the calling thread's stream: ggml's graphs read the result once they
// are ordered after it (record(), as vs_context does) or after synchronize(). Throws
// vs::error(VS_ERR_COMPUTE) on a CUDA or cuBLAS error.
void snake_stack(int device, void * blas, void * x_f16, int64_t C, int64_t T, int K, const snake_conv * convs,
                 int n_pairs, void * scratch, const snake_segments & seg = {});

// ---------------------------------------------------------------- LeakyReLU residual stacks
//
// HiFi-GAN's ResBlock2 (Piper's decoder): for each convolution in turn,
//   x += conv(LeakyReLU(x) * mask) + bias
// with C -> C convolutions of odd kernel K ("same" padding, dilation d) and weights as
// snake_conv's. mask (dev) [T] is 1 on the frames of a batch's sentences and 0 in the gaps
// between them (null: 1 everywhere), so that each sentence reads the zeros it reads alone;
// frames outside the mask end up holding what the convolutions spill there, which the
// caller masks. x (dev) [T, C] has room for snake_frames() frames. Queued as snake_stack().

struct leaky_conv {
    const void *  w        = nullptr;  // (dev) [C, K, C] F16
    const float * bias     = nullptr;  // (dev) [C]
    int           dilation = 1;
};

size_t leaky_scratch_bytes(int64_t C, int64_t T, int K, const int * dilations, int n);
void   leaky_stack(int device, void * blas, float * x, int64_t C, int64_t T, int K, const leaky_conv * convs, int n,
                   float slope, const float * mask, void * scratch);

// HiFi-GAN's output layer (Piper's conv_post, C -> 1, odd kernel K, no bias, "same" padding):
// out (dev) [T] = tanh(conv(LeakyReLU(x) * mask)), x (dev) [T, C], w (dev) [C, K] F32 (input
// channel fastest), mask (dev) [T] or null. Queued as snake_stack().
bool leaky_conv_tanh_supported(int64_t C, int K);
void leaky_conv_tanh(int device, const float * x, int64_t C, int64_t T, int K, float slope, const float * mask,
                     const float * w, float * out);
// Host memory to the device, queued as snake_stack() (the host's copy may go at return).
void upload(int device, void * dst, const void * host, size_t bytes);
// Device memory to the host, after the calling thread's queued work (synchronous).
void download(int device, void * host, const void * src, size_t bytes);

// sum = (sum + x) * scale over n floats (dev); queued as snake_stack().
void accumulate(int device, float * sum, const float * x, int64_t n, float scale);
// accumulate over n F16 values (snake_stack's activations), summed as floats: x may be null
// (sum * scale), and with `out` (F32) the result goes there instead of into sum.
void accumulate_f16(int device, void * sum, const void * x, int64_t n, float scale, float * out = nullptr);
// A stack's input from a graph's output: dst (dev) [T, C] F16 = a (F32) + b (F16; null: a
// alone) on the frames of seg's segments (or its range; all T frames by default), zeros in
// the gaps between them, whatever a and b hold there. Queued as snake_stack().
void stack_input(int device, void * dst, const float * a, const void * b, int64_t C, int64_t T,
                 const snake_segments & seg = {});
void copy(int device, void * dst, const void * src, size_t bytes);
// bytes of zeros at dst (dev); queued as snake_stack().
void clear(int device, void * dst, size_t bytes);
// n values of standard normal noise stream `key` times `scale` into out (dev), each as the
// host draws it (gaussian_pair in vs-impl.h, to the last bits of the float functions);
// queued as snake_stack().
void gaussian(int device, uint64_t key, float * out, int64_t n, float scale);

// HiFT's excitation (chatterbox::nsf_sample), a thread a sample: `frames` frames of f0 (host
// [frames]) from each frame's cycles before it (host [frames, p.n]) into out (host [frames *
// p.per]), after the calling thread's queued work (synchronous).
void nsf_source(int device, const chatterbox::nsf_params & p, const float * f0, const double * start, int64_t frames,
                float * out);

// Waits for the calling thread's queued work; throws vs::error(VS_ERR_COMPUTE) on an error.
void synchronize(int device);

// ggml queues a graph on its backend's own stream, the engine on the calling thread's.
// vs_context orders the two with CUDA events (ggml's events' cudaEvent_t), so that neither
// waits on the host: record() marks the calling thread's work queued so far, wait() makes its
// later work wait for an event ggml recorded. queued() counts the calling thread's calls
// above that queue work (not download() or synchronize(), done when they return): where it
// has not moved since a record(), there is nothing new to wait for.
void     record(int device, void * event);
void     wait(int device, void * event);
uint64_t queued();

// ---------------------------------------------------------------- Captured launches
//
// A sentence's residual stacks are a few hundred small launches (kernels, cuBLAS's GEMMs,
// copies): launching them one by one takes the host longer than the device takes to run
// them. launch_cache runs such a sequence as it is the first time its key comes, captures
// it as a CUDA graph the second time and replays that graph after. The sequence must be
// queued on the calling thread's stream with nothing synchronous in it (its host inputs
// uploaded before), and under one key read and write the same device memory with the same
// launches every time: the key names its shapes, and the caller clears the cache when the
// memory it uses moves. Keys seen last longest ago go first past `limit` (captured or only
// seen). Not thread-safe: a context's.
class launch_cache {
  public:
    explicit launch_cache(size_t limit = 64) : limit_(limit) {}
    ~launch_cache() { clear(); }
    launch_cache(const launch_cache &)             = delete;
    launch_cache & operator=(const launch_cache &) = delete;

    // Queues `queue`'s launches on `device` under `key`: run, captured and replayed, or
    // replayed (then true). Throws vs::error(VS_ERR_COMPUTE) on a CUDA error (a capture
    // under way ended and dropped) and whatever `queue` throws.
    bool run(int device, const std::string & key, const std::function<void()> & queue);
    // Drops every capture (before the memory they use moves or goes).
    void   clear();
    size_t captured() const;

  private:
    struct entry {
        void *   exec = nullptr;  // cudaGraphExec_t once captured
        uint64_t used = 0;
    };
    std::map<std::string, entry> entries_;
    uint64_t                     clock_ = 0;
    size_t                       limit_;
};

}  // namespace vs::cuda
