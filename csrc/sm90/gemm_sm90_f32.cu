// The Hopper GEMM with fp32 output (gemm_sm90.cuh's mid tile, 128 x 128 x 64, cooperative), for linear_logp's
// logits: c [m, n] fp32 = a [m, k] b^T with b [n, k]. The mainloop is the bf16 GEMM's (one accumulator chain per
// element over all of K, k-tiles from 0 upward, no split-K); the epilogue stores the fp32 accumulator as it is
// (1.0 * acc, exact), so rounding this output to bf16 gives the bf16 GEMM's bits (a GPU test checks it).
//
// One tile for every M: the fp32 logits are a training path (M in the thousands), and one kernel keeps this file's
// compile (CUTLASS's templates) to one instantiation. Fewer than kPadRows rows run on A zero-padded (the binding).
#include "gemm_sm90.cuh"

#include <climits>

namespace ws1::sm90 {

cudaError_t gemm_f32out(const bf16* a, const bf16* b, float* c, int64_t m, int64_t n, int64_t k, int device,
                        int sm_count, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorInvalidValue;
  if (n % kGemmAlign || k % kGemmAlign) return cudaErrorInvalidValue;
  return gemm_detail::run<gemm_detail::MidOut<gemm_detail::Fwd, float>, float>(
      a, b, c, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), device, sm_count, stream);
}

int gemm_f32out_infos(KernelInfo* out, int cap) {
  const void* fns[] = {gemm_detail::kernel_fn<gemm_detail::MidOut<gemm_detail::Fwd, float>>()};
  const char* names[] = {"sm90_gemm_fwd_f32out_128x128x64_cooperative"};
  return fill_kernel_infos(out, cap, fns, names, 1);
}

}  // namespace ws1::sm90
