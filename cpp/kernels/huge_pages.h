// Asking the kernel for transparent huge pages behind a large buffer (the KV cache).
//
// A decode step reads K/V planes of 4 KB (16 tokens x 64 dims x fp32) from blocks scattered over a
// cache of gigabytes: with 4 KB pages nearly every plane is a TLB miss and a page walk. Where THP
// is in "madvise" mode (Debian's default), madvise(MADV_HUGEPAGE) on the buffer before its pages
// are first touched maps it with 2 MB pages instead: paged attention read fp32 K/V ~10% faster
// (104 sequences x 350 tokens, 3.24 -> 2.91 ms a layer on the 2-core EPYC). The first touch of
// each huge page costs more (defrag "madvise" compacts synchronously), so the engine leaves it
// opt-in (python/pagedcore/engine/kv_cache.py, PAGEDCORE_KV_HUGE_PAGES=1).
#ifndef PAGEDCORE_KERNELS_HUGE_PAGES_H_
#define PAGEDCORE_KERNELS_HUGE_PAGES_H_

#include <cstddef>
#include <cstdint>

namespace pagedcore {
namespace kernels {

// Advises [ptr, ptr + num_bytes), trimmed inward to whole 2 MB pages. Returns the bytes advised:
// 0 when the range holds no whole huge page, the system is not Linux, or madvise refused (THP
// "never", or a kernel without it). Never fails loudly: this is a performance hint only.
size_t advise_huge_pages(uintptr_t ptr, size_t num_bytes);

}  // namespace kernels
}  // namespace pagedcore

#endif  // PAGEDCORE_KERNELS_HUGE_PAGES_H_
