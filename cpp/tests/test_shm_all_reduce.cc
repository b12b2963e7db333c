// The shared-memory all-reduce across fork()ed ranks: exact fp32 sums of integer-valued data, bf16
// summed in fp32 and rounded once, odd sizes and sizes above a slot (chunks), many calls in a row,
// both sum kernels, and a peer that dies or closes raising PeerDiedError instead of hanging.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "distributed/shm_all_reduce.h"
#include "distributed/sum_kernels.h"
#include "fork_ranks.h"

using namespace pagedcore;
using namespace pagedcore::distributed;
using pagedcore_test::run_ranks;
using pagedcore_test::unique_shm_name;

namespace {

WaitOptions quick(double timeout_s = 30) {
  WaitOptions o;
  o.timeout_s = timeout_s;
  o.check_interval_ms = 10;
  return o;
}

// Integer-valued, distinct per rank and element: every partial sum is exact in fp32.
float value(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 1001 - 500); }

// A bf16 value whose sums need rounding: mantissas that do not line up.
uint16_t bf16_value(int rank, int64_t i) {
  return kernels::float_to_bf16(std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank)) * 3.0f +
                                (rank == 1 ? 1000.0f : 0.0f));
}

void check_fp32_sum(int world_size, size_t slot_bytes, int64_t count, kernels::Isa isa) {
  const std::string name = unique_shm_name("ar");
  ShmAllReduce::create(name, world_size, slot_bytes);
  run_ranks(world_size, [&](int rank) {
    ShmAllReduce group(name, rank);
    std::vector<float> data(count);  // [count]
    for (int64_t i = 0; i < count; ++i) data[i] = value(rank, i);
    group.all_reduce_isa(data.data(), count, kernels::DType::kFloat32, quick(), isa);
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < world_size; ++r) want += value(r, i);
      CHECK_EQ(data[i], want);
    }
  });
  SharedSegment::unlink(name);
}

}  // namespace

TEST(fp32_sum_is_exact_for_odd_sizes) {
  for (int64_t count : {1, 3, 17, 33, 1000, 4099}) check_fp32_sum(2, 1 << 16, count, kernels::active_isa());
}

TEST(fp32_sum_three_ranks_generic_kernel) { check_fp32_sum(3, 1 << 16, 1001, kernels::Isa::kGeneric); }

TEST(sizes_above_a_slot_go_in_chunks) {
  check_fp32_sum(2, 256, 1000, kernels::active_isa());  // 64 floats per chunk, a partial last chunk
  check_fp32_sum(3, 4096, 100003, kernels::active_isa());
}

TEST(bf16_is_summed_in_fp32_and_rounded_once) {
  for (kernels::Isa isa : {kernels::Isa::kGeneric, kernels::active_isa()}) {
    const std::string name = unique_shm_name("bf16");
    const int64_t count = 777;
    ShmAllReduce::create(name, 3, 512);  // chunks of 256 elements
    run_ranks(3, [&](int rank) {
      ShmAllReduce group(name, rank);
      std::vector<uint16_t> data(count);  // [count] bf16
      for (int64_t i = 0; i < count; ++i) data[i] = bf16_value(rank, i);
      group.all_reduce_isa(data.data(), count, kernels::DType::kBFloat16, quick(), isa);
      for (int64_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < 3; ++r) sum += kernels::bf16_to_float(bf16_value(r, i));
        CHECK_EQ(data[i], kernels::float_to_bf16(sum));
      }
    });
    SharedSegment::unlink(name);
  }
}

TEST(sum_kernels_agree_including_nan_and_tails) {
  if (!sum_uses_avx512(kernels::Isa::kAvx512)) return;  // no AVX-512 here: one kernel only
  for (int64_t count : {1, 15, 16, 31, 257}) {
    std::vector<float> a(count), b(count), out_g(count), out_v(count);
    std::vector<uint16_t> ha(count), hb(count), hout_g(count), hout_v(count);
    for (int64_t i = 0; i < count; ++i) {
      a[i] = std::sin(static_cast<float>(i)) * 100.0f;
      b[i] = i == 5 ? NAN : std::cos(static_cast<float>(i) * 1.7f);
      ha[i] = kernels::float_to_bf16(a[i]);
      hb[i] = kernels::float_to_bf16(b[i]);
    }
    const float* in[] = {a.data(), b.data()};
    const uint16_t* hin[] = {ha.data(), hb.data()};
    sum_fp32_generic(out_g.data(), in, 2, count);
    sum_fp32_avx512(out_v.data(), in, 2, count);
    sum_bf16_generic(hout_g.data(), hin, 2, count);
    sum_bf16_avx512(hout_v.data(), hin, 2, count);
    for (int64_t i = 0; i < count; ++i) {
      CHECK((std::isnan(out_g[i]) && std::isnan(out_v[i])) || out_g[i] == out_v[i]);
      CHECK_EQ(hout_g[i], hout_v[i]);
    }
  }
}

TEST(many_calls_in_a_row) {
  const std::string name = unique_shm_name("many");
  ShmAllReduce::create(name, 2, 1024);
  run_ranks(2, [&](int rank) {
    ShmAllReduce group(name, rank);
    for (int call = 0; call < 2000; ++call) {
      const int64_t count = 1 + call % 300;  // 1 .. 300 floats, sometimes two chunks
      std::vector<float> data(count, static_cast<float>(call + rank));
      group.all_reduce(data.data(), count, kernels::DType::kFloat32, quick());
      for (float x : data) CHECK_EQ(x, static_cast<float>(2 * call + 1));
    }
  });
  SharedSegment::unlink(name);
}

TEST(the_name_is_unlinked_once_every_rank_opened) {
  const std::string name = unique_shm_name("unlink");
  ShmAllReduce::create(name, 2, 256);
  {
    ShmAllReduce rank0(name, 0);
    CHECK(::access(("/dev/shm/" + name).c_str(), F_OK) == 0);
    ShmAllReduce rank1(name, 1);
    CHECK(::access(("/dev/shm/" + name).c_str(), F_OK) != 0);
    CHECK_THROWS(ShmAllReduce(name, 1));  // gone by name: a third open fails
  }
  CHECK(!SharedSegment::unlink(name));
}

TEST(a_rank_opened_twice_is_refused) {
  const std::string name = unique_shm_name("twice");
  ShmAllReduce::create(name, 3, 256);
  ShmAllReduce rank0(name, 0);
  CHECK_THROWS(ShmAllReduce(name, 0));
  CHECK_THROWS(ShmAllReduce(name, 5));
  SharedSegment::unlink(name);
}

TEST(a_killed_peer_raises_peer_died_within_bounded_time) {
  const std::string name = unique_shm_name("killed");
  ShmAllReduce::create(name, 2, 256);
  std::vector<pid_t> child = pagedcore_test::fork_children(1, [&](int rank) {
    ShmAllReduce group(name, rank);
    float x = 1;
    group.all_reduce(&x, 1, kernels::DType::kFloat32, quick());
    ::raise(SIGKILL);  // dies between two all-reduces, as a crashed rank would
  });
  ShmAllReduce group(name, 0);
  float x = 2;
  group.all_reduce(&x, 1, kernels::DType::kFloat32, quick());
  CHECK_EQ(x, 3.0f);
  const auto start = std::chrono::steady_clock::now();
  bool died = false;
  try {
    group.all_reduce(&x, 1, kernels::DType::kFloat32, quick(60));
  } catch (const PeerDiedError&) {
    died = true;
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(died);
  CHECK(waited < 10);  // the liveness check, not the 60 s deadline
  CHECK_THROWS(group.all_reduce(&x, 1, kernels::DType::kFloat32, quick()));  // broken from now on
  ::waitpid(child[0], nullptr, 0);
}

TEST(a_closed_peer_raises_and_an_absent_one_times_out) {
  const std::string name = unique_shm_name("closed");
  ShmAllReduce::create(name, 2, 256);
  ShmAllReduce rank0(name, 0);
  float x = 1;
  bool timed_out = false;
  try {
    rank0.all_reduce(&x, 1, kernels::DType::kFloat32, quick(0.2));  // rank 1 never opened
  } catch (const WaitTimeoutError&) {
    timed_out = true;
  }
  CHECK(timed_out);
  SharedSegment::unlink(name);

  const std::string name2 = unique_shm_name("closed2");
  ShmAllReduce::create(name2, 2, 256);
  ShmAllReduce a(name2, 0);
  {
    ShmAllReduce b(name2, 1);
    b.close();
  }
  bool died = false;
  try {
    a.all_reduce(&x, 1, kernels::DType::kFloat32, quick(30));
  } catch (const PeerDiedError&) {
    died = true;
  }
  CHECK(died);
}

int main() { return pagedcore_test::run_all(); }
