// The CPU kernels for 16-float vectors (avx512; compiled with its flags).
#include "kernels.h"

#define VS_CPU_ISA avx512
#define VS_CPU_VW 16
#include "attention_kernel.inc"
#include "decoder_kernel.inc"
#include "gate_kernel.inc"
#include "residual_kernel.inc"
#include "stats_kernel.inc"
