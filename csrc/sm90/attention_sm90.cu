// Causal GQA attention forward on Hopper (profile cuda_bf16_sm90): TMA + wgmma, bf16 in, fp32 accumulators.
//
// The rule is the generic tiled kernel's (../kernels/attention_tiled.cu), so prefill, chunked prefill and decode
// give a row the same bits:
//   - a CTA takes one row block: consecutive tokens of one sample times the group's query heads of one kv head
//     (row r = token r / G of the block, head g G + r % G), so its rows share their keys; the host builds the
//     blocks once per layout, or passes none and the CTA takes one token (the step path);
//   - the keys are walked in fixed logical blocks of 64 (128 in the wide schedules, whose bits are therefore their
//     own) from position 0 up to the block's last key;
//   - per row: S = Q K^T over the head dim in ascending 16-wide wgmma k-steps, keys at or past the row's own
//     n_keys masked to -inf by a select, the row max and the row sum of p = exp2(s - m) in a fixed order (a
//     thread's 16 values in ascending key order, then the quad's butterfly), l = l alpha + sum, and
//     O = O alpha + bf16(P) V in ascending 16-key k-steps.
//   A key block past a row's last key leaves the row's state unchanged bit for bit (scores -inf: m stays, alpha = 1
//   exactly, the sum adds +0, P V adds exact zeros), so a row's bits do not depend on the block it lands in.
//
// How it is laid out on the machine:
//   - one producer warp (a warpgroup in the wide schedules) streams each key block's K and V (a 64 x 128 box each,
//     128 x 128 wide) by TMA into a ring of kStages slots, one full and one empty mbarrier a slot;
//   - W consumer warpgroups take 64 query rows each (W = 2: 128-row blocks, so each key block TMA writes to shared
//     memory feeds twice the MMA work, 128 flops a byte, and L2 is not the limit);
//   - S is wgmma m64n64k16 with Q and K from shared memory (K-major, 128-byte swizzle); P V is m64n128k16 with P
//     from registers (an m64n64 accumulator's registers are, in order, the A fragments of its four 16-key k-steps)
//     and V read MN-major from the same slot that TMA wrote.
//   - TMA reads whole boxes, so the last block can hold another sample's keys, a cache's stale slots, or zero fill
//     past the tensor. Their scores are masked by the select; their values are zeroed in shared memory (behind a
//     proxy fence and a barrier of the consumers) before P V, so 0 x inf or 0 x NaN never reaches a real row.
// No split of the key range, no atomics: one writer per output element.
#include <climits>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "attention_sm90.cuh"
#include "kernel_attrs.cuh"
#include "ws1_sm90.h"

namespace ws1::sm90 {
namespace attn_detail {

using namespace cute;

// kN: keys a logical key block (64, the generic kernel's, or 128: the wide schedules)
template <int kStages, int kN>
using SmemKV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                      Shape<Int<kN>, Int<kD>, Int<kStages>>{}));
// V as P V's B operand (N = head dim, K = keys): the same bytes, seen transposed (MN-major)
template <int kStages, int kN>
using SmemVt = decltype(composition(SmemKV<kStages, kN>{}, make_layout(Shape<Int<kD>, Int<kN>, Int<kStages>>{},
                                                                       Stride<Int<kN>, _1, Int<kN * kD>>{})));

// S = Q K^T with Q from shared memory, or from registers (kQRegs: the warpgroup reads only K from shared memory a
// k-step, half the bytes: with m64n64 tiles the SS form asks about as many bytes a cycle as shared memory serves)
// (kN = 128: m64n128, Q and K from shared memory)
template <bool kQRegs, int kN>
using MmaS = std::conditional_t<
    kN == 128, decltype(make_tiled_mma(SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{})),
    std::conditional_t<
        kQRegs, decltype(make_tiled_mma(SM90_64x64x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::K>{})),
        decltype(make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}))>>;
using MmaO = decltype(make_tiled_mma(SM90_64x128x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>{}));

// The key (or value) tensor as TMA sees it: (key row, head dim, kv head)
inline auto kv_tensor(const bf16* p, int rows, int hkv) {
  return make_tensor(make_gmem_ptr(reinterpret_cast<const Element*>(p)), make_shape(rows, Int<kD>{}, hkv),
                     make_stride(hkv * kD, _1{}, kD));
}

template <int kStages, int kN>
auto kv_tma(const bf16* p, int rows, int hkv) {
  return make_tma_atom(SM90_TMA_LOAD{}, kv_tensor(p, rows, hkv), SmemKV<kStages, kN>{}(_, _, 0),
                       Shape<Int<kN>, Int<kD>>{});
}

// kN = 128 (the wide schedules): S is 64 registers a thread, and S, O and P with the overlap need about 200, more
// than 288 threads can hold (the 9 warps put 3 on one of the SM's four 16384-register sub-partitions). So, as FA3
// does, the producer is a whole warpgroup that gives its registers back (setmaxnreg: 24 a thread) and the consumers
// take them (240): 3 warps a sub-partition at launch (168 each), then 24 + 2 x 240 = 504 per thread triple.
template <int W, int kStagesT, bool kQRegs, int kN>
struct Cfg {
  static constexpr int kStages = kStagesT;
  static constexpr bool kWide = kN == 128;
  static constexpr int kConsumerThreads = 128 * W;
  // and the producer, the last: one warp, or a warpgroup for the wide schedules' register hand-over
  static constexpr int kThreads = kConsumerThreads + (kWide ? 128 : 32);
  using Tma = decltype(kv_tma<kStages, kN>(nullptr, 0, 0));
  struct SharedStorage {
    alignas(1024) ArrayEngine<Element, kQRegs ? 64 : cosize_v<SmemQ> * W> q;  // unused with Q in registers
    alignas(1024) ArrayEngine<Element, cosize_v<SmemKV<kStages, kN>>> k;
    alignas(1024) ArrayEngine<Element, cosize_v<SmemKV<kStages, kN>>> v;
    alignas(8) uint64_t full[kStages];   // the slot's K and V landed
    alignas(8) uint64_t empty[kStages];  // every consumer thread is done with the slot
  };
};

using Full = cutlass::arch::ClusterTransactionBarrier;
using Empty = cutlass::arch::ClusterBarrier;


// blocks: int32 [n_blocks, 3] = (first row, tokens in the block, the block's key count: the largest n_keys of its
// rows), or null: one token a CTA, its key count its own
// Registers are capped by __maxnreg__, not launch bounds: bounds of 288 threads left the Q-in-registers kernel 168
// registers, and its wgmma serialised and spilled; 208 x 288 threads still fit the register file.
// kLoop: 0 the plain loop, 1 the overlapped loop, 2 the overlapped loop with the two warpgroups taking turns to
// issue their MMAs (ping-pong: one's softmax runs under the other's GEMMs; W = 2 only). kN: keys a key block.
template <int W, int kStages, int kLoop, bool kQRegs, int kN = kKeys>
__global__ void __maxnreg__(kQRegs ? 208 : 168)
    ws1_sm90_attn_fwd(CUTLASS_GRID_CONSTANT typename Cfg<W, kStages, kQRegs, kN>::Tma const tma_k,
                      CUTLASS_GRID_CONSTANT typename Cfg<W, kStages, kQRegs, kN>::Tma const tma_v, const bf16* __restrict__ q,
                      const int32_t* __restrict__ key_base, const int32_t* __restrict__ n_keys,
                      const int32_t* __restrict__ blocks, bf16* __restrict__ o, float* __restrict__ lse, int kv_rows,
                      int hq, int hkv, float scale_log2) {
  using C = Cfg<W, kStages, kQRegs, kN>;
  static_assert(!C::kWide || !kQRegs, "the wide schedules keep Q in shared memory");
  constexpr bool kOverlap = kLoop >= 1;
  constexpr bool kPingPong = kLoop == 2;
  static_assert(!kPingPong || W == 2, "ping-pong needs two consumer warpgroups");
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename C::SharedStorage*>(smem_raw);
  Tensor sK = make_tensor(make_smem_ptr(smem.k.begin()), SmemKV<kStages, kN>{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.begin()), SmemKV<kStages, kN>{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.begin()), SmemVt<kStages, kN>{});

  const int g = static_cast<int>(blockIdx.y);
  const int group = hq / hkv;
  const int t0 = blocks ? blocks[3 * blockIdx.x] : static_cast<int>(blockIdx.x);
  const int tokens = blocks ? blocks[3 * blockIdx.x + 1] : 1;
  const int key_count = blocks ? blocks[3 * blockIdx.x + 2] : n_keys[t0];
  const int n_kb = (key_count + kN - 1) / kN;
  const int base = tokens > 0 ? key_base[t0] : 0;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      Full::init(&smem.full[s], 1);
      Empty::init(&smem.empty[s], C::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // The producer warp: one lane walks the key blocks into the ring, kStages - 1 ahead of the consumers.
  if (threadIdx.x >= C::kConsumerThreads) {
    if constexpr (C::kWide) cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == C::kConsumerThreads) {
      // (key rows of this kv head from the sample's position 0, head dim) cut into 64-key blocks
      auto keys_of = [&](auto const& tma) {
        Tensor m = domain_offset(make_coord(base, 0), tma.get_tma_tensor(make_shape(kv_rows, Int<kD>{}, hkv))(_, _, g));
        return local_tile(m, Shape<Int<kN>, Int<kD>>{}, make_coord(_, 0));
      };
      Tensor gK = keys_of(tma_k);
      Tensor gV = keys_of(tma_v);
      auto tK = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto tV = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      constexpr uint32_t kBytes = 2 * kN * kD * sizeof(Element);
      for (int kb = 0; kb < n_kb; ++kb) {
        const int slot = kb % kStages;
        if (kb >= kStages) Empty::wait(&smem.empty[slot], (kb / kStages - 1) & 1);
        Full::arrive_and_expect_tx(&smem.full[slot], kBytes);
        copy(tma_k.with(smem.full[slot]), get<0>(tK)(_, kb), get<1>(tK)(_, slot));
        copy(tma_v.with(smem.full[slot]), get<0>(tV)(_, kb), get<1>(tV)(_, slot));
      }
    }
    return;
  }

  if constexpr (C::kWide) cutlass::arch::warpgroup_reg_alloc<240>();
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int lane = tid % 32, quad = lane / 4, pair = (lane % 4) * 2;
  // this thread's two rows: warp (tid / 32) * 16 + quad, and 8 below
  int row_t[2], row_h[2], row_n[2];
  bool row_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = wg * kWgRows + (tid / 32) * 16 + quad + 8 * i;
    row_ok[i] = row / group < tokens;
    row_t[i] = t0 + row / group;
    row_h[i] = g * group + row % group;
    row_n[i] = row_ok[i] ? n_keys[row_t[i]] : 0;
  }

  MmaS<kQRegs, kN> mma_s;
  auto thr_s = mma_s.get_thread_slice(tid);
  // Q as S's A operand, loaded once (zeros past the block's tokens)
  auto load_q = [&]() {
    if constexpr (kQRegs) {
      // the register fragment of k-step s (head dims [16 s, 16 s + 16)): values (c, h, kk) at row quad + 8 h, dim
      // pair + c + 8 kk, in that order (CuTe's ALayout_64x16), i.e. 32-bit word h + 2 kk + 4 s of the fragment
      Tensor r = make_tensor<Element>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kD / 16>>, Stride<Stride<_1, _2, _4>, _0, _8>>{});
      uint32_t* r32 = reinterpret_cast<uint32_t*>(raw_pointer_cast(r.data()));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bf16* qr = q + (static_cast<int64_t>(row_t[h]) * hq + row_h[h]) * kD + pair;
#pragma unroll
        for (int st = 0; st < kD / 16; ++st) {
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            r32[h + 2 * kk + 4 * st] = row_ok[h] ? *reinterpret_cast<const uint32_t*>(qr + 16 * st + 8 * kk) : 0u;
          }
        }
      }
      return r;
    } else {
      Tensor sQ = make_tensor(make_smem_ptr(smem.q.begin() + wg * cosize_v<SmemQ>), SmemQ{});
      // this warpgroup's 64 rows of Q into shared memory: 16-byte chunks, which the 128-byte swizzle moves whole
      for (int c = tid; c < kWgRows * (kD / 8); c += 128) {
        const int r = c / (kD / 8), col = (c % (kD / 8)) * 8;
        const int row = wg * kWgRows + r;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row / group < tokens) {
          const int64_t t = t0 + row / group;
          val = *reinterpret_cast<const uint4*>(q + (t * hq + g * group + row % group) * kD + col);
        }
        *reinterpret_cast<uint4*>(&sQ(r, col)) = val;
      }
      cutlass::arch::fence_view_async_shared();  // the generic-proxy writes, seen by wgmma's async proxy
      // barrier ids are immediates: an id in a register makes ptxas reserve all 16
      if (wg == 0) {
        cutlass::arch::NamedBarrier::sync(128, 1);
      } else {
        cutlass::arch::NamedBarrier::sync(128, 2);
      }
      return thr_s.make_fragment_A(thr_s.partition_A(sQ));  // (MMA, 1, 8): descriptors
    }
  };
  Tensor tSrQ = load_q();

  MmaO mma_o;
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK));  // (MMA, 1, 8, stage)
  Tensor tOrV = thr_o.make_fragment_B(thr_o.partition_B(sVt));  // (MMA, 1, kN / 16, stage)
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kWgRows>, Int<kN>>{});  // kN / 2 values
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<kWgRows>, Int<kD>>{});  // 64 values
  // P in bf16 as P V's A operand: k-step s is the accumulator's values [8 s, 8 s + 8), in order
  Tensor tOrP = make_tensor<Element>(
      Layout<Shape<Shape<_2, _2, _2>, _1, Int<kN / 16>>, Stride<Stride<_1, _2, _4>, _0, _8>>{});
  constexpr int kS = kN / 2;  // S values a thread
  static_assert(size(tSrS) == kS && size(tOrO) == 64, "the accumulator layouts this kernel indexes by hand");
  clear(tOrO);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int tail = key_count % kN;  // keys of the last block; 0: it is full

  // S = Q K^T of the block in `slot`, one chain over the head dim per score (issued, not waited for)
  auto issue_s = [&](int slot) {
    if constexpr (kQRegs) warpgroup_fence_operand(tSrQ);
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    mma_s.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
    for (int ks = 0; ks < size<2>(tSrQ); ++ks) {
      gemm(mma_s, tSrQ(_, _, ks), tSrK(_, _, ks, slot), tSrS);
      mma_s.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  // O += P V of the block in `slot`, 16 keys a k-step in ascending order (issued, not waited for)
  auto issue_pv = [&](int slot) {
    warpgroup_fence_operand(tOrP);
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
#pragma unroll
    for (int ks = 0; ks < size<2>(tOrP); ++ks) gemm(mma_o, tOrP(_, _, ks), tOrV(_, _, ks, slot), tOrO);
    warpgroup_commit_batch();
  };
  // the last block's rows past the key count: zero their values before any P V reads them (every consumer thread
  // takes a share; both warpgroups read the slot, so all of them meet at the barrier)
  auto zero_tail = [&](int kb, int slot) {
    if (tail == 0 || kb != n_kb - 1) return;
    for (int c = threadIdx.x; c < (kN - tail) * (kD / 8); c += C::kConsumerThreads) {
      const int j = tail + c / (kD / 8), col = (c % (kD / 8)) * 8;
      *reinterpret_cast<uint4*>(&sV(j, col, slot)) = make_uint4(0u, 0u, 0u, 0u);
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(C::kConsumerThreads, 3);
  };
  // the block's softmax on the finished S, in place (S becomes p); the running (m, l) updated; alpha out
  auto softmax = [&](int kb, float (&alpha)[2]) {
    // value i of the accumulator: row quad + 8 ((i / 2) % 2), key pair + (i % 2) + 8 (i / 4)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int h = (i / 2) % 2;
      const int key = kb * kN + pair + (i % 2) + 8 * (i / 4);
      tSrS(i) = key < row_n[h] ? tSrS(i) * scale_log2 : -INFINITY;
      mx[h] = fmaxf(mx[h], tSrS(i));
    }
    float rs[2] = {0.0f, 0.0f}, m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      m_use[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: every p is exp2(-inf) = 0
      alpha[h] = m_new == m[h] ? 1.0f : exp2f(m[h] - m_use[h]);  // exactly 1 when the max stays
      m[h] = m_new;
    }
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int h = (i / 2) % 2;
      tSrS(i) = exp2f(tSrS(i) - m_use[h]);
      rs[h] += tSrS(i);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rs[h] += __shfl_xor_sync(0xffffffffu, rs[h], 1);
      rs[h] += __shfl_xor_sync(0xffffffffu, rs[h], 2);
      l[h] = l[h] * alpha[h] + rs[h];
    }
  };
  // O *= alpha (after every earlier P V finished), then P = bf16(p) for this block's P V
  auto rescale_and_pack = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) tOrO(i) *= alpha[(i / 2) % 2];
    uint32_t* p32 = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
#pragma unroll
    for (int i = 0; i < kS / 2; ++i) p32[i] = pack2(tSrS(2 * i), tSrS(2 * i + 1));
  };

  // Both schedules do, per row and block, the same operations in the same order: S, the softmax, O *= alpha,
  // O += P V. The overlapped one issues block kb's S and block kb - 1's P V together and runs kb's softmax while
  // that P V runs; the rescale waits for it. So they give the same bits (a GPU test compares them).
  // Ping-pong turns (named barriers 4 and 5, 256 threads: one warpgroup's arrivals and the other's sync): a
  // warpgroup waits for its turn before each MMA issue and hands the turn over after it. Each issues n_kb + 1
  // times; warpgroup 0 hands over after every issue, warpgroup 1 once before its first and after every issue but
  // its last, so both barriers see as many arrivals as syncs and none is left pending. The turns order issues
  // only: each warpgroup's operations on its rows, and so the bits, are those of the overlapped loop.
  int issues_left = n_kb + 1;
  auto take_turn = [&]() {
    if constexpr (kPingPong) {
      if (wg == 0) {
        cutlass::arch::NamedBarrier::sync(256, 4);
      } else {
        cutlass::arch::NamedBarrier::sync(256, 5);
      }
    }
  };
  auto pass_turn = [&]() {
    if constexpr (kPingPong) {
      --issues_left;
      if (wg == 0) {
        cutlass::arch::NamedBarrier::arrive(256, 5);
      } else if (issues_left > 0) {
        cutlass::arch::NamedBarrier::arrive(256, 4);
      }
    }
  };
  if constexpr (kPingPong) {
    if (wg == 1 && n_kb > 0) cutlass::arch::NamedBarrier::arrive(256, 4);  // warpgroup 0 goes first
  }

  if constexpr (kOverlap) {
    if (n_kb > 0) {
      Full::wait(&smem.full[0], 0);
      zero_tail(0, 0);
      take_turn();
      issue_s(0);
      pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      float alpha[2];
      softmax(0, alpha);
      rescale_and_pack(alpha);
    }
    for (int kb = 1; kb < n_kb; ++kb) {
      const int slot = kb % kStages, prev = (kb - 1) % kStages;
      Full::wait(&smem.full[slot], (kb / kStages) & 1);
      zero_tail(kb, slot);
      take_turn();
      issue_s(slot);
      issue_pv(prev);
      pass_turn();
      warpgroup_wait<1>();  // S done; the previous block's P V may still run
      warpgroup_fence_operand(tSrS);
      float alpha[2];
      softmax(kb, alpha);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      Empty::arrive(&smem.empty[prev]);
      rescale_and_pack(alpha);
    }
    if (n_kb > 0) {
      const int last = (n_kb - 1) % kStages;
      take_turn();
      issue_pv(last);
      pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      Empty::arrive(&smem.empty[last]);
    }
  } else {
    for (int kb = 0; kb < n_kb; ++kb) {
      const int slot = kb % kStages;
      Full::wait(&smem.full[slot], (kb / kStages) & 1);
      issue_s(slot);
      zero_tail(kb, slot);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      float alpha[2];
      softmax(kb, alpha);
      rescale_and_pack(alpha);
      issue_pv(slot);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      Empty::arrive(&smem.empty[slot]);
    }
  }

  // O / l in bf16 (0 on rows with no key), lse = (m + log2 l) ln 2 for the backward
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!row_ok[h]) continue;
    const bool any = row_n[h] > 0;
    const float inv = any ? 1.0f / l[h] : 0.0f;
    bf16* orow = o + (static_cast<int64_t>(row_t[h]) * hq + row_h[h]) * kD + pair;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<uint32_t*>(orow + 8 * j) = pack2(tOrO(4 * j + 2 * h) * inv, tOrO(4 * j + 2 * h + 1) * inv);
    }
    if (lane % 4 == 0) {
      lse[static_cast<int64_t>(row_t[h]) * hq + row_h[h]] = any ? (m[h] + log2f(l[h])) * kLn2 : 0.0f;
    }
  }
}

template <int W, int kStages, int kLoop, bool kQRegs, int kN = kKeys>
cudaError_t launch(const bf16* q, const bf16* k, const bf16* v, const int32_t* key_base, const int32_t* n_keys,
                   const int32_t* blocks, int n_blocks, int kv_rows, bf16* o, float* lse, int hq, int hkv,
                   float scale, int device, cudaStream_t stream) {
  using C = Cfg<W, kStages, kQRegs, kN>;
  const typename C::Tma tk = kv_tma<kStages, kN>(k, kv_rows, hkv);
  const typename C::Tma tv = kv_tma<kStages, kN>(v, kv_rows, hkv);
  auto* kernel = &ws1_sm90_attn_fwd<W, kStages, kLoop, kQRegs, kN>;
  constexpr int kSmem = static_cast<int>(sizeof(typename C::SharedStorage));
  // once per device (kernel_attrs.cuh); the most shared memory per SM, so that two one-warpgroup CTAs fit (ncu saw
  // one CTA an SM, limited by shared memory too, without it)
  if (const cudaError_t e = configure_smem_once<&ws1_sm90_attn_fwd<W, kStages, kLoop, kQRegs, kN>>(kSmem, true, device);
      e != cudaSuccess)
    return e;
  const dim3 grid(static_cast<unsigned>(n_blocks), static_cast<unsigned>(hkv));
  kernel<<<grid, C::kThreads, kSmem, stream>>>(tk, tv, q, key_base, n_keys, blocks, o, lse, kv_rows, hq, hkv,
                                               scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace attn_detail

bool attn_fwd_supported(int hq, int hkv, int d, int block_rows) {
  return d == attn_detail::kD && hkv > 0 && hq % hkv == 0 && (block_rows == 64 || block_rows == 128) &&
         block_rows % (hq / hkv) == 0;
}

// Schedule 3 keeps Q in registers: about 200 registers a thread. A CTA's warps are dealt to the SM's four
// sub-partitions, each with 16384 registers: the 9 warps of a two-warpgroup CTA put 3 on one (3 x 32 x 200 > 16384),
// so that launch fails ("too many resources requested", seen on an H100); one warpgroup (5 warps) fits.
// Schedules 4 and 6 (ping-pong) take turns between two warpgroups, so they need 128-row blocks.
bool attn_fwd_schedule_ok(int block_rows, int schedule) {
  return schedule >= 0 && schedule < kSchedules && !(schedule == 3 && block_rows == 128) &&
         !((schedule == 4 || schedule == 6) && block_rows == 64);
}

cudaError_t attn_fwd(const bf16* q, const bf16* k, const bf16* v, const int32_t* key_base, const int32_t* n_keys,
                     const int32_t* blocks, int64_t n_blocks, int64_t kv_rows, bf16* o, float* lse, int hq, int hkv,
                     int d, int block_rows, float scale, int schedule, int device, cudaStream_t stream) {
  using namespace attn_detail;
  if (n_blocks == 0) return cudaSuccess;
  if (!attn_fwd_supported(hq, hkv, d, block_rows) || !attn_fwd_schedule_ok(block_rows, schedule) || n_blocks > INT_MAX || kv_rows < 1 || kv_rows > INT_MAX ||
      hkv > 65535)
    return cudaErrorInvalidValue;
  // make_tma_atom encodes its descriptors through the driver API: the thread's context must be current
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return e;
  const int nb = static_cast<int>(n_blocks), kr = static_cast<int>(kv_rows);
#define WS1_ATTN_LAUNCH(W, S, O, R) \
  launch<W, S, O, R>(q, k, v, key_base, n_keys, blocks, nb, kr, o, lse, hq, hkv, scale, device, stream)
#define WS1_ATTN_WIDE(W, O) \
  launch<W, 2, O, false, 128>(q, k, v, key_base, n_keys, blocks, nb, kr, o, lse, hq, hkv, scale, device, stream)
  switch (schedule * 2 + (block_rows == 128 ? 1 : 0)) {
    case 0: return WS1_ATTN_LAUNCH(1, 2, 0, false);
    case 1: return WS1_ATTN_LAUNCH(2, 2, 0, false);
    case 2: return WS1_ATTN_LAUNCH(1, 2, 1, false);
    case 3: return WS1_ATTN_LAUNCH(2, 2, 1, false);
    case 4: return WS1_ATTN_LAUNCH(1, 3, 1, false);
    case 5: return WS1_ATTN_LAUNCH(2, 3, 1, false);
    case 6: return WS1_ATTN_LAUNCH(1, 2, 1, true);
    // no case 7: two warpgroups with Q in registers (about 200 registers a thread) do not fit; no case 8: ping-pong
    // needs two warpgroups (attn_fwd_schedule_ok)
    case 9: return WS1_ATTN_LAUNCH(2, 2, 2, false);
    // the wide schedules: 128-key blocks (other bits than 0-4's), a producer warpgroup, setmaxnreg
    case 10: return WS1_ATTN_WIDE(1, 1);
    case 11: return WS1_ATTN_WIDE(2, 1);
    case 13: return WS1_ATTN_WIDE(2, 2);
    default: return cudaErrorInvalidValue;
  }
#undef WS1_ATTN_LAUNCH
#undef WS1_ATTN_WIDE
}

int attn_fwd_infos(KernelInfo* out, int cap) {
  using namespace attn_detail;
  const void* fns[] = {reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<1, 2, 0, false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<2, 2, 0, false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<1, 2, 1, false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<2, 2, 1, false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<1, 3, 1, false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<2, 3, 1, false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<1, 2, 1, true>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<2, 2, 2, false>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<1, 2, 1, false, 128>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<2, 2, 1, false, 128>),
                       reinterpret_cast<const void*>(&ws1_sm90_attn_fwd<2, 2, 2, false, 128>)};
  const char* names[] = {"ws1_sm90_attn_fwd_64",          "ws1_sm90_attn_fwd_128",
                         "ws1_sm90_attn_fwd_64_overlap",  "ws1_sm90_attn_fwd_128_overlap",
                         "ws1_sm90_attn_fwd_64_overlap3", "ws1_sm90_attn_fwd_128_overlap3",
                         "ws1_sm90_attn_fwd_64_qregs",    "ws1_sm90_attn_fwd_128_pingpong",
                         "ws1_sm90_attn_fwd_64_wide",     "ws1_sm90_attn_fwd_128_wide",
                         "ws1_sm90_attn_fwd_128_wide_pingpong"};
  return fill_kernel_infos(out, cap, fns, names, 11);
}

}  // namespace ws1::sm90
