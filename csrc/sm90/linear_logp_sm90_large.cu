// linear_logp's fused forward, the large tile (M > kFusedMidM: 128 x 256 x 64 on a 2-CTA cluster, gemm_sm90.cuh's
// large bucket), in a file of its own so that it compiles beside the mid tile. Each 256-wide tile holds two 128-wide
// vocab blocks, and a lane holds the same values of each block, in the same order, as in the mid tile
// (linear_logp_sm90.cuh), so a row's bits are the same in either.
#include "linear_logp_sm90.cuh"

namespace ws1::sm90::lse_detail {

cudaError_t fused_gemm_large(const bf16* x, const bf16* w, Arguments const& epi, int m, int n, int k, int device,
                             int sm_count, cudaStream_t stream) {
  return run_fused<LargeFused>(x, w, epi, m, n, k, device, sm_count, stream);
}

const void* fused_gemm_large_fn() { return fused_kernel_fn<LargeFused>(); }

}  // namespace ws1::sm90::lse_detail
