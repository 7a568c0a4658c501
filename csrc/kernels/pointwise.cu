// silu and swiglu: one element per thread, fp32 math (IEEE exp and division), one rounding to bf16.
// No reduction: every output element depends only on its own inputs, so any grid gives the same bits.
#include "ws1_kernels.h"

namespace ws1 {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void ws1_silu_fwd(const bf16* __restrict__ x, bf16* __restrict__ y, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = __bfloat162float(x[i]);
  y[i] = __float2bfloat16_rn(v * sigmoid(v));
}

__global__ void ws1_silu_bwd(const bf16* __restrict__ x, const bf16* __restrict__ dy, bf16* __restrict__ dx,
                             int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = __bfloat162float(x[i]);
  float s = sigmoid(v);
  dx[i] = __float2bfloat16_rn(__bfloat162float(dy[i]) * (s * (1.0f + v * (1.0f - s))));
}

__global__ void ws1_swiglu_fwd(const bf16* __restrict__ gate, const bf16* __restrict__ up, bf16* __restrict__ y,
                               int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = __bfloat162float(gate[i]);
  y[i] = __float2bfloat16_rn((g * sigmoid(g)) * __bfloat162float(up[i]));
}

__global__ void ws1_swiglu_bwd(const bf16* __restrict__ gate, const bf16* __restrict__ up,
                               const bf16* __restrict__ dy, bf16* __restrict__ dgate, bf16* __restrict__ dup,
                               int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = __bfloat162float(gate[i]);
  float u = __bfloat162float(up[i]);
  float d = __bfloat162float(dy[i]);
  float s = sigmoid(g);
  dup[i] = __float2bfloat16_rn(d * (g * s));
  dgate[i] = __float2bfloat16_rn((d * u) * (s * (1.0f + g * (1.0f - s))));
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t silu_fwd(const bf16* x, bf16* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ws1_silu_fwd<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t silu_bwd(const bf16* x, const bf16* dy, bf16* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ws1_silu_bwd<<<blocks_for(n), kThreads, 0, stream>>>(x, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t swiglu_fwd(const bf16* gate, const bf16* up, bf16* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ws1_swiglu_fwd<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, y, n);
  return cudaGetLastError();
}

cudaError_t swiglu_bwd(const bf16* gate, const bf16* up, const bf16* dy, bf16* dgate, bf16* dup, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ws1_swiglu_bwd<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, dy, dgate, dup, n);
  return cudaGetLastError();
}

int pointwise_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_silu_fwd), reinterpret_cast<const void*>(ws1_silu_bwd),
                       reinterpret_cast<const void*>(ws1_swiglu_fwd),
                       reinterpret_cast<const void*>(ws1_swiglu_bwd)};
  const char* names[] = {"ws1_silu_fwd", "ws1_silu_bwd", "ws1_swiglu_fwd", "ws1_swiglu_bwd"};
  return fill_kernel_infos(out, cap, fns, names, 4);
}

}  // namespace ws1
