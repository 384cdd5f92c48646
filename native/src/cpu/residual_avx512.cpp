// The fused residual convolution for 16-float vectors (avx512; compiled with its flags).
#include "residual.h"

#define VS_CPU_ISA avx512
#define VS_CPU_VW 16
#include "residual_kernel.inc"
