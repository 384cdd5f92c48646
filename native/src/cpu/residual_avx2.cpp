// The fused residual convolution for 8-float vectors (avx2; compiled with its flags).
#include "residual.h"

#define VS_CPU_ISA avx2
#define VS_CPU_VW 8
#include "residual_kernel.inc"
