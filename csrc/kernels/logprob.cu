// logp: the selected-token log-probability of each row of bf16 logits, in fp32.
// Forward: one block of kThreads threads per row. Thread l walks columns l, l + kThreads, ... (max, then the sum
// of exp(x - max)); the partials fold by a fixed butterfly per warp, then warp 0 folds the warps' values in
// order: the order depends only on V. lse = max + log(sum); out = x[target] - lse; lse is kept for the backward.
// Backward: one thread per element, dlogits = g * ([v == target] - exp(x - lse)), one rounding to bf16.
#include "ws1_kernels.h"

namespace ws1 {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// every thread gets the block's value; combine = 0 for max, 1 for sum (warps folded in order by warp 0)
__device__ float block_fold(float v, float* shared, int combine) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = combine == 0 ? warp_max(v) : warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float acc = shared[0];
    for (int w = 1; w < kWarps; ++w) acc = combine == 0 ? fmaxf(acc, shared[w]) : acc + shared[w];
    shared[kWarps] = acc;
  }
  __syncthreads();
  const float out = shared[kWarps];
  __syncthreads();
  return out;
}

__device__ __forceinline__ float f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float f32(float x) { return x; }

// InT: bf16 logits (logp) or fp32 logits (linear_logp keeps its logits in fp32)
template <typename InT>
__global__ void __launch_bounds__(kThreads)
    ws1_logp_fwd(const InT* __restrict__ logits, const int64_t* __restrict__ targets, float* __restrict__ out,
                 float* __restrict__ lse_out, int64_t vocab) {
  __shared__ float shared[kWarps + 1];
  const int64_t t = blockIdx.x;
  const InT* row = logits + t * vocab;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) m = fmaxf(m, f32(row[v]));
  m = block_fold(m, shared, 0);
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) s += expf(f32(row[v]) - m);
  s = block_fold(s, shared, 1);
  if (threadIdx.x == 0) {
    const float lse = m + logf(s);
    const int64_t target = targets[t];
    const float x = (target >= 0 && target < vocab) ? f32(row[target]) : NAN;
    out[t] = x - lse;
    lse_out[t] = lse;
  }
}

template <typename InT>
__global__ void ws1_logp_bwd(const InT* __restrict__ logits, const int64_t* __restrict__ targets,
                             const float* __restrict__ lse, const float* __restrict__ g, bf16* __restrict__ dlogits,
                             bf16* __restrict__ dlogits_lo, int64_t vocab) {
  const int64_t t = blockIdx.x;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (v >= vocab) return;
  const float p = expf(f32(logits[t * vocab + v]) - lse[t]);
  const float onehot = (v == targets[t]) ? 1.0f : 0.0f;
  const float d = g[t] * (onehot - p);
  const bf16 hi = __float2bfloat16_rn(d);
  dlogits[t * vocab + v] = hi;
  if (dlogits_lo != nullptr) dlogits_lo[t * vocab + v] = __float2bfloat16_rn(d - __bfloat162float(hi));
}


template <typename InT>
cudaError_t launch_fwd(const InT* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                       int64_t vocab, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  ws1_logp_fwd<InT><<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(logits, targets, out, lse, vocab);
  return cudaGetLastError();
}

template <typename InT>
cudaError_t launch_bwd(const InT* logits, const int64_t* targets, const float* lse, const float* g, bf16* dlogits,
                       bf16* dlogits_lo, int64_t tokens, int64_t vocab, cudaStream_t stream) {
  if (tokens == 0 || vocab == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((vocab + 255) / 256));
  ws1_logp_bwd<InT><<<grid, 256, 0, stream>>>(logits, targets, lse, g, dlogits, dlogits_lo, vocab);
  return cudaGetLastError();
}

}  // namespace

cudaError_t logp_fwd(const bf16* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                     int64_t vocab, cudaStream_t stream) {
  return launch_fwd(logits, targets, out, lse, tokens, vocab, stream);
}

cudaError_t logp_fwd_f32(const float* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                         int64_t vocab, cudaStream_t stream) {
  return launch_fwd(logits, targets, out, lse, tokens, vocab, stream);
}

cudaError_t logp_bwd(const bf16* logits, const int64_t* targets, const float* lse, const float* g, bf16* dlogits,
                     int64_t tokens, int64_t vocab, cudaStream_t stream) {
  return launch_bwd(logits, targets, lse, g, dlogits, static_cast<bf16*>(nullptr), tokens, vocab, stream);
}

cudaError_t logp_bwd_f32(const float* logits, const int64_t* targets, const float* lse, const float* g,
                         bf16* dlogits, bf16* dlogits_lo, int64_t tokens, int64_t vocab, cudaStream_t stream) {
  return launch_bwd(logits, targets, lse, g, dlogits, dlogits_lo, tokens, vocab, stream);
}

int logprob_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_logp_fwd<bf16>),
                       reinterpret_cast<const void*>(ws1_logp_bwd<bf16>),
                       reinterpret_cast<const void*>(ws1_logp_fwd<float>),
                       reinterpret_cast<const void*>(ws1_logp_bwd<float>)};
  const char* names[] = {"ws1_logp_fwd", "ws1_logp_bwd", "ws1_logp_fwd_f32", "ws1_logp_bwd_f32"};
  return fill_kernel_infos(out, cap, fns, names, 4);
}

}  // namespace ws1
