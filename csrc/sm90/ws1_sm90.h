// ws1 Hopper kernels (profile cuda_bf16_sm90): host launchers over raw pointers, sizes and a stream, built only
// for sm_90a (`-gencode=arch=compute_90a,code=sm_90a`) into their own extension, ws1_cuda_sm90_ext. The rules are
// those of ../kernels/ws1_kernels.h: one fp32 accumulator chain per output element over the whole reduced dim.
#pragma once

#include "../kernels/ws1_kernels.h"

namespace ws1::sm90 {

// The frozen M buckets of the GEMM (ws1_kernels.cuda_sm90.linear.BUCKETS says the same): M <= kSmallM takes the
// decode tile, M <= kMidM the middle one, anything larger the large one.
constexpr int64_t kSmallM = 64;
constexpr int64_t kMidM = 1024;

// Which bucket an M falls in (0 small, 1 mid, 2 large).
int gemm_bucket(int64_t m);

// c [m, n] = a [m, k] b^T with b [n, k] (b_trans, the forward), or a [m, k] b with b [k, n] (dx; here k is the
// reduced dim, the forward's N). n and k multiples of 8 (16-byte TMA rows); all row-major and contiguous.
cudaError_t gemm(const bf16* a, const bf16* b, bf16* c, int64_t m, int64_t n, int64_t k, bool b_trans, int device,
                 int sm_count, cudaStream_t stream);
int gemm_kernel_infos(KernelInfo* out, int cap);

// A call with fewer rows runs on A zero-padded to this many (the binding): see ws1_sm90_ops.cpp.
constexpr int64_t kPadRows = 64;

// Leading dims a multiple of this many elements (16-byte TMA rows).
constexpr int64_t kGemmAlign = 8;

// The buckets' launchers (gemm_sm90_{small,mid,large}.cu).
cudaError_t gemm_small(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, bool b_trans, int device,
                       int sm_count, cudaStream_t stream);
cudaError_t gemm_mid(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, bool b_trans, int device,
                     int sm_count, cudaStream_t stream);
cudaError_t gemm_large(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, bool b_trans, int device,
                       int sm_count, cudaStream_t stream);
int gemm_small_infos(KernelInfo* out, int cap);
int gemm_mid_infos(KernelInfo* out, int cap);
int gemm_large_infos(KernelInfo* out, int cap);

// The mid bucket's wide tile (gemm_sm90_mid_wide.cu, 128 x 192): every tile gives an element the same accumulator
// chain, so the same bits; which one runs is a speed choice. gemm_mid_wide_pick says where it would run: a mid-bucket
// call whose 128 x 192 tiles fit one wave of the SMs while its 128 x 128 tiles do not. Wired (kMidWideWired) since
// its first timing: qkv's forward at 384-512 rows went from 0.67-0.77x to 0.89-0.98x cuBLAS; gemm_tile runs any tile
// at any M (0 small, 1 mid, 2 large, 3 mid wide) for the tests and probes.
constexpr bool kMidWideWired = true;
constexpr int kGemmTiles = 4;
bool gemm_mid_wide_pick(int64_t m, int64_t n, int sm_count);
cudaError_t gemm_mid_wide(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, bool b_trans, int device,
                          int sm_count, cudaStream_t stream);
int gemm_mid_wide_infos(KernelInfo* out, int cap);
cudaError_t gemm_tile(const bf16* a, const bf16* b, bf16* c, int64_t m, int64_t n, int64_t k, bool b_trans, int tile,
                      int device, int sm_count, cudaStream_t stream);

// c [m, n] fp32 = a [m, k] b^T with b [n, k] (b_trans), or a b with b [k, n] (gemm_sm90_f32.cu: the mid tile
// for every m, the accumulator stored unrounded); n and k multiples of 8.
cudaError_t gemm_f32out(const bf16* a, const bf16* b, float* c, int64_t m, int64_t n, int64_t k, bool b_trans,
                        int device, int sm_count, cudaStream_t stream);
int gemm_f32out_infos(KernelInfo* out, int cap);

// linear_logp's forward, fused (linear_logp_sm90.cu): out[t] = (x w^T)[t, targets[t]] - lse[t], lse[t] =
// logsumexp of the row, fp32 [m] each, x [m, k], w [n, k]; the GEMM's epilogue reduces each 128-wide vocab block of
// a row to a (max, sum) pair in `workspace` (fp32, linear_logp_workspace(m, n) values), which a second kernel folds;
// the [m, n] logits are never written. n and k multiples of 8.
int64_t linear_logp_blocks(int64_t vocab);
// The fused forward's own frozen M table (0: M <= kFusedSmallM, the 64 x 128 ping-pong tile; 1: M <= kFusedMidM,
// 128 x 128; 2: 128 x 256 on a 2-CTA cluster). Every tile gives the same bits (linear_logp_sm90.cuh), so the table
// is a speed choice alone; it is not the GEMM's (kSmallM, kMidM) because the epilogue moves the crossovers: on an
// H100 at V = 151936, K = 4096 the 128 x 128 fused kernel was 1.27x the 128 x 256 one at M = 512.
constexpr int64_t kFusedSmallM = 64;
constexpr int64_t kFusedMidM = 256;
int linear_logp_bucket(int64_t m);
inline int64_t linear_logp_workspace(int64_t m, int64_t vocab) { return m * (2 * linear_logp_blocks(vocab) + 1); }
cudaError_t linear_logp_fwd(const bf16* x, const bf16* w, const int64_t* targets, float* workspace, float* out,
                            float* lse, int64_t m, int64_t n, int64_t k, int device, int sm_count,
                            cudaStream_t stream);
int linear_logp_infos(KernelInfo* out, int cap);

// The weight gradient under sample_blocks_main_grad (wgrad_sm90.cu): main_grad [n, k] fp32 += the blocks' dy^T x in
// table order (table: int32 [programs, 16] physical rows, -1 empty; the first n_blocks programs are the blocks),
// each element's chain starting from main_grad's value. dy_lo (nullable): dy's low bf16 half, a k-step of its own
// after each block's high half. The op gathers the blocks into gathered_dy [wgrad_rows, n] and gathered_x
// [wgrad_rows, k] (bf16, the caller's buffers). consumers: 1 (a 128 x 128 tile a CTA) or 2 (128 x 256, two
// warpgroups); stage_rows: 64 (4 k-steps a stage, a 4-slot ring) or 32 (2 k-steps, 8 slots; 4 slots with one
// warpgroup, so two CTAs share an SM); every choice gives the same bits. n a multiple of kWgradTile, k of kWgradTile * consumers.
constexpr int64_t kWgradTile = 128;
constexpr int64_t kWgradStageRows = 64;
int64_t wgrad_rows(int64_t n_blocks, bool split);
cudaError_t wgrad_blocks(const bf16* dy, const bf16* dy_lo, const bf16* x, const int32_t* table, int64_t n_blocks,
                         float* main_grad, bf16* gathered_dy, bf16* gathered_x, int64_t n, int64_t k, int consumers,
                         int stage_rows, int device, cudaStream_t stream);
int wgrad_infos(KernelInfo* out, int cap);

// logp in one pass over bf16 logits [tokens, vocab] (logp_sm90.cu): out and lse fp32 [tokens]; the backward writes
// dlogits bf16 [tokens, vocab]. 16-byte loads where the rows allow (logp_vector_path), the same arithmetic else.
cudaError_t logp_fwd(const bf16* logits, const int64_t* targets, float* out, float* lse, int64_t tokens,
                     int64_t vocab, cudaStream_t stream);
cudaError_t logp_bwd(const bf16* logits, const int64_t* targets, const float* lse, const float* g, bf16* dlogits,
                     int64_t tokens, int64_t vocab, cudaStream_t stream);
bool logp_vector_path(const void* logits, int64_t vocab);
int logp_kernel_infos(KernelInfo* out, int cap);

// Causal GQA attention forward (attention_sm90.cu): o [T, hq, d] bf16 and lse [T, hq] fp32 from q [T, hq, d] and
// k, v [kv_rows, hkv, d], each row's keys at key_base[t] + [0, n_keys[t]). blocks: int32 [n_blocks, 3] row blocks
// (first row, tokens, key count), at most block_rows / (hq / hkv) tokens each; or null, one token a CTA (n_blocks =
// T). block_rows 128 runs two consumer warpgroups a CTA, 64 one. schedule: 0 the plain loop on a 2-slot ring, 1 the
// overlapped loop (block kb's S issued with block kb - 1's P V) on 2 slots, 2 the same on 3, 3 the overlapped loop
// on 2 slots with Q in registers (S's A operand; 64-row blocks only), 4 the overlapped loop on 2 slots with the two
// warpgroups taking turns to issue (ping-pong; 128-row blocks only): attn_fwd_schedule_ok. Every choice gives a row
// the same bits. The wide schedules walk keys in logical blocks of 128, so their bits are their own (the same in
// every block size and either schedule): 5 the overlapped loop, 6 with ping-pong (128-row blocks only), each with a
// producer warpgroup that hands its registers to the consumers (setmaxnreg).
constexpr int kSchedules = 7;
bool attn_fwd_supported(int hq, int hkv, int d, int block_rows);
bool attn_fwd_schedule_ok(int block_rows, int schedule);
cudaError_t attn_fwd(const bf16* q, const bf16* k, const bf16* v, const int32_t* key_base, const int32_t* n_keys,
                     const int32_t* blocks, int64_t n_blocks, int64_t kv_rows, bf16* o, float* lse, int hq, int hkv,
                     int d, int block_rows, float scale, int schedule, int device, cudaStream_t stream);
int attn_fwd_infos(KernelInfo* out, int cap);

// Causal GQA attention backward (attention_bwd_sm90.cu; training calls: whole samples, no kv prefix): dq [T, hq, d],
// dk and dv [T, hkv, d] (the caller zeroes dk and dv: rows of no sample stay 0), from the forward's lse and the
// tables: blocks (the forward's row blocks at 64-row blocks, n_blocks of them) and kblocks int32 [n_kblocks, 3] =
// (the sample's first row, its length, the key block's index in it), one per 64 keys of every sample. delta: an fp32
// workspace of T * hq values. Head dim 128 and a group dividing 64 (attn_fwd_supported at 64 rows). fuse_dkv: dK and
// dV in one walk over the row blocks (one kernel) instead of one kernel each; the same bits either way.
cudaError_t attn_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* dout, const float* lse,
                     const int32_t* key_base, const int32_t* n_keys, const int32_t* blocks, int64_t n_blocks,
                     const int32_t* kblocks, int64_t n_kblocks, float* delta, bf16* dq, bf16* dk, bf16* dv,
                     int64_t tokens, int hq, int hkv, int d, float scale, bool fuse_dkv, cudaStream_t stream);
int attn_bwd_infos(KernelInfo* out, int cap);

}  // namespace ws1::sm90
