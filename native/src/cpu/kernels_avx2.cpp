// The CPU kernels for 8-float vectors (avx2; compiled with its flags).
#include "kernels.h"

#define VS_CPU_ISA avx2
#define VS_CPU_VW 8
#include "attention_kernel.inc"
#include "decoder_kernel.inc"
#include "gate_kernel.inc"
#include "residual_kernel.inc"
#include "stats_kernel.inc"
