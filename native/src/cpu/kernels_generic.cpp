// The CPU kernels for 4-float vectors (the build's own instruction set).
#include "kernels.h"

#define VS_CPU_ISA generic
#define VS_CPU_VW 4
#include "attention_kernel.inc"
#include "decoder_kernel.inc"
#include "gate_kernel.inc"
#include "residual_kernel.inc"
#include "stats_kernel.inc"
