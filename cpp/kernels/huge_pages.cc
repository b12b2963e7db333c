#include "kernels/huge_pages.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pagedcore {
namespace kernels {

size_t advise_huge_pages(uintptr_t ptr, size_t num_bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;  // 2 MB, x86-64 and aarch64 (4 KB base pages)
  const uintptr_t begin = (ptr + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (ptr + num_bytes) & ~(kHuge - 1);
  if (num_bytes == 0 || end <= begin) return 0;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) != 0) return 0;
  return end - begin;
#else
  (void)ptr;
  (void)num_bytes;
  return 0;
#endif
}

}  // namespace kernels
}  // namespace pagedcore
