// What the Hopper attention's forward (attention_sm90.cu) and backward (attention_bwd_sm90.cu) share: the widths,
// the shared-memory layout of a 64 x 128 tile of rows (K-major, 128-byte swizzle, so wgmma reads it as an A or B
// operand) and its transposed view (the same bytes as an MN-major B operand), and the bf16 packing of a register
// fragment. Both files keep the same rule: keys in logical blocks of 64 from the sample's position 0, query rows
// in blocks of 64 (tokens x the group's heads) aligned to the sample's first token.
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

}  // namespace ws1::sm90::attn_detail
