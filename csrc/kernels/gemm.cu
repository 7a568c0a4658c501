// det_gemm and lm_head: bf16 GEMMs with fp32 accumulation on the tensor cores (WMMA, sm_80+), no split of K.
//
// gemm: C[M, Nc] = A[M, R] . op(B) with op(B)[r, n] = B[n, r] (b_trans: y = x W^T) or B[r, n] (dx = dy W).
// One block of 4 warps owns a 32 x 32 tile of C; it walks R in steps of 16 from 0 upward, staging a 32 x 16
// slice of A and a 16 x 32 slice of op(B) in shared memory (zero-filled past the edges) and issuing one 16x16x16
// MMA per warp per step. Every element of C is the same chain of MMAs over the same R steps, whatever M, the
// tile it falls in or the grid: the order depends only on R. One rounding to bf16 at the end.
//
// An A (or dY) given in two bf16 halves (hi + lo, an fp32 operand split: linear_logp's dlogits) gets a second MMA
// per step into the same accumulator, right after the first: the same fixed order, near fp32 precision.
//
// wgrad_blocks: main_grad[N, K] += dY_b^T . X_b for the sample blocks b = 0, 1, ... in order (16 rows each, a
// host-built table, empty slots zero). A block of 4 warps owns a 32 x 32 tile of main_grad, loads it into the
// accumulators, and for each block in order issues one MMA (K = 16 rows: one MMA K step), then stores the tile:
// main_grad carries the same chain across micro-batches that run in ascending sample order.
#include <mma.h>

#include "ws1_kernels.h"

namespace ws1 {
namespace {

using namespace nvcuda;

constexpr int kTile = 32;    // C tile edge
constexpr int kStep = 16;    // R per MMA step
constexpr int kThreads = 128;  // 4 warps: 2 x 2 sub-tiles of 16 x 16

__device__ __forceinline__ void put(bf16* c, int64_t i, float v) { c[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void put(float* c, int64_t i, float v) { c[i] = v; }

template <typename OutT>
__global__ void __launch_bounds__(kThreads)
    ws1_gemm_fixed_k(const bf16* __restrict__ a, const bf16* __restrict__ a_lo, const bf16* __restrict__ b,
                     OutT* __restrict__ c, int64_t m, int64_t nc, int64_t r, bool b_trans) {
  __shared__ __align__(32) bf16 as[kTile][kStep];
  __shared__ __align__(32) bf16 as_lo[kTile][kStep];
  __shared__ __align__(32) bf16 bs[kStep][kTile];
  __shared__ __align__(32) float cs[kTile][kTile];
  const int warp = threadIdx.x / 32;
  const int wm = warp / 2, wn = warp % 2;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  const bf16 zero = __float2bfloat16_rn(0.0f);
  for (int64_t r0 = 0; r0 < r; r0 += kStep) {
    for (int i = threadIdx.x; i < kTile * kStep; i += kThreads) {
      const int row = i / kStep, k = i % kStep;
      const int64_t gm = m0 + row, gr = r0 + k;
      const bool in = gm < m && gr < r;
      as[row][k] = in ? a[gm * r + gr] : zero;
      if (a_lo != nullptr) as_lo[row][k] = in ? a_lo[gm * r + gr] : zero;
    }
    for (int i = threadIdx.x; i < kStep * kTile; i += kThreads) {
      const int k = i / kTile, col = i % kTile;
      const int64_t gr = r0 + k, gn = n0 + col;
      bf16 v = zero;
      if (gr < r && gn < nc) v = b_trans ? b[gn * r + gr] : b[gr * nc + gn];
      bs[k][col] = v;
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
    wmma::load_matrix_sync(fa, &as[wm * 16][0], kStep);
    wmma::load_matrix_sync(fb, &bs[0][wn * 16], kTile);
    wmma::mma_sync(acc, fa, fb, acc);
    if (a_lo != nullptr) {  // the low half of an fp32 A split as hi + lo (two bf16 terms): the same step, next
      wmma::load_matrix_sync(fa, &as_lo[wm * 16][0], kStep);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    __syncthreads();
  }
  wmma::store_matrix_sync(&cs[wm * 16][wn * 16], acc, kTile, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int row = i / kTile, col = i % kTile;
    const int64_t gm = m0 + row, gn = n0 + col;
    if (gm < m && gn < nc) put(c, gm * nc + gn, cs[row][col]);
  }
}

__global__ void __launch_bounds__(kThreads)
    ws1_gemm_wgrad_blocks(const bf16* __restrict__ dy, const bf16* __restrict__ dy_lo, const bf16* __restrict__ x,
                          const int32_t* __restrict__ table, int n_blocks, float* __restrict__ main_grad, int64_t n,
                          int64_t k) {
  __shared__ __align__(32) bf16 as[kTile][kStep];   // dY^T slice: [n][slot]
  __shared__ __align__(32) bf16 as_lo[kTile][kStep];  // its low half (an fp32 dY split as hi + lo), if any
  __shared__ __align__(32) bf16 bs[kStep][kTile];   // X slice: [slot][k]
  __shared__ __align__(32) float cs[kTile][kTile];
  __shared__ int32_t rows[kWgradBlock];
  const int warp = threadIdx.x / 32;
  const int wm = warp / 2, wn = warp % 2;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int row = i / kTile, col = i % kTile;
    const int64_t gn = n0 + row, gk = k0 + col;
    cs[row][col] = (gn < n && gk < k) ? main_grad[gn * k + gk] : 0.0f;
  }
  __syncthreads();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, &cs[wm * 16][wn * 16], kTile, wmma::mem_row_major);
  const bf16 zero = __float2bfloat16_rn(0.0f);
  for (int blk = 0; blk < n_blocks; ++blk) {
    if (threadIdx.x < kWgradBlock) rows[threadIdx.x] = table[static_cast<int64_t>(blk) * kWgradBlock + threadIdx.x];
    __syncthreads();
    for (int i = threadIdx.x; i < kTile * kStep; i += kThreads) {
      const int nn = i / kStep, s = i % kStep;
      const int32_t row = rows[s];
      const int64_t gn = n0 + nn;
      const bool in = row >= 0 && gn < n;
      as[nn][s] = in ? dy[static_cast<int64_t>(row) * n + gn] : zero;
      if (dy_lo != nullptr) as_lo[nn][s] = in ? dy_lo[static_cast<int64_t>(row) * n + gn] : zero;
    }
    for (int i = threadIdx.x; i < kStep * kTile; i += kThreads) {
      const int s = i / kTile, col = i % kTile;
      const int32_t row = rows[s];
      const int64_t gk = k0 + col;
      bs[s][col] = (row >= 0 && gk < k) ? x[static_cast<int64_t>(row) * k + gk] : zero;
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
    wmma::load_matrix_sync(fa, &as[wm * 16][0], kStep);
    wmma::load_matrix_sync(fb, &bs[0][wn * 16], kTile);
    wmma::mma_sync(acc, fa, fb, acc);
    if (dy_lo != nullptr) {
      wmma::load_matrix_sync(fa, &as_lo[wm * 16][0], kStep);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    __syncthreads();
  }
  wmma::store_matrix_sync(&cs[wm * 16][wn * 16], acc, kTile, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int row = i / kTile, col = i % kTile;
    const int64_t gn = n0 + row, gk = k0 + col;
    if (gn < n && gk < k) main_grad[gn * k + gk] = cs[row][col];
  }
}

}  // namespace

template <typename OutT>
cudaError_t launch_gemm(const bf16* a, const bf16* a_lo, const bf16* b, OutT* c, int64_t m, int64_t nc, int64_t r,
                        bool b_trans, cudaStream_t stream) {
  if (m == 0 || nc == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((nc + kTile - 1) / kTile), static_cast<unsigned>((m + kTile - 1) / kTile));
  if (grid.y > 65535u) return cudaErrorInvalidValue;
  ws1_gemm_fixed_k<OutT><<<grid, kThreads, 0, stream>>>(a, a_lo, b, c, m, nc, r, b_trans);
  return cudaGetLastError();
}

cudaError_t gemm(const bf16* a, const bf16* a_lo, const bf16* b, bf16* c, int64_t m, int64_t nc, int64_t r,
                 bool b_trans, cudaStream_t stream) {
  return launch_gemm(a, a_lo, b, c, m, nc, r, b_trans, stream);
}

cudaError_t gemm_f32_out(const bf16* a, const bf16* b, float* c, int64_t m, int64_t nc, int64_t r, bool b_trans,
                         cudaStream_t stream) {
  return launch_gemm(a, static_cast<const bf16*>(nullptr), b, c, m, nc, r, b_trans, stream);
}

cudaError_t gemm_wgrad_blocks(const bf16* dy, const bf16* dy_lo, const bf16* x, const int32_t* table, int n_blocks,
                              float* main_grad, int64_t n, int64_t k, cudaStream_t stream) {
  if (n_blocks == 0 || n == 0 || k == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((k + kTile - 1) / kTile), static_cast<unsigned>((n + kTile - 1) / kTile));
  if (grid.y > 65535u) return cudaErrorInvalidValue;
  ws1_gemm_wgrad_blocks<<<grid, kThreads, 0, stream>>>(dy, dy_lo, x, table, n_blocks, main_grad, n, k);
  return cudaGetLastError();
}

int gemm_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_gemm_fixed_k<bf16>),
                       reinterpret_cast<const void*>(ws1_gemm_fixed_k<float>),
                       reinterpret_cast<const void*>(ws1_gemm_wgrad_blocks)};
  const char* names[] = {"ws1_gemm_fixed_k", "ws1_gemm_fixed_k_f32_out", "ws1_gemm_wgrad_blocks"};
  return fill_kernel_infos(out, cap, fns, names, 3);
}

}  // namespace ws1
