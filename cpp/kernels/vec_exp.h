// exp over a vector, written once against the trait interface (vec_generic.h) and used by the AVX
// traits' exp: Cephes-style 2^n * p(r), |rel err| ~ 2e-7; inputs below -87.3 (and -inf) give
// exactly 0, so masked softmax scores vanish. Defined in the including unit's ISA namespace, like
// the traits themselves.
#pragma once

#ifndef PC_ISA_NAMESPACE
#error "vec_exp.h is included by a trait header (vec_avx2.h, vec_avx512.h)"
#endif

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

template <typename V>
inline typename V::R vec_exp(typename V::R x) {
  using R = typename V::R;
  const R lo = V::set1(-87.3365478515625f);
  const auto underflow = V::less(x, lo);
  x = V::max(V::min(x, V::set1(88.3762626647949f)), lo);
  const R n = V::round_nearest(V::mul(x, V::set1(1.44269504088896341f)));  // x / ln 2
  x = V::fnmadd(n, V::set1(0.693359375f), x);     // r = x - n ln 2, ln 2 in two parts
  x = V::fnmadd(n, V::set1(-2.12194440e-4f), x);
  R y = V::set1(1.9875691500E-4f);
  y = V::fmadd(y, x, V::set1(1.3981999507E-3f));
  y = V::fmadd(y, x, V::set1(8.3334519073E-3f));
  y = V::fmadd(y, x, V::set1(4.1665795894E-2f));
  y = V::fmadd(y, x, V::set1(1.6666665459E-1f));
  y = V::fmadd(y, x, V::set1(5.0000001201E-1f));
  y = V::fmadd(y, V::mul(x, x), V::add(x, V::set1(1.f)));
  return V::zero_where(underflow, V::mul(y, V::pow2n(n)));
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
