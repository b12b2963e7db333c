// sample_rows' vector passes for the avx2 unit (sample_rows_pass.h; flags in CMakeLists.txt).
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/sample_rows_pass.h"

namespace pagedcore {
namespace kernels {
namespace sample_avx2 {

#define PC_SAMPLE_WIDTH 8
#include "kernels/sample_rows_pass.inc"
#undef PC_SAMPLE_WIDTH

}  // namespace sample_avx2
}  // namespace kernels
}  // namespace pagedcore
