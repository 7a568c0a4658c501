// linear_logp's forward on Hopper, fused: out[t] = (x W^T)[t, target_t] - logsumexp_v (x W^T)[t, v] in fp32, with
// the fp32 logits never written to memory. This header holds the GEMM with the log-sum-exp epilogue, templated on
// its tile; linear_logp_sm90.cu instantiates the mid tile (kSmallM < M <= kMidM) and the fold,
// linear_logp_sm90_small.cu and linear_logp_sm90_large.cu the other buckets' tiles, so the CUTLASS kernels compile
// in parallel.
//
// 1. The GEMM (a mainloop of gemm_sm90.cuh: 64 x 128 x 64 ping-pong for M <= 64, 128 x 128 x 64 cooperative up to
//    M = 256, 128 x 256 x 64 on a 2-CTA cluster above: linear_logp_bucket; one accumulator chain per logit over
//    all of K, k-tiles from 0 upward, 16-wide wgmma steps, no split-K) ends in an
//    epilogue that reduces each 128-wide vocab block of its tile of fp32 logits, still in registers, to one
//    (max, sum of exp) pair per row. In wgmma's accumulator layout a row of a warpgroup's 64 x N tile lies in the
//    4 lanes of one quad; column c of the tile sits in lane 4r + (c % 8) / 2 at column group c / 8. So in every
//    tile a lane holds the same 32 values of a vocab block (its 16 column groups, 2 values each), in the same
//    order: the reduction below sees the same values in the same order whatever the tile (the ping-pong tile is one warpgroup's 64 x 128).
//    Per lane and block: the max by a fixed pairwise tree, then 2^((x - max) log2e) of each value summed by the
//    same fixed tree; the quad's 4 pairs combine by a fixed xor butterfly. The pair goes to partials[t, block]; the
//    lane that holds the target's column writes that logit, unrounded, to target_logit[t].
// 2. ws1_sm90_lse_finalize (linear_logp_sm90.cu): one warp per row folds the row's ceil(V / 128) pairs, lane l
//    taking blocks l, l + 32, ... in ascending order, then a xor butterfly; lse = m + ln(s), out = target_logit -
//    lse.
//
// Every order above is a function of V alone (the vocab block is 128 columns in every tile, and a row's values
// never meet another row's), so a row's bits do not depend on the batch. Every tile's accumulator chains are the
// GEMM's (one chain per logit, 16-wide wgmma steps in ascending K), which gemm_sm90_f32.cu stores for the backward:
// the GPU tests check the target logit against it bit for bit in every bucket, and a row's bits across both
// bucket boundaries.
//
// Why trees and not running sums: the epilogue does not overlap the tile's MMAs (the cooperative kernel's two
// consumer warpgroups share one tile), and with two consumer warps per scheduler a running max and a running sum
// over 32 values are dependent chains that leave the schedulers idle (ncu at 23563ec: about 1690 executed
// instructions a consumer warp per tile, about 7 us a tile, stall_wait first). Trees give 16 independent operations
// at their first level.
#pragma once

#include <climits>

#include "cutlass/epilogue/thread/linear_combination.h"
#include "gemm_sm90.cuh"
#include "online_lse.cuh"

namespace ws1::sm90 {
namespace lse_detail {

using namespace cute;

constexpr int kBlockN = 128;            // the vocab block
constexpr int kGroups = kBlockN / 8;    // a lane's column groups in one block
constexpr int kValues = 2 * kGroups;    // a lane's values of one row in one block

struct Arguments {
  const int64_t* targets = nullptr;  // [m]
  float2* partials = nullptr;        // [m, n_blocks]: (max, sum of 2^((x - max) log2e)) per row and vocab block
  float* target_logit = nullptr;     // [m]
  int64_t n_blocks = 0;
};

// 2^x without the denormal fix-up (one MUFU instruction): a term below 2^-126 is below the ulp of a sum whose
// largest term is 1, so flushing it changes no sum.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// v[0] <- the fixed pairwise tree of op over v[0..N) (adjacent pairs, then pairs of pairs, ...); v is overwritten
template <int N, class Op>
__device__ __forceinline__ float tree(float (&v)[N], Op op) {
#pragma unroll
  for (int w = 1; w < N; w *= 2) {
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) v[i] = op(v[i], v[i + w]);
  }
  return v[0];
}

// An operator-style epilogue (CUTLASS's DefaultEpilogue interface, run in the warp-specialised kernel through
// Sm90TmaWarpSpecializedAdapter): it reads the accumulators in registers and writes only the partials.
class LseEpilogue {
 public:
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ElementOutput = float;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = void;
  using ElementD = float;
  using StrideC = cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor>;
  using StrideD = StrideC;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  // GemmUniversalAdapter names the epilogue's thread op; this one never runs (operator() below is the epilogue)
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<float, 1, float, float>;

  struct SharedStorage {};
  using TensorStorage = SharedStorage;
  using Arguments = lse_detail::Arguments;
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.targets != nullptr && args.partials != nullptr && args.target_logit != nullptr;
  }

  CUTLASS_HOST_DEVICE
  LseEpilogue(Params const& params_, SharedStorage const& = SharedStorage()) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    static_assert(is_static<FrgLayout>::value, "the accumulator layout must be static");
    // wgmma's fp32 accumulator fragment: ((2 columns, 2 row halves, N/8 column groups), MMA_M, MMA_N)
    static_assert(rank<0>(FrgLayout{}) == 3 && size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2,
                  "not wgmma's fp32 accumulator layout");
    constexpr int kMmaM = size<1>(FrgLayout{});
    constexpr int kTileN = size<1>(BlockShapeMNK{});
    // one wgmma atom spans the tile's N, so column group g of a lane is columns 8g .. 8g + 7 of the tile
    static_assert(size<2>(FrgLayout{}) == 1 && size<0, 2>(FrgLayout{}) * 8 == kTileN,
                  "one wgmma atom must span the tile's N");
    static_assert(kTileN % kBlockN == 0, "the tile's N must be whole vocab blocks");
    constexpr int kBlocks = kTileN / kBlockN;

    const int64_t m_total = get<0>(problem_shape_mnkl);
    const int64_t n_total = get<1>(problem_shape_mnkl);
    const int64_t m0 = get<0>(blk_coord_mnkl) * size<0>(blk_shape_MNK);
    const int64_t n0 = get<1>(blk_coord_mnkl) * kTileN;
    const bool full = n0 + kTileN <= n_total;  // uniform: only the last N tile masks columns past V

    // each accumulator's (row, column) in the tile
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor coords = thr_mma.partition_C(make_identity_tensor(take<0, 2>(blk_shape_MNK)));
    const int lane = threadIdx.x % 32;

    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < kMmaM; ++mm) {
      // the two rows' targets first, so that their loads overlap the reductions
      int64_t row[2], target[2];
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        row[h] = m0 + get<0>(coords(make_coord(make_coord(0, h, 0), mm, 0)));
        target[h] = row[h] < m_total ? params.targets[row[h]] : -1;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kBlocks; ++j) {
        const int64_t block = n0 / kBlockN + j;
        const int64_t b0 = n0 + j * kBlockN;  // the block's first column
        // the lane's values of block j for row half h, in ascending column order (group, column of the pair)
        auto ix = [&](int h, int i) { return make_coord(make_coord(i % 2, h, j * kGroups + i / 2), mm, 0); };
        // the target's logit first, so that the block's accumulators are dead once read below (a row of a
        // padded call has target -1, in no block)
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          if (target[h] >= b0 && target[h] < b0 + kBlockN) {
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kValues; ++i) {
              if (n0 + get<1>(coords(ix(h, i))) == target[h]) params.target_logit[row[h]] = acc(ix(h, i));
            }
          }
        }
        float mx[2], s[2];
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          float v[kValues];
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kValues; ++i) {
            v[i] = acc(ix(h, i));
            if (!full && n0 + get<1>(coords(ix(h, i))) >= n_total) v[i] = -INFINITY;  // past V: weighs nothing
          }
          float w[kValues];
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kValues; ++i) w[i] = v[i];
          mx[h] = tree(w, [](float a, float b) { return fmaxf(a, b); });
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kValues; ++i) v[i] = ex2_ftz((v[i] - mx[h]) * lse::kLog2e);
          s[h] = tree(v, [](float a, float b) { return a + b; });
          if (mx[h] == -INFINITY) s[h] = 0.0f;  // an empty partial (every value past V)
        }
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          lse::butterfly<4>(mx[h], s[h]);  // the quad that holds the row (every lane runs it: warp-wide shuffles)
          if (row[h] >= m_total || block >= params.n_blocks) continue;
          if (lane % 4 == 0) params.partials[row[h] * params.n_blocks + block] = make_float2(mx[h], s[h]);
        }
      }
    }
  }

 private:
  Params params;
};

using Element = gemm_detail::Element;
using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<LseEpilogue>;

// The fused GEMM on one tile, cluster and schedule: a gemm_sm90.cuh mainloop, this epilogue.
template <class TileShape, class ClusterShape, class Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative>
struct Fused {
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, gemm_detail::kAlign,
      Element, gemm_detail::Fwd, gemm_detail::kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
// M <= kSmallM: a 64 x 128 tile per consumer warpgroup, ping-pong (one warpgroup's epilogue runs under the other's
// MMAs); its wgmma is the mid tile's m64n128k16, so the accumulators are the same
using SmallFused = Fused<Shape<_64, _128, _64>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
using MidFused = Fused<Shape<_128, _128, _64>, Shape<_1, _1, _1>>;    // M <= kFusedMidM (gemm_detail::MidOut's tile)
using LargeFused = Fused<Shape<_128, _256, _64>, Shape<_1, _2, _1>>;  // above (gemm_detail::Large's tile)

// The fused GEMM's launch: the epilogue's arguments, then CUTLASS's set-up and launch (gemm_detail::run_gemm).
template <class Cfg>
cudaError_t run_fused(const bf16* x, const bf16* w, Arguments const& epi, int m, int n, int k, int device,
                      int sm_count, cudaStream_t stream) {
  return gemm_detail::run_packed<typename Cfg::Gemm>(x, w, epi, m, n, k, device, sm_count, stream);
}

template <class Cfg>
const void* fused_kernel_fn() {
  return reinterpret_cast<const void*>(&cutlass::device_kernel<typename Cfg::Kernel>);
}

// The small and the large tile's launchers and kernel records (linear_logp_sm90_{small,large}.cu).
cudaError_t fused_gemm_small(const bf16* x, const bf16* w, Arguments const& epi, int m, int n, int k, int device,
                             int sm_count, cudaStream_t stream);
const void* fused_gemm_small_fn();
cudaError_t fused_gemm_large(const bf16* x, const bf16* w, Arguments const& epi, int m, int n, int k, int device,
                             int sm_count, cudaStream_t stream);
const void* fused_gemm_large_fn();

}  // namespace lse_detail
}  // namespace ws1::sm90
