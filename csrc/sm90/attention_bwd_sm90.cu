// Causal GQA attention backward on Hopper (profile cuda_bf16_sm90): wgmma, bf16 in, fp32 accumulators, no atomics.
// Training calls only (whole samples, no kv prefix). Three kernels (two with fuse_dkv), in this order on the stream:
//   - dQ: a CTA per row block of the forward's rule (consecutive tokens of one sample x the group's heads, 64
//     rows), walking the sample's keys in logical blocks of 64 from position 0, twice. Both passes: S = Q K^T and
//     dP = dO V^T (wgmma, both operands from shared memory), p = exp2(s scale log2e - lse log2e) where the key is
//     visible (a select: 0 elsewhere). The first pass sums delta = sum_j p dP per row (each thread's 16 values a
//     block in order, then the quad's butterfly) and writes it; the second forms dS = p (dP - delta) and
//     dQ += dS K, dS split into bf16 hi + lo as two register A operands (K read MN-major);
//   - dK and dV: a CTA per (64-key block of a sample, kv head), one launch each, walking the sample's row blocks
//     that see the keys in ascending order (blocks of 64 / G tokens aligned to the sample's first token):
//     S^T = K Q^T, P^T as above; dV += (P^T hi + lo) dO; for dK also dP^T = V dO^T, dS^T = P^T (dP^T - delta), and
//     dK += (dS^T hi + lo) Q. The group's heads are rows of each row block, so both sum over them inside the MMA's
//     fixed reduction. Or (fuse_dkv) both in one walk, one launch, the same operations per accumulator: the same
//     bits.
// Why delta from p dP and not rowsum(dO . O), the usual flash backward's: O was rounded to bf16, and its P to bf16
// before P V, so dO . O is not the sum of p dP that the softmax's gradient needs; on the GPU tests' fixture that
// put 138 dK elements past the contract's gradient tolerance (max 0.046 against 0.012 + 1/64 |ref|), and the bf16
// dS a few more. With both fixed, an fp32 emulation of this arithmetic misses none.
// Every element's reduction runs over blocks fixed in the sample's own positions, in ascending order, with one
// writer: a packed call, a padded one, a permuted one and any micro-batch split of whole samples give the same bits.
// Tiles stream by cp.async into two slots (the next block's copies in flight under this block's MMAs), rows past the
// sample or the key count zero-filled, so no copy reads another sample's rows.
#include <climits>

#include "attention_sm90.cuh"
#include "kernel_attrs.cuh"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "ws1_sm90.h"

namespace ws1::sm90 {
namespace attn_detail {

using namespace cute;

using MmaSS = decltype(make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}));
using MmaRS = decltype(make_tiled_mma(SM90_64x128x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>{}));
// an m64n64 accumulator's values as the A fragments of four 16-wide k-steps (the forward's P)
using FragA = Layout<Shape<Shape<_2, _2, _2>, _1, _4>, Stride<Stride<_1, _2, _4>, _0, _8>>;

// The streamed tiles come in two slots: the next block's copies are in flight while the tensor cores work on this
// one. dQ: Q and dO stay, K and V stream (t[0], t[1], then slot s's K and V at t[2 + 2 s], t[3 + 2 s]). dK/dV: K
// and V stay, each row block's Q and dO stream likewise, with its rows' lse and delta beside them.
struct BwdSmem {
  alignas(1024) ArrayEngine<Element, cosize_v<SmemQ>> t[6];  // six 64 x 128 tiles
  float lse[2][kWgRows];                                     // dK/dV: slot s's rows' lse (natural log)
  float delta[2][kWgRows];                                   // and their delta
};
constexpr int kBwdSmem = static_cast<int>(sizeof(BwdSmem));

// c = a b over the head dim (8 k-steps), both from shared memory, waited for
template <class TA, class TB, class TC>
__device__ __forceinline__ void ss_gemm(MmaSS& mma, TA const& a, TB const& b, TC& c) {
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int ks = 0; ks < size<2>(a); ++ks) {
    gemm(mma, a(_, _, ks), b(_, _, ks), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
}

// c1 = a1 b1 and c2 = a2 b2 (both from shared memory) in one batch, waited for once: the second GEMM's issue does not
// wait for the first's result (S and dP of a key block are independent). Each accumulator sees the same k-steps in
// the same order as with two ss_gemm calls, so the same bits
template <class TA1, class TB1, class TC1, class TA2, class TB2, class TC2>
__device__ __forceinline__ void ss_gemm_pair(MmaSS& mma, TA1 const& a1, TB1 const& b1, TC1& c1, TA2 const& a2,
                                             TB2 const& b2, TC2& c2) {
  warpgroup_fence_operand(c1);
  warpgroup_fence_operand(c2);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int ks = 0; ks < size<2>(a1); ++ks) {
    gemm(mma, a1(_, _, ks), b1(_, _, ks), c1);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int ks = 0; ks < size<2>(a2); ++ks) {
    gemm(mma, a2(_, _, ks), b2(_, _, ks), c2);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(c1);
  warpgroup_fence_operand(c2);
}

// c += hi b + lo b over 64 (4 k-steps each, hi's first), hi and lo from registers, waited for. hi + lo is the fp32
// probability or dS to about 2^-17 relative, so the gradient GEMMs lose little more than fp32 operands would; bf16
// alone (the usual flash backward) left a few dK and dV elements past the contract's gradient tolerance
template <class TA, class TB, class TC>
__device__ __forceinline__ void rs_gemm2(MmaRS& mma, TA& hi, TA& lo, TB const& b, TC& c) {
  warpgroup_fence_operand(hi);
  warpgroup_fence_operand(lo);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
#pragma unroll
  for (int ks = 0; ks < size<2>(hi); ++ks) gemm(mma, hi(_, _, ks), b(_, _, ks), c);
#pragma unroll
  for (int ks = 0; ks < size<2>(lo); ++ks) gemm(mma, lo(_, _, ks), b(_, _, ks), c);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
}

// rs_gemm2's c += hi b + lo b, then d = a e from shared memory, in one batch waited for once (the fused dK/dV walk's
// dV GEMM and dP^T: independent, and each accumulator sees its own k-steps in the same order, so the same bits)
template <class TA, class TB, class TC, class TS, class TSB, class TD>
__device__ __forceinline__ void rs_gemm2_then_ss(MmaRS& mma, TA& hi, TA& lo, TB const& b, TC& c, MmaSS& mma_s,
                                                 TS const& a2, TSB const& b2, TD& d) {
  warpgroup_fence_operand(hi);
  warpgroup_fence_operand(lo);
  warpgroup_fence_operand(c);
  warpgroup_fence_operand(d);
  warpgroup_arrive();
#pragma unroll
  for (int ks = 0; ks < size<2>(hi); ++ks) gemm(mma, hi(_, _, ks), b(_, _, ks), c);
#pragma unroll
  for (int ks = 0; ks < size<2>(lo); ++ks) gemm(mma, lo(_, _, ks), b(_, _, ks), c);
  mma_s.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int ks = 0; ks < size<2>(a2); ++ks) {
    gemm(mma_s, a2(_, _, ks), b2(_, _, ks), d);
    mma_s.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
  warpgroup_fence_operand(d);
}

// hi = bf16(acc), lo = bf16(acc - hi), value by value in the accumulator's order (an A fragment's)
template <class TF, class TA>
__device__ __forceinline__ void split_frag(TF& hi, TF& lo, TA const& acc) {
  uint32_t* h32 = reinterpret_cast<uint32_t*>(raw_pointer_cast(hi.data()));
  uint32_t* l32 = reinterpret_cast<uint32_t*>(raw_pointer_cast(lo.data()));
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float a = acc(2 * i), b = acc(2 * i + 1);
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    h32[i] = *reinterpret_cast<const uint32_t*>(&h);
    l32[i] = pack2(a - __low2float(h), b - __high2float(h));
  }
}

// dQ for one row block (blocks: the forward's table with 64 / G tokens a block), the table walked from its end (the
// blocks that see the most keys come last in a sample, so they start first)
__global__ void __launch_bounds__(128)
    ws1_sm90_attn_bwd_dq(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ dout, const float* __restrict__ lse, float* __restrict__ delta,
                         const int32_t* __restrict__ key_base, const int32_t* __restrict__ n_keys,
                         const int32_t* __restrict__ blocks, bf16* __restrict__ dq, int hq, int hkv, float scale_log2,
                         float scale) {
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<BwdSmem*>(smem_raw);
  Tensor sQ = make_tensor(make_smem_ptr(smem.t[0].begin()), SmemQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.t[1].begin()), SmemQ{});

  const int g = static_cast<int>(blockIdx.y), group = hq / hkv, tid = threadIdx.x;
  const int gs = group_shift(group), gm = group - 1;
  const int bi = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int t0 = blocks[3 * bi], tokens = blocks[3 * bi + 1], key_count = blocks[3 * bi + 2];
  const int base = tokens > 0 ? key_base[t0] : 0;
  const int lane = tid % 32, quad = lane / 4, pair = (lane % 4) * 2;

  auto row_ptr = [&](const bf16* x) {
    return [=](int r) -> const bf16* {
      return (r >> gs) < tokens ? x + ((static_cast<int64_t>(t0) + (r >> gs)) * hq + g * group + (r & gm)) * kD
                                : nullptr;
    };
  };
  auto key_ptr = [&](const bf16* x, int kb) {
    return [=](int j) -> const bf16* {
      return kb * kKeys + j < key_count ? x + ((static_cast<int64_t>(base) + kb * kKeys + j) * hkv + g) * kD
                                        : nullptr;
    };
  };
  auto issue_keys_to = [&](int kb, int slot) {
    Tensor sK = make_tensor(make_smem_ptr(smem.t[2 + 2 * slot].begin()), SmemQ{});
    Tensor sV = make_tensor(make_smem_ptr(smem.t[3 + 2 * slot].begin()), SmemQ{});
    load_rows_async(sK, key_ptr(k, kb), k, tid);
    load_rows_async(sV, key_ptr(v, kb), v, tid);
  };
  const int n_kb = (key_count + kKeys - 1) / kKeys;
  load_rows_async(sQ, row_ptr(q), q, tid);
  load_rows_async(sdO, row_ptr(dout), dout, tid);
  if (n_kb > 0) issue_keys_to(0, 0);
  cp_async_commit();

  int row_t[2], row_h[2], row_n[2];
  bool row_ok[2];
  float lse2[2], dl[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = (tid / 32) * 16 + quad + 8 * h;
    row_ok[h] = (row >> gs) < tokens;
    row_t[h] = t0 + (row >> gs);
    row_h[h] = g * group + (row & gm);
    row_n[h] = row_ok[h] ? n_keys[row_t[h]] : 0;
    const int64_t at = static_cast<int64_t>(row_t[h]) * hq + row_h[h];
    lse2[h] = row_ok[h] ? lse[at] * kLog2e : 0.0f;
  }

  MmaSS mma_s;
  MmaRS mma_q;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_q = mma_q.get_thread_slice(tid);
  Tensor tQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));
  Tensor tdO = thr_s.make_fragment_A(thr_s.partition_A(sdO));
  Tensor accS = partition_fragment_C(mma_s, Shape<Int<kWgRows>, Int<kKeys>>{});
  Tensor accP = partition_fragment_C(mma_s, Shape<Int<kWgRows>, Int<kKeys>>{});
  Tensor accQ = partition_fragment_C(mma_q, Shape<Int<kWgRows>, Int<kD>>{});
  Tensor hi = make_tensor<Element>(FragA{});
  Tensor lo = make_tensor<Element>(FragA{});
  clear(accQ);

  // Two passes over the key blocks, one stream of 2 n_kb steps through the two slots (step st reads key block
  // st mod n_kb into slot st & 1): the first sums delta = sum_j p dP over the row's keys, the second forms dS and dQ.
  for (int st = 0; st < 2 * n_kb; ++st) {
    const bool second = st >= n_kb;
    const int kb = second ? st - n_kb : st;
    if (st + 1 < 2 * n_kb) issue_keys_to(st + 1 < n_kb ? st + 1 : st + 1 - n_kb, (st + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // step st's copies (and Q, dO) have landed
    cutlass::arch::fence_view_async_shared();
    __syncthreads();
    const int slot = st & 1;
    Tensor sK = make_tensor(make_smem_ptr(smem.t[2 + 2 * slot].begin()), SmemQ{});
    Tensor sV = make_tensor(make_smem_ptr(smem.t[3 + 2 * slot].begin()), SmemQ{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.t[2 + 2 * slot].begin()), SmemQt{});
    Tensor tK = thr_s.make_fragment_B(thr_s.partition_B(sK));
    Tensor tV = thr_s.make_fragment_B(thr_s.partition_B(sV));
    Tensor tKt = thr_q.make_fragment_B(thr_q.partition_B(sKt));
    ss_gemm_pair(mma_s, tQ, tK, accS, tdO, tV, accP);
    if (!second) {
      // value i: row quad + 8 ((i / 2) % 2), key pair + (i % 2) + 8 (i / 4); this thread's 16 a row, in order
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int h = (i / 2) % 2;
        const bool vis = kb * kKeys + pair + (i % 2) + 8 * (i / 4) < row_n[h];
        dl[h] += vis ? exp2f(accS(i) * scale_log2 - lse2[h]) * accP(i) : 0.0f;
      }
      if (st + 1 == n_kb) {
        // the quad's four partial sums by a butterfly: a + b = b + a, so all four lanes hold the same bits
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          dl[h] += __shfl_xor_sync(0xffffffffu, dl[h], 1);
          dl[h] += __shfl_xor_sync(0xffffffffu, dl[h], 2);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int h = (i / 2) % 2;
        const bool vis = kb * kKeys + pair + (i % 2) + 8 * (i / 4) < row_n[h];
        const float p = vis ? exp2f(accS(i) * scale_log2 - lse2[h]) : 0.0f;
        accS(i) = vis ? p * (accP(i) - dl[h]) : 0.0f;
      }
      split_frag(hi, lo, accS);
      rs_gemm2(mma_q, hi, lo, tKt, accQ);
    }
    __syncthreads();  // every warp's MMAs on this slot are done before the next step refills it
  }
  cp_async_wait<0>();
  // delta for the dK kernel: one writer a row (the quad's first lane)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row_ok[h] && pair == 0) delta[static_cast<int64_t>(row_t[h]) * hq + row_h[h]] = dl[h];
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!row_ok[h]) continue;
    bf16* out = dq + (static_cast<int64_t>(row_t[h]) * hq + row_h[h]) * kD + pair;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<uint32_t*>(out + 8 * j) =
          pack2(accQ(4 * j + 2 * h) * scale, accQ(4 * j + 2 * h + 1) * scale);
    }
  }
}

// dV (kDK false) or dK (kDK true) for one 64-key block of a sample and one kv head. kblocks: int32 [n, 3] =
// (the sample's first row, its length, the key block's index in the sample). kMode: 0 dV into `out`, 1 dK into
// `out`, 2 both in one walk (dK into `out`, dV into `out2`): S^T, the loads and P^T computed once for both. The
// fused walk does each accumulator's operations in the same order as its own kernel, so it gives the same bits.
template <int kMode>
__global__ void __launch_bounds__(128)
    ws1_sm90_attn_bwd_dkv(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                          const bf16* __restrict__ dout, const float* __restrict__ lse,
                          const float* __restrict__ delta, const int32_t* __restrict__ kblocks,
                          bf16* __restrict__ out, bf16* __restrict__ out2, int hq, int hkv, float scale_log2,
                          float scale) {
  constexpr bool kDK = kMode != 0, kBoth = kMode == 2;
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<BwdSmem*>(smem_raw);
  Tensor sK = make_tensor(make_smem_ptr(smem.t[0].begin()), SmemQ{});
  Tensor sV = make_tensor(make_smem_ptr(smem.t[1].begin()), SmemQ{});

  const int g = static_cast<int>(blockIdx.y), group = hq / hkv, tid = threadIdx.x;
  const int gs = group_shift(group), gm = group - 1;
  const int s0 = kblocks[3 * blockIdx.x], len = kblocks[3 * blockIdx.x + 1], kb = kblocks[3 * blockIdx.x + 2];
  const int tb = (kWgRows >> gs);  // tokens a row block
  const int lane = tid % 32, quad = lane / 4, pair = (lane % 4) * 2;

  auto key_ptr = [&](const bf16* x) {
    return [=](int j) -> const bf16* {
      return kb * kKeys + j < len ? x + ((static_cast<int64_t>(s0) + kb * kKeys + j) * hkv + g) * kD : nullptr;
    };
  };
  // row block rb's tiles (Q and, for dK, dO; dV reads dO as its B operand) and its rows' lse (and delta) into slot
  // rb & 1
  auto issue_rows = [&](int rb) {
    const int slot = rb & 1;
    auto row_ptr = [&](const bf16* x) {
      return [=](int r) -> const bf16* {
        const int tok = rb * tb + (r >> gs);
        return tok < len ? x + ((static_cast<int64_t>(s0) + tok) * hq + g * group + (r & gm)) * kD : nullptr;
      };
    };
    Tensor sQ = make_tensor(make_smem_ptr(smem.t[2 + 2 * slot].begin()), SmemQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.t[3 + 2 * slot].begin()), SmemQ{});
    load_rows_async(sQ, row_ptr(q), q, tid);
    load_rows_async(sdO, row_ptr(dout), dout, tid);
    const int col = tid % kWgRows, tok = rb * tb + (col >> gs);
    const int64_t at = (static_cast<int64_t>(s0) + tok) * hq + g * group + (col & gm);
    if (tid < kWgRows) {
      load_f32_async(&smem.lse[slot][col], tok < len ? lse + at : nullptr, lse);
    } else if (kDK) {
      load_f32_async(&smem.delta[slot][col], tok < len ? delta + at : nullptr, delta);
    }
  };

  const int rb_begin = kb * kKeys / tb, rb_end = (len + tb - 1) / tb;
  load_rows_async(sK, key_ptr(k), k, tid);
  if constexpr (kDK) load_rows_async(sV, key_ptr(v), v, tid);
  if (rb_begin < rb_end) issue_rows(rb_begin);
  cp_async_commit();

  int kpos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) kpos[h] = kb * kKeys + (tid / 32) * 16 + quad + 8 * h;

  MmaSS mma_s;
  MmaRS mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tK = thr_s.make_fragment_A(thr_s.partition_A(sK));
  Tensor tV = thr_s.make_fragment_A(thr_s.partition_A(sV));
  Tensor accS = partition_fragment_C(mma_s, Shape<Int<kKeys>, Int<kWgRows>>{});
  Tensor accP = partition_fragment_C(mma_s, Shape<Int<kKeys>, Int<kWgRows>>{});
  Tensor acc = partition_fragment_C(mma_o, Shape<Int<kKeys>, Int<kD>>{});
  Tensor acc_v = partition_fragment_C(mma_o, Shape<Int<kBoth ? kKeys : 1>, Int<kBoth ? kD : 1>>{});  // kBoth: dV
  Tensor hi = make_tensor<Element>(FragA{});
  Tensor lo = make_tensor<Element>(FragA{});
  clear(acc);
  if constexpr (kBoth) clear(acc_v);

  for (int rb = rb_begin; rb < rb_end; ++rb) {
    if (rb + 1 < rb_end) issue_rows(rb + 1);  // into the slot row block rb - 1 read (done: the barrier below)
    cp_async_commit();
    cp_async_wait<1>();
    cutlass::arch::fence_view_async_shared();
    __syncthreads();
    const int slot = rb & 1;
    Tensor sQ = make_tensor(make_smem_ptr(smem.t[2 + 2 * slot].begin()), SmemQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.t[3 + 2 * slot].begin()), SmemQ{});
    Tensor sBt = make_tensor(make_smem_ptr(smem.t[(kDK ? 2 : 3) + 2 * slot].begin()), SmemQt{});
    Tensor tQ = thr_s.make_fragment_B(thr_s.partition_B(sQ));
    Tensor tdO = thr_s.make_fragment_B(thr_s.partition_B(sdO));
    Tensor tB = thr_o.make_fragment_B(thr_o.partition_B(sBt));  // dK's Q^T or dV's dO^T
    // S^T: keys x rows (and for dK alone dP^T in the same batch; the fused walk takes dP^T after dV, registers)
    if constexpr (kDK && !kBoth) {
      ss_gemm_pair(mma_s, tK, tQ, accS, tV, tdO, accP);
    } else {
      ss_gemm(mma_s, tK, tQ, accS);
    }
    // value i: key quad + 8 ((i / 2) % 2), column (query row of the block) pair + (i % 2) + 8 (i / 4)
    auto visible = [&](int i) {
      const int h = (i / 2) % 2, col = pair + (i % 2) + 8 * (i / 4);
      const int tok = rb * tb + (col >> gs);
      return tok < len && kpos[h] <= tok;
    };
    if constexpr (kBoth) {
      // P^T first, for dV (its own kernel's operations), then dS^T from the same p in place, for dK
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int col = pair + (i % 2) + 8 * (i / 4);
        accS(i) = visible(i) ? exp2f(accS(i) * scale_log2 - smem.lse[slot][col] * kLog2e) : 0.0f;
      }
      Tensor sdOt = make_tensor(make_smem_ptr(smem.t[3 + 2 * slot].begin()), SmemQt{});
      Tensor tdOt = thr_o.make_fragment_B(thr_o.partition_B(sdOt));
      split_frag(hi, lo, accS);
      rs_gemm2_then_ss(mma_o, hi, lo, tdOt, acc_v, mma_s, tV, tdO, accP);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int col = pair + (i % 2) + 8 * (i / 4);
        accS(i) = visible(i) ? accS(i) * (accP(i) - smem.delta[slot][col]) : 0.0f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int col = pair + (i % 2) + 8 * (i / 4);
        const bool vis = visible(i);
        const float p = vis ? exp2f(accS(i) * scale_log2 - smem.lse[slot][col] * kLog2e) : 0.0f;
        if constexpr (kDK) {
          accS(i) = vis ? p * (accP(i) - smem.delta[slot][col]) : 0.0f;
        } else {
          accS(i) = p;
        }
      }
    }
    split_frag(hi, lo, accS);
    rs_gemm2(mma_o, hi, lo, tB, acc);
    __syncthreads();  // every warp is done with this slot before the next iteration refills it
  }
  cp_async_wait<0>();

  const float mul = kDK ? scale : 1.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (kpos[h] >= len) continue;
    const int64_t at = ((static_cast<int64_t>(s0) + kpos[h]) * hkv + g) * kD + pair;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<uint32_t*>(out + at + 8 * j) =
          pack2(acc(4 * j + 2 * h) * mul, acc(4 * j + 2 * h + 1) * mul);
      if constexpr (kBoth) {
        *reinterpret_cast<uint32_t*>(out2 + at + 8 * j) =
            pack2(acc_v(4 * j + 2 * h) * 1.0f, acc_v(4 * j + 2 * h + 1) * 1.0f);
      }
    }
  }
}

// once per device (kernel_attrs.cuh); two CTAs an SM fit at the default carveout
template <auto kKernel>
cudaError_t set_smem() {
  return configure_smem_once<kKernel>(kBwdSmem, false);
}

}  // namespace attn_detail

cudaError_t attn_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* dout, const float* lse,
                     const int32_t* key_base, const int32_t* n_keys, const int32_t* blocks, int64_t n_blocks,
                     const int32_t* kblocks, int64_t n_kblocks, float* delta, bf16* dq, bf16* dk, bf16* dv,
                     int64_t tokens, int hq, int hkv, int d, float scale, bool fuse_dkv, cudaStream_t stream) {
  using namespace attn_detail;
  if (!attn_fwd_supported(hq, hkv, d, kWgRows) || n_blocks > INT_MAX || n_kblocks > INT_MAX || hkv > 65535)
    return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  (void)o;  // delta comes from the backward's own p and dP (the dQ kernel's first pass), not from O
  const float scale_log2 = scale * kLog2e;
  if (n_blocks > 0) {
    if (const cudaError_t e = set_smem<&ws1_sm90_attn_bwd_dq>(); e != cudaSuccess) return e;
    ws1_sm90_attn_bwd_dq<<<dim3(static_cast<unsigned>(n_blocks), static_cast<unsigned>(hkv)), 128, kBwdSmem,
                           stream>>>(q, k, v, dout, lse, delta, key_base, n_keys, blocks, dq, hq, hkv, scale_log2,
                                     scale);
  }
  if (n_kblocks > 0) {
    const dim3 grid(static_cast<unsigned>(n_kblocks), static_cast<unsigned>(hkv));
    if (fuse_dkv) {
      if (const cudaError_t e = set_smem<&ws1_sm90_attn_bwd_dkv<2>>(); e != cudaSuccess) return e;
      ws1_sm90_attn_bwd_dkv<2><<<grid, 128, kBwdSmem, stream>>>(q, k, v, dout, lse, delta, kblocks, dk, dv, hq, hkv,
                                                                scale_log2, scale);
    } else {
      if (const cudaError_t e = set_smem<&ws1_sm90_attn_bwd_dkv<0>>(); e != cudaSuccess) return e;
      if (const cudaError_t e = set_smem<&ws1_sm90_attn_bwd_dkv<1>>(); e != cudaSuccess) return e;
      ws1_sm90_attn_bwd_dkv<0><<<grid, 128, kBwdSmem, stream>>>(q, k, v, dout, lse, delta, kblocks, dv, nullptr, hq,
                                                                hkv, scale_log2, scale);
      ws1_sm90_attn_bwd_dkv<1><<<grid, 128, kBwdSmem, stream>>>(q, k, v, dout, lse, delta, kblocks, dk, nullptr, hq,
                                                                hkv, scale_log2, scale);
    }
  }
  return cudaGetLastError();
}

int attn_bwd_infos(KernelInfo* out, int cap) {
  using namespace attn_detail;
  const void* fns[] = {reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_dq),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_dkv<0>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_dkv<1>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_dkv<2>)};
  const char* names[] = {"ws1_sm90_attn_bwd_dq", "ws1_sm90_attn_bwd_dv", "ws1_sm90_attn_bwd_dk",
                         "ws1_sm90_attn_bwd_dkv"};
  return fill_kernel_infos(out, cap, fns, names, 4);
}

}  // namespace ws1::sm90
