// sample_rows' vector passes for the avx512 unit (sample_rows_pass.h; flags in CMakeLists.txt).
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/sample_rows_pass.h"

namespace pagedcore {
namespace kernels {
namespace sample_avx512 {

#define PC_SAMPLE_WIDTH 16
#include "kernels/sample_rows_pass.inc"
#undef PC_SAMPLE_WIDTH

}  // namespace sample_avx512
}  // namespace kernels
}  // namespace pagedcore
