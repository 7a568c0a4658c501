// What the Hopper attention's forward (attention_sm90.cu) and backward (attention_bwd_sm90.cu) share: the widths,
// the shared-memory layout of a 64 x 128 tile of rows (K-major, 128-byte swizzle, so wgmma reads it as an A or B
// operand) and its transposed view (the same bytes as an MN-major B operand), and the bf16 packing of a register
// fragment. Both files keep the same rule: keys in logical blocks from the sample's position 0 (64 keys, kKeys; the
// forward's wide schedules take 128), query rows in blocks of 64 (tokens x the group's heads) aligned to the sample's
// first token.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "ws1_sm90.h"

namespace ws1::sm90::attn_detail {

using Element = cutlass::bfloat16_t;

constexpr int kD = 128;      // head dim
constexpr int kKeys = 64;    // keys per logical key block
constexpr int kWgRows = 64;  // query rows per consumer warpgroup
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// a 64-row x 128 tile (rows: queries or keys)
using SmemQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                           cute::Shape<cute::Int<kWgRows>, cute::Int<kD>>{}));
// the same tile as a (head dim, rows) MN-major B operand
using SmemQt = decltype(cute::composition(
    SmemQ{}, cute::make_layout(cute::Shape<cute::Int<kD>, cute::Int<kWgRows>>{},
                               cute::Stride<cute::Int<kWgRows>, cute::_1>{})));

// A query group divides 64 (attn_fwd_supported), so it is a power of two: a row's token is row >> group_shift(G)
// and its head in the group row & (G - 1). A runtime division costs about 20 instructions, and the backward's tile
// copies and visibility tests take one a value.
__device__ __forceinline__ int group_shift(int group) { return 31 - __clz(group); }

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (the lower address), .y = hi
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Row r of a 64 x 128 tile in shared memory from `src(r)` (a pointer to 128 bf16, or null for zeros), 16-byte
// chunks (the 128-byte swizzle moves them whole), by the 128 threads of one warpgroup (tid 0..127).
template <class Tile, class Src>
__device__ __forceinline__ void load_rows(Tile& tile, Src src, int tid) {
  for (int c = tid; c < kWgRows * (kD / 8); c += 128) {
    const int r = c / (kD / 8), col = (c % (kD / 8)) * 8;
    const bf16* p = src(r);
    const uint4 val = p ? *reinterpret_cast<const uint4*>(p + col) : make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(&tile(r, col)) = val;
  }
}

// The same tile filled by cp.async (16-byte copies that bypass the registers; a null row zero-fills), so the next
// tile streams in while the tensor cores work on this one. `any` is a valid global address, given for the
// zero-filled copies (which read no byte of it). The copies join the thread's open cp.async group: commit it, wait
// for it (cp_async_wait), then fence_view_async_shared and a CTA barrier before wgmma reads the tile.
template <class Tile, class Src>
__device__ __forceinline__ void load_rows_async(Tile& tile, Src src, const bf16* any, int tid) {
  for (int c = tid; c < kWgRows * (kD / 8); c += 128) {
    const int r = c / (kD / 8), col = (c % (kD / 8)) * 8;
    const bf16* p = src(r);
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&tile(r, col)));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(p ? p + col : any),
                 "r"(p ? 16 : 0));
  }
}

// one fp32 from `p` (or 0 when null) into shared memory by cp.async, in the thread's open group
__device__ __forceinline__ void load_f32_async(float* dst, const float* p, const float* any) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(p ? p : any), "r"(p ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// wait until at most N of this thread's committed groups are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace ws1::sm90::attn_detail
