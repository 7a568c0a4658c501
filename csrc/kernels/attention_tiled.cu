// attention forward on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulators): causal GQA within each sample.
//
// One CTA (4 warps) takes one row block: up to 64 query rows that share their keys, i.e. consecutive tokens of one
// sample times the group's query heads of one kv head (row r = token (r / G) of the block, head g * G + r % G).
// The host builds the blocks once per layout (a block never spans two samples). The CTA walks the sample's keys in
// fixed logical blocks of 64, [0, 64), [64, 128), ... from position 0 up to the block's last key, loading each into
// shared memory; each warp then, for its 16 rows:
//   - S = Q K^T over the head dim in ascending 16-wide steps (one mma chain per score);
//   - masks every key at or past the row's own n_keys to -inf (a row sees exactly positions 0..p of its sample);
//   - takes the block's row max, then p = exp2(s - m) and the row sum in a fixed order (a thread's 16 values in
//     ascending key order, then the quad's butterfly), l = l * alpha + sum;
//   - acc = acc * alpha + bf16(P) V over the block's keys in ascending 16-wide steps.
// Every step depends only on the row's own values and the keys' logical positions: the same bits whether the row
// comes in a packed prefill, a chunked prefill or a decode step, whatever else the CTA holds. A key block past a
// row's last key (its CTA has later rows) leaves the row's state unchanged bit for bit: its scores are -inf, so
// m stays, alpha = 1 exactly, the row sum adds +0 to l, and the P V product adds exact zeros to acc.
// Output acc / l in bf16 (0 on rows with no key), lse = (m + log2 l) ln 2 in fp32 for the backward, which stays
// the one-warp-per-row kernels of attention.cu. No split of the key range, no atomics.
#include <math.h>

#include "ws1_kernels.h"

namespace ws1 {
namespace {

constexpr int kRows = 64;      // query rows per CTA (4 warps x 16)
constexpr int kKeys = 64;      // keys per logical key block
constexpr int kThreads = 128;  // 4 warps
constexpr int kPad = 8;        // shared-memory row padding (bf16): conflict-free fragment reads
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (the lower address), .y = hi
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a b: m16n8k16, a row-major 16x16 bf16 (4 regs), b column-major 16x8 bf16 (2 regs), fp32 d (4 regs)
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t lds32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Four 8x8 bf16 matrices, transposed on the way (lane l names row l % 8 of matrix l / 8): for values stored
// [key][dim], matrix i's thread fragment is the B operand's (keys 2 (lane % 4), +1 at dim lane / 4)
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int D>
struct Smem {
  bf16 k[kKeys][D + kPad];  // keys of the block, row-major [key][dim]
  bf16 v[kKeys][D + kPad];  // values of the block, row-major [key][dim]
};

// blocks: int32 [n_blocks, 3] = (first row, rows in the block, the block's key count: the largest n_keys of its rows),
// or null: one block per row
template <int D>
__global__ void __launch_bounds__(kThreads)
    ws1_attn_fwd_tiled(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                       const int32_t* __restrict__ key_base, const int32_t* __restrict__ n_keys,
                       const int32_t* __restrict__ blocks, bf16* __restrict__ o, float* __restrict__ lse, int hq,
                       int hkv, float scale_log2) {
  static_assert(D % 16 == 0 && D <= 128, "head dim: a multiple of 16, at most 128");
  constexpr int kSteps = D / 16;  // 16-wide steps over the head dim
  constexpr int kDimTiles = D / 8;
  __shared__ __align__(16) Smem<D> sm;

  const int g = blockIdx.y;
  const int group = hq / hkv;
  // no table: one block per row (the step path's decode and its pads), its key count the row's own
  const int t0 = blocks ? blocks[3 * blockIdx.x] : static_cast<int>(blockIdx.x);
  const int tokens = blocks ? blocks[3 * blockIdx.x + 1] : 1;
  const int key_count = blocks ? blocks[3 * blockIdx.x + 2] : n_keys[t0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad = lane / 4, pair = (lane % 4) * 2;

  // this thread's two rows: r_lo = warp * 16 + quad and r_hi = r_lo + 8
  int row_t[2], row_h[2], row_n[2];
  bool row_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + quad + 8 * i;
    row_ok[i] = r / group < tokens;
    row_t[i] = t0 + r / group;
    row_h[i] = g * group + r % group;
    row_n[i] = row_ok[i] ? n_keys[row_t[i]] : 0;
  }

  // Q as A fragments, loaded once: step s holds columns [16 s, 16 s + 16)
  uint32_t qa[kSteps][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (row_ok[i]) {
        const bf16* qr = q + (static_cast<int64_t>(row_t[i]) * hq + row_h[i]) * D + 16 * s + pair;
        qa[s][i] = lds32(qr);
        qa[s][i + 2] = lds32(qr + 8);
      } else {
        qa[s][i] = qa[s][i + 2] = 0u;
      }
    }
  }

  float acc[kDimTiles][4];
#pragma unroll
  for (int j = 0; j < kDimTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int64_t base = tokens > 0 ? key_base[t0] : 0;

  for (int kb = 0; kb < key_count; kb += kKeys) {
    __syncthreads();  // the previous block's reads are done
    constexpr int kChunks = D / 8;  // 16-byte chunks per key row
    for (int c = threadIdx.x; c < kKeys * kChunks; c += kThreads) {
      const int j = c / kChunks, col = (c % kChunks) * 8;
      uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
      if (kb + j < key_count) {
        const int64_t off = ((base + kb + j) * hkv + g) * D + col;
        kv = *reinterpret_cast<const uint4*>(k + off);
        vv = *reinterpret_cast<const uint4*>(v + off);
      }
      *reinterpret_cast<uint4*>(&sm.k[j][col]) = kv;
      *reinterpret_cast<uint4*>(&sm.v[j][col]) = vv;
    }
    __syncthreads();

    // scores of the block: 8 key tiles of 8, each one chain over the head dim
    float s[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const bf16* kr = &sm.k[nt * 8 + quad][16 * st + pair];
        mma16816(s[nt], qa[st], lds32(kr), lds32(kr + 8));
      }
    }
    // mask, then the row max (exact in any order)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2;
        const int key = kb + nt * 8 + pair + (e % 2);
        s[nt][e] = key < row_n[i] ? s[nt][e] * scale_log2 : -INFINITY;
        mx[i] = fmaxf(mx[i], s[nt][e]);
      }
    }
    float alpha[2], rs[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: every p is exp2(-inf) = 0
      alpha[i] = m_new == m[i] ? 1.0f : exp2f(m[i] - m_use);  // exactly 1 when the max stays
      m[i] = m_new;
      rs[i] = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        s[nt][2 * i] = exp2f(s[nt][2 * i] - m_use);
        s[nt][2 * i + 1] = exp2f(s[nt][2 * i + 1] - m_use);
        rs[i] += s[nt][2 * i];
        rs[i] += s[nt][2 * i + 1];
      }
      rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 1);
      rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 2);
      l[i] = l[i] * alpha[i] + rs[i];
    }
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) {
      acc[j][0] *= alpha[0];
      acc[j][1] *= alpha[0];
      acc[j][2] *= alpha[1];
      acc[j][3] *= alpha[1];
    }
    // acc += bf16(P) V, 16 keys per step in ascending order; P's accumulator layout is the A fragment's
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      const uint32_t pa[4] = {pack2(s[2 * ks][0], s[2 * ks][1]), pack2(s[2 * ks][2], s[2 * ks][3]),
                              pack2(s[2 * ks + 1][0], s[2 * ks + 1][1]), pack2(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int j = 0; j < kDimTiles; j += 2) {  // two dim tiles per ldmatrix: keys 0-7, 8-15 at j, then at j + 1
        uint32_t b[4];
        ldsm_x4_trans(b, &sm.v[16 * ks + (lane / 8 % 2) * 8 + lane % 8][(j + lane / 16) * 8]);
        mma16816(acc[j], pa, b[0], b[1]);
        mma16816(acc[j + 1], pa, b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!row_ok[i]) continue;
    const bool any = row_n[i] > 0;
    const float inv = any ? 1.0f / l[i] : 0.0f;
    bf16* orow = o + (static_cast<int64_t>(row_t[i]) * hq + row_h[i]) * D + pair;
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) {
      const uint32_t w = pack2(acc[j][2 * i] * inv, acc[j][2 * i + 1] * inv);
      *reinterpret_cast<uint32_t*>(orow + 8 * j) = w;
    }
    if (lane % 4 == 0) lse[static_cast<int64_t>(row_t[i]) * hq + row_h[i]] = any ? (m[i] + log2f(l[i])) * kLn2 : 0.0f;
  }
}

}  // namespace

bool attn_fwd_tiled_supported(int hq, int hkv, int d) {
  return hkv > 0 && hq % hkv == 0 && kRows % (hq / hkv) == 0 && d == 128;
}

cudaError_t attn_fwd_tiled(const bf16* q, const bf16* k, const bf16* v, const int32_t* key_base,
                           const int32_t* n_keys, const int32_t* blocks, int n_blocks, bf16* o, float* lse, int hq,
                           int hkv, int d, float scale, cudaStream_t stream) {
  if (n_blocks == 0) return cudaSuccess;
  if (!attn_fwd_tiled_supported(hq, hkv, d)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n_blocks), static_cast<unsigned>(hkv));
  ws1_attn_fwd_tiled<128><<<grid, kThreads, 0, stream>>>(q, k, v, key_base, n_keys, blocks, o, lse, hq, hkv,
                                                          scale * kLog2e);
  return cudaGetLastError();
}

int attention_tiled_kernel_infos(KernelInfo* out, int cap) {
  const void* fns[] = {reinterpret_cast<const void*>(ws1_attn_fwd_tiled<128>)};
  const char* names[] = {"ws1_attn_fwd_tiled"};
  return fill_kernel_infos(out, cap, fns, names, 1);
}

}  // namespace ws1
