// det_gemm and lm_head: bf16 GEMMs with fp32 accumulation on the tensor cores (WMMA, sm_80+), no split of K.
//
// gemm: C[M, Nc] = A[M, R] . op(B) with op(B)[r, n] = B[n, r] (b_trans: y = x W^T) or B[r, n] (dx = dy W).
// Every element of C is one accumulator fed by a chain of 16x16x16 MMAs over R in steps of 16 from 0 upward,
// stopping at the last step that holds a real element (the tail of that step is zero-filled). That chain is the
// same whatever M, the tile the element falls in, the warp that computes it or the grid: the order depends only
// on R. One rounding at the end (bf16, or none for the fp32-out variant).
//
// Tiles (a frozen choice by M, which changes only who computes an element, never its chain): a block of 8 warps
// owns 128 x 128 of C for M > 64 (each warp 32 x 64: 2 x 4 fragments); for M <= 64 a block of 4 warps owns
// 32 x 64 (each warp 32 x 16), so a decode-sized GEMM still spreads over many blocks. R is staged 32 at a time in
// shared memory (two MMA steps), with 16-byte vector loads when the operands allow it (row length a multiple of
// 8 elements, 16-byte aligned pointers) and the next stage loaded into registers while the current one computes.
//
// An A (or dY) given in two bf16 halves (hi + lo, an fp32 operand split: linear_logp's dlogits) gets a second MMA
// per step into the same accumulator, right after the first: the same fixed order, near fp32 precision.
//
// wgrad_blocks: main_grad[N, K] += dY_b^T . X_b for the sample blocks b = 0, 1, ... in order (16 rows each, a
// host-built table, empty slots zero). Every element of main_grad is loaded into an accumulator, fed one MMA per
// block in order (K = 16 rows: one MMA K step), and stored: main_grad carries the same chain across micro-batches
// that run in ascending sample order. The tile (below) decides who computes an element, never its chain.
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "ws1_kernels.h"

namespace ws1 {
namespace {

using namespace nvcuda;


__device__ __forceinline__ void put(bf16* c, int64_t i, float v) { c[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void put(float* c, int64_t i, float v) { c[i] = v; }

constexpr int kBK = 32;  // R staged per shared-memory tile: two MMA steps
constexpr int kPad = 8;  // row padding of the shared tiles (elements): keeps WMMA's 32-byte alignment

// 8 consecutive bf16 of row `row`, columns [col, col + 8) of a row-major [rows, cols] matrix with leading dimension
// `ld`, zero past the edges: one 16-byte load when `vec` (cols % 8 == 0, 16-byte aligned base), else element-wise.
__device__ __forceinline__ uint4 load8(const bf16* __restrict__ p, int64_t row, int64_t col, int64_t rows,
                                       int64_t cols, int64_t ld, bool vec) {
  uint4 out = make_uint4(0u, 0u, 0u, 0u);
  if (p == nullptr || row >= rows || col >= cols) return out;
  const bf16* src = p + row * ld + col;
  if (vec) return *reinterpret_cast<const uint4*>(src);
  bf16* e = reinterpret_cast<bf16*>(&out);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = col + i < cols ? src[i] : __float2bfloat16_rn(0.0f);
  return out;
}

template <int BM, int BN, int WM, int WN, bool BT, typename OutT>
struct GemmTile {
  static constexpr int kWarps = (BM / WM) * (BN / WN);
  static constexpr int kThreadsT = kWarps * 32;
  static constexpr int kFM = WM / 16, kFN = WN / 16;
  static constexpr int kLdA = kBK + kPad;                // As[m][k]
  static constexpr int kLdB = BT ? kBK + kPad : BN + kPad;  // BT: Bs[n][k]; else Bs[k][n]
  static constexpr int kBRows = BT ? BN : kBK;
  static constexpr int kAVec = BM * kBK / 8;             // 16-byte pieces per stage
  static constexpr int kBVec = BN * kBK / 8;
  static constexpr int kAPer = (kAVec + kThreadsT - 1) / kThreadsT;
  static constexpr int kBPer = (kBVec + kThreadsT - 1) / kThreadsT;
};

template <int BM, int BN, int WM, int WN, bool BT, typename OutT>
__global__ void __launch_bounds__(GemmTile<BM, BN, WM, WN, BT, OutT>::kThreadsT)
    ws1_gemm_tiled(const bf16* __restrict__ a, const bf16* __restrict__ a_lo, const bf16* __restrict__ b,
                   OutT* __restrict__ c, int64_t m, int64_t nc, int64_t r, bool vec_a, bool vec_b) {
  using T = GemmTile<BM, BN, WM, WN, BT, OutT>;
  using BLayout = typename std::conditional<BT, wmma::col_major, wmma::row_major>::type;
  __shared__ __align__(32) bf16 as[BM][T::kLdA];
  __shared__ __align__(32) bf16 as_lo[BM][T::kLdA];
  __shared__ __align__(32) bf16 bs[T::kBRows][T::kLdB];
  __shared__ __align__(32) float stage[T::kWarps][16][16];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
  const bool has_lo = a_lo != nullptr;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[T::kFM][T::kFN];
#pragma unroll
  for (int i = 0; i < T::kFM; ++i)
#pragma unroll
    for (int j = 0; j < T::kFN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  uint4 ra[T::kAPer], ra_lo[T::kAPer], rb[T::kBPer];
  auto load_stage = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < T::kAPer; ++i) {
      const int v = tid + i * T::kThreadsT;
      const int row = v / (kBK / 8), col = (v % (kBK / 8)) * 8;
      const bool live = v < T::kAVec;
      ra[i] = live ? load8(a, m0 + row, k0 + col, m, r, r, vec_a) : make_uint4(0u, 0u, 0u, 0u);
      ra_lo[i] = live && has_lo ? load8(a_lo, m0 + row, k0 + col, m, r, r, vec_a) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < T::kBPer; ++i) {
      const int v = tid + i * T::kThreadsT;
      const bool live = v < T::kBVec;
      if (BT) {  // B [Nc, R]: rows n, 8 consecutive k
        const int row = v / (kBK / 8), col = (v % (kBK / 8)) * 8;
        rb[i] = live ? load8(b, n0 + row, k0 + col, nc, r, r, vec_b) : make_uint4(0u, 0u, 0u, 0u);
      } else {  // B [R, Nc]: rows k, 8 consecutive n
        const int row = v / (BN / 8), col = (v % (BN / 8)) * 8;
        rb[i] = live ? load8(b, k0 + row, n0 + col, r, nc, nc, vec_b) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  auto store_stage = [&]() {
#pragma unroll
    for (int i = 0; i < T::kAPer; ++i) {
      const int v = tid + i * T::kThreadsT;
      if (v >= T::kAVec) continue;
      const int row = v / (kBK / 8), col = (v % (kBK / 8)) * 8;
      *reinterpret_cast<uint4*>(&as[row][col]) = ra[i];
      if (has_lo) *reinterpret_cast<uint4*>(&as_lo[row][col]) = ra_lo[i];
    }
#pragma unroll
    for (int i = 0; i < T::kBPer; ++i) {
      const int v = tid + i * T::kThreadsT;
      if (v >= T::kBVec) continue;
      const int per_row = BT ? kBK / 8 : BN / 8;
      const int row = v / per_row, col = (v % per_row) * 8;
      *reinterpret_cast<uint4*>(&bs[row][col]) = rb[i];
    }
  };

  const int64_t stages = (r + kBK - 1) / kBK;
  if (stages > 0) load_stage(0);
  for (int64_t st = 0; st < stages; ++st) {
    store_stage();
    __syncthreads();
    if (st + 1 < stages) load_stage((st + 1) * kBK);
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s) {
      if (st * kBK + s * 16 >= r) break;  // the chain ends at the last step holding a real element
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[T::kFM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BLayout> fb[T::kFN];
#pragma unroll
      for (int i = 0; i < T::kFM; ++i) wmma::load_matrix_sync(fa[i], &as[wm * WM + i * 16][s * 16], T::kLdA);
#pragma unroll
      for (int j = 0; j < T::kFN; ++j) {
        if (BT) {
          wmma::load_matrix_sync(fb[j], &bs[wn * WN + j * 16][s * 16], T::kLdB);
        } else {
          wmma::load_matrix_sync(fb[j], &bs[s * 16][wn * WN + j * 16], T::kLdB);
        }
      }
#pragma unroll
      for (int i = 0; i < T::kFM; ++i)
#pragma unroll
        for (int j = 0; j < T::kFN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      if (has_lo) {  // the low half of an fp32 A split as hi + lo: the same step, right after the high half
#pragma unroll
        for (int i = 0; i < T::kFM; ++i) {
          wmma::load_matrix_sync(fa[i], &as_lo[wm * WM + i * 16][s * 16], T::kLdA);
#pragma unroll
          for (int j = 0; j < T::kFN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < T::kFM; ++i)
#pragma unroll
    for (int j = 0; j < T::kFN; ++j) {
      wmma::store_matrix_sync(&stage[warp][0][0], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int64_t gm = m0 + wm * WM + i * 16 + e / 16, gn = n0 + wn * WN + j * 16 + e % 16;
        if (gm < m && gn < nc) put(c, gm * nc + gn, stage[warp][e / 16][e % 16]);
      }
      __syncwarp();
    }
}

// wgrad: one block of 8 warps owns 128 x 128 of main_grad ([N, K]: rows n of dY's columns, columns k of X's), each
// warp 32 x 64 (2 x 4 fragments). Per sample block b, in order: the 16 rows of the table, dY^T [n, slot] staged as
// [slot][n] (read column-major by the MMA) and X [slot][k], one MMA per fragment (plus one for dY's low half).
constexpr int kWgBM = 128, kWgBN = 128, kWgWM = 32, kWgWN = 64;
constexpr int kWgWarps = (kWgBM / kWgWM) * (kWgBN / kWgWN);
constexpr int kWgThreads = kWgWarps * 32;
constexpr int kWgFM = kWgWM / 16, kWgFN = kWgWN / 16;
constexpr int kWgVecA = kWgradBlock * kWgBM / 8, kWgVecB = kWgradBlock * kWgBN / 8;

__global__ void __launch_bounds__(kWgThreads)
    ws1_gemm_wgrad_blocks(const bf16* __restrict__ dy, const bf16* __restrict__ dy_lo, const bf16* __restrict__ x,
                          const int32_t* __restrict__ table, int n_blocks, float* __restrict__ main_grad, int64_t n,
                          int64_t k, bool vec_dy, bool vec_x) {
  __shared__ __align__(32) bf16 as[kWgradBlock][kWgBM + kPad];     // dY rows: [slot][n]
  __shared__ __align__(32) bf16 as_lo[kWgradBlock][kWgBM + kPad];  // their low halves, if any
  __shared__ __align__(32) bf16 bs[kWgradBlock][kWgBN + kPad];     // X rows: [slot][k]
  __shared__ __align__(32) float stage[kWgWarps][16][16];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / (kWgBN / kWgWN), wn = warp % (kWgBN / kWgWN);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kWgBM;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kWgBN;
  const bool has_lo = dy_lo != nullptr;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kWgFM][kWgFN];
#pragma unroll
  for (int i = 0; i < kWgFM; ++i)
#pragma unroll
    for (int j = 0; j < kWgFN; ++j) {  // main_grad's tile into the accumulators, through the warp's staging tile
      for (int e = lane; e < 256; e += 32) {
        const int64_t gn = n0 + wm * kWgWM + i * 16 + e / 16, gk = k0 + wn * kWgWN + j * 16 + e % 16;
        stage[warp][e / 16][e % 16] = (gn < n && gk < k) ? main_grad[gn * k + gk] : 0.0f;
      }
      __syncwarp();
      wmma::load_matrix_sync(acc[i][j], &stage[warp][0][0], 16, wmma::mem_row_major);
      __syncwarp();
    }

  // one 16-byte piece of dY (and its low half) and one of X per thread per block (256 threads, 256 pieces each)
  uint4 ra = make_uint4(0u, 0u, 0u, 0u), ra_lo = ra, rb = ra;
  const int a_slot = tid / (kWgBM / 8), a_col = (tid % (kWgBM / 8)) * 8;
  const int b_slot = tid / (kWgBN / 8), b_col = (tid % (kWgBN / 8)) * 8;
  auto load_block = [&](int blk) {
    const int32_t arow = table[static_cast<int64_t>(blk) * kWgradBlock + a_slot];
    const int32_t brow = table[static_cast<int64_t>(blk) * kWgradBlock + b_slot];
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    ra = arow >= 0 ? load8(dy, arow, n0 + a_col, INT64_MAX, n, n, vec_dy) : z;
    ra_lo = arow >= 0 && has_lo ? load8(dy_lo, arow, n0 + a_col, INT64_MAX, n, n, vec_dy) : z;
    rb = brow >= 0 ? load8(x, brow, k0 + b_col, INT64_MAX, k, k, vec_x) : z;
  };
  static_assert(kWgVecA == kWgThreads && kWgVecB == kWgThreads, "one piece of each operand per thread");

  if (n_blocks > 0) load_block(0);
  for (int blk = 0; blk < n_blocks; ++blk) {
    *reinterpret_cast<uint4*>(&as[a_slot][a_col]) = ra;
    if (has_lo) *reinterpret_cast<uint4*>(&as_lo[a_slot][a_col]) = ra_lo;
    *reinterpret_cast<uint4*>(&bs[b_slot][b_col]) = rb;
    __syncthreads();
    if (blk + 1 < n_blocks) load_block(blk + 1);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> fa[kWgFM];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb[kWgFN];
#pragma unroll
    for (int i = 0; i < kWgFM; ++i) wmma::load_matrix_sync(fa[i], &as[0][wm * kWgWM + i * 16], kWgBM + kPad);
#pragma unroll
    for (int j = 0; j < kWgFN; ++j) wmma::load_matrix_sync(fb[j], &bs[0][wn * kWgWN + j * 16], kWgBN + kPad);
#pragma unroll
    for (int i = 0; i < kWgFM; ++i)
#pragma unroll
      for (int j = 0; j < kWgFN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    if (has_lo) {  // the low half of an fp32 dY split as hi + lo: the same block, right after the high half
#pragma unroll
      for (int i = 0; i < kWgFM; ++i) {
        wmma::load_matrix_sync(fa[i], &as_lo[0][wm * kWgWM + i * 16], kWgBM + kPad);
#pragma unroll
        for (int j = 0; j < kWgFN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kWgFM; ++i)
#pragma unroll
    for (int j = 0; j < kWgFN; ++j) {
      wmma::store_matrix_sync(&stage[warp][0][0], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int64_t gn = n0 + wm * kWgWM + i * 16 + e / 16, gk = k0 + wn * kWgWN + j * 16 + e % 16;
        if (gn < n && gk < k) main_grad[gn * k + gk] = stage[warp][e / 16][e % 16];
      }
      __syncwarp();
    }
}

}  // namespace

// the frozen tile table: 128 x 128 (8 warps) above M = 64, 32 x 64 (4 warps) at or below
constexpr int64_t kSmallM = 64;

template <int BM, int BN, int WM, int WN, bool BT, typename OutT>
cudaError_t launch_tile(const bf16* a, const bf16* a_lo, const bf16* b, OutT* c, int64_t m, int64_t nc, int64_t r,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((nc + BN - 1) / BN), static_cast<unsigned>((m + BM - 1) / BM));
  if (grid.y > 65535u) return cudaErrorInvalidValue;
  auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec_a = r % 8 == 0 && aligned(a) && aligned(a_lo);
  const bool vec_b = (BT ? r % 8 == 0 : nc % 8 == 0) && aligned(b);
  ws1_gemm_tiled<BM, BN, WM, WN, BT, OutT>
      <<<grid, GemmTile<BM, BN, WM, WN, BT, OutT>::kThreadsT, 0, stream>>>(a, a_lo, b, c, m, nc, r, vec_a, vec_b);
  return cudaGetLastError();
}

template <typename OutT>
cudaError_t launch_gemm(const bf16* a, const bf16* a_lo, const bf16* b, OutT* c, int64_t m, int64_t nc, int64_t r,
                        bool b_trans, cudaStream_t stream) {
  if (m == 0 || nc == 0) return cudaSuccess;
  if (m <= kSmallM) {
    return b_trans ? launch_tile<32, 64, 32, 16, true, OutT>(a, a_lo, b, c, m, nc, r, stream)
                   : launch_tile<32, 64, 32, 16, false, OutT>(a, a_lo, b, c, m, nc, r, stream);
  }
  return b_trans ? launch_tile<128, 128, 32, 64, true, OutT>(a, a_lo, b, c, m, nc, r, stream)
                 : launch_tile<128, 128, 32, 64, false, OutT>(a, a_lo, b, c, m, nc, r, stream);
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
  const dim3 grid(static_cast<unsigned>((k + kWgBN - 1) / kWgBN), static_cast<unsigned>((n + kWgBM - 1) / kWgBM));
  if (grid.y > 65535u) return cudaErrorInvalidValue;
  auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec_dy = n % 8 == 0 && aligned(dy) && aligned(dy_lo);
  const bool vec_x = k % 8 == 0 && aligned(x);
  ws1_gemm_wgrad_blocks<<<grid, kWgThreads, 0, stream>>>(dy, dy_lo, x, table, n_blocks, main_grad, n, k, vec_dy,
                                                         vec_x);
  return cudaGetLastError();
}

int gemm_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {
      reinterpret_cast<const void*>(ws1_gemm_tiled<128, 128, 32, 64, true, bf16>),
      reinterpret_cast<const void*>(ws1_gemm_tiled<128, 128, 32, 64, false, bf16>),
      reinterpret_cast<const void*>(ws1_gemm_tiled<32, 64, 32, 16, true, bf16>),
      reinterpret_cast<const void*>(ws1_gemm_tiled<32, 64, 32, 16, false, bf16>),
      reinterpret_cast<const void*>(ws1_gemm_tiled<128, 128, 32, 64, true, float>),
      reinterpret_cast<const void*>(ws1_gemm_tiled<128, 128, 32, 64, false, float>),
      reinterpret_cast<const void*>(ws1_gemm_tiled<32, 64, 32, 16, true, float>),
      reinterpret_cast<const void*>(ws1_gemm_tiled<32, 64, 32, 16, false, float>),
      reinterpret_cast<const void*>(ws1_gemm_wgrad_blocks)};
  const char* names[] = {"ws1_gemm_fixed_k",          "ws1_gemm_fixed_k_nn",          "ws1_gemm_fixed_k_small",
                         "ws1_gemm_fixed_k_small_nn", "ws1_gemm_fixed_k_f32_out",     "ws1_gemm_fixed_k_f32_out_nn",
                         "ws1_gemm_fixed_k_f32_out_small", "ws1_gemm_fixed_k_f32_out_small_nn", "ws1_gemm_wgrad_blocks"};
  return fill_kernel_infos(out, cap, fns, names, 9);
}

}  // namespace ws1
