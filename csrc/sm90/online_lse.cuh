// The online log-sum-exp pieces that the Hopper logp kernels share (logp_sm90.cu, linear_logp_sm90.cu): a partial
// is a pair (m, s) with s = sum_j 2^((x_j - m) log2e) over the values it has seen and m their max. Every combine is
// commutative in IEEE arithmetic (one max, two products and one sum), so a fixed xor butterfly leaves the same pair
// in every lane; what fixes the bits is the order of the folds, which each kernel fixes as a function of V alone.
//
// exp: ex2.approx.f32 (MUFU; about 2 ulp), the instruction Triton's exp lowers to: the accurate expf costs about
// 20 instructions an element, which at 622M elements (4096 x 151936) would make a logp kernel compute-bound.
#pragma once

#include <cmath>

namespace ws1::sm90::lse {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^((from - to) log2e), with an empty partial (from = -inf) weighing nothing
__device__ __forceinline__ float rescale(float from, float to) {
  return from == -INFINITY ? 0.0f : ex2((from - to) * kLog2e);
}

// (m, s) <- (m, s) (+) (m2, s2); two empty partials stay empty
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float mc = fmaxf(m, m2);
  if (mc == -INFINITY) return;
  s = s * rescale(m, mc) + s2 * rescale(m2, mc);
  m = mc;
}

// the butterfly over the lanes whose index differs in the bits of `lanes - 1` (lanes: 2, 4, ... 32), each step a
// commutative combine, so every lane of a group ends with the same pair
template <int kLanes>
__device__ __forceinline__ void butterfly(float& m, float& s) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
    combine(m, s, m2, s2);
  }
}

}  // namespace ws1::sm90::lse
