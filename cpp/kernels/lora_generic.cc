// The multi-LoRA kernel for any CPU (baseline flags; see lora_impl.h).
#define PC_ISA_NAMESPACE lora_generic
#include "kernels/lora_impl.h"
