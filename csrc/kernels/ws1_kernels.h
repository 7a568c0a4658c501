// ws1 CUDA kernels: host launchers over raw pointers, sizes and a stream (no torch headers).
//
// Every kernel here is batch-invariant by construction: each output element is computed by one thread or one
// warp in an order that depends only on the reduced length (a row's width, a block's 16 slots), never on the
// number of rows, the grid or the device; no split of a reduction, no atomics on reduced values, fp32
// accumulation, one rounding to bf16. Each launcher returns the launch's cudaError_t; the binding checks it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ws1 {

using bf16 = __nv_bfloat16;

// Tokens per weight-gradient block, aligned to each sample's position 0 (ws1_kernels.main_grad.WGRAD_BLOCK).
constexpr int kWgradBlock = 16;

// What the runtime reports of one kernel of this build (binary and PTX versions prove which code ran).
struct KernelInfo {
  const char* name;
  cudaFuncAttributes attr;
  cudaError_t err;
};

// Fill `out` (room for `cap`) with the runtime's attributes of `n` kernels; the count written.
inline int fill_kernel_infos(KernelInfo* out, int cap, const void* const* fns, const char* const* names, int n) {
  int written = 0;
  for (int i = 0; i < n && written < cap; ++i, ++written) {
    out[written].name = names[i];
    out[written].err = cudaFuncGetAttributes(&out[written].attr, fns[i]);
  }
  return written;
}

// ---- pointwise.cu: silu and swiglu, fp32 math, one element per thread
cudaError_t silu_fwd(const bf16* x, bf16* y, int64_t n, cudaStream_t stream);
cudaError_t silu_bwd(const bf16* x, const bf16* dy, bf16* dx, int64_t n, cudaStream_t stream);
cudaError_t swiglu_fwd(const bf16* gate, const bf16* up, bf16* y, int64_t n, cudaStream_t stream);
cudaError_t swiglu_bwd(const bf16* gate, const bf16* up, const bf16* dy, bf16* dgate, bf16* dup, int64_t n,
                       cudaStream_t stream);
int pointwise_kernel_infos(KernelInfo* out, int cap);

// ---- norm.cu: rms_norm ([T, 1, D]) and qk_norm ([T, NH, D]); one warp per (token, head) row
cudaError_t norm_fwd(const bf16* x, const bf16* w, bf16* y, int64_t tokens, int nh, int d, float eps,
                     cudaStream_t stream);
// table: int32 [n_programs, kWgradBlock] physical rows (-1 empty); programs [0, n_blocks) are the wgrad blocks
// in sample_blocks_main_grad order, the rest hold pad rows (dx only). dx and bsum may be null.
cudaError_t norm_bwd_blocks(const bf16* x, const bf16* w, const bf16* dy, bf16* dx, float* bsum,
                            const int32_t* table, int n_programs, int n_blocks, int nh, int d, float eps,
                            cudaStream_t stream);
// main_grad[c] += bsum[b, c] for b = 0, 1, ..., n_blocks - 1, in that order (one thread per column)
cudaError_t wgrad_accumulate(const float* bsum, float* main_grad, int n_blocks, int d, cudaStream_t stream);
int norm_kernel_infos(KernelInfo* out, int cap);

// ---- rope.cu: rotate_half RoPE on [T, NH, D]; positions int64 [T]; backward = the transposed rotation
cudaError_t rope(const bf16* x, const int64_t* positions, bf16* y, int64_t tokens, int nh, int d, double theta,
                 bool backward, cudaStream_t stream);
int rope_kernel_infos(KernelInfo* out, int cap);

// ---- embedding.cu: exact gather; backward walks runs of one id (ids stable-sorted, rows in logical order)
cudaError_t embedding_fwd(const int64_t* ids, const bf16* w, bf16* y, int64_t tokens, int64_t vocab, int h,
                          cudaStream_t stream);
cudaError_t embedding_bwd(const int64_t* ids_sorted, const int64_t* rows, const bf16* dy, float* main_grad,
                          int64_t n, int64_t vocab, int h, cudaStream_t stream);
int embedding_kernel_infos(KernelInfo* out, int cap);

// ---- logprob.cu: selected-token logprob of [T, V] bf16 logits (fp32 out and lse); backward to bf16 dlogits
cudaError_t logp_fwd(const bf16* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                     int64_t vocab, cudaStream_t stream);
cudaError_t logp_bwd(const bf16* logits, const int64_t* targets, const float* lse, const float* g, bf16* dlogits,
                     int64_t tokens, int64_t vocab, cudaStream_t stream);
// fp32 logits (linear_logp): the same kernels on fp32 input; dlogits still bf16 (the dx and dW GEMMs' input)
cudaError_t logp_fwd_f32(const float* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                         int64_t vocab, cudaStream_t stream);
// dlogits in two bf16 halves: hi = bf16(d), lo = bf16(d - hi) (the GEMMs take both: near fp32 precision)
cudaError_t logp_bwd_f32(const float* logits, const int64_t* targets, const float* lse, const float* g,
                         bf16* dlogits, bf16* dlogits_lo, int64_t tokens, int64_t vocab, cudaStream_t stream);
int logprob_kernel_infos(KernelInfo* out, int cap);

// ---- gemm.cu: C[M, Nc] = A[M, R] . op(B), op(B) = B^T (B [Nc, R]) or B (B [R, Nc]); fp32 accumulation over R
// in a fixed order; and the weight gradient main_grad[N, K] += dY_b^T X_b over the table's blocks in order
// a_lo / dy_lo (nullable): the low bf16 half of an fp32 operand split as hi + lo, one more MMA per step
cudaError_t gemm(const bf16* a, const bf16* a_lo, const bf16* b, bf16* c, int64_t m, int64_t nc, int64_t r,
                 bool b_trans, cudaStream_t stream);
cudaError_t gemm_f32_out(const bf16* a, const bf16* b, float* c, int64_t m, int64_t nc, int64_t r, bool b_trans,
                         cudaStream_t stream);
cudaError_t gemm_wgrad_blocks(const bf16* dy, const bf16* dy_lo, const bf16* x, const int32_t* table, int n_blocks,
                              float* main_grad, int64_t n, int64_t k, cudaStream_t stream);
int gemm_kernel_infos(KernelInfo* out, int cap);

// ---- attention.cu: causal GQA attention, one warp per (query row, head); keys per sample contiguous from
// position 0 (key_base[t]: the row of the sample's position-0 key; n_keys[t]: the query's position + 1, 0 on pads)
cudaError_t attn_fwd(const bf16* q, const bf16* k, const bf16* v, const int32_t* key_base, const int32_t* n_keys,
                     bf16* o, float* lse, int64_t rows, int hq, int hkv, int d, float scale, cudaStream_t stream);
// training calls (no prefix): q_end[j] = one past the last row of key row j's sample (j on pads: no query)
cudaError_t attn_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* dout, const float* lse,
                     float* delta, const int32_t* key_base, const int32_t* n_keys, const int32_t* q_end, bf16* dq,
                     bf16* dk, bf16* dv, int64_t rows, int hq, int hkv, int d, float scale, cudaStream_t stream);
int attention_kernel_infos(KernelInfo* out, int cap);

// ---- attention_tiled.cu: the forward on tensor cores, one CTA per row block: blocks int32 [n_blocks, 3] = (first
// row, rows, the block's largest n_keys), the rows of one sample and kv head x its group's query heads (at most 64
// rows: rows * (hq / hkv) <= 64), or null with n_blocks = rows: one block per row; tables as attn_fwd's. Head dim
// 128 and 64 % (hq / hkv) == 0 only (supported()).
bool attn_fwd_tiled_supported(int hq, int hkv, int d);
cudaError_t attn_fwd_tiled(const bf16* q, const bf16* k, const bf16* v, const int32_t* key_base,
                           const int32_t* n_keys, const int32_t* blocks, int n_blocks, bf16* o, float* lse, int hq,
                           int hkv, int d, float scale, cudaStream_t stream);
int attention_tiled_kernel_infos(KernelInfo* out, int cap);

}  // namespace ws1
