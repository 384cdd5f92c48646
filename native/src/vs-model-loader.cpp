// GGUF loading: metadata, tensors mapped from the file, copies for other devices.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "vs-impl.h"

namespace vs {

struct model_file {
    void * addr = MAP_FAILED;
    size_t size = 0;

    explicit model_file(const std::string & path) {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            throw error(VS_ERR_IO, "cannot open model '" + path + "': " + std::strerror(errno));
        }
        struct stat st{};
        if (fstat(fd, &st) != 0 || st.st_size == 0) {
            ::close(fd);
            throw error(VS_ERR_FORMAT, "model '" + path + "' is empty");
        }
        size = (size_t) st.st_size;
        addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        if (addr == MAP_FAILED) {
            throw error(VS_ERR_IO, "cannot map model '" + path + "': " + std::strerror(errno));
        }
    }

    ~model_file() {
        if (addr != MAP_FAILED) {
            munmap(addr, size);
        }
    }
};

// Four lanes of 64-bit multiply-rotate over the file's words, folded with its length
// (the scheme of xxHash64's long-input loop, with constants of its own).
uint64_t file_digest(const std::string & path) {
    const model_file   f(path);
    const auto *       bytes = static_cast<const uint8_t *>(f.addr);
    constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full;
    uint64_t           lane[4] = { P1 + P2, P2, 0, 0 - P1 };
    auto               round   = [](uint64_t acc, uint64_t v) {
        acc += v * P2;
        acc = (acc << 31) | (acc >> 33);
        return acc * P1;
    };
    size_t i = 0;
    for (; i + 32 <= f.size; i += 32) {
        for (int k = 0; k < 4; ++k) {
            uint64_t v;
            std::memcpy(&v, bytes + i + 8 * k, 8);
            lane[k] = round(lane[k], v);
        }
    }
    uint64_t h = mix64(lane[0]) ^ mix64(lane[1] + 1) ^ mix64(lane[2] + 2) ^ mix64(lane[3] + 3) ^ (uint64_t) f.size;
    for (; i < f.size; ++i) {
        h = mix64(h ^ bytes[i]);
    }
    return mix64(h);
}

// The GGUF header walked before ggml's parser sees it, refusing what that parser does not
// survive (it divides by a tensor's dimensions and by its type's block size) and what the
// engine does not run: every length within the file, 1 to 4 dimensions of at least 1, tensors
// of type F32, F16 or Q8_0.
class header_reader {
  public:
    header_reader(const uint8_t * data, size_t size, const std::string & path) : p_(data), n_(size), path_(path) {}

    void check() {
        skip(4);  // the magic, checked already
        const uint32_t version = u32();
        if (version < 2 || version > 3) {
            fail("GGUF version " + std::to_string(version) + " (this engine reads 2 and 3)");
        }
        const uint64_t n_tensors = u64(), n_kv = u64();
        if (n_tensors > MAX_ITEMS || n_kv > MAX_ITEMS) {
            fail("it claims " + std::to_string(n_tensors) + " tensors and " + std::to_string(n_kv) + " metadata keys");
        }
        for (uint64_t i = 0; i < n_kv; ++i) {
            skip(string_length());
            value(u32(), true);
        }
        for (uint64_t i = 0; i < n_tensors; ++i) {
            const uint64_t name = string_length();
            if (name >= GGML_MAX_NAME) {
                fail("tensor " + std::to_string(i) + " has a name of " + std::to_string(name) + " bytes");
            }
            skip(name);
            const uint32_t dims = u32();
            if (dims < 1 || dims > GGML_MAX_DIMS) {
                fail("tensor " + std::to_string(i) + " has " + std::to_string(dims) + " dimensions");
            }
            for (uint32_t d = 0; d < dims; ++d) {
                const uint64_t ne = u64();
                if (ne < 1 || ne > (uint64_t) INT32_MAX) {  // ggml's parser divides by each
                    fail("tensor " + std::to_string(i) + " has a dimension of " + std::to_string(ne));
                }
            }
            const uint32_t type = u32();
            if (type != GGML_TYPE_F32 && type != GGML_TYPE_F16 && type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q4_0) {
                fail("tensor " + std::to_string(i) + " has type " + std::to_string(type) +
                     " (this engine reads F32, F16, Q8_0 and Q4_0)");
            }
            skip(8);  // its offset: ggml's parser checks it
        }
    }

  private:
    static constexpr uint64_t MAX_ITEMS = 1u << 20;
    const uint8_t *           p_;
    size_t                    n_, at_ = 0;
    const std::string &       path_;

    [[noreturn]] void fail(const std::string & why) const {
        throw error(VS_ERR_FORMAT, "'" + path_ + "' is a damaged GGUF file: " + why);
    }

    void skip(uint64_t bytes) {
        if (bytes > n_ - at_) {
            fail("it ends inside its header");
        }
        at_ += (size_t) bytes;
    }

    template <typename T>
    T read() {
        T            v;
        const size_t at = at_;
        skip(sizeof(T));
        std::memcpy(&v, p_ + at, sizeof(T));
        return v;
    }

    uint32_t u32() { return read<uint32_t>(); }
    uint64_t u64() { return read<uint64_t>(); }

    uint64_t string_length() {
        const uint64_t n = u64();
        if (n > n_) {
            fail("a string of " + std::to_string(n) + " bytes");
        }
        return n;
    }

    void value(uint32_t type, bool arrays) {
        static const uint8_t sizes[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };  // by gguf_type
        if (type == GGUF_TYPE_STRING) {
            skip(string_length());
        } else if (type == GGUF_TYPE_ARRAY && arrays) {
            const uint32_t element = u32();
            const uint64_t count   = u64();
            if (element == GGUF_TYPE_ARRAY || element >= GGUF_TYPE_COUNT || count > n_) {
                fail("an array of " + std::to_string(count) + " values of type " + std::to_string(element));
            }
            for (uint64_t k = 0; k < count; ++k) {
                value(element, false);
            }
        } else if (type < std::size(sizes) && sizes[type] > 0) {
            skip(sizes[type]);
        } else {
            fail("a metadata value of type " + std::to_string(type));
        }
    }
};

static std::string gguf_string(gguf_context * g, const char * key) {
    int64_t id = gguf_find_key(g, key);
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_STRING) {
        return "";
    }
    return gguf_get_val_str(g, id);
}

static bool report(const vs_model_params & params, float fraction) {
    return !params.progress || params.progress(fraction, params.progress_user_data);
}

std::unique_ptr<vs_model> load_model(const std::string & path, const vs_model_params & params) {
    auto model  = std::make_unique<vs_model>();
    model->path = path;
    model->file = std::make_shared<model_file>(path);

    static const char magic[4] = { 'G', 'G', 'U', 'F' };
    if (model->file->size < 4 || std::memcmp(model->file->addr, magic, 4) != 0) {
        throw error(VS_ERR_FORMAT, "'" + path + "' is not a GGUF file");
    }

    header_reader(static_cast<const uint8_t *>(model->file->addr), model->file->size, path).check();
    ggml_context *   meta_ctx = nullptr;
    gguf_init_params gparams{ /*no_alloc =*/true, /*ctx =*/&meta_ctx };
    model->meta.reset(gguf_init_from_file(path.c_str(), gparams));
    if (!model->meta) {
        throw error(VS_ERR_FORMAT, "'" + path + "' is a damaged or truncated GGUF file");
    }
    model->host.ctx.reset(meta_ctx);
    gguf_context * g = model->meta.get();

    if (gguf_get_n_tensors(g) == 0) {
        model->bad("the file holds no tensors");
    }
    model->arch = gguf_string(g, "general.architecture");
    model->name = gguf_string(g, "general.name");
    if (model->arch != "piper" && model->arch != "kokoro" && model->arch != "ge2e" && model->arch != "chatterbox") {
        throw error(VS_ERR_FORMAT, "'" + path + "' holds a model of architecture '" + model->arch +
                                       "'; this engine runs: piper, kokoro, ge2e, chatterbox");
    }
    for (int64_t i = 0; i < gguf_get_n_kv(g); ++i) {
        if (gguf_get_kv_type(g, i) == GGUF_TYPE_STRING) {
            model->strings[gguf_get_key(g, i)] = gguf_get_val_str(g, i);
        }
    }
    if (!report(params, 0.1f)) {
        throw error(VS_ERR_ABORTED, "model loading cancelled");
    }

    // The tensors stay in the mapped file: one CPU buffer over the data section.
    const size_t data_offset = gguf_get_data_offset(g);
    size_t       data_end    = data_offset;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        ggml_tensor * t   = ggml_get_tensor(meta_ctx, gguf_get_tensor_name(g, i));
        size_t        end = data_offset + gguf_get_tensor_offset(g, i) + ggml_nbytes(t);
        data_end          = std::max(data_end, end);
    }
    if (data_end > model->file->size) {
        throw error(VS_ERR_FORMAT, "'" + path + "' is truncated: " + std::to_string(model->file->size) +
                                       " bytes, tensors need " + std::to_string(data_end));
    }
    char * base = (char *) model->file->addr;
    model->host.buffer.reset(ggml_backend_cpu_buffer_from_ptr(base + data_offset, data_end - data_offset));
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        const char *  name = gguf_get_tensor_name(g, i);
        ggml_tensor * t    = ggml_get_tensor(meta_ctx, name);
        if (ggml_backend_tensor_alloc(model->host.buffer.get(), t, base + data_offset + gguf_get_tensor_offset(g, i)) !=
            GGML_STATUS_SUCCESS) {
            throw error(VS_ERR_FORMAT, std::string("tensor '") + name + "' lies outside the file");
        }
        model->host.tensors[name] = t;
        if ((i & 63) == 0 && !report(params, 0.1f + 0.8f * (float) i / (float) gguf_get_n_tensors(g))) {
            throw error(VS_ERR_ABORTED, "model loading cancelled");
        }
    }
    model->sample_rate = model->u32_in(model->arch + ".sample_rate", 1000, 384000);
    if (!report(params, 1.0f)) {
        throw error(VS_ERR_ABORTED, "model loading cancelled");
    }
    return model;
}

derived_weights & derived_for(vs_model & model, ggml_backend_dev_t dev) {
    std::lock_guard<std::mutex> lock(model.device_mutex);
    auto &                      d = model.derived[dev];
    if (!d) {
        d = std::make_unique<derived_weights>();
    }
    return *d;
}

std::shared_ptr<weight_set> weights_for(vs_model & model, ggml_backend_dev_t dev) {
    std::shared_ptr<weight_set> host(std::shared_ptr<weight_set>{}, &model.host);  // non-owning
    ggml_backend_buffer_type_t  buft = ggml_backend_dev_buffer_type(dev);
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU || ggml_backend_buft_is_host(buft)) {
        return host;
    }
    std::lock_guard<std::mutex> lock(model.device_mutex);
    auto                        it = model.on_device.find(dev);
    if (it != model.on_device.end()) {
        return it->second;
    }
    auto             set = std::make_shared<weight_set>();
    ggml_init_params ip{ ggml_tensor_overhead() * (model.host.tensors.size() + 1), nullptr, true };
    set->ctx.reset(ggml_init(ip));
    for (const auto & [name, src] : model.host.tensors) {
        ggml_tensor * t = ggml_dup_tensor(set->ctx.get(), src);
        ggml_set_name(t, name.c_str());
        set->tensors[name] = t;
    }
    set->buffer.reset(ggml_backend_alloc_ctx_tensors_from_buft(set->ctx.get(), buft));
    if (!set->buffer) {
        throw error(VS_ERR_DEVICE, "not enough memory on " + device_id(dev) + " for the model's weights");
    }
    ggml_backend_buffer_set_usage(set->buffer.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (const auto & [name, src] : model.host.tensors) {
        ggml_backend_tensor_set(set->tensors[name], src->data, 0, ggml_nbytes(src));
    }
    model.on_device[dev] = set;
    return set;
}

}  // namespace vs

ggml_tensor * vs_model::tensor(const std::string & tensor_name) const {
    auto it = host.tensors.find(tensor_name);
    if (it == host.tensors.end()) {
        throw vs::error(VS_ERR_FORMAT, "model '" + path + "' lacks tensor '" + tensor_name + "'");
    }
    return it->second;
}

static int64_t require_key(const vs_model & m, const std::string & key) {
    int64_t id = gguf_find_key(m.meta.get(), key.c_str());
    if (id < 0) {
        throw vs::error(VS_ERR_FORMAT, "model '" + m.path + "' lacks metadata '" + key + "'");
    }
    return id;
}

bool vs_model::has(const std::string & key) const {
    return gguf_find_key(meta.get(), key.c_str()) >= 0;
}

uint32_t vs_model::u32(const std::string & key) const {
    int64_t id = require_key(*this, key);
    if (gguf_get_kv_type(meta.get(), id) != GGUF_TYPE_UINT32) {
        throw vs::error(VS_ERR_FORMAT, "metadata '" + key + "' is not a uint32");
    }
    return gguf_get_val_u32(meta.get(), id);
}

float vs_model::f32(const std::string & key) const {
    int64_t id = require_key(*this, key);
    if (gguf_get_kv_type(meta.get(), id) != GGUF_TYPE_FLOAT32) {
        throw vs::error(VS_ERR_FORMAT, "metadata '" + key + "' is not a float32");
    }
    return gguf_get_val_f32(meta.get(), id);
}

std::vector<int32_t> vs_model::i32_array(const std::string & key) const {
    int64_t id = require_key(*this, key);
    if (gguf_get_kv_type(meta.get(), id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta.get(), id) != GGUF_TYPE_INT32) {
        throw vs::error(VS_ERR_FORMAT, "metadata '" + key + "' is not an int32 array");
    }
    const int32_t * data = (const int32_t *) gguf_get_arr_data(meta.get(), id);
    return std::vector<int32_t>(data, data + gguf_get_arr_n(meta.get(), id));
}

std::vector<std::string> vs_model::str_array(const std::string & key) const {
    int64_t id = require_key(*this, key);
    if (gguf_get_kv_type(meta.get(), id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta.get(), id) != GGUF_TYPE_STRING) {
        throw vs::error(VS_ERR_FORMAT, "metadata '" + key + "' is not a string array");
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < gguf_get_arr_n(meta.get(), id); ++i) {
        out.emplace_back(gguf_get_arr_str(meta.get(), id, i));
    }
    return out;
}

void vs_model::bad(const std::string & what) const {
    throw vs::error(VS_ERR_FORMAT, "'" + path + "': " + what);
}

int vs_model::u32_in(const std::string & key, int lo, int hi) const {
    const uint32_t v = u32(key);
    if (v < (uint32_t) lo || v > (uint32_t) hi) {
        bad("metadata '" + key + "' is " + std::to_string(v) + "; this engine runs " + std::to_string(lo) + " to " +
            std::to_string(hi));
    }
    return (int) v;
}

float vs_model::f32_in(const std::string & key, float lo, float hi) const {
    const float v = f32(key);
    if (!(v >= lo && v <= hi)) {  // NaN fails too
        bad("metadata '" + key + "' is " + std::to_string(v) + "; this engine runs " + std::to_string(lo) + " to " +
            std::to_string(hi));
    }
    return v;
}

std::vector<int32_t> vs_model::i32_array_in(const std::string & key, size_t n_min, size_t n_max, int32_t lo,
                                            int32_t hi) const {
    std::vector<int32_t> v = i32_array(key);
    if (v.size() < n_min || v.size() > n_max) {
        bad("metadata '" + key + "' has " + std::to_string(v.size()) + " values; this engine runs " +
            std::to_string(n_min) + " to " + std::to_string(n_max));
    }
    for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] < lo || v[i] > hi) {
            bad("metadata '" + key + "'[" + std::to_string(i) + "] is " + std::to_string(v[i]) + "; this engine runs " +
                std::to_string(lo) + " to " + std::to_string(hi));
        }
    }
    return v;
}

namespace vs {

static std::string shape_text(const int64_t * ne) {
    int n = 4;
    while (n > 1 && ne[n - 1] == 1) {
        --n;
    }
    std::string s = "[";
    for (int i = 0; i < n; ++i) {
        s += (i ? ", " : "") + std::to_string(ne[i]);
    }
    return s + "]";
}

void check_tensors(const vs_model & model, const std::vector<tensor_spec> & specs, bool q4_0) {
    for (const auto & spec : specs) {
        const ggml_tensor * t = model.tensor(spec.name);
        if (!std::equal(spec.ne.begin(), spec.ne.end(), t->ne)) {
            model.bad("tensor '" + spec.name + "' is " + shape_text(t->ne) + "; the architecture needs " +
                      shape_text(spec.ne.data()));
        }
        const bool reduced =
            t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_Q8_0 || (q4_0 && t->type == GGML_TYPE_Q4_0);
        if (t->type != GGML_TYPE_F32 && !(reduced && spec.reducible)) {
            model.bad("tensor '" + spec.name + "' is " + ggml_type_name(t->type) + "; the engine reads it as " +
                      (spec.reducible ? (q4_0 ? "F32, F16, Q8_0 or Q4_0" : "F32, F16 or Q8_0") : "F32"));
        }
    }
}

}  // namespace vs
