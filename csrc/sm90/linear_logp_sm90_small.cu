// linear_logp's fused forward, the small tile (M <= kFusedSmallM, decode and short calls: 64 x 128 x 64, ping-pong, so
// one consumer warpgroup's log-sum-exp epilogue runs while the other issues its MMAs), in a file of its own so that
// it compiles beside the other tiles. A warpgroup's tile is the mid tile's 64 x 128 half: the same wgmma
// (m64n128k16) and the same values in each lane, so a row's bits are the same in every bucket.
#include "linear_logp_sm90.cuh"

namespace ws1::sm90::lse_detail {

cudaError_t fused_gemm_small(const bf16* x, const bf16* w, Arguments const& epi, int m, int n, int k, int device,
                             int sm_count, cudaStream_t stream) {
  return run_fused<SmallFused>(x, w, epi, m, n, k, device, sm_count, stream);
}

const void* fused_gemm_small_fn() { return fused_kernel_fn<SmallFused>(); }

}  // namespace ws1::sm90::lse_detail
