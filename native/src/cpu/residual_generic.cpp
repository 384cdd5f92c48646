// The fused residual convolution for 4-float vectors (the build's own instruction set).
#include "residual.h"

#define VS_CPU_ISA generic
#define VS_CPU_VW 4
#include "residual_kernel.inc"
