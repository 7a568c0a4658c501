// linear_logp's forward on Hopper, fused (linear_logp_sm90.cuh says how and why): the mid tile's GEMM with the
// log-sum-exp epilogue, the fold of its partials, and the entry point that picks the tile by M (linear_logp_bucket,
// the fused kernel's own table: ws1_sm90.h).
#include "linear_logp_sm90.cuh"

namespace ws1::sm90 {
namespace lse_detail {

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

int linear_logp_bucket(int64_t m) { return m <= kFusedSmallM ? 0 : (m <= kFusedMidM ? 1 : 2); }

cudaError_t linear_logp_fwd(const bf16* x, const bf16* w, const int64_t* targets, float* workspace, float* out,
                            float* lse, int64_t m, int64_t n, int64_t k, int device, int sm_count,
                            cudaStream_t stream) {
  using namespace lse_detail;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorInvalidValue;
  if (n % kGemmAlign || k % kGemmAlign) return cudaErrorInvalidValue;
  const int64_t n_blocks = linear_logp_blocks(n);
  auto* partials = reinterpret_cast<float2*>(workspace);  // [m, n_blocks] pairs, then target_logit [m]
  float* target_logit = workspace + 2 * m * n_blocks;
  const Arguments epi{targets, partials, target_logit, n_blocks};
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int bucket = linear_logp_bucket(m);
  const cudaError_t e = bucket == 0   ? fused_gemm_small(x, w, epi, mi, ni, ki, device, sm_count, stream)
                        : bucket == 1 ? run_fused<MidFused>(x, w, epi, mi, ni, ki, device, sm_count, stream)
                                      : fused_gemm_large(x, w, epi, mi, ni, ki, device, sm_count, stream);
  if (e != cudaSuccess) return e;
  const auto grid = static_cast<unsigned>((m + kFinalWarps - 1) / kFinalWarps);
  ws1_sm90_lse_finalize<<<grid, kFinalWarps * 32, 0, stream>>>(partials, target_logit, targets, out, lse, m, n,
                                                                n_blocks);
  return cudaGetLastError();
}

int linear_logp_infos(KernelInfo* out, int cap) {
  const void* fns[] = {lse_detail::fused_gemm_small_fn(), lse_detail::fused_kernel_fn<lse_detail::MidFused>(),
                       lse_detail::fused_gemm_large_fn(),
                       reinterpret_cast<const void*>(lse_detail::ws1_sm90_lse_finalize)};
  const char* names[] = {"sm90_linear_logp_lse_64x128x64_pingpong", "sm90_linear_logp_lse_128x128x64_cooperative",
                         "sm90_linear_logp_lse_128x256x64_cooperative", "ws1_sm90_lse_finalize"};
  return fill_kernel_infos(out, cap, fns, names, 4);
}

}  // namespace ws1::sm90
