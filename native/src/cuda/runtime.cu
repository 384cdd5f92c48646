// The engine's CUDA runtime: devices, cuBLAS handles, copies, noise, the calling thread's stream and its captured
// launches.
#include "common.cuh"

namespace vs::cuda {

namespace {

// Pairs of noise (gaussian_pair), a thread a pair at a time.
__global__ void gaussian_kernel(uint64_t key, float * __restrict__ out, int64_t n, float scale) {
    const int64_t pairs = (n + 1) / 2;
    for (int64_t p = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; p < pairs;
         p += (int64_t) gridDim.x * blockDim.x) {
        float a = 0.0f, b = 0.0f;
        gaussian_pair(key, (uint64_t) p, scale, a, b);
        out[2 * p] = a;
        if (2 * p + 1 < n) {
            out[2 * p + 1] = b;
        }
    }
}

}  // namespace

thread_local uint64_t n_queued = 0;

int device_of(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    if (!reg || std::strcmp(ggml_backend_reg_name(reg), "CUDA") != 0) {
        return -1;
    }
    // The CUDA registry lists the devices in CUDA's order.
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        if (ggml_backend_reg_dev_get(reg, i) == dev) {
            return (int) i;
        }
    }
    return -1;
}

void * blas_create(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    cublasHandle_t h = nullptr;
    check_blas(cublasCreate(&h), "cublasCreate");
    check_blas(cublasSetStream(h, cudaStreamPerThread), "cublasSetStream");
    return h;
}

void blas_destroy(void * blas) {
    if (blas) {
        cublasDestroy(static_cast<cublasHandle_t>(blas));
    }
}

void upload(int device, void * dst, const void * host, size_t bytes) {
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread), "upload");
}

void download(int device, void * host, const void * src, size_t bytes) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread), "download");
    check(cudaStreamSynchronize(cudaStreamPerThread), "download");
}

void copy(int device, void * dst, const void * src, size_t bytes) {
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread), "device copy");
}

void clear(int device, void * dst, size_t bytes) {
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    check(cudaMemsetAsync(dst, 0, bytes, cudaStreamPerThread), "clear");
}

void gaussian(int device, uint64_t key, float * out, int64_t n, float scale) {
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    const int64_t pairs = (n + 1) / 2;
    if (pairs > 0) {
        gaussian_kernel<<<elementwise_blocks(pairs), ELEMENTWISE, 0, cudaStreamPerThread>>>(key, out, n, scale);
        check(cudaGetLastError(), "noise kernel launch");
    }
}

void synchronize(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamSynchronize(cudaStreamPerThread), "engine kernels");
}

void record(int device, void * event) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), cudaStreamPerThread), "event record");
}

void wait(int device, void * event) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamWaitEvent(cudaStreamPerThread, static_cast<cudaEvent_t>(event), 0), "event wait");
}

uint64_t queued() {
    return n_queued;
}

// A capture's instance, dropped (one in flight is freed when it completes).
static void drop_exec(void * exec) {
    if (exec) {
        cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
    }
}

bool launch_cache::run(int device, const std::string & key, const std::function<void()> & queue) {
    check(cudaSetDevice(device), "cudaSetDevice");
    ++n_queued;
    auto it = entries_.find(key);
    if (it == entries_.end()) {  // first seen: run, remembered
        while (!entries_.empty() && entries_.size() >= limit_) {
            auto oldest = std::min_element(entries_.begin(), entries_.end(), [](const auto & a, const auto & b) {
                return a.second.used < b.second.used;
            });
            drop_exec(oldest->second.exec);
            entries_.erase(oldest);
        }
        entries_[key].used = ++clock_;
        queue();
        return false;
    }
    it->second.used     = ++clock_;
    const bool replayed = it->second.exec != nullptr;
    if (!replayed) {  // seen once: captured
        check(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal), "capture");
        try {
            queue();
        } catch (...) {
            cudaGraph_t dropped = nullptr;
            cudaStreamEndCapture(cudaStreamPerThread, &dropped);
            if (dropped) {
                cudaGraphDestroy(dropped);
            }
            cudaGetLastError();
            throw;
        }
        cudaGraph_t graph = nullptr;
        check(cudaStreamEndCapture(cudaStreamPerThread, &graph), "capture");
        cudaGraphExec_t   exec = nullptr;
        const cudaError_t e    = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        check(e, "capture's instantiation");
        it->second.exec = exec;
    }
    check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->second.exec), cudaStreamPerThread), "captured launches");
    return replayed;
}

void launch_cache::clear() {
    for (auto & [key, e] : entries_) {
        drop_exec(e.exec);
    }
    entries_.clear();
}

size_t launch_cache::captured() const {
    return (size_t) std::count_if(entries_.begin(), entries_.end(), [](const auto & e) { return e.second.exec; });
}

}  // namespace vs::cuda
