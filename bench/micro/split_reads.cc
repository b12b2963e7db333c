// 120 per-op weight reads (a Q4_1 token's linears) split over two threads: busy time per thread and the
// finish gaps at the joins; with a chunk size, chunks claimed from both ends instead (see README.md here).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include "kernels/parallel.h"
using namespace pagedcore::kernels;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
__attribute__((target("avx512f"))) static float rd(const uint8_t* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i)); a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 64));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 128)); a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 192));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
int main(int argc, char** argv) {
  const bool two_ended = argc > 1;
  const int64_t chunk_bytes = argc > 1 ? atoi(argv[1]) : 0;
  const size_t sizes[4] = {345600, 207360, 1105920, 552960};
  std::vector<std::vector<uint8_t>> ws;
  size_t total = 0;
  for (int l = 0; l < 30; ++l) for (size_t s : sizes) { ws.emplace_back(s, 0x3c); total += s; }
  std::vector<uint8_t> flush(total, 0x3c);
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    sink = rd(flush.data(), flush.size());
    double busy[2] = {0, 0}, wall = 0, finish_gap = 0;
    int first_task_thread0 = 0;
    for (auto& w : ws) {
      double t_start = now(), done[2] = {t_start, t_start};  // a thread that took no task finished at the start
      if (!two_ended) {
      parallel_for(2, [&](int task, int thread) {
        double a = now();
        const size_t h = w.size() / 2 / 256 * 256;
        sink = rd(w.data() + task * h, task == 0 ? h : w.size() - h);
        double b = now();
        busy[thread] += b - a; done[thread] = b;
        if (task == 0 && thread == 0) ++first_task_thread0;
      });
      } else {
      // chunks claimed from both ends: front (ascending) by task 0, back (descending) by task 1
      const int64_t chunk = chunk_bytes, nchunks = (w.size() + chunk - 1) / chunk;
      std::atomic<int64_t> front{0}, back{nchunks};
      parallel_for(2, [&](int task, int thread) {
        double a = now();
        for (;;) {
          int64_t c;
          if (task == 0) { c = front.fetch_add(1); if (c >= back.load()) break; }
          else { c = back.fetch_sub(1) - 1; if (c < front.load()) break; }
          // a chunk may be taken twice at the meeting point: harmless for a read
          const size_t off = c * chunk, len = std::min<size_t>(chunk, w.size() - off);
          sink = rd(w.data() + off, len);
        }
        double b = now();
        busy[thread] += b - a; done[thread] = b;
        if (task == 0 && thread == 0) ++first_task_thread0;
      });
      }
      double t_end = now();
      wall += t_end - t_start;
      finish_gap += std::max(done[0], done[1]) - std::min(done[0], done[1]);
    }
    printf("120 split reads: wall %.3f ms, busy thread0 %.3f thread1 %.3f ms, sum of finish gaps %.3f ms, "
           "task0 on thread0 %d/120\n",
           wall * 1e3, busy[0] * 1e3, busy[1] * 1e3, finish_gap * 1e3, first_task_thread0);
  }
}
