// The attention kernel for AVX512-BF16 CPUs: the AVX-512 kernel, whose calls over a bf16 cache take
// vdpbf16ps pair dot products (attention_dot_tiles.h). Compiled with -mavx512bf16.
#define PC_ISA_NAMESPACE attention_avx512_bf16dot
#define PC_VEC VecAvx512
#include "kernels/vec_avx512.h"
#include "kernels/attention_impl.h"
