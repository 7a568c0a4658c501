// The Hopper GEMM with fp32 output (gemm_sm90.cuh's mid tile, 128 x 128 x 64, cooperative), for linear_logp's
// backward: its logits, c [m, n] fp32 = a [m, k] b^T with b [n, k] (b_trans), and its dx, c = a b with b [k, n]
// (each half of the split dlogits times the weight). The mainloop is the bf16 GEMM's (one accumulator chain per
// element over all of K, k-tiles from 0 upward, no split-K); the epilogue stores the fp32 accumulator as it is
// (1.0 * acc, exact), so rounding this output to bf16 gives the bf16 GEMM's bits (a GPU test checks it).
//
// One tile for every M: these are training paths (M in the thousands), and one tile keeps this file's compile
// (CUTLASS's templates) to two instantiations. Fewer than kPadRows rows run on A zero-padded (the binding).
#include "gemm_sm90.cuh"

#include <climits>

namespace ws1::sm90 {

cudaError_t gemm_f32out(const bf16* a, const bf16* b, float* c, int64_t m, int64_t n, int64_t k, bool b_trans,
                        int device, int sm_count, cudaStream_t stream) {
  using namespace gemm_detail;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorInvalidValue;
  if (n % kGemmAlign || k % kGemmAlign) return cudaErrorInvalidValue;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  return b_trans ? run<MidOut<Fwd, float>, float>(a, b, c, mi, ni, ki, device, sm_count, stream)
                 : run<MidOut<Dx, float>, float>(a, b, c, mi, ni, ki, device, sm_count, stream);
}

int gemm_f32out_infos(KernelInfo* out, int cap) {
  using namespace gemm_detail;
  const void* fns[] = {kernel_fn<MidOut<Fwd, float>>(), kernel_fn<MidOut<Dx, float>>()};
  const char* names[] = {"sm90_gemm_fwd_f32out_128x128x64_cooperative", "sm90_gemm_dx_f32out_128x128x64_cooperative"};
  return fill_kernel_infos(out, cap, fns, names, 2);
}

}  // namespace ws1::sm90
