// GGUF loading: metadata, tensors mapped from the file, copies for other devices.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

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

    ggml_context *   meta_ctx = nullptr;
    gguf_init_params gparams{ /*no_alloc =*/true, /*ctx =*/&meta_ctx };
    model->meta.reset(gguf_init_from_file(path.c_str(), gparams));
    if (!model->meta) {
        throw error(VS_ERR_FORMAT, "'" + path + "' is a damaged or truncated GGUF file");
    }
    model->host.ctx.reset(meta_ctx);
    gguf_context * g = model->meta.get();

    model->arch = gguf_string(g, "general.architecture");
    model->name = gguf_string(g, "general.name");
    if (model->arch != "piper" && model->arch != "kokoro" && model->arch != "ge2e") {
        throw error(VS_ERR_FORMAT, "'" + path + "' holds a model of architecture '" + model->arch +
                                       "'; this engine runs: piper, kokoro, ge2e");
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
    model->sample_rate = (int) model->u32(model->arch + ".sample_rate");
    if (!report(params, 1.0f)) {
        throw error(VS_ERR_ABORTED, "model loading cancelled");
    }
    return model;
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
