// The multi-LoRA kernel built with -mavx2 -mfma (CMakeLists.txt; see lora_impl.h).
#define PC_ISA_NAMESPACE lora_avx2
#include "kernels/lora_impl.h"
