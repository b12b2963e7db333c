// sample_rows' vector passes for the generic unit (sample_rows_pass.h; flags in CMakeLists.txt).
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/sample_rows_pass.h"

namespace pagedcore {
namespace kernels {
namespace sample_generic {

#define PC_SAMPLE_WIDTH 4
#include "kernels/sample_rows_pass.inc"
#undef PC_SAMPLE_WIDTH

}  // namespace sample_generic
}  // namespace kernels
}  // namespace pagedcore
