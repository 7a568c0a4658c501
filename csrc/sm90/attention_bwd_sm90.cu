// Causal GQA attention backward on Hopper (profile cuda_bf16_sm90): wgmma, bf16 in, fp32 accumulators, no atomics.
// Training calls only (whole samples, no kv prefix). Three kernels:
//   - delta[t, h] = sum_d dO . O, one warp a row: each lane's 4 values in order, then a fixed butterfly;
//   - dQ: a CTA per row block of the forward's rule (consecutive tokens of one sample x the group's heads, 64
//     rows), walking the sample's keys in logical blocks of 64 from position 0: S = Q K^T and dP = dO V^T (wgmma,
//     both operands from shared memory), p = exp2(s scale log2e - lse log2e) and dS = p (dP - delta) where the key
//     is visible (a select: 0 elsewhere), then dQ += bf16(dS) K (P-style register A operand, K read MN-major);
//   - dK and dV: a CTA per (64-key block of a sample, kv head), one launch each, walking the sample's row blocks
//     that see the keys in ascending order (blocks of 64 / G tokens aligned to the sample's first token):
//     S^T = K Q^T, P^T as above; dV += bf16(P^T) dO; for dK also dP^T = V dO^T, dS^T = P^T (dP^T - delta), and
//     dK += bf16(dS^T) Q. The group's heads are rows of each row block, so both sum over them inside the MMA's
//     fixed reduction.
// Every element's reduction runs over blocks fixed in the sample's own positions, in ascending order, with one
// writer: a packed call, a padded one, a permuted one and any micro-batch split of whole samples give the same bits.
// Tiles come by plain 16-byte loads into the 128-byte-swizzled layout (rows past the sample or the key count are
// zeros), so no TMA box reads another sample's rows.
#include <climits>

#include "attention_sm90.cuh"
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

struct BwdSmem {
  alignas(1024) ArrayEngine<Element, cosize_v<SmemQ>> t[4];  // four 64 x 128 tiles
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

// c += a b over 64 (4 k-steps), a from registers, waited for
template <class TA, class TB, class TC>
__device__ __forceinline__ void rs_gemm(MmaRS& mma, TA& a, TB const& b, TC& c) {
  warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
#pragma unroll
  for (int ks = 0; ks < size<2>(a); ++ks) gemm(mma, a(_, _, ks), b(_, _, ks), c);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
}

template <class TF, class TA>
__device__ __forceinline__ void pack_frag(TF& frag, TA const& acc) {
  uint32_t* p32 = reinterpret_cast<uint32_t*>(raw_pointer_cast(frag.data()));
#pragma unroll
  for (int i = 0; i < 16; ++i) p32[i] = pack2(acc(2 * i), acc(2 * i + 1));
}

__global__ void __launch_bounds__(256)
    ws1_sm90_attn_bwd_delta(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ delta,
                            int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const bf16* a = o + row * kD + lane * 4;
  const bf16* b = dout + row * kD + lane * 4;
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) s += __bfloat162float(a[e]) * __bfloat162float(b[e]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) delta[row] = s;
}

// dQ for one row block (blocks: the forward's table with 64 / G tokens a block)
__global__ void __launch_bounds__(128)
    ws1_sm90_attn_bwd_dq(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                         const int32_t* __restrict__ key_base, const int32_t* __restrict__ n_keys,
                         const int32_t* __restrict__ blocks, bf16* __restrict__ dq, int hq, int hkv, float scale_log2,
                         float scale) {
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<BwdSmem*>(smem_raw);
  Tensor sQ = make_tensor(make_smem_ptr(smem.t[0].begin()), SmemQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.t[1].begin()), SmemQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.t[2].begin()), SmemQ{});
  Tensor sV = make_tensor(make_smem_ptr(smem.t[3].begin()), SmemQ{});
  Tensor sKt = make_tensor(make_smem_ptr(smem.t[2].begin()), SmemQt{});

  const int g = static_cast<int>(blockIdx.y), group = hq / hkv, tid = threadIdx.x;
  const int t0 = blocks[3 * blockIdx.x], tokens = blocks[3 * blockIdx.x + 1], key_count = blocks[3 * blockIdx.x + 2];
  const int base = tokens > 0 ? key_base[t0] : 0;
  const int lane = tid % 32, quad = lane / 4, pair = (lane % 4) * 2;

  auto row_ptr = [&](const bf16* x) {
    return [=](int r) -> const bf16* {
      return r / group < tokens ? x + ((static_cast<int64_t>(t0) + r / group) * hq + g * group + r % group) * kD
                                : nullptr;
    };
  };
  load_rows(sQ, row_ptr(q), tid);
  load_rows(sdO, row_ptr(dout), tid);

  int row_t[2], row_h[2], row_n[2];
  bool row_ok[2];
  float lse2[2], dl[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = (tid / 32) * 16 + quad + 8 * h;
    row_ok[h] = row / group < tokens;
    row_t[h] = t0 + row / group;
    row_h[h] = g * group + row % group;
    row_n[h] = row_ok[h] ? n_keys[row_t[h]] : 0;
    const int64_t at = static_cast<int64_t>(row_t[h]) * hq + row_h[h];
    lse2[h] = row_ok[h] ? lse[at] * kLog2e : 0.0f;
    dl[h] = row_ok[h] ? delta[at] : 0.0f;
  }

  MmaSS mma_s;
  MmaRS mma_q;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_q = mma_q.get_thread_slice(tid);
  Tensor tQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));
  Tensor tK = thr_s.make_fragment_B(thr_s.partition_B(sK));
  Tensor tdO = thr_s.make_fragment_A(thr_s.partition_A(sdO));
  Tensor tV = thr_s.make_fragment_B(thr_s.partition_B(sV));
  Tensor tKt = thr_q.make_fragment_B(thr_q.partition_B(sKt));
  Tensor accS = partition_fragment_C(mma_s, Shape<Int<kWgRows>, Int<kKeys>>{});
  Tensor accP = partition_fragment_C(mma_s, Shape<Int<kWgRows>, Int<kKeys>>{});
  Tensor accQ = partition_fragment_C(mma_q, Shape<Int<kWgRows>, Int<kD>>{});
  Tensor frag = make_tensor<Element>(FragA{});
  clear(accQ);

  const int n_kb = (key_count + kKeys - 1) / kKeys;
  for (int kb = 0; kb < n_kb; ++kb) {
    __syncthreads();  // the previous block's MMAs (waited for) are done reading the key tiles
    auto key_ptr = [&](const bf16* x) {
      return [=](int j) -> const bf16* {
        return kb * kKeys + j < key_count ? x + ((static_cast<int64_t>(base) + kb * kKeys + j) * hkv + g) * kD
                                          : nullptr;
      };
    };
    load_rows(sK, key_ptr(k), tid);
    load_rows(sV, key_ptr(v), tid);
    cutlass::arch::fence_view_async_shared();
    __syncthreads();
    ss_gemm(mma_s, tQ, tK, accS);
    ss_gemm(mma_s, tdO, tV, accP);
    // value i: row quad + 8 ((i / 2) % 2), key pair + (i % 2) + 8 (i / 4)
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i / 2) % 2;
      const bool vis = kb * kKeys + pair + (i % 2) + 8 * (i / 4) < row_n[h];
      const float p = vis ? exp2f(accS(i) * scale_log2 - lse2[h]) : 0.0f;
      accS(i) = vis ? p * (accP(i) - dl[h]) : 0.0f;
    }
    pack_frag(frag, accS);
    rs_gemm(mma_q, frag, tKt, accQ);
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
// (the sample's first row, its length, the key block's index in the sample)
template <bool kDK>
__global__ void __launch_bounds__(128)
    ws1_sm90_attn_bwd_dkv(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                          const bf16* __restrict__ dout, const float* __restrict__ lse,
                          const float* __restrict__ delta, const int32_t* __restrict__ kblocks,
                          bf16* __restrict__ out, int hq, int hkv, float scale_log2, float scale) {
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<BwdSmem*>(smem_raw);
  Tensor sK = make_tensor(make_smem_ptr(smem.t[0].begin()), SmemQ{});
  Tensor sV = make_tensor(make_smem_ptr(smem.t[1].begin()), SmemQ{});
  Tensor sQ = make_tensor(make_smem_ptr(smem.t[2].begin()), SmemQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.t[3].begin()), SmemQ{});
  Tensor sQt = make_tensor(make_smem_ptr(smem.t[2].begin()), SmemQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.t[3].begin()), SmemQt{});

  const int g = static_cast<int>(blockIdx.y), group = hq / hkv, tid = threadIdx.x;
  const int s0 = kblocks[3 * blockIdx.x], len = kblocks[3 * blockIdx.x + 1], kb = kblocks[3 * blockIdx.x + 2];
  const int tb = kWgRows / group;  // tokens a row block
  const int lane = tid % 32, quad = lane / 4, pair = (lane % 4) * 2;

  auto key_ptr = [&](const bf16* x) {
    return [=](int j) -> const bf16* {
      return kb * kKeys + j < len ? x + ((static_cast<int64_t>(s0) + kb * kKeys + j) * hkv + g) * kD : nullptr;
    };
  };
  load_rows(sK, key_ptr(k), tid);
  if constexpr (kDK) load_rows(sV, key_ptr(v), tid);

  int kpos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) kpos[h] = kb * kKeys + (tid / 32) * 16 + quad + 8 * h;

  MmaSS mma_s;
  MmaRS mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tK = thr_s.make_fragment_A(thr_s.partition_A(sK));
  Tensor tV = thr_s.make_fragment_A(thr_s.partition_A(sV));
  Tensor tQ = thr_s.make_fragment_B(thr_s.partition_B(sQ));
  Tensor tdO = thr_s.make_fragment_B(thr_s.partition_B(sdO));
  Tensor tB = thr_o.make_fragment_B(thr_o.partition_B(kDK ? sQt : sdOt));  // dK's Q^T or dV's dO^T
  Tensor accS = partition_fragment_C(mma_s, Shape<Int<kKeys>, Int<kWgRows>>{});
  Tensor accP = partition_fragment_C(mma_s, Shape<Int<kKeys>, Int<kWgRows>>{});
  Tensor acc = partition_fragment_C(mma_o, Shape<Int<kKeys>, Int<kD>>{});
  Tensor frag = make_tensor<Element>(FragA{});
  clear(acc);

  const int rb_end = (len + tb - 1) / tb;
  for (int rb = kb * kKeys / tb; rb < rb_end; ++rb) {
    __syncthreads();  // the previous row block's MMAs (waited for) are done reading the row tiles
    auto row_ptr = [&](const bf16* x) {
      return [=](int r) -> const bf16* {
        const int tok = rb * tb + r / group;
        return tok < len ? x + ((static_cast<int64_t>(s0) + tok) * hq + g * group + r % group) * kD : nullptr;
      };
    };
    load_rows(sQ, row_ptr(q), tid);
    load_rows(sdO, row_ptr(dout), tid);
    // this thread's 16 columns (query rows of the block): pair + c + 8 j, slot c + 2 j
    int tpos[16];
    float lse2[16], dl[16];
#pragma unroll
    for (int ci = 0; ci < 16; ++ci) {
      const int col = pair + (ci % 2) + 8 * (ci / 2);
      const int tok = rb * tb + col / group;
      const bool ok = tok < len;
      const int64_t at = (static_cast<int64_t>(s0) + tok) * hq + g * group + col % group;
      tpos[ci] = ok ? tok : -1;
      lse2[ci] = ok ? lse[at] * kLog2e : 0.0f;
      dl[ci] = (kDK && ok) ? delta[at] : 0.0f;
    }
    cutlass::arch::fence_view_async_shared();
    __syncthreads();
    ss_gemm(mma_s, tK, tQ, accS);  // S^T: keys x rows
    if constexpr (kDK) ss_gemm(mma_s, tV, tdO, accP);
    // value i: key quad + 8 ((i / 2) % 2), column slot (i % 2) + 2 (i / 4)
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i / 2) % 2, ci = (i % 2) + 2 * (i / 4);
      const bool vis = kpos[h] <= tpos[ci];  // tpos -1 past the sample: never
      const float p = vis ? exp2f(accS(i) * scale_log2 - lse2[ci]) : 0.0f;
      if constexpr (kDK) {
        accS(i) = vis ? p * (accP(i) - dl[ci]) : 0.0f;
      } else {
        accS(i) = p;
      }
    }
    pack_frag(frag, accS);
    rs_gemm(mma_o, frag, tB, acc);
  }

  const float mul = kDK ? scale : 1.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (kpos[h] >= len) continue;
    bf16* o = out + ((static_cast<int64_t>(s0) + kpos[h]) * hkv + g) * kD + pair;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<uint32_t*>(o + 8 * j) = pack2(acc(4 * j + 2 * h) * mul, acc(4 * j + 2 * h + 1) * mul);
    }
  }
}

template <class Kernel>
cudaError_t set_smem(Kernel* kernel) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBwdSmem);
}

}  // namespace attn_detail

cudaError_t attn_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* dout, const float* lse,
                     const int32_t* key_base, const int32_t* n_keys, const int32_t* blocks, int64_t n_blocks,
                     const int32_t* kblocks, int64_t n_kblocks, float* delta, bf16* dq, bf16* dk, bf16* dv,
                     int64_t tokens, int hq, int hkv, int d, float scale, cudaStream_t stream) {
  using namespace attn_detail;
  if (!attn_fwd_supported(hq, hkv, d, kWgRows) || n_blocks > INT_MAX || n_kblocks > INT_MAX || hkv > 65535)
    return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  const int64_t rows = tokens * hq;
  ws1_sm90_attn_bwd_delta<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(o, dout, delta, rows);
  const float scale_log2 = scale * kLog2e;
  if (n_blocks > 0) {
    if (const cudaError_t e = set_smem(&ws1_sm90_attn_bwd_dq); e != cudaSuccess) return e;
    ws1_sm90_attn_bwd_dq<<<dim3(static_cast<unsigned>(n_blocks), static_cast<unsigned>(hkv)), 128, kBwdSmem,
                           stream>>>(q, k, v, dout, lse, delta, key_base, n_keys, blocks, dq, hq, hkv, scale_log2,
                                     scale);
  }
  if (n_kblocks > 0) {
    const dim3 grid(static_cast<unsigned>(n_kblocks), static_cast<unsigned>(hkv));
    if (const cudaError_t e = set_smem(&ws1_sm90_attn_bwd_dkv<false>); e != cudaSuccess) return e;
    if (const cudaError_t e = set_smem(&ws1_sm90_attn_bwd_dkv<true>); e != cudaSuccess) return e;
    ws1_sm90_attn_bwd_dkv<false><<<grid, 128, kBwdSmem, stream>>>(q, k, v, dout, lse, delta, kblocks, dv, hq, hkv,
                                                                  scale_log2, scale);
    ws1_sm90_attn_bwd_dkv<true><<<grid, 128, kBwdSmem, stream>>>(q, k, v, dout, lse, delta, kblocks, dk, hq, hkv,
                                                                 scale_log2, scale);
  }
  return cudaGetLastError();
}

int attn_bwd_infos(KernelInfo* out, int cap) {
  using namespace attn_detail;
  const void* fns[] = {reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_delta),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_dq),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_dkv<false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_bwd_dkv<true>)};
  const char* names[] = {"ws1_sm90_attn_bwd_delta", "ws1_sm90_attn_bwd_dq", "ws1_sm90_attn_bwd_dv",
                         "ws1_sm90_attn_bwd_dk"};
  return fill_kernel_infos(out, cap, fns, names, 4);
}

}  // namespace ws1::sm90
