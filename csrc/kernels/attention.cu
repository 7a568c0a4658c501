// attention: causal GQA attention within each sample, one warp per (query row, query head).
//
// Forward: the warp walks its sample's keys one at a time from logical position 0 up to the query's position
// (keys = the sample's kv prefix, then the call's own rows, laid out contiguously per sample by the caller): the
// score is a lane-strided dot product folded by a fixed butterfly, then a running-max softmax update (m, l, acc),
// exactly one update per key. The order of every sum depends only on the key positions and D, so a query row gets
// the same bits in a packed prefill, a chunked prefill or a decode step, whatever the batch. Output acc / l in
// bf16, lse = m + log(l) in fp32 for the backward.
//
// Backward (training calls: whole samples, no prefix): delta = rowsum(dO * O) per (row, head); dq by a walk over
// the same keys in the same order; dk and dv by one warp per (key row, kv head) walking the group's query heads in
// order and, for each, the sample's query rows from the key's position upward. No atomics, no split.
#include <math.h>

#include "ws1_kernels.h"

namespace ws1 {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxPerLane = 8;  // D <= 256

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// lane's elements of a D-vector: d = lane + 32 * i, i < kMaxPerLane, d < D
__device__ __forceinline__ void load_row(const bf16* __restrict__ p, int d, int lane, float (&out)[kMaxPerLane]) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    out[i] = e < d ? __bfloat162float(p[e]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float (&a)[kMaxPerLane], const bf16* __restrict__ b, int d, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < d) s += a[i] * __bfloat162float(b[e]);
  }
  return warp_sum(s);
}

__global__ void __launch_bounds__(kThreads)
    ws1_attn_fwd(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                 const int32_t* __restrict__ key_base, const int32_t* __restrict__ n_keys, bf16* __restrict__ o,
                 float* __restrict__ lse, int64_t rows, int hq, int hkv, int d, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= rows * hq) return;
  const int64_t t = item / hq;
  const int h = static_cast<int>(item % hq);
  const int g = h / (hq / hkv);
  const int64_t qo = (t * hq + h) * d;
  const int n = n_keys[t];
  float qv[kMaxPerLane], acc[kMaxPerLane];
  load_row(q + qo, d, lane, qv);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t base = key_base[t];
  for (int j = 0; j < n; ++j) {
    const int64_t ko = ((base + j) * hkv + g) * d;
    const float s = dot(qv, k + ko, d, lane) * scale;
    const float m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new);
    const float p = expf(s - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < d) acc[i] = acc[i] * alpha + p * __bfloat162float(v[ko + e]);
    }
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < d) o[qo + e] = __float2bfloat16_rn(n > 0 ? acc[i] / l : 0.0f);
  }
  if (lane == 0) lse[t * hq + h] = n > 0 ? m + logf(l) : 0.0f;
}

__global__ void __launch_bounds__(kThreads)
    ws1_attn_bwd_delta(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ delta,
                       int64_t items, int d) {
  const int lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= items) return;
  float ov[kMaxPerLane];
  load_row(o + item * d, d, lane, ov);
  const float s = dot(ov, dout + item * d, d, lane);
  if (lane == 0) delta[item] = s;
}

__global__ void __launch_bounds__(kThreads)
    ws1_attn_bwd_dq(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                    const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                    const int32_t* __restrict__ key_base, const int32_t* __restrict__ n_keys, bf16* __restrict__ dq,
                    int64_t rows, int hq, int hkv, int d, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= rows * hq) return;
  const int64_t t = item / hq;
  const int h = static_cast<int>(item % hq);
  const int g = h / (hq / hkv);
  const int64_t qo = (t * hq + h) * d;
  const int n = n_keys[t];
  float qv[kMaxPerLane], dov[kMaxPerLane], acc[kMaxPerLane];
  load_row(q + qo, d, lane, qv);
  load_row(dout + qo, d, lane, dov);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
  const float lse_t = lse[t * hq + h], delta_t = delta[t * hq + h];
  const int64_t base = key_base[t];
  for (int j = 0; j < n; ++j) {
    const int64_t ko = ((base + j) * hkv + g) * d;
    const float p = expf(dot(qv, k + ko, d, lane) * scale - lse_t);
    const float ds = p * (dot(dov, v + ko, d, lane) - delta_t);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < d) acc[i] += ds * __bfloat162float(k[ko + e]);
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < d) dq[qo + e] = __float2bfloat16_rn(acc[i] * scale);
  }
}

__global__ void __launch_bounds__(kThreads)
    ws1_attn_bwd_dkv(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                     const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                     const int32_t* __restrict__ q_end, bf16* __restrict__ dk, bf16* __restrict__ dv, int64_t rows,
                     int hq, int hkv, int d, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= rows * hkv) return;
  const int64_t j = item / hkv;
  const int g = static_cast<int>(item % hkv);
  const int group = hq / hkv;
  const int64_t ko = (j * hkv + g) * d;
  float kv[kMaxPerLane], vv[kMaxPerLane], dk_acc[kMaxPerLane], dv_acc[kMaxPerLane];
  load_row(k + ko, d, lane, kv);
  load_row(v + ko, d, lane, vv);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) dk_acc[i] = dv_acc[i] = 0.0f;
  const int64_t end = q_end[j];
  for (int hh = 0; hh < group; ++hh) {
    const int h = g * group + hh;
    for (int64_t t = j; t < end; ++t) {
      const int64_t qo = (t * hq + h) * d;
      const float p = expf(dot(kv, q + qo, d, lane) * scale - lse[t * hq + h]);
      const float dp = dot(vv, dout + qo, d, lane);
      const float ds = p * (dp - delta[t * hq + h]);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e < d) {
          dk_acc[i] += ds * __bfloat162float(q[qo + e]);
          dv_acc[i] += p * __bfloat162float(dout[qo + e]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < d) {
      dk[ko + e] = __float2bfloat16_rn(dk_acc[i] * scale);
      dv[ko + e] = __float2bfloat16_rn(dv_acc[i]);
    }
  }
}

unsigned blocks_for(int64_t items) { return static_cast<unsigned>((items + kWarps - 1) / kWarps); }

}  // namespace

cudaError_t attn_fwd(const bf16* q, const bf16* k, const bf16* v, const int32_t* key_base, const int32_t* n_keys,
                     bf16* o, float* lse, int64_t rows, int hq, int hkv, int d, float scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (d > 32 * kMaxPerLane || hkv == 0 || hq % hkv) return cudaErrorInvalidValue;
  ws1_attn_fwd<<<blocks_for(rows * hq), kThreads, 0, stream>>>(q, k, v, key_base, n_keys, o, lse, rows, hq, hkv, d,
                                                               scale);
  return cudaGetLastError();
}

cudaError_t attn_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* dout, const float* lse,
                     float* delta, const int32_t* key_base, const int32_t* n_keys, const int32_t* q_end, bf16* dq,
                     bf16* dk, bf16* dv, int64_t rows, int hq, int hkv, int d, float scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (d > 32 * kMaxPerLane || hkv == 0 || hq % hkv) return cudaErrorInvalidValue;
  ws1_attn_bwd_delta<<<blocks_for(rows * hq), kThreads, 0, stream>>>(o, dout, delta, rows * hq, d);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ws1_attn_bwd_dq<<<blocks_for(rows * hq), kThreads, 0, stream>>>(q, k, v, dout, lse, delta, key_base, n_keys, dq,
                                                                  rows, hq, hkv, d, scale);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ws1_attn_bwd_dkv<<<blocks_for(rows * hkv), kThreads, 0, stream>>>(q, k, v, dout, lse, delta, q_end, dk, dv, rows,
                                                                    hq, hkv, d, scale);
  return cudaGetLastError();
}

int attention_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_attn_fwd), reinterpret_cast<const void*>(ws1_attn_bwd_delta),
                       reinterpret_cast<const void*>(ws1_attn_bwd_dq),
                       reinterpret_cast<const void*>(ws1_attn_bwd_dkv)};
  const char* names[] = {"ws1_attn_fwd", "ws1_attn_bwd_delta", "ws1_attn_bwd_dq", "ws1_attn_bwd_dkv"};
  return fill_kernel_infos(out, cap, fns, names, 4);
}

}  // namespace ws1
