// ws1 Hopper GEMM (cuda_bf16_sm90), its configurations: c = a b^T (b [N, K], the forward) or c = a b (b [K, N],
// dx), bf16 in and out, fp32 accumulators, on TMA + wgmma through CUTLASS 3.x's sm90 collectives (a persistent,
// warp-specialised kernel: a producer warp streams A and B tiles into a multi-stage shared-memory ring through
// TMA, consumer warpgroups issue wgmma). One .cu file per M bucket instantiates its pair, so buckets build in
// parallel.
//
// Batch invariance by construction: every output element is one accumulator chain over the whole reduced dim,
// k-tiles walked from 0 upward and, inside a k-tile, 16-wide wgmma steps in ascending order; no split-K, no
// stream-K (the tile scheduler is CUTLASS's plain persistent one), no atomics. The epilogue rounds alpha * acc
// with alpha = 1 (exact) to bf16 once and never reads C. The tile shape follows a frozen table of M buckets; the
// bits do not depend on the tile (each element's chain is the same), which the gate checks on both sides of every
// bucket boundary.
#pragma once

#include "ws1_sm90.h"

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace ws1::sm90::gemm_detail {

using namespace cute;

using Element = cutlass::bfloat16_t;
using Acc = float;
constexpr int kAlign = static_cast<int>(kGemmAlign);

// One GEMM configuration: tile, cluster and schedule; LayoutB picks the forward (ColumnMajor: b is [N, K], K
// contiguous) or dx (RowMajor: b is [K, N], N contiguous); ElementD the output (bf16, or fp32 for linear_logp's
// logits: the accumulator stored as it is, no rounding).
template <class LayoutB, class Tile, class Cluster, class KernelSchedule, class EpilogueSchedule,
          class ElementOut = Element>
struct Config {
  using ElementD = ElementOut;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, Acc, void, cutlass::layout::RowMajor, kAlign, ElementD,
      cutlass::layout::RowMajor, kAlign, EpilogueSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlign, Element,
      LayoutB, kAlign, Acc, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  // the plain persistent scheduler (no stream-K: a tile's K is never split)
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// M <= 64 (decode): 64-row tiles, narrow N tiles so that the weights stream through every SM at once
template <class LayoutB>
using Small = Config<LayoutB, Shape<_64, _32, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                     cutlass::epilogue::TmaWarpSpecialized>;
// 64 < M <= 1024 (MidOut: the same tile with another output type)
template <class LayoutB, class ElementOut>
using MidOut = Config<LayoutB, Shape<_128, _128, _64>, Shape<_1, _1, _1>,
                      cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                      cutlass::epilogue::TmaWarpSpecializedCooperative, ElementOut>;
template <class LayoutB>
using Mid = MidOut<LayoutB, Element>;
// 64 < M <= 1024 where N makes the 128 x 128 tile's last wave a partial one and 128 x 192 tiles fit one wave
// (gemm_mid_wide_pick): qkv's N = 6144 at M = 512 is 192 tiles of 128 x 128 for 132 SMs, 128 of 128 x 192
template <class LayoutB>
using MidWide = Config<LayoutB, Shape<_128, _192, _64>, Shape<_1, _1, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                       cutlass::epilogue::TmaWarpSpecializedCooperative>;
// M > 1024
template <class LayoutB>
using Large = Config<LayoutB, Shape<_128, _256, _64>, Shape<_1, _2, _1>,
                     cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                     cutlass::epilogue::TmaWarpSpecializedCooperative>;

using Fwd = cutlass::layout::ColumnMajor;  // b [N, K]
using Dx = cutlass::layout::RowMajor;      // b [K, N]

// CUTLASS encodes its TMA descriptors through the driver API (cuTensorMapEncodeTiled), which needs the calling
// thread's context current. A thread whose first CUDA work this is has none: autograd's backward worker, whose
// tensors come from torch's cache without a runtime call, once failed the encode with CUDA_ERROR_INVALID_CONTEXT,
// and CUTLASS only printed it and launched on the unwritten descriptor (an illegal instruction). cudaSetDevice makes
// the device's primary context current (CUDA 12 and later), in well under a microsecond when it already is.
inline cudaError_t bind_context(int device) { return cudaSetDevice(device); }

// Set up and launch one CUTLASS GEMM on `stream`: the context bound, no workspace (the persistent scheduler needs
// none), CUTLASS's statuses turned into CUDA errors.
template <class Gemm>
cudaError_t run_gemm(typename Gemm::Arguments const& args, int device, cudaStream_t stream) {
  if (const cudaError_t e = bind_context(device); e != cudaSuccess) return e;
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (Gemm::get_workspace_size(args) != 0) return cudaErrorInvalidValue;
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  if (gemm.run(stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  return cudaGetLastError();
}

// Launch one CUTLASS GEMM on packed operands: a is [m, k] and b is [n, k] in the kernel's own stride types, with
// the epilogue's arguments as given. The plain GEMM (run, below) and linear_logp's fused forward share it, so
// their mainloops are fed the same way.
template <class Gemm>
cudaError_t run_packed(const bf16* a, const bf16* b, typename Gemm::GemmKernel::EpilogueArguments const& epi, int m,
                       int n, int k, int device, int sm_count, cudaStream_t stream) {
  using K = typename Gemm::GemmKernel;
  auto sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(m, k, 1));
  auto sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(n, k, 1));
  cutlass::KernelHardwareInfo hw{device, sm_count};
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {m, n, k, 1},
                                {reinterpret_cast<const Element*>(a), sa, reinterpret_cast<const Element*>(b), sb},
                                epi,
                                hw};
  return run_gemm<Gemm>(args, device, stream);
}

template <class Cfg, class OutT = bf16>
cudaError_t run(const bf16* a, const bf16* b, OutT* c, int m, int n, int k, int device, int sm_count,
                cudaStream_t stream) {
  using ElementD = typename Cfg::ElementD;
  static_assert(sizeof(ElementD) == sizeof(OutT), "the output pointer's type is not the kernel's");
  using Gemm = typename Cfg::Gemm;
  using K = typename Gemm::GemmKernel;
  auto sc = cutlass::make_cute_packed_stride(typename K::StrideC{}, make_shape(m, n, 1));
  auto sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, make_shape(m, n, 1));
  return run_packed<Gemm>(a, b, {{1.0f, 0.0f}, nullptr, sc, reinterpret_cast<ElementD*>(c), sd}, m, n, k, device,
                          sm_count, stream);
}

template <class Cfg>
const void* kernel_fn() {
  return reinterpret_cast<const void*>(&cutlass::device_kernel<typename Cfg::Gemm::GemmKernel>);
}

// One bucket's launcher and kernel records (each bucket's .cu file instantiates its pair: the forward on a
// [N, K] b and dx on a [K, N] b).
template <template <class> class Cfg>
cudaError_t launch(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, bool b_trans, int device,
                   int sm_count, cudaStream_t stream) {
  return b_trans ? run<Cfg<Fwd>>(a, b, c, m, n, k, device, sm_count, stream)
                 : run<Cfg<Dx>>(a, b, c, m, n, k, device, sm_count, stream);
}

template <template <class> class Cfg>
int infos(KernelInfo* out, int cap, const char* fwd_name, const char* dx_name) {
  const void* fns[] = {kernel_fn<Cfg<Fwd>>(), kernel_fn<Cfg<Dx>>()};
  const char* names[] = {fwd_name, dx_name};
  return fill_kernel_infos(out, cap, fns, names, 2);
}

}  // namespace ws1::sm90::gemm_detail
