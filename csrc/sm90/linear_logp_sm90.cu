// linear_logp's forward on Hopper, fused: out[t] = (x W^T)[t, target_t] - logsumexp_v (x W^T)[t, v] in fp32, with
// the fp32 logits never written to memory.
//
// 1. The GEMM (the mainloop of gemm_sm90.cuh's mid tile, 128 x 128 x 64, cooperative: one accumulator chain per
//    logit over all of K, k-tiles from 0 upward, no split-K) ends in an epilogue that reduces its 128 x 128 tile
//    of fp32 logits, still in registers, to one (max, sum of exp) pair per row: the vocab block of the tile's N
//    coordinate. In wgmma's accumulator layout a row of a warpgroup's 64 x 128 tile lies in the 4 lanes of one
//    quad, 32 values each. Each lane takes the max of its 32 values, then sums 2^((x - max) log2e) over them in
//    ascending column order; the quad's 4 pairs combine by a fixed xor butterfly. The pair goes to
//    partials[t, block]; the lane that holds the target's column writes that logit, unrounded, to target_logit[t].
// 2. ws1_sm90_lse_finalize: one warp per row folds the row's ceil(V / 128) pairs, lane l taking blocks l, l + 32,
//    ... in ascending order, then a xor butterfly; lse = m + ln(s), out = target_logit - lse.
//
// Every order above is a function of V alone (the tile is the same for every M, and a row's values never meet
// another row's), so a row's bits do not depend on the batch. The logits the epilogue sees are the accumulators
// of gemm_sm90_f32.cu (the same mainloop and tile), which the backward recomputes: the backward's softmax is of the
// same logits the forward reduced.
#include <climits>

#include "cutlass/epilogue/thread/linear_combination.h"
#include "gemm_sm90.cuh"
#include "online_lse.cuh"

namespace ws1::sm90 {
namespace lse_detail {

using namespace cute;

constexpr int kBlockN = 128;  // the vocab block: the tile's N
using TileShape = Shape<_128, Int<kBlockN>, _64>;

struct Arguments {
  const int64_t* targets = nullptr;  // [m]
  float2* partials = nullptr;        // [m, n_blocks]: (max, sum of 2^((x - max) log2e)) per row and vocab block
  float* target_logit = nullptr;     // [m]
  int64_t n_blocks = 0;
};

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
    constexpr int kCols = size<0, 2>(FrgLayout{});
    constexpr int kMmaM = size<1>(FrgLayout{});
    constexpr int kMmaN = size<2>(FrgLayout{});

    const int64_t m_total = get<0>(problem_shape_mnkl);
    const int64_t n_total = get<1>(problem_shape_mnkl);
    const int64_t m_coord = get<0>(blk_coord_mnkl);
    const int64_t n_coord = get<1>(blk_coord_mnkl);
    const int64_t m0 = m_coord * size<0>(blk_shape_MNK);
    const int64_t n0 = n_coord * size<1>(blk_shape_MNK);

    // each accumulator's (row, column) in the tile
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor coords = thr_mma.partition_C(make_identity_tensor(take<0, 2>(blk_shape_MNK)));
    const int lane = threadIdx.x % 32;

    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < kMmaM; ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + get<0>(coords(make_coord(0, h, 0), mm, 0));
        // f(value, column) over this lane's values of the row, in ascending column order: (nn, group, column
        // of the pair); columns past V are left out
        auto each_value = [&](auto&& f) {
          CUTLASS_PRAGMA_UNROLL
          for (int nn = 0; nn < kMmaN; ++nn) {
            CUTLASS_PRAGMA_UNROLL
            for (int g = 0; g < kCols; ++g) {
              CUTLASS_PRAGMA_UNROLL
              for (int p = 0; p < 2; ++p) {
                const auto ix = make_coord(make_coord(p, h, g), mm, nn);
                const int64_t col = n0 + get<1>(coords(ix));
                if (col < n_total) f(acc(ix), col);
              }
            }
          }
        };
        float mx = -INFINITY;
        each_value([&](float x, int64_t) { mx = fmaxf(mx, x); });
        float s = 0.0f;
        if (mx != -INFINITY) each_value([&](float x, int64_t) { s += lse::ex2((x - mx) * lse::kLog2e); });
        lse::butterfly<4>(mx, s);  // the quad that holds the row (every lane runs it: the shuffles are warp-wide)
        if (row < m_total) {
          if (lane % 4 == 0) params.partials[row * params.n_blocks + n_coord] = make_float2(mx, s);
          const int64_t t = params.targets[row];
          if (t >= n0 && t < n0 + kBlockN) {
            each_value([&](float x, int64_t col) {
              if (col == t) params.target_logit[row] = x;
            });
          }
        }
      }
    }
  }

 private:
  Params params;
};

using Element = gemm_detail::Element;
using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<LseEpilogue>;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, gemm_detail::kAlign,
    Element, gemm_detail::Fwd, gemm_detail::kAlign, float, TileShape, Shape<_1, _1, _1>,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                    cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

constexpr int kFinalWarps = 8;

__global__ void __launch_bounds__(kFinalWarps * 32)
    ws1_sm90_lse_finalize(const float2* __restrict__ partials, const float* __restrict__ target_logit,
                          const int64_t* __restrict__ targets, float* __restrict__ out, float* __restrict__ lse_out,
                          int64_t tokens, int64_t vocab, int64_t n_blocks) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kFinalWarps + threadIdx.x / 32;
  if (t >= tokens) return;  // the whole warp
  const int lane = threadIdx.x % 32;
  const float2* row = partials + t * n_blocks;
  float m = -INFINITY, s = 0.0f;
  for (int64_t b = lane; b < n_blocks; b += 32) {
    const float2 p = row[b];
    lse::combine(m, s, p.x, p.y);
  }
  lse::butterfly<32>(m, s);
  if (lane == 0) {
    const float l = m + logf(s);
    const int64_t target = targets[t];
    out[t] = (target >= 0 && target < vocab) ? target_logit[t] - l : NAN;
    lse_out[t] = l;
  }
}

}  // namespace lse_detail

int64_t linear_logp_blocks(int64_t vocab) { return (vocab + lse_detail::kBlockN - 1) / lse_detail::kBlockN; }

cudaError_t linear_logp_fwd(const bf16* x, const bf16* w, const int64_t* targets, float* workspace, float* out,
                            float* lse, int64_t m, int64_t n, int64_t k, int device, int sm_count,
                            cudaStream_t stream) {
  using namespace lse_detail;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorInvalidValue;
  if (n % kGemmAlign || k % kGemmAlign) return cudaErrorInvalidValue;
  const int64_t n_blocks = linear_logp_blocks(n);
  auto* partials = reinterpret_cast<float2*>(workspace);  // [m, n_blocks] pairs, then target_logit [m]
  float* target_logit = workspace + 2 * m * n_blocks;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  using K = Gemm::GemmKernel;
  auto sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(mi, ki, 1));
  auto sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(ni, ki, 1));
  cutlass::KernelHardwareInfo hw{device, sm_count};
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {mi, ni, ki, 1},
                                {reinterpret_cast<const Element*>(x), sa, reinterpret_cast<const Element*>(w), sb},
                                {targets, partials, target_logit, n_blocks},
                                hw};
  if (const cudaError_t e = gemm_detail::run_gemm<Gemm>(args, device, stream); e != cudaSuccess) return e;
  const auto grid = static_cast<unsigned>((m + kFinalWarps - 1) / kFinalWarps);
  ws1_sm90_lse_finalize<<<grid, kFinalWarps * 32, 0, stream>>>(partials, target_logit, targets, out, lse, m, n,
                                                                n_blocks);
  return cudaGetLastError();
}

int linear_logp_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(&cutlass::device_kernel<lse_detail::Kernel>),
                       reinterpret_cast<const void*>(lse_detail::ws1_sm90_lse_finalize)};
  const char* names[] = {"sm90_linear_logp_lse_128x128x64_cooperative", "ws1_sm90_lse_finalize"};
  return fill_kernel_infos(out, cap, fns, names, 2);
}

}  // namespace ws1::sm90
