// The mid-M bucket's wide tile (128 x 192) of the Hopper GEMM (gemm_sm90.cuh): its forward and dx kernels, in a
// file of their own so that the tiles compile in parallel. Wired where gemm_mid_wide_pick says (kMidWideWired in
// ws1_sm90.h); the GPU tests hold its bits to the 128 x 128 tile's, and ci/gemm_dx_probe.py --tile times it.
#include "gemm_sm90.cuh"

namespace ws1::sm90 {

cudaError_t gemm_mid_wide(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, bool b_trans, int device,
                          int sm_count, cudaStream_t stream) {
  return gemm_detail::launch<gemm_detail::MidWide>(a, b, c, m, n, k, b_trans, device, sm_count, stream);
}

int gemm_mid_wide_infos(KernelInfo* out, int cap) {
  return gemm_detail::infos<gemm_detail::MidWide>(out, cap, "sm90_gemm_fwd_128x192x64_cooperative",
                                                  "sm90_gemm_dx_128x192x64_cooperative");
}

}  // namespace ws1::sm90
