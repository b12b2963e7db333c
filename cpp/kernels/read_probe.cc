// The memory-bandwidth probe (linear.h read_probe): a buffer read once by each thread's slice, through the ISA's
// widest loads, so a benchmark can set kernels' streaming rates against what any kernel could stream.
#include <algorithm>
#include <vector>

#include "kernels/linear.h"
#include "kernels/linear_kernel.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {

float read_probe(const void* data, int64_t bytes, int threads) {
  return read_probe(data, bytes, threads, active_isa());
}

float read_probe(const void* data, int64_t bytes, int threads, Isa isa) {
  if (!data || bytes <= 0 || !isa_supported(isa)) return 0.f;
  const LinearIsaKernels& kern = linear_isa_kernels(isa);
  const int max = std::max(1, max_threads());
  const int n = threads <= 0 || threads > max ? max : threads;
  const int64_t per = (bytes / n) / 64 * 64;
  std::vector<float> partial(n, 0.f);
  parallel_for(n, [&](int t, int) {
    const int64_t begin = t * per, len = t == n - 1 ? bytes - begin : per;
    partial[t] = kern.read(static_cast<const char*>(data) + begin, len);
  });
  float s = 0.f;
  for (float v : partial) s += v;
  return s;
}

}  // namespace kernels
}  // namespace pagedcore
