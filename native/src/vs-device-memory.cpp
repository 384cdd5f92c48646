// A context's device memory: inputs staged through pinned memory, scratch and handoff buffers, outputs left on the
// device, and the order of its work on CUDA.
#include <cstring>

#include "vs-context.h"
#include "vs-cuda.h"

// ggml's event as ggml-backend-impl.h (not an installed header) lays it out: on a CUDA device
// its context is the cudaEvent_t, which the engine's stream records and waits for
// (vs::cuda::record, wait).
struct ggml_event_layout {
    ggml_backend_dev_t device;
    void *             context;
};

void * vs::cuda_event(ggml_backend_event_t e, ggml_backend_dev_t dev) {
    const auto * l = reinterpret_cast<const ggml_event_layout *>(e);
    return e && l->device == dev ? l->context : nullptr;
}

void vs_context::after_engine() {
    if (cuda_device < 0 || vs::cuda::queued() == engine_seen) {
        return;
    }
    engine_seen = vs::cuda::queued();
    if (void * e = vs::cuda_event(engine_done.get(), dev)) {
        vs::cuda::record(cuda_device, e);
        ggml_backend_event_wait(backend.get(), engine_done.get());
    } else {
        vs::cuda::synchronize(cuda_device);
    }
}

void vs_context::drain() {
    if (cuda_device < 0 || !backend) {
        return;
    }
    ggml_backend_synchronize(backend.get());
    vs::cuda::synchronize(cuda_device);
    staged      = 0;
    engine_seen = UINT64_MAX;  // the next graph orders itself after whatever the engine queues next
}

void vs_context::set_input(ggml_tensor * t, const void * data, size_t offset, size_t bytes) {
    bytes                           = bytes == SIZE_MAX ? ggml_nbytes(t) - offset : bytes;
    const ggml_backend_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
    ggml_backend_buffer_type_t  pinned =
        cuda_device >= 0 && staging_min > 0 ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
    if (!pinned || !buf || ggml_backend_buffer_is_host(buf) || bytes == 0) {
        ggml_backend_tensor_set(t, data, offset, bytes);
        return;
    }
    const size_t need = (bytes + 255) & ~(size_t) 255;
    if (!staging || staged + need > ggml_backend_buffer_get_size(staging.get())) {
        ggml_backend_synchronize(backend.get());  // what is staged there has been copied
        staged = 0;
        if (!staging || need > ggml_backend_buffer_get_size(staging.get())) {
            staging.reset();
            staging.reset(ggml_backend_buft_alloc_buffer(pinned, std::max(need, staging_min)));
        }
        if (!staging) {
            ggml_backend_tensor_set(t, data, offset, bytes);
            return;
        }
    }
    auto * p = static_cast<uint8_t *>(ggml_backend_buffer_get_base(staging.get())) + staged;
    std::memcpy(p, data, bytes);
    staged += need;
    after_engine();  // the engine may still read or write t's memory
    ggml_backend_tensor_set_async(backend.get(), t, p, offset, bytes);
}

void * vs::grown(vs_context & c, vs::buffer_ptr & buf, size_t bytes, const char * what) {
    if (!buf || ggml_backend_buffer_get_size(buf.get()) < bytes) {
        c.drain();  // the device may still use the old one
        if (buf && (&buf == &c.scratch || &buf == &c.handoff)) {
            c.drop_shared_graphs();  // while what they read and write is there
        }
        buf.reset();  // the old one first: only one is ever held
        buf.reset(ggml_backend_buft_alloc_buffer(ggml_backend_get_default_buffer_type(c.backend.get()), bytes));
        if (!buf) {
            throw vs::error(VS_ERR_COMPUTE, "out of device memory on " + c.device + " (" + std::to_string(bytes >> 20) +
                                                " MiB of " + what + ")");
        }
        ggml_backend_buffer_clear(buf.get(), 0);  // what is read before it is written is zeros, not NaNs
    }
    return ggml_backend_buffer_get_base(buf.get());
}

// A new F32 tensor [ne0, ne1] of graph context g at `offset` bytes into buf.
static ggml_tensor * tensor_in(vs_context & c, const vs::buffer_ptr & buf, ggml_context * g, size_t offset, int64_t ne0,
                               int64_t ne1, const char * what) {
    ggml_tensor * t = ggml_new_tensor_2d(g, GGML_TYPE_F32, ne0, ne1);
    if (!buf || offset + ggml_nbytes(t) > ggml_backend_buffer_get_size(buf.get()) ||
        ggml_backend_tensor_alloc(buf.get(), t,
                                  static_cast<uint8_t *>(ggml_backend_buffer_get_base(buf.get())) + offset) !=
            GGML_STATUS_SUCCESS) {
        throw vs::error(VS_ERR_COMPUTE, std::string("a tensor outside the device ") + what + " on " + c.device);
    }
    return t;
}

bool vs::in_device_memory(const vs_context & c, const ggml_tensor * t) {
    return t->buffer && ggml_backend_buffer_get_type(t->buffer) == ggml_backend_dev_buffer_type(c.dev) &&
           !ggml_backend_buffer_is_host(t->buffer) && ggml_is_contiguous(t);
}

void * vs_context::device_scratch(size_t bytes) {
    return vs::grown(*this, scratch, bytes, "scratch");
}

ggml_tensor * vs_context::scratch_tensor(ggml_context * g, size_t offset, int64_t ne0, int64_t ne1) {
    return tensor_in(*this, scratch, g, offset, ne0, ne1, "scratch");
}

// The named outputs left in `buf`, which is about to be written.
static void drop_outputs_in(vs_context & c, const vs::buffer_ptr & buf) {
    for (auto it = c.device_outputs.begin(); it != c.device_outputs.end();) {
        it = it->second.buf == &buf ? c.device_outputs.erase(it) : std::next(it);
    }
}

void * vs_context::device_handoff(size_t bytes) {
    drop_outputs_in(*this, handoff);
    return vs::grown(*this, handoff, bytes, "stage handoff");
}

ggml_tensor * vs_context::handoff_tensor(ggml_context * g, size_t offset, int64_t ne0, int64_t ne1) {
    return tensor_in(*this, handoff, g, offset, ne0, ne1, "stage handoff");
}

void * vs_context::blas() {
    if (!cuda_blas) {
        cuda_blas = vs::cuda::blas_create(cuda_device);
    }
    return cuda_blas;
}

bool vs_context::fused_lstm(const ggml_tensor * w_hh, int64_t H) const {
    return cuda_device >= 0 && vs::cuda::lstm_supported(w_hh->type, H) && w_hh->buffer &&
           !ggml_backend_buffer_is_host(w_hh->buffer);
}

const float * vs_context::lstm(const ggml_tensor * gx, const ggml_tensor * w_hh, int64_t H, int64_t n, int64_t cols,
                               int64_t D, float * h, float * c, float * out) {
    if (!gx->buffer || ggml_backend_buffer_is_host(gx->buffer)) {
        throw vs::error(VS_ERR_COMPUTE,
                        std::string(ggml_get_name(w_hh)) + ": input projections were not computed on " + device);
    }
    const auto    t0 = std::chrono::steady_clock::now();
    const float * kept =
        vs::cuda::lstm(cuda_device, static_cast<const float *>(gx->data), w_hh->data, w_hh->type, H, n, gx->ne[1], cols,
                       D, h, c, out, device_scratch(vs::cuda::lstm_scratch_bytes(H, n, cols)));
    if (profiling && !out) {
        vs::cuda::synchronize(cuda_device);  // the op's time is the kernel's
    }
    profile_op("LSTM (engine's CUDA kernel)", vs::ms_since(t0));
    return kept;
}

void vs_context::set_output(const std::string & name, std::vector<float> data, int64_t rows, int64_t cols) {
    device_outputs.erase(name);
    outputs[name] = { std::move(data), { rows, cols } };
}

void vs_context::set_device_output(const std::string & name, const vs::buffer_ptr & buf, size_t offset, int64_t rows,
                                   int64_t cols) {
    GGML_ASSERT(buf && offset + sizeof(float) * (size_t) (rows * cols) <= ggml_backend_buffer_get_size(buf.get()));
    outputs.erase(name);
    device_outputs[name] = { &buf, offset, rows, cols };
}

void vs_context::keep_output_on_device(const std::string & name, const void * src, int64_t rows, int64_t cols) {
    drop_outputs_in(*this, kept_outputs);
    const size_t bytes = sizeof(float) * (size_t) (rows * cols);
    vs::cuda::copy(cuda_device, vs::grown(*this, kept_outputs, bytes, "named outputs"), src, bytes);
    set_device_output(name, kept_outputs, 0, rows, cols);
}

const vs_context::named_output * vs_context::output(const std::string & name) const {
    if (auto d = device_outputs.find(name); d != device_outputs.end()) {
        named_output out{ std::vector<float>((size_t) (d->second.rows * d->second.cols)),
                          { d->second.rows, d->second.cols } };
        const auto * base = static_cast<const uint8_t *>(ggml_backend_buffer_get_base(d->second.buf->get()));
        vs::cuda::download(cuda_device, out.first.data(), base + d->second.offset, sizeof(float) * out.first.size());
        device_outputs.erase(d);
        outputs[name] = std::move(out);
    }
    auto it = outputs.find(name);
    return it == outputs.end() ? nullptr : &it->second;
}
