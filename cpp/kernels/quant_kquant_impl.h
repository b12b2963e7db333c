// The k-quant kernels (Q4_K, Q5_K, Q6_K: 256-weight super-blocks of 6-bit or int8 sub-block scales)
// of quant_linear_impl.h, which includes this file inside each per-ISA translation unit: the trait Q,
// its vector types, half() and row_blocks() are that file's. Per super-block, int32 lanes add the
// products times each sub-block's scale (madd with the scales, free on maddubs), then one float FMA
// with d * d_x; the minimums (Q4_K / Q5_K) and Q6_K's -32 offset come from the activations' 16-sums.
#ifndef PC_ISA_NAMESPACE
#error "quant_kquant_impl.h is included by quant_linear_impl.h"
#endif

#include <cstdint>

#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

// The 6-bit scales and minimums of the 8 sub-blocks of a Q4_K / Q5_K super-block.
inline void unpack_scales(const uint8_t* q, int16_t* sc, int16_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    mn[j] = q[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// kKind: 4 = Q4_K, 5 = Q5_K, 6 = Q6_K.
template <class Block, int kKind>
struct BlocksK {
  static constexpr bool kWide = Q::kRegs >= 32;
  // The unsigned weights of chunks c and c + 1 (parts 0 and 1; S == 1: chunk c only).
  static V unpack(const Block& b, int c) {
    const int c1 = S == 2 ? c + 1 : c;
    if constexpr (kKind == 6) {  // chunk c = 4 h + t
      const uint8_t* ql = b.ql;
      const int h0 = c >> 2, t0 = c & 3, h1 = c1 >> 2, t1 = c1 & 3;
      const V lo = Q::shr_and(Q::load2(ql + 64 * h0 + 32 * (t0 & 1), ql + 64 * h1 + 32 * (t1 & 1)),
                              4 * (t0 >> 1), 4 * (t1 >> 1), 0x0F);
      const uint8_t* qh = b.qh;
      const V hi = Q::shr_and(Q::load2(qh + 32 * h0, qh + 32 * h1), 2 * t0, 2 * t1, 0x03);
      return Q::or_(lo, Q::shl4(hi));
    } else {
      const uint8_t* qs = b.qs;
      V u = Q::shr_and(Q::load2(qs + 32 * (c >> 1), qs + 32 * (c1 >> 1)), 4 * (c & 1), 4 * (c1 & 1), 0x0F);
      if constexpr (kKind == 5) u = Q::or_(u, Q::shl4(Q::shr_and(Q::load2(b.qh, b.qh), c, c1, 0x01)));
      return u;
    }
  }

  template <int MR, int NR>
  static void tile(const QuantBlockArgs& a, int64_t m, int64_t n, float (&out)[MR][NR]) {
    const int64_t nsb = a.K / kBlockK;
    const Block* w[NR];
    for (int j = 0; j < NR; ++j) w[j] = row_blocks<Block>(a, n + j);
    const int8_t* xq[MR];
    const float* xd[MR];
    const int16_t* xb[MR];
    for (int r = 0; r < MR; ++r) {
      xq[r] = a.x.q + (m + r) * a.x.q_stride;
      xd[r] = a.x.d + (m + r) * a.x.d_stride;
      xb[r] = a.x.bsum + (m + r) * a.x.bsum_stride;
    }
    F acc[MR][NR];
    float corr[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) {
        acc[r][j] = Q::fzero();
        corr[r][j] = 0.f;
      }
    for (int64_t sb = 0; sb < nsb; ++sb) {
      // Per weight row: 16 scales (one per 16 weights), the float scale of the integer sum and the
      // weight of the correction term (minimums or Q6_K's offset), over 16 activation sums.
      int16_t sc[NR][16], mn[NR][16];
      float dscale[NR], dcorr[NR];
      for (int j = 0; j < NR; ++j) {
        const Block& b = w[j][sb];
        if constexpr (kKind == 6) {
          for (int i = 0; i < 16; ++i) sc[j][i] = mn[j][i] = b.scales[i];
          dscale[j] = half(b.d);
          dcorr[j] = -32.f * dscale[j];
        } else {
          int16_t s8[8], m8[8];
          unpack_scales(b.scales, s8, m8);
          for (int i = 0; i < 16; ++i) {
            sc[j][i] = s8[i >> 1];
            mn[j][i] = m8[i >> 1];
          }
          dscale[j] = half(b.d);
          dcorr[j] = -half(b.dmin);
        }
      }
      I isum[MR][NR];
      for (int r = 0; r < MR; ++r)
        for (int j = 0; j < NR; ++j) isum[r][j] = Q::izero();
      for (int c = 0; c < 8; c += S) {
        V u[NR];
        typename Q::SC scv[NR];
        for (int j = 0; j < NR; ++j) {
          u[j] = unpack(w[j][sb], c);
          scv[j] = Q::scales(&sc[j][2 * c]);
        }
        for (int r = 0; r < MR; ++r) {
          const V xv = Q::load(xq[r] + sb * kBlockK + c * 32);
          for (int j = 0; j < NR; ++j) isum[r][j] = Q::add(isum[r][j], Q::dot_scaled(u[j], xv, scv[j]));
        }
      }
      for (int r = 0; r < MR; ++r) {
        const float dx = xd[r][sb];
        const int16_t* bs = xb[r] + sb * 16;
        for (int j = 0; j < NR; ++j) {
          int32_t msum = 0;
          for (int i = 0; i < 16; ++i) msum += mn[j][i] * bs[i];
          acc[r][j] = Q::fmadd(Q::cvt(isum[r][j]), Q::set1(dscale[j] * dx), acc[r][j]);
          corr[r][j] += dcorr[j] * dx * static_cast<float>(msum);
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) out[r][j] = Q::hsum(acc[r][j]) + corr[r][j];
  }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
