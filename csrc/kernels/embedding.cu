// embedding: an exact gather forward; a sorted, sample-ordered backward into main_grad.
// Forward: thread (t, c) copies weight[id_t, c] (no arithmetic: exact bits; an out-of-range id gives a zero row
// and reads nothing out of bounds). Backward: the call's real rows in logical order, stable-sorted by id on the
// host side of the op (torch.sort, deterministic); thread (i, c) works only where i opens a run of one id: it
// loads main_grad[id, c] and adds the run's rows one by one in logical order, then stores. One writer per
// element, no atomics; across micro-batches in ascending sample order every element sees the same additions.
#include "ws1_kernels.h"

namespace ws1 {
namespace {

constexpr int kThreads = 256;

__global__ void ws1_embedding_gather(const int64_t* __restrict__ ids, const bf16* __restrict__ w,
                                     bf16* __restrict__ y, int64_t vocab, int h) {
  const int64_t t = blockIdx.x;
  const int c = blockIdx.y * kThreads + threadIdx.x;
  if (c >= h) return;
  const int64_t id = ids[t];
  y[t * h + c] = (id >= 0 && id < vocab) ? w[id * h + c] : __float2bfloat16_rn(0.0f);
}

__global__ void ws1_embedding_bwd_runs(const int64_t* __restrict__ ids_sorted, const int64_t* __restrict__ rows,
                                       const bf16* __restrict__ dy, float* __restrict__ main_grad, int64_t n,
                                       int64_t vocab, int h) {
  const int64_t i = blockIdx.x;
  const int c = blockIdx.y * kThreads + threadIdx.x;
  if (c >= h) return;
  const int64_t id = ids_sorted[i];
  if ((i > 0 && ids_sorted[i - 1] == id) || id < 0 || id >= vocab) return;
  float acc = main_grad[id * h + c];
  for (int64_t j = i; j < n && ids_sorted[j] == id; ++j) acc += __bfloat162float(dy[rows[j] * h + c]);
  main_grad[id * h + c] = acc;
}

}  // namespace

cudaError_t embedding_fwd(const int64_t* ids, const bf16* w, bf16* y, int64_t tokens, int64_t vocab, int h,
                          cudaStream_t stream) {
  if (tokens == 0 || h == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((h + kThreads - 1) / kThreads));
  ws1_embedding_gather<<<grid, kThreads, 0, stream>>>(ids, w, y, vocab, h);
  return cudaGetLastError();
}

cudaError_t embedding_bwd(const int64_t* ids_sorted, const int64_t* rows, const bf16* dy, float* main_grad,
                          int64_t n, int64_t vocab, int h, cudaStream_t stream) {
  if (n == 0 || h == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((h + kThreads - 1) / kThreads));
  ws1_embedding_bwd_runs<<<grid, kThreads, 0, stream>>>(ids_sorted, rows, dy, main_grad, n, vocab, h);
  return cudaGetLastError();
}

int embedding_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_embedding_gather),
                       reinterpret_cast<const void*>(ws1_embedding_bwd_runs)};
  const char* names[] = {"ws1_embedding_gather", "ws1_embedding_bwd_runs"};
  return fill_kernel_infos(out, cap, fns, names, 2);
}

}  // namespace ws1
