// RoPE (rotate_half, as Hugging Face): one thread per (token, head, i < D/2) pair of elements i and i + D/2.
// Angles in fp64 as the fp32 reference builds them (inv_i = 1 / theta^(2i/D), angle = position * inv_i), cos
// and sin rounded to fp32, the rotation in fp32, one rounding to bf16. Pads (position -1) use position 0.
// No reduction: any grid gives the same bits. backward applies the transposed rotation to the gradient.
#include "ws1_kernels.h"

namespace ws1 {
namespace {

constexpr int kThreads = 256;

__global__ void ws1_rope_rotate(const bf16* __restrict__ x, const int64_t* __restrict__ positions,
                                bf16* __restrict__ y, int64_t pairs, int nh, int d, double theta, bool backward) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= pairs) return;
  const int half = d / 2;
  const int i = static_cast<int>(idx % half);
  const int64_t row = idx / half;  // token * nh + head
  const int64_t t = row / nh;
  int64_t pos = positions[t];
  if (pos < 0) pos = 0;
  const double inv = 1.0 / pow(theta, static_cast<double>(i) * 2.0 / static_cast<double>(d));
  const double ang = static_cast<double>(pos) * inv;
  const float c = static_cast<float>(cos(ang));
  const float s = static_cast<float>(sin(ang));
  const int64_t at = row * d + i;
  const float a = __bfloat162float(x[at]);
  const float b = __bfloat162float(x[at + half]);
  if (!backward) {
    y[at] = __float2bfloat16_rn(a * c + (-b) * s);
    y[at + half] = __float2bfloat16_rn(b * c + a * s);
  } else {
    y[at] = __float2bfloat16_rn(a * c + b * s);
    y[at + half] = __float2bfloat16_rn(b * c + (-(a * s)));
  }
}

}  // namespace

cudaError_t rope(const bf16* x, const int64_t* positions, bf16* y, int64_t tokens, int nh, int d, double theta,
                 bool backward, cudaStream_t stream) {
  const int64_t pairs = tokens * nh * (d / 2);
  if (pairs == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((pairs + kThreads - 1) / kThreads);
  ws1_rope_rotate<<<grid, kThreads, 0, stream>>>(x, positions, y, pairs, nh, d, theta,
                                                 backward);
  return cudaGetLastError();
}

int rope_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_rope_rotate)};
  const char* names[] = {"ws1_rope_rotate"};
  return fill_kernel_infos(out, cap, fns, names, 1);
}

}  // namespace ws1
