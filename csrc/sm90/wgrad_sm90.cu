// The weight gradient on Hopper under sample_blocks_main_grad (profile cuda_bf16_sm90; docs/cuda_sm90.md, "The
// weight gradient on wgmma: the plan"): main_grad[n, k] += sum over the call's blocks b, in table order, of
// dY_b^T X_b, where block b is 16 rows of one sample aligned to its first position (row_tables.block_table; empty
// slots are zero rows), and the accumulator chain of every element starts from main_grad's value.
//
// 1. ws1_sm90_wgrad_gather writes the blocks, in table order, into two row-major buffers: dY's rows into
//    [R, N] and X's into [R, K], 16 rows a block, zeros in empty slots and past the last block (R is padded to the
//    64-row stage). With dy_lo (linear_logp's dlogits split as hi + lo), each block is 32 rows: hi's 16, then lo's
//    16, and X's block twice, so each half is one k-step of its own.
// 2. ws1_sm90_wgrad_wgmma: one CTA per 128 x 128 tile of main_grad (one consumer warpgroup) or 128 x 256 (two),
//    and a producer warp. The consumers load their tile of main_grad into the wgmma accumulators, then walk R in
//    stages from row 0 upward (the producer's TMA into a ring, one mbarrier pair per slot: 64-row stages in 4
//    slots, or 32-row stages in 8), 16-row wgmma k-steps, every one accumulating (ScaleOut::One): one
//    k-step is one block, so the chain per element is the rule's, block by block in table order. Then it stores
//    the tile back: one writer per element, no atomics.
//
// Why the accumulator is loaded rather than added in an epilogue: a micro-batch split must give the bits of one
// call, and (main_grad + S1) + S2, each S summed from zero, is not main_grad + b1 + b2 + ... chained block by block.
// Why zero blocks change nothing: a k-step of zero rows adds exact zeros (an accumulator at -0.0 would become +0.0;
// a +0-initialised main_grad never holds -0.0 from sums of products).
//
// Both operands are MN-major (dY's N, and X's K, contiguous along a row), which wgmma reads for 16-bit types.
// main_grad's dims must be multiples of the tile (128): the caller keeps the generic kernel for other weights, a
// choice made by the weight's shape alone, never by the batch.
#include <climits>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "kernel_attrs.cuh"
#include "ws1_sm90.h"

namespace ws1::sm90 {
namespace wgrad_detail {

using namespace cute;
using Element = cutlass::bfloat16_t;

constexpr int kBlockRows = 16;  // WGRAD_BLOCK: one wgmma k-step
constexpr int kTileM = static_cast<int>(kWgradTile);  // main_grad rows (the weight's N) per CTA
// R is padded to kWgradStageRows (64); a stage is 64 rows (4 k-steps, a 4-slot ring) or 32 (2 k-steps, 8 slots):
// the same shared memory, finer release. The k-steps, and so every element's chain, are the same either way.
constexpr int kPadRows = static_cast<int>(kWgradStageRows);
constexpr int kGatherThreads = 256;

template <int kRows, int kStageRows, int kStages>
using SmemOf = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{},
                                      make_shape(Int<kRows>{}, Int<kStageRows>{}, Int<kStages>{})));

// The TMA atom over a gathered buffer seen as (mn, r), mn contiguous: `mn` the weight's N (for dY) or K (for X)
template <int kTileRows, int kStageRows, int kStages>
auto gathered_tma(const bf16* buffer, int mn, int r) {
  Tensor g = make_tensor(make_gmem_ptr(reinterpret_cast<const Element*>(buffer)), make_shape(mn, r),
                         make_stride(Int<1>{}, mn));
  return make_tma_atom(SM90_TMA_LOAD{}, g, SmemOf<kTileRows, kStageRows, kStages>{}(_, _, 0),
                       make_shape(Int<kTileRows>{}, Int<kStageRows>{}));
}

// One CTA's shape: kConsumers warpgroups side by side along main_grad's columns, each a 128 x 128 slab with the same
// wgmma atom (m64n128k16, 2 of them down the rows), so every element's chain is the same whatever kConsumers: the
// wider CTA only reads A once for both slabs (about 85 flop a byte from L2 against 64).
template <int kConsumers, int kStageRowsT>
struct Cfg {
  static constexpr int kStageRows = kStageRowsT;
  // 256 rows in flight, except one warpgroup on 32-row stages: 4 slots (64 KB), so that two CTAs share an SM
  // (160 threads at about 154 registers each) and one's load and store of main_grad overlap the other's MMAs
  static constexpr int kStages = (kConsumers == 1 && kStageRows == 32) ? 4 : 4 * 64 / kStageRows;
  static_assert(kPadRows % kStageRows == 0, "a stage must divide the padded R");
  static constexpr int kTileN = kTileM * kConsumers;  // main_grad columns (the weight's K) per CTA
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + 32;  // and one producer warp, the last
  using SmemA = SmemOf<kTileM, kStageRows, kStages>;
  using SmemB = SmemOf<kTileN, kStageRows, kStages>;
  using Mma = decltype(make_tiled_mma(SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::MN, GMMA::Major::MN>{},
                                      Layout<Shape<_1, Int<kConsumers>, _1>>{}));
  using TmaA = decltype(gathered_tma<kTileM, kStageRows, kStages>(nullptr, 0, 0));
  using TmaB = decltype(gathered_tma<kTileN, kStageRows, kStages>(nullptr, 0, 0));
  struct SharedStorage {
    alignas(128) ArrayEngine<Element, cosize_v<SmemA>> a;
    alignas(128) ArrayEngine<Element, cosize_v<SmemB>> b;
    alignas(8) uint64_t full[kStages];   // the stage's TMA bytes landed
    alignas(8) uint64_t empty[kStages];  // every thread's MMAs on the stage are done
  };
};

using Full = cutlass::arch::ClusterTransactionBarrier;
using Empty = cutlass::arch::ClusterBarrier;

// dst row r <- the table's source row for r (first's row, or second's for the lo half), or zeros
__global__ void __launch_bounds__(kGatherThreads)
    ws1_sm90_wgrad_gather(const bf16* __restrict__ first, const bf16* __restrict__ second,
                          const int32_t* __restrict__ table, int64_t rows_used, int halves, int64_t width,
                          bf16* __restrict__ dst) {
  const int64_t r = blockIdx.x;
  const bf16* src = first;
  int64_t row = -1;
  if (r < rows_used) {
    const int64_t per_block = static_cast<int64_t>(kBlockRows) * halves;
    const int64_t b = r / per_block;
    const int64_t within = r % per_block;
    row = table[b * kBlockRows + within % kBlockRows];
    if (within >= kBlockRows) src = second;
  }
  uint4* out = reinterpret_cast<uint4*>(dst + r * width);
  const int64_t vecs = width / 8;
  if (row < 0) {
    for (int64_t i = threadIdx.x; i < vecs; i += kGatherThreads) out[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* in = reinterpret_cast<const uint4*>(src + row * width);
  for (int64_t i = threadIdx.x; i < vecs; i += kGatherThreads) out[i] = in[i];
}

template <int kConsumers, int kStageRowsT>
__global__ void __launch_bounds__(Cfg<kConsumers, kStageRowsT>::kThreads, 1)
    ws1_sm90_wgrad_wgmma(CUTLASS_GRID_CONSTANT typename Cfg<kConsumers, kStageRowsT>::TmaA const tma_a,
                         CUTLASS_GRID_CONSTANT typename Cfg<kConsumers, kStageRowsT>::TmaB const tma_b,
                         float* __restrict__ main_grad, int n, int k, int r) {
  using C = Cfg<kConsumers, kStageRowsT>;
  constexpr int kTileN = C::kTileN;
  constexpr int kStageRows = C::kStageRows;
  constexpr int kStages = C::kStages;
  extern __shared__ __align__(128) char smem_raw[];
  auto& smem = *reinterpret_cast<typename C::SharedStorage*>(smem_raw);
  // (tile rows of main_grad, stage rows, stage) and (tile columns, stage rows, stage)
  Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), typename C::SmemA{});
  Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), typename C::SmemB{});

  // dY^T as (N, R) and X^T as (K, R), both MN-major, cut into this CTA's 128-row slab and 64-row stages
  Tensor gA = local_tile(tma_a.get_tma_tensor(make_shape(n, r)), make_shape(Int<kTileM>{}, Int<kStageRows>{}),
                         make_coord(static_cast<int>(blockIdx.y), _));
  Tensor gB = local_tile(tma_b.get_tma_tensor(make_shape(k, r)), make_shape(Int<kTileN>{}, Int<kStageRows>{}),
                         make_coord(static_cast<int>(blockIdx.x), _));
  auto tA = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
  auto tB = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
  auto tAgA = get<0>(tA);  // (TMA, stage index) in global memory
  auto tAsA = get<1>(tA);  // (TMA, slot) in shared memory
  auto tBgB = get<0>(tB);
  auto tBsB = get<1>(tB);
  constexpr uint32_t kStageBytes = (kTileM + kTileN) * kStageRows * sizeof(Element);

  const int n_stages = r / kStageRows;
  constexpr int kConsumerThreads = C::kConsumerThreads;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      Full::init(&smem.full[s], 1);
      Empty::init(&smem.empty[s], kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // The producer warp: one lane walks the stages, each into the ring's next slot once the consumers have released
  // it, so the loads run kStages - 1 stages ahead of the MMAs whatever the consumers are doing.
  if (threadIdx.x >= kConsumerThreads) {
    if (threadIdx.x == kConsumerThreads) {
      for (int t = 0; t < n_stages; ++t) {
        const int slot = t % kStages;
        if (t >= kStages) Empty::wait(&smem.empty[slot], (t / kStages - 1) & 1);
        Full::arrive_and_expect_tx(&smem.full[slot], kStageBytes);
        copy(tma_a.with(smem.full[slot]), tAgA(_, t), tAsA(_, slot));
        copy(tma_b.with(smem.full[slot]), tBgB(_, t), tBsB(_, slot));
      }
    }
    return;
  }

  // the accumulators start as this tile of main_grad: the carried chain
  typename C::Mma mma;
  ThrMMA thr = mma.get_thread_slice(threadIdx.x);
  Tensor mC = make_tensor(make_gmem_ptr(main_grad), make_shape(n, k), make_stride(k, Int<1>{}));
  Tensor tCgC = thr.partition_C(local_tile(mC, make_shape(Int<kTileM>{}, Int<kTileN>{}),
                                           make_coord(static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x))));
  Tensor acc = thr.make_fragment_C(tCgC);
  copy(tCgC, acc);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  mma.accumulate_ = GMMA::ScaleOut::One;  // never Zero: the first k-step adds to main_grad's value

  for (int t = 0; t < n_stages; ++t) {
    const int slot = t % kStages;
    Full::wait(&smem.full[slot], (t / kStages) & 1);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    gemm(mma, tCrA(_, _, _, slot), tCrB(_, _, _, slot), acc);  // 4 k-steps, ascending
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // the previous stage's MMAs are done (this one's may still run)
    warpgroup_fence_operand(acc);
    if (t > 0) Empty::arrive(&smem.empty[(t - 1) % kStages]);
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  copy(acc, tCgC);
}

template <int kConsumers, int kStageRows>
cudaError_t launch_wgmma(const bf16* gathered_dy, const bf16* gathered_x, float* main_grad, int n, int k, int r,
                         cudaStream_t stream) {
  using C = Cfg<kConsumers, kStageRows>;
  if (k % C::kTileN) return cudaErrorInvalidValue;
  // (N, R) and (K, R) views of the row-major [R, N] and [R, K] buffers: the first mode contiguous
  const typename C::TmaA tma_a = gathered_tma<kTileM, kStageRows, C::kStages>(gathered_dy, n, r);
  const typename C::TmaB tma_b = gathered_tma<C::kTileN, kStageRows, C::kStages>(gathered_x, k, r);
  auto* kernel = &ws1_sm90_wgrad_wgmma<kConsumers, kStageRows>;
  constexpr int kSmem = static_cast<int>(sizeof(typename C::SharedStorage));
  // once per device (kernel_attrs.cuh); the most shared memory per SM, so that the 64 KB variant fits two CTAs
  if (const cudaError_t e = configure_smem_once<&ws1_sm90_wgrad_wgmma<kConsumers, kStageRows>>(kSmem, true);
      e != cudaSuccess)
    return e;
  // x walks main_grad's column tiles and y its row tiles, so the CTAs resident at once share few slabs of dY (the
  // large operand, re-read from DRAM by every column tile when the order was the other way: ncu at eb44825 saw
  // 25 GB of DRAM traffic at the lm_head shape, 4096 rows) and X's whole buffer stays in L2. Order only: each tile's
  // chain is its own, so the bits do not change.
  const dim3 grid(static_cast<unsigned>(k / C::kTileN), static_cast<unsigned>(n / kTileM));
  kernel<<<grid, C::kThreads, kSmem, stream>>>(tma_a, tma_b, main_grad, n, k, r);
  return cudaGetLastError();
}

}  // namespace wgrad_detail

int64_t wgrad_rows(int64_t n_blocks, bool split) {
  const int64_t used = n_blocks * wgrad_detail::kBlockRows * (split ? 2 : 1);
  return (used + kWgradStageRows - 1) / kWgradStageRows * kWgradStageRows;
}

cudaError_t wgrad_blocks(const bf16* dy, const bf16* dy_lo, const bf16* x, const int32_t* table, int64_t n_blocks,
                         float* main_grad, bf16* gathered_dy, bf16* gathered_x, int64_t n, int64_t k, int consumers,
                         int stage_rows, int device, cudaStream_t stream) {
  using namespace wgrad_detail;
  if (consumers != 1 && consumers != 2) return cudaErrorInvalidValue;
  if (stage_rows != 32 && stage_rows != 64) return cudaErrorInvalidValue;
  if (n_blocks <= 0) return cudaSuccess;
  // make_tma_atom encodes its descriptors through the driver API, which needs the thread's context current: a
  // thread whose first CUDA work this is (autograd's backward worker) has none (gemm_sm90.cuh, bind_context)
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return e;
  if (n % kTileM || k % (kTileM * consumers) || n / kTileM > 65535 || k > INT_MAX) return cudaErrorInvalidValue;
  const bool split = dy_lo != nullptr;
  const int64_t r = wgrad_rows(n_blocks, split);
  if (r > INT_MAX) return cudaErrorInvalidValue;
  const int64_t used = n_blocks * kBlockRows * (split ? 2 : 1);
  const auto grid_rows = static_cast<unsigned>(r);
  ws1_sm90_wgrad_gather<<<grid_rows, kGatherThreads, 0, stream>>>(dy, split ? dy_lo : dy, table, used,
                                                                  split ? 2 : 1, n, gathered_dy);
  ws1_sm90_wgrad_gather<<<grid_rows, kGatherThreads, 0, stream>>>(x, x, table, used, split ? 2 : 1, k,
                                                                  gathered_x);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  const int ni = static_cast<int>(n), ki = static_cast<int>(k), ri = static_cast<int>(r);
  if (stage_rows == 32)
    return consumers == 2 ? launch_wgmma<2, 32>(gathered_dy, gathered_x, main_grad, ni, ki, ri, stream)
                          : launch_wgmma<1, 32>(gathered_dy, gathered_x, main_grad, ni, ki, ri, stream);
  return consumers == 2 ? launch_wgmma<2, 64>(gathered_dy, gathered_x, main_grad, ni, ki, ri, stream)
                        : launch_wgmma<1, 64>(gathered_dy, gathered_x, main_grad, ni, ki, ri, stream);
}

int wgrad_infos(KernelInfo* out, int cap) {
  using namespace wgrad_detail;
  const void* fns[] = {reinterpret_cast<const void*>(&ws1_sm90_wgrad_wgmma<1, 64>),
                       reinterpret_cast<const void*>(&ws1_sm90_wgrad_wgmma<2, 64>),
                       reinterpret_cast<const void*>(&ws1_sm90_wgrad_wgmma<1, 32>),
                       reinterpret_cast<const void*>(&ws1_sm90_wgrad_wgmma<2, 32>),
                       reinterpret_cast<const void*>(ws1_sm90_wgrad_gather)};
  const char* names[] = {"ws1_sm90_wgrad_wgmma_128x128x64", "ws1_sm90_wgrad_wgmma_128x256x64",
                         "ws1_sm90_wgrad_wgmma_128x128x32", "ws1_sm90_wgrad_wgmma_128x256x32",
                         "ws1_sm90_wgrad_gather"};
  return fill_kernel_infos(out, cap, fns, names, 5);
}

}  // namespace ws1::sm90
