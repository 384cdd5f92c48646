// A context's weights: the file's tensors on its device, and weights re-laid out for it (made once).
#include <cstring>

#include "cpu/kernels.h"
#include "vs-context.h"

ggml_tensor * vs_context::w(const std::string & name) const {
    auto it = weights->tensors.find(name);
    if (it == weights->tensors.end()) {
        throw vs::error(VS_ERR_FORMAT, "model '" + model->path + "' lacks tensor '" + name + "'");
    }
    return it->second;
}

ggml_tensor * vs_context::derived_tensor(const std::string & key, ggml_type type, const std::array<int64_t, 4> & ne,
                                         const std::function<void(uint8_t *)> & fill) {
    std::lock_guard<std::recursive_mutex> lock(derived->mutex);  // workers may ask at once
    auto                                  it = derived->tensors.find(key);
    if (it != derived->tensors.end()) {
        return it->second;
    }
    ggml_init_params ip{ ggml_tensor_overhead(), nullptr, true };
    vs::ggml_ctx_ptr ctx(ggml_init(ip));
    ggml_tensor *    t = ggml_new_tensor_4d(ctx.get(), type, ne[0], ne[1], ne[2], ne[3]);
    ggml_set_name(t, key.substr(0, GGML_MAX_NAME - 1).c_str());
    vs::buffer_ptr buf(ggml_backend_alloc_ctx_tensors_from_buft(ctx.get(), ggml_backend_dev_buffer_type(dev)));
    if (!buf) {
        throw vs::error(VS_ERR_COMPUTE, "out of memory on " + device + " for '" + key + "'");
    }
    std::vector<uint8_t> bytes(ggml_nbytes(t));
    fill(bytes.data());
    ggml_backend_tensor_set(t, bytes.data(), 0, bytes.size());
    derived->ctx.push_back(std::move(ctx));
    derived->buffers.push_back(std::move(buf));
    return derived->tensors[key] = t;
}

ggml_tensor * vs_context::swapped_weight(const std::string & name) {
    const ggml_tensor * src = model->tensor(name);
    if (src->type != GGML_TYPE_F32 && src->type != GGML_TYPE_F16) {
        return nullptr;
    }
    const size_t  es = ggml_type_size(src->type);
    const int64_t A = src->ne[0], B = src->ne[1], R = src->ne[2] * src->ne[3];
    return derived_tensor(name + ".swapped", src->type, { B, A, src->ne[2], src->ne[3] }, [&](uint8_t * out) {
        const auto * in = static_cast<const uint8_t *>(src->data);
        for (int64_t r = 0; r < R; ++r) {
            for (int64_t a = 0; a < A; ++a) {
                for (int64_t b = 0; b < B; ++b) {
                    std::memcpy(out + ((r * A + a) * B + b) * es, in + ((r * B + b) * A + a) * es, es);
                }
            }
        }
    });
}

ggml_tensor * vs_context::channel_padded_weight(const std::string & name, int64_t multiple) {
    const ggml_tensor * src = model->tensor(name);
    const int64_t       A = src->ne[0], A2 = (A + multiple - 1) / multiple * multiple;
    if (A2 == A || (src->type != GGML_TYPE_F32 && src->type != GGML_TYPE_F16)) {
        return w(name);
    }
    const size_t  es   = ggml_type_size(src->type);
    const int64_t rows = ggml_nrows(src);
    return derived_tensor(name + ".padded", src->type, { A2, src->ne[1], src->ne[2], src->ne[3] }, [&](uint8_t * out) {
        const auto * in = static_cast<const uint8_t *>(src->data);
        std::memset(out, 0, (size_t) (A2 * rows) * es);
        for (int64_t r = 0; r < rows; ++r) {
            std::memcpy(out + (size_t) (r * A2) * es, in + (size_t) (r * A) * es, (size_t) A * es);
        }
    });
}

ggml_tensor * vs_context::reversed_weight(const std::string & name, int axis) {
    const ggml_tensor * src  = model->tensor(name);
    const ggml_type     type = src->type == GGML_TYPE_F16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    const int64_t       n    = ggml_nelements(src);
    GGML_ASSERT(axis >= 0 && axis < GGML_MAX_DIMS);
    int64_t stride = 1;  // elements between neighbours along `axis`
    for (int a = 0; a < axis; ++a) {
        stride *= src->ne[a];
    }
    const int64_t len = src->ne[axis];
    return derived_tensor(name + ".reversed" + std::to_string(axis), type,
                          { src->ne[0], src->ne[1], src->ne[2], src->ne[3] }, [&](uint8_t * out) {
                              std::vector<float> floats;  // F32 and other types, as floats
                              if (type == GGML_TYPE_F32) {
                                  floats = vs::host_floats(src);
                              }
                              const auto * in = type == GGML_TYPE_F32 ? reinterpret_cast<const uint8_t *>(floats.data())
                                                                      : static_cast<const uint8_t *>(src->data);
                              const size_t es = ggml_type_size(type);
                              for (int64_t i = 0; i < n; ++i) {
                                  const int64_t at = (i / stride) % len;
                                  std::memcpy(out + (i + (len - 1 - 2 * at) * stride) * es, in + i * es, es);
                              }
                          });
}

ggml_tensor * vs_context::conv(ggml_context * g, ggml_tensor * x, const std::string & name, int dilation, int pad) {
    ggml_tensor * w    = this->w(name + ".weight");  // [IC, K, OC]
    const int     same = dilation * (int) (w->ne[1] - 1) / 2;
    pad                = pad < 0 ? same : pad;
    ggml_tensor * packed =
        cpu_kernels && pad == same && w->ne[2] % (2 * vs::cpu::vector_floats()) == 0 && ggml_nrows(x) == x->ne[1]
            ? cpu_packed_conv(name + ".weight")
            : nullptr;
    if (packed) {
        return vs::cpu::conv(g, ggml_is_contiguous(x) ? x : ggml_cont(g, x), packed, this->w(name + ".bias"), dilation);
    }
    return vs::conv1d(graph_opts(), g, x, w, this->w(name + ".bias"), dilation, pad);
}

ggml_tensor * vs_context::cpu_packed_conv(const std::string & name) {
    const ggml_tensor * src = model->tensor(name);
    if (src->type != GGML_TYPE_F32 && src->type != GGML_TYPE_F16) {
        return nullptr;
    }
    const int64_t IC = src->ne[0], K = src->ne[1], OC = src->ne[2];
    return derived_tensor(name + ".cpu", GGML_TYPE_F32, { OC, IC, K, 1 }, [&](uint8_t * out) {
        const std::vector<float> floats = vs::host_floats(src);  // F16 exactly
        vs::cpu::pack_conv_weight(floats.data(), IC, K, OC, reinterpret_cast<float *>(out));
    });
}

ggml_tensor * vs_context::cpu_packed_conv_int16(const std::string & name, ggml_tensor *& scales) {
    const ggml_tensor * src = model->tensor(name);
    scales                  = nullptr;
    if (!cpu_int16 || (src->type != GGML_TYPE_F32 && src->type != GGML_TYPE_F16) || src->ne[0] % 2 != 0) {
        return nullptr;
    }
    const int64_t IC = src->ne[0], K = src->ne[1], OC = src->ne[2];
    scales = derived_tensor(name + ".cpu16scales", GGML_TYPE_F32, { OC, 1, 1, 1 }, [&](uint8_t * out) {
        const std::vector<float> floats = vs::host_floats(src);
        vs::cpu::conv_weight_int16_scales(floats.data(), IC, K, OC, reinterpret_cast<float *>(out));
    });
    return derived_tensor(name + ".cpu16", GGML_TYPE_I16, { OC, IC, K, 1 }, [&](uint8_t * out) {
        const std::vector<float> floats = vs::host_floats(src);
        std::vector<float>       unused((size_t) OC);  // the scales, derived above
        vs::cpu::pack_conv_weight_int16(floats.data(), IC, K, OC, reinterpret_cast<int16_t *>(out), unused.data());
    });
}

ggml_tensor * vs_context::weight_as(const std::string & name, ggml_type type) {
    GGML_ASSERT(type == GGML_TYPE_F16 || type == GGML_TYPE_F32);
    const ggml_tensor * src = model->tensor(name);
    if (src->type == type) {
        return w(name);
    }
    return derived_tensor(name + "." + ggml_type_name(type), type, { src->ne[0], src->ne[1], src->ne[2], src->ne[3] },
                          [&](uint8_t * out) {
                              const std::vector<float> floats = vs::host_floats(src);
                              if (type == GGML_TYPE_F32) {
                                  std::memcpy(out, floats.data(), floats.size() * sizeof(float));
                              } else {
                                  ggml_fp32_to_fp16_row(floats.data(), reinterpret_cast<ggml_fp16_t *>(out),
                                                        (int64_t) floats.size());
                              }
                          });
}

namespace vs {

std::vector<float> host_floats(const ggml_tensor * t) {
    std::vector<float> v((size_t) ggml_nelements(t));
    if (t->type == GGML_TYPE_F32) {
        std::memcpy(v.data(), t->data, ggml_nbytes(t));
    } else if (const auto * traits = ggml_get_type_traits(t->type); traits->to_float) {
        traits->to_float(t->data, v.data(), ggml_nelements(t));
    } else {
        throw error(VS_ERR_FORMAT, std::string("'") + ggml_get_name(t) + "' has a type without floats");
    }
    return v;
}

}  // namespace vs
