// Device registry: every device ggml reports, and the choice of one for a context.
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "vs-impl.h"

namespace vs {

static int to_vs_type(enum ggml_backend_dev_type type) {
    switch (type) {
        case GGML_BACKEND_DEVICE_TYPE_GPU:
            return VS_DEVICE_GPU;
        case GGML_BACKEND_DEVICE_TYPE_IGPU:
            return VS_DEVICE_IGPU;
        case GGML_BACKEND_DEVICE_TYPE_ACCEL:
            return VS_DEVICE_ACCEL;
        default:
            return VS_DEVICE_CPU;
    }
}

static void copy_str(char * dst, size_t cap, const char * src) {
    std::strncpy(dst, src ? src : "", cap - 1);
    dst[cap - 1] = '\0';
}

std::string device_id(ggml_backend_dev_t dev) {
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        return "cpu";
    }
    // Device names are unique per backend ("CUDA0", "Vulkan1"); lower-case them for ids.
    std::string id = ggml_backend_dev_name(dev);
    for (char & c : id) {
        c = (char) std::tolower((unsigned char) c);
    }
    return id;
}

static std::vector<device_entry> enumerate() {
    // ggml's Vulkan matmuls through NV_coopmat2 accumulate F16 products in F16, which moved
    // Kokoro's batched BERT and Piper's packed batch outside the GPU tests' bounds, where
    // CUDA, the CPU and Vulkan's other matmul paths keep within them at the same speed. ggml
    // reads its switch once, when its Vulkan backend starts.
#ifdef _WIN32
    _putenv_s("GGML_VK_DISABLE_COOPMAT2", "1");
#else
    setenv("GGML_VK_DISABLE_COOPMAT2", "1", 0);
#endif
    ggml_backend_load_all();
    std::vector<device_entry> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        device_entry       e{};
        e.dev = dev;
        copy_str(e.info.id, sizeof(e.info.id), device_id(dev).c_str());
        copy_str(e.info.name, sizeof(e.info.name), ggml_backend_dev_name(dev));
        copy_str(e.info.description, sizeof(e.info.description), ggml_backend_dev_description(dev));
        e.info.type = to_vs_type(ggml_backend_dev_type(dev));
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_ACCEL) {
            continue;  // accelerators (BLAS, AMX) only extend the CPU backend; not a device to choose
        }
        out.push_back(e);
    }
    return out;
}

const std::vector<device_entry> & devices() {
    static std::once_flag            once;
    static std::vector<device_entry> list;
    std::call_once(once, [] { list = enumerate(); });
    return list;
}

void refresh_memory(device_entry & e) {
    ggml_backend_dev_memory(e.dev, &e.info.memory_free, &e.info.memory_total);
}

ggml_backend_dev_t resolve_device(const std::string & request) {
    const auto & list = devices();
    if (request.empty() || request == "auto") {
        // Discrete GPUs first (most free memory wins), then integrated ones, then the CPU. A
        // card that two backends list (CUDA and Vulkan) goes to the other one: Vulkan is
        // the portable path, and the slower one on the cards both drive.
        auto is_vulkan = [](const device_entry & e) {
            return std::strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(e.dev)), "Vulkan") == 0;
        };
        auto listed_elsewhere = [&](const device_entry & e) {
            for (const auto & o : list) {
                if (o.dev != e.dev && !is_vulkan(o) && o.info.type == e.info.type &&
                    std::strcmp(o.info.description, e.info.description) == 0) {
                    return true;
                }
            }
            return false;
        };
        ggml_backend_dev_t best      = nullptr;
        int                best_rank = -1;
        size_t             best_free = 0;
        for (auto e : list) {
            if (is_vulkan(e) && listed_elsewhere(e)) {
                continue;
            }
            refresh_memory(e);
            int rank = e.info.type == VS_DEVICE_GPU ? 2 : e.info.type == VS_DEVICE_IGPU ? 1 : 0;
            if (rank > best_rank || (rank == best_rank && e.info.memory_free > best_free)) {
                best      = e.dev;
                best_rank = rank;
                best_free = e.info.memory_free;
            }
        }
        if (!best) {
            throw error(VS_ERR_DEVICE, "ggml reports no device");
        }
        return best;
    }
    for (const auto & e : list) {
        if (request == e.info.id) {
            return e.dev;
        }
    }
    std::string known;
    for (const auto & e : list) {
        known += (known.empty() ? "" : ", ") + std::string(e.info.id);
    }
    throw error(VS_ERR_DEVICE, "unknown device '" + request + "' (available: auto, " + known + ")");
}

}  // namespace vs
