// A preloaded library that hides AVX-512, AVX-VNNI and AMX from CPUID, so that a process and every
// library it loads afterwards (onnxruntime's MLAS, numpy, the engine's kernel choice) take the code
// paths they take on a CPU with AVX2 and FMA alone. tools/cpu_table.py --isa avx2 runs its
// benchmarks under it:
//
//     LD_PRELOAD=build/native/libvs-isa-mask.so python main.py bench ...
//
// It needs CPUID faulting (Linux's ARCH_SET_CPUID; /proc/cpuinfo lists `cpuid_fault`): every CPUID
// then traps, and the handler runs the instruction with faulting lifted for a moment and clears the
// hidden features' bits from what it returns. Threads and children made with fork inherit the
// faulting; a program started with exec does not (the preload sets it again there). The C
// library's own string functions chose theirs before this runs (GLIBC_TUNABLES sets those).
#include <asm/prctl.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>

#if !defined(__x86_64__) || !defined(__linux__)
#error "isa-mask is for x86-64 Linux"
#endif

namespace {

// CPUID leaf 7, subleaf 0: EBX avx512f, dq, ifma, pf, er, cd, bw, vl; ECX avx512_vbmi, vbmi2, vnni,
// bitalg, vpopcntdq; EDX avx512_4vnniw, 4fmaps, vp2intersect, amx_bf16, avx512_fp16, amx_tile,
// amx_int8. Subleaf 1: EAX avx_vnni, avx512_bf16. Leaf 0xD, subleaf 0: the AVX-512 state
// components (opmask, ZMM_Hi256, Hi16_ZMM) and AMX's (XTILECFG, XTILEDATA) in the XCR0 it supports.
constexpr uint32_t kLeaf7Ebx = 1u << 16 | 1u << 17 | 1u << 21 | 1u << 26 | 1u << 27 | 1u << 28 | 1u << 30 | 1u << 31;
constexpr uint32_t kLeaf7Ecx = 1u << 1 | 1u << 6 | 1u << 11 | 1u << 12 | 1u << 14;
constexpr uint32_t kLeaf7Edx = 1u << 2 | 1u << 3 | 1u << 8 | 1u << 22 | 1u << 23 | 1u << 24 | 1u << 25;
constexpr uint32_t kLeaf7Sub1Eax = 1u << 4 | 1u << 5;
constexpr uint32_t kLeafDEax     = 0xe0u | 0x60000u;

long set_cpuid(int enabled) {
    return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled);
}

void on_segv(int, siginfo_t *, void * context) {
    auto *       regs = static_cast<ucontext_t *>(context)->uc_mcontext.gregs;
    const auto * ip   = reinterpret_cast<const unsigned char *>(regs[REG_RIP]);
    if (ip[0] != 0x0f || ip[1] != 0xa2) {
        // Not a CPUID: a real fault. Fall back to the default action, which the retried
        // instruction then takes.
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    const auto leaf = static_cast<uint32_t>(regs[REG_RAX]), subleaf = static_cast<uint32_t>(regs[REG_RCX]);
    uint32_t   a, b, c, d;
    set_cpuid(1);
    __cpuid_count(leaf, subleaf, a, b, c, d);
    set_cpuid(0);
    if (leaf == 7 && subleaf == 0) {
        b &= ~kLeaf7Ebx;
        c &= ~kLeaf7Ecx;
        d &= ~kLeaf7Edx;
    } else if (leaf == 7 && subleaf == 1) {
        a &= ~kLeaf7Sub1Eax;
    } else if (leaf == 0xd && subleaf == 0) {
        a &= ~kLeafDEax;
    }
    regs[REG_RAX] = a;
    regs[REG_RBX] = b;
    regs[REG_RCX] = c;
    regs[REG_RDX] = d;
    regs[REG_RIP] += 2;
}

__attribute__((constructor)) void hide_features() {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags     = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, nullptr) != 0 || set_cpuid(0) != 0) {
        std::fprintf(stderr, "isa-mask: this CPU or kernel has no CPUID faulting; nothing is hidden\n");
        _exit(3);
    }
}

}  // namespace
