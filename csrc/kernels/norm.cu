// rms_norm and qk_norm: one warp per (token, head) row for the forward and the row terms of the backward; the
// weight gradient by sample blocks (ws1's sample_blocks_main_grad rule).
//
// A row's sums are lane-strided fp32 partial sums (lane l adds elements l, l + 32, ...) folded by a 5-step
// butterfly: the order depends only on the row width D. Math as the fp32 reference: ms = sum(x*x) / D,
// r = 1 / sqrt(ms + eps) (IEEE division and square root), y = (x * r) * w, one rounding to bf16.
// Backward of one block program: r and c = sum(g * xhat) / D per row of its 16 slots (g = dy * w), then
// dx = r * (g - xhat * c), then (a wgrad block) its column sums of dy * xhat, slot by slot, head by head, into
// bsum[p]; wgrad_accumulate adds the block sums into main_grad in block order.
#include "ws1_kernels.h"

namespace ws1 {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__global__ void __launch_bounds__(kThreads) ws1_norm_fwd(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                         bf16* __restrict__ y, int64_t rows, int d, float eps) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= rows) return;
  const bf16* xr = x + row * d;
  float acc = 0.0f;
  for (int i = lane; i < d; i += 32) {
    const float v = __bfloat162float(xr[i]);
    acc += v * v;
  }
  const float ms = warp_sum(acc) / static_cast<float>(d);
  const float r = 1.0f / sqrtf(ms + eps);
  bf16* yr = y + row * d;
  for (int i = lane; i < d; i += 32) {
    yr[i] = __float2bfloat16_rn((__bfloat162float(xr[i]) * r) * __bfloat162float(w[i]));
  }
}

__global__ void __launch_bounds__(kThreads)
    ws1_norm_bwd_blocks(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ dy,
                        bf16* __restrict__ dx, float* __restrict__ bsum, const int32_t* __restrict__ table,
                        int n_blocks, int nh, int d, float eps) {
  extern __shared__ float smem[];
  const int slots = kWgradBlock * nh;
  float* rs = smem;
  float* cs = smem + slots;
  const int p = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* prow = table + static_cast<int64_t>(p) * kWgradBlock;
  for (int j = warp; j < slots; j += kWarps) {
    const int32_t row = prow[j / nh];
    if (row < 0) {
      if (lane == 0) rs[j] = 0.0f, cs[j] = 0.0f;
      continue;
    }
    const int64_t base = (static_cast<int64_t>(row) * nh + (j % nh)) * d;
    float acc = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float v = __bfloat162float(x[base + i]);
      acc += v * v;
    }
    const float r = 1.0f / sqrtf(warp_sum(acc) / static_cast<float>(d) + eps);
    float gx = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float g = __bfloat162float(dy[base + i]) * __bfloat162float(w[i]);
      gx += g * (__bfloat162float(x[base + i]) * r);
    }
    const float c = warp_sum(gx) / static_cast<float>(d);
    if (lane == 0) rs[j] = r, cs[j] = c;
  }
  __syncthreads();
  if (dx != nullptr) {
    const int64_t total = static_cast<int64_t>(slots) * d;
    for (int64_t idx = threadIdx.x; idx < total; idx += kThreads) {
      const int j = static_cast<int>(idx / d), i = static_cast<int>(idx % d);
      const int32_t row = prow[j / nh];
      if (row < 0) continue;
      const int64_t at = (static_cast<int64_t>(row) * nh + (j % nh)) * d + i;
      const float r = rs[j];
      const float g = __bfloat162float(dy[at]) * __bfloat162float(w[i]);
      const float xhat = __bfloat162float(x[at]) * r;
      dx[at] = __float2bfloat16_rn(r * (g - xhat * cs[j]));
    }
  }
  if (bsum != nullptr && p < n_blocks) {
    for (int col = threadIdx.x; col < d; col += kThreads) {
      float acc = 0.0f;
      for (int k = 0; k < kWgradBlock; ++k) {
        const int32_t row = prow[k];
        if (row < 0) continue;
        for (int h = 0; h < nh; ++h) {
          const int64_t at = (static_cast<int64_t>(row) * nh + h) * d + col;
          acc += __bfloat162float(dy[at]) * (__bfloat162float(x[at]) * rs[k * nh + h]);
        }
      }
      bsum[static_cast<int64_t>(p) * d + col] = acc;
    }
  }
}

__global__ void ws1_wgrad_accumulate(const float* __restrict__ bsum, float* __restrict__ main_grad, int n_blocks,
                                     int d) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= d) return;
  float m = main_grad[col];
  for (int b = 0; b < n_blocks; ++b) m += bsum[static_cast<int64_t>(b) * d + col];
  main_grad[col] = m;
}

}  // namespace

cudaError_t norm_fwd(const bf16* x, const bf16* w, bf16* y, int64_t tokens, int nh, int d, float eps,
                     cudaStream_t stream) {
  const int64_t rows = tokens * nh;
  if (rows == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  ws1_norm_fwd<<<grid, kThreads, 0, stream>>>(x, w, y, rows, d, eps);
  return cudaGetLastError();
}

cudaError_t norm_bwd_blocks(const bf16* x, const bf16* w, const bf16* dy, bf16* dx, float* bsum,
                            const int32_t* table, int n_programs, int n_blocks, int nh, int d, float eps,
                            cudaStream_t stream) {
  if (n_programs == 0) return cudaSuccess;
  const size_t shared = 2 * sizeof(float) * kWgradBlock * static_cast<size_t>(nh);
  if (shared > 48 * 1024) return cudaErrorInvalidValue;  // 16 * nh rows of r and c: nh <= 384
  ws1_norm_bwd_blocks<<<n_programs, kThreads, shared, stream>>>(x, w, dy, dx, bsum, table, n_blocks, nh, d, eps);
  return cudaGetLastError();
}

cudaError_t wgrad_accumulate(const float* bsum, float* main_grad, int n_blocks, int d, cudaStream_t stream) {
  if (n_blocks == 0 || d == 0) return cudaSuccess;
  ws1_wgrad_accumulate<<<(d + 255) / 256, 256, 0, stream>>>(bsum, main_grad, n_blocks, d);
  return cudaGetLastError();
}

int norm_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_norm_fwd), reinterpret_cast<const void*>(ws1_norm_bwd_blocks),
                       reinterpret_cast<const void*>(ws1_wgrad_accumulate)};
  const char* names[] = {"ws1_norm_fwd", "ws1_norm_bwd_blocks", "ws1_wgrad_accumulate"};
  return fill_kernel_infos(out, cap, fns, names, 3);
}

}  // namespace ws1
