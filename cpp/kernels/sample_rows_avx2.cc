// sample_rows' vector passes for the avx2 unit (sample_rows_pass.h; flags in CMakeLists.txt).
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/sample_rows_pass.h"

namespace pagedcore {
namespace kernels {
namespace sample_avx2 {

#include "kernels/sample_rows_pass.inc"

}  // namespace sample_avx2
}  // namespace kernels
}  // namespace pagedcore
