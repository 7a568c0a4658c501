// The large-M bucket of the Hopper GEMM (gemm_sm90.cuh): its forward and dx kernels, in a file of their own so that
// the three buckets compile in parallel.
#include "gemm_sm90.cuh"

namespace ws1::sm90 {

cudaError_t gemm_large(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, bool b_trans, int device,
                    int sm_count, cudaStream_t stream) {
  return gemm_detail::launch<gemm_detail::Large>(a, b, c, m, n, k, b_trans, device, sm_count, stream);
}

int gemm_large_infos(KernelInfo* out, int cap) {
  return gemm_detail::infos<gemm_detail::Large>(out, cap, "sm90_gemm_fwd_128x256x64_cooperative", "sm90_gemm_dx_128x256x64_cooperative");
}

}  // namespace ws1::sm90
