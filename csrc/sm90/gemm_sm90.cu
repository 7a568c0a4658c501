// The Hopper GEMM's entry point: checks the sizes, picks the M bucket, and lists every bucket's kernels.
// The kernels themselves (CUTLASS 3.x sm90 collectives) are in gemm_sm90.cuh, instantiated per bucket.
#include "ws1_sm90.h"

#include <climits>

namespace ws1::sm90 {

int gemm_bucket(int64_t m) { return m <= kSmallM ? 0 : (m <= kMidM ? 1 : 2); }

bool gemm_mid_wide_pick(int64_t m, int64_t n, int sm_count) {
  const int64_t rows = (m + 127) / 128;
  return gemm_bucket(m) == 1 && rows * ((n + 191) / 192) <= sm_count && rows * ((n + 127) / 128) > sm_count;
}

cudaError_t gemm_tile(const bf16* a, const bf16* b, bf16* c, int64_t m, int64_t n, int64_t k, bool b_trans, int tile,
                      int device, int sm_count, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorInvalidValue;
  if (n % kGemmAlign || k % kGemmAlign) return cudaErrorInvalidValue;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  switch (tile) {
    case 0:
      return gemm_small(a, b, c, mi, ni, ki, b_trans, device, sm_count, stream);
    case 1:
      return gemm_mid(a, b, c, mi, ni, ki, b_trans, device, sm_count, stream);
    case 2:
      return gemm_large(a, b, c, mi, ni, ki, b_trans, device, sm_count, stream);
    case 3:
      return gemm_mid_wide(a, b, c, mi, ni, ki, b_trans, device, sm_count, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t gemm(const bf16* a, const bf16* b, bf16* c, int64_t m, int64_t n, int64_t k, bool b_trans, int device,
                 int sm_count, cudaStream_t stream) {
  int tile = gemm_bucket(m);
  if (kMidWideWired && gemm_mid_wide_pick(m, n, sm_count)) tile = 3;
  return gemm_tile(a, b, c, m, n, k, b_trans, tile, device, sm_count, stream);
}

int gemm_kernel_infos(KernelInfo* out, int cap) {
  int n = gemm_small_infos(out, cap);
  n += gemm_mid_infos(out + n, cap - n);
  n += gemm_large_infos(out + n, cap - n);
  n += gemm_mid_wide_infos(out + n, cap - n);
  return n;
}

}  // namespace ws1::sm90
