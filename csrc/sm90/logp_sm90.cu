// logp for the Hopper profile: the selected-token log-probability of each row of bf16 logits, in fp32, in ONE pass
// over the logits (the generic kernel, ../kernels/logprob.cu, reads each row twice with scalar loads). linear_logp
// has its own fused forward (linear_logp_sm90.cu), which never writes its logits.
//
// Forward: one block of kThreads threads per row. The row is cut into 8-element vectors (16 bytes); thread l owns
// vectors l, l + kThreads, l + 2 kThreads, ... and folds them IN THAT ORDER into an online (max, sum) pair: per
// vector, m' = max(m, max of its 8 values), s' = s * 2^((m - m') log2e) + sum_j 2^((x_j - m') log2e), j = 0..7 in
// order. The loads are issued four vectors ahead, the folds stay in vector order, so the arithmetic is a function
// of V alone. The 16 warps' pairs fold by a fixed xor butterfly (each combine is commutative in IEEE arithmetic,
// so every lane holds the same pair), then thread 0 folds the warps in order. lse = m + ln(s); out = x[t] - lse.
//
// Loads: 16-byte vector loads when the logits are 16-byte aligned and V % 8 == 0, else eight scalar loads per
// vector (a partial last vector filled with -inf, which neither the max nor the sum can see). Both paths run the
// same arithmetic on the same vectors, so a row's bits never depend on its address.
//
// Backward: one thread per 8-element vector, dlogits = g * ([v == target] - 2^((x - lse) log2e)), one rounding to
// bf16, 16-byte stores where aligned. Elementwise: nothing is reduced.
//
// exp, rescale, combine and the warp butterfly: online_lse.cuh.
#include <cstdint>

#include "online_lse.cuh"
#include "ws1_sm90.h"

namespace ws1::sm90 {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;       // bf16 values per 16-byte vector
constexpr int kAhead = 4;     // vectors loaded before the first of them is folded
constexpr int kBwdThreads = 256;
using lse::combine;
using lse::ex2;
using lse::kLog2e;
using lse::rescale;

struct Vec8 {
  float x[kVec];
};

__device__ __forceinline__ float bf_to_f(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

// vector i of a row (8 values): one 16-byte load (Aligned) or scalar loads with -inf past the row's end
template <bool Aligned>
__device__ __forceinline__ Vec8 load_vec(const bf16* __restrict__ row, int64_t i, int64_t vocab) {
  Vec8 v;
  if constexpr (Aligned) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row) + i);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v.x[2 * j] = bf_to_f(w[j] & 0xffffu);
      v.x[2 * j + 1] = bf_to_f(w[j] >> 16);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t c = i * kVec + j;
      v.x[j] = c < vocab ? to_f(row[c]) : -INFINITY;
    }
  }
  return v;
}

__device__ __forceinline__ void fold_vec(const Vec8& v, float& m, float& s) {
  float vm = v.x[0];
#pragma unroll
  for (int j = 1; j < kVec; ++j) vm = fmaxf(vm, v.x[j]);
  const float m_new = fmaxf(m, vm);
  if (m_new == -INFINITY) return;  // nothing finite seen yet (an all -inf prefix)
  float acc = s * rescale(m, m_new);
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc += ex2((v.x[j] - m_new) * kLog2e);
  m = m_new;
  s = acc;
}

template <bool Aligned>
__global__ void __launch_bounds__(kThreads, 2)
    ws1_sm90_logp_fwd(const bf16* __restrict__ logits, const int64_t* __restrict__ targets, float* __restrict__ out,
                      float* __restrict__ lse_out, int64_t vocab) {
  __shared__ float shared_m[kWarps];
  __shared__ float shared_s[kWarps];
  const int64_t t = blockIdx.x;
  const bf16* row = logits + t * vocab;
  const int64_t nvec = (vocab + kVec - 1) / kVec;
  float m = -INFINITY, s = 0.0f;
  int64_t i = threadIdx.x;
  for (; i + (kAhead - 1) * kThreads < nvec; i += kAhead * kThreads) {
    Vec8 v[kAhead];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) v[a] = load_vec<Aligned>(row, i + a * kThreads, vocab);
#pragma unroll
    for (int a = 0; a < kAhead; ++a) fold_vec(v[a], m, s);
  }
  for (; i < nvec; i += kThreads) fold_vec(load_vec<Aligned>(row, i, vocab), m, s);
  lse::butterfly<32>(m, s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float bm = shared_m[0], bs = shared_s[0];
    for (int w = 1; w < kWarps; ++w) combine(bm, bs, shared_m[w], shared_s[w]);
    const float lse = bm + logf(bs);
    const int64_t target = targets[t];
    const float x = (target >= 0 && target < vocab) ? to_f(row[target]) : NAN;
    out[t] = x - lse;
    lse_out[t] = lse;
  }
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const uint32_t a = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return a | (b << 16);
}

template <bool Aligned>
__global__ void __launch_bounds__(kBwdThreads)
    ws1_sm90_logp_bwd(const bf16* __restrict__ logits, const int64_t* __restrict__ targets,
                      const float* __restrict__ lse, const float* __restrict__ g, bf16* __restrict__ dlogits,
                      int64_t vocab) {
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kBwdThreads + threadIdx.x;
  const int64_t nvec = (vocab + kVec - 1) / kVec;
  if (i >= nvec) return;
  const bf16* row = logits + t * vocab;
  const Vec8 v = load_vec<Aligned>(row, i, vocab);
  const float l = lse[t], gt = g[t];
  const int64_t target = targets[t];
  float d[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float onehot = (i * kVec + j == target) ? 1.0f : 0.0f;
    d[j] = gt * (onehot - ex2((v.x[j] - l) * kLog2e));
  }
  bf16* drow = dlogits + t * vocab;
  if constexpr (Aligned) {
    const uint4 raw = {pack2(d[0], d[1]), pack2(d[2], d[3]), pack2(d[4], d[5]), pack2(d[6], d[7])};
    reinterpret_cast<uint4*>(drow)[i] = raw;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t c = i * kVec + j;
      if (c < vocab) drow[c] = __float2bfloat16_rn(d[j]);
    }
  }
}

bool aligned_rows(const void* p, int64_t vocab) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && vocab % kVec == 0;
}

cudaError_t launch_fwd(const bf16* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                       int64_t vocab, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const auto grid = static_cast<unsigned>(tokens);
  if (aligned_rows(logits, vocab)) {
    ws1_sm90_logp_fwd<true><<<grid, kThreads, 0, stream>>>(logits, targets, out, lse, vocab);
  } else {
    ws1_sm90_logp_fwd<false><<<grid, kThreads, 0, stream>>>(logits, targets, out, lse, vocab);
  }
  return cudaGetLastError();
}

}  // namespace

bool logp_vector_path(const void* logits, int64_t vocab) { return aligned_rows(logits, vocab); }

cudaError_t logp_fwd(const bf16* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                     int64_t vocab, cudaStream_t stream) {
  return launch_fwd(logits, targets, out, lse, tokens, vocab, stream);
}

cudaError_t logp_bwd(const bf16* logits, const int64_t* targets, const float* lse, const float* g, bf16* dlogits,
                     int64_t tokens, int64_t vocab, cudaStream_t stream) {
  if (tokens == 0 || vocab == 0) return cudaSuccess;
  const int64_t nvec = (vocab + kVec - 1) / kVec;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((nvec + kBwdThreads - 1) / kBwdThreads));
  // both the read and the write must be aligned for the vector path (dlogits is a fresh allocation: it is)
  if (aligned_rows(logits, vocab) && aligned_rows(dlogits, vocab)) {
    ws1_sm90_logp_bwd<true><<<grid, kBwdThreads, 0, stream>>>(logits, targets, lse, g, dlogits, vocab);
  } else {
    ws1_sm90_logp_bwd<false><<<grid, kBwdThreads, 0, stream>>>(logits, targets, lse, g, dlogits, vocab);
  }
  return cudaGetLastError();
}

int logp_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_sm90_logp_fwd<true>),
                       reinterpret_cast<const void*>(ws1_sm90_logp_fwd<false>),
                       reinterpret_cast<const void*>(ws1_sm90_logp_bwd<true>),
                       reinterpret_cast<const void*>(ws1_sm90_logp_bwd<false>)};
  const char* names[] = {"ws1_sm90_logp_fwd_vec", "ws1_sm90_logp_fwd_scalar", "ws1_sm90_logp_bwd_vec",
                         "ws1_sm90_logp_bwd_scalar"};
  return fill_kernel_infos(out, cap, fns, names, 4);
}

}  // namespace ws1::sm90
