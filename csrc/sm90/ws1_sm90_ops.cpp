// The Hopper extension's binding (ws1_cuda_sm90_ext): registers torch.ops.ws1_sm90.* with a CUDA and a Meta
// implementation. Built only for sm_90a by csrc/setup.py when the arch list names 9.0a; the generic kernels
// (torch.ops.ws1.*, ws1_cuda_ext) that the cuda_bf16_sm90 profile reuses are the other extension's.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../binding.h"
#include "ws1_sm90.h"

namespace {

using at::Tensor;
using ws1::binding::bf;
using ws1::binding::bf_mut;
using ws1::binding::check_bf16;
using ws1::binding::check_launch;

// What both GEMM ops check and how they pad a short call: c = a b^T (b_trans: b [N, K]) or a b (b [K, N]).
// Fewer than kPadRows rows run on A zero-padded to kPadRows, and the op keeps the first m rows of C. Rows are
// independent (row i of C reads row i of A only), so the kept rows have the bits of the unpadded product; with a
// short A every tile's TMA reads the same few rows and the kernel ran at 0.4-0.8x cuBLAS (padded: 0.85-1.05x).
struct GemmCall {
  int64_t m, r, nc;
  Tensor a_run;  // a, or a zero-padded to kPadRows rows
};

// TMA descriptors need a 16-byte aligned global address: CUTLASS only prints a failed encode and launches anyway
void check_address(const char* op, const char* name, const Tensor& t) {
  const auto off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16);
  TORCH_CHECK(off == 0, "ws1_", op, ": ", name, " starts ", off,
              " bytes past a 16-byte boundary (a view at an odd offset); TMA reads from a 16-byte boundary");
}

GemmCall gemm_call(const char* op, const Tensor& a, const Tensor& b, bool b_trans) {
  check_bf16(op, "a", a);
  check_bf16(op, "b", b);
  check_address(op, "a", a);
  check_address(op, "b", b);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "ws1_", op, ": a and b must be 2-D");
  const int64_t r = a.size(1);
  const int64_t nc = b_trans ? b.size(0) : b.size(1);
  TORCH_CHECK((b_trans ? b.size(1) : b.size(0)) == r, "ws1_", op, ": inner sizes differ: a ", a.sizes(), ", b ",
              b.sizes(), b_trans ? " (b transposed)" : "");
  TORCH_CHECK(r % ws1::sm90::kGemmAlign == 0 && nc % ws1::sm90::kGemmAlign == 0, "ws1_", op, ": the reduced (", r,
              ") and output (", nc, ") widths must be multiples of ", ws1::sm90::kGemmAlign, " (16-byte TMA rows)");
  const int64_t m = a.size(0);
  const bool pad = m > 0 && m < ws1::sm90::kPadRows;
  return {m, r, nc, pad ? at::constant_pad_nd(a, {0, 0, 0, ws1::sm90::kPadRows - m}, 0) : a};
}

// the caller's rows of a padded call's output (the first rows of a row-major tensor: contiguous as they are)
Tensor unpad(const GemmCall& g, const Tensor& c) { return g.a_run.size(0) == g.m ? c : c.narrow(0, 0, g.m); }

// bf16 out; the M bucket picks the tile (ws1_sm90.h)
Tensor gemm(const Tensor& a, const Tensor& b, bool b_trans) {
  const GemmCall g = gemm_call("sm90.gemm", a, b, b_trans);
  const c10::cuda::CUDAGuard guard(a.device());
  if (g.m == 0) return at::empty({0, g.nc}, a.options());
  if (g.r == 0) return at::zeros({g.m, g.nc}, a.options());
  Tensor c = at::empty({g.a_run.size(0), g.nc}, a.options());
  const auto* props = at::cuda::getCurrentDeviceProperties();  // cached by torch: no query per call
  check_launch("sm90.gemm", ws1::sm90::gemm(bf(g.a_run), bf(b), bf_mut(c), g.a_run.size(0), g.nc, g.r, b_trans,
                                            a.get_device(), props->multiProcessorCount,
                                            at::cuda::getCurrentCUDAStream()));
  return unpad(g, c);
}

// fp32 out, one tile for every M: linear_logp's backward (its logits, b_trans; its dx, not)
Tensor gemm_f32(const Tensor& a, const Tensor& b, bool b_trans) {
  const GemmCall g = gemm_call("sm90.gemm_f32", a, b, b_trans);
  const c10::cuda::CUDAGuard guard(a.device());
  const auto f32 = a.options().dtype(at::kFloat);
  if (g.m == 0) return at::empty({0, g.nc}, f32);
  if (g.r == 0) return at::zeros({g.m, g.nc}, f32);
  Tensor c = at::empty({g.a_run.size(0), g.nc}, f32);
  const auto* props = at::cuda::getCurrentDeviceProperties();
  check_launch("sm90.gemm_f32", ws1::sm90::gemm_f32out(bf(g.a_run), bf(b), c.data_ptr<float>(), g.a_run.size(0),
                                                       g.nc, g.r, b_trans, a.get_device(),
                                                       props->multiProcessorCount, at::cuda::getCurrentCUDAStream()));
  return unpad(g, c);
}

Tensor gemm_f32_meta(const Tensor& a, const Tensor& b, bool b_trans) {
  return at::empty({a.size(0), b_trans ? b.size(0) : b.size(1)}, a.options().dtype(at::kFloat));
}

// bf16 out on a named tile at any M (ws1_sm90.h, gemm_tile): for the tests that hold every tile to one set of bits
// and for the probes that time them; the candidate calls `gemm`
Tensor gemm_tile(const Tensor& a, const Tensor& b, bool b_trans, int64_t tile) {
  TORCH_CHECK(0 <= tile && tile < ws1::sm90::kGemmTiles, "sm90.gemm_tile: tile must be in [0, ", ws1::sm90::kGemmTiles,
              "), got ", tile);
  const GemmCall g = gemm_call("sm90.gemm_tile", a, b, b_trans);
  const c10::cuda::CUDAGuard guard(a.device());
  if (g.m == 0) return at::empty({0, g.nc}, a.options());
  if (g.r == 0) return at::zeros({g.m, g.nc}, a.options());
  Tensor c = at::empty({g.a_run.size(0), g.nc}, a.options());
  const auto* props = at::cuda::getCurrentDeviceProperties();
  check_launch("sm90.gemm_tile", ws1::sm90::gemm_tile(bf(g.a_run), bf(b), bf_mut(c), g.a_run.size(0), g.nc, g.r,
                                                      b_trans, static_cast<int>(tile), a.get_device(),
                                                      props->multiProcessorCount, at::cuda::getCurrentCUDAStream()));
  return unpad(g, c);
}

Tensor gemm_tile_meta(const Tensor& a, const Tensor& b, bool b_trans, int64_t) {
  return at::empty({a.size(0), b_trans ? b.size(0) : b.size(1)}, a.options());
}

Tensor gemm_meta(const Tensor& a, const Tensor& b, bool b_trans) {
  return at::empty({a.size(0), b_trans ? b.size(0) : b.size(1)}, a.options());
}

int64_t gemm_bucket(int64_t m) { return ws1::sm90::gemm_bucket(m); }
bool gemm_mid_wide_pick(int64_t m, int64_t n, int64_t sm_count) {
  return ws1::sm90::gemm_mid_wide_pick(m, n, static_cast<int>(sm_count));
}
int64_t linear_logp_bucket(int64_t m) { return ws1::sm90::linear_logp_bucket(m); }

// linear_logp's fused forward: (out, lse), fp32 [T] each; the logits are reduced in the GEMM's epilogue and never
// written (the (max, sum) pairs of the 128-wide vocab blocks go to a workspace of T * (2 ceil(V / 128) + 1) floats)
std::tuple<Tensor, Tensor> linear_logp_fwd(const Tensor& x, const Tensor& w, const Tensor& targets) {
  check_bf16("sm90.linear_logp_fwd", "x", x);
  check_bf16("sm90.linear_logp_fwd", "w", w);
  check_address("sm90.linear_logp_fwd", "x", x);
  check_address("sm90.linear_logp_fwd", "w", w);
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && w.size(1) == x.size(1),
              "ws1_sm90.linear_logp_fwd: x [T, H] and w [V, H] expected, got ", x.sizes(), " and ", w.sizes());
  const int64_t t = x.size(0), h = x.size(1), vocab = w.size(0);
  TORCH_CHECK(h % ws1::sm90::kGemmAlign == 0 && vocab % ws1::sm90::kGemmAlign == 0,
              "ws1_sm90.linear_logp_fwd: H (", h, ") and V (", vocab, ") must be multiples of ",
              ws1::sm90::kGemmAlign, " (16-byte TMA rows)");
  TORCH_CHECK(targets.is_cuda() && targets.scalar_type() == at::kLong && targets.dim() == 1 &&
                  targets.is_contiguous() && targets.size(0) == t,
              "ws1_sm90.linear_logp_fwd: targets must be contiguous int64 [T] on the device, T = ", t);
  TORCH_CHECK(vocab > 0 && h > 0, "ws1_sm90.linear_logp_fwd: empty vocabulary or hidden width");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto f32 = x.options().dtype(at::kFloat);
  Tensor out = at::empty({t}, f32);
  Tensor lse = at::empty({t}, f32);
  if (t == 0) return {out, lse};
  Tensor workspace = at::empty({ws1::sm90::linear_logp_workspace(t, vocab)}, f32);
  const auto* props = at::cuda::getCurrentDeviceProperties();
  check_launch("sm90.linear_logp_fwd",
               ws1::sm90::linear_logp_fwd(bf(x), bf(w), targets.data_ptr<int64_t>(), workspace.data_ptr<float>(),
                                          out.data_ptr<float>(), lse.data_ptr<float>(), t, vocab, h, x.get_device(),
                                          props->multiProcessorCount, at::cuda::getCurrentCUDAStream()));
  return {out, lse};
}

std::tuple<Tensor, Tensor> linear_logp_fwd_meta(const Tensor& x, const Tensor&, const Tensor&) {
  return {at::empty({x.size(0)}, x.options().dtype(at::kFloat)), at::empty({x.size(0)}, x.options().dtype(at::kFloat))};
}

// ------------------------------------------------------------------------------------------- logp

void check_targets(const char* op, const Tensor& logits, const Tensor& targets) {
  check_bf16(op, "logits", logits);
  TORCH_CHECK(logits.dim() == 2, "ws1_sm90.", op, ": logits must be 2-D [T, V], got ", logits.dim(), "-D");
  TORCH_CHECK(targets.is_cuda() && targets.scalar_type() == at::kLong && targets.dim() == 1 &&
                  targets.is_contiguous() && targets.size(0) == logits.size(0),
              "ws1_sm90.", op, ": targets must be contiguous int64 [T] on the device, T = ", logits.size(0));
}

std::tuple<Tensor, Tensor> logp_fwd(const Tensor& logits, const Tensor& targets) {
  check_targets("logp_fwd", logits, targets);
  const c10::cuda::CUDAGuard guard(logits.device());
  Tensor out = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  Tensor lse = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  check_launch("sm90.logp_fwd", ws1::sm90::logp_fwd(bf(logits), targets.data_ptr<int64_t>(), out.data_ptr<float>(),
                                                    lse.data_ptr<float>(), logits.size(0), logits.size(1),
                                                    at::cuda::getCurrentCUDAStream()));
  return {out, lse};
}

Tensor logp_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g) {
  check_targets("logp_bwd", logits, targets);
  for (const Tensor* t : {&lse, &g}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 1 &&
                    t->size(0) == logits.size(0),
                "ws1_sm90.logp_bwd: lse and g must be contiguous fp32 [T] on the device");
  }
  const c10::cuda::CUDAGuard guard(logits.device());
  Tensor dlogits = at::empty_like(logits);
  check_launch("sm90.logp_bwd", ws1::sm90::logp_bwd(bf(logits), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                                    g.data_ptr<float>(), bf_mut(dlogits), logits.size(0),
                                                    logits.size(1), at::cuda::getCurrentCUDAStream()));
  return dlogits;
}

std::tuple<Tensor, Tensor> logp_fwd_meta(const Tensor& logits, const Tensor&) {
  return {at::empty({logits.size(0)}, logits.options().dtype(at::kFloat)),
          at::empty({logits.size(0)}, logits.options().dtype(at::kFloat))};
}

Tensor logp_bwd_meta(const Tensor& logits, const Tensor&, const Tensor&, const Tensor&) {
  return at::empty_like(logits);
}

// whether logp on these logits takes the 16-byte path (the tests prove both paths give the same bits)
bool logp_vector_path(const Tensor& logits) {
  return ws1::sm90::logp_vector_path(logits.data_ptr(), logits.size(-1));
}

// The weight gradient under sample_blocks_main_grad, in place on main_grad (wgrad_sm90.cu): the generic
// ws1.gemm_wgrad's contract, for weights whose dims are multiples of kWgradTile (the caller keeps the generic kernel
// for the others, by the weight's shape alone).
// consumers: the CTA's warpgroups (1: 128 x 128 tiles, 2: 128 x 256); stage_rows: a pipeline stage's rows (64 or
// 32); the same bits for every choice (GPU-tested).
void wgrad(const Tensor& dy, const Tensor& x, const Tensor& table, int64_t n_blocks, const Tensor& main_grad,
           const std::optional<Tensor>& dy_lo, int64_t consumers, int64_t stage_rows) {
  check_bf16("sm90.wgrad", "dy", dy);
  check_bf16("sm90.wgrad", "x", x);
  check_address("sm90.wgrad", "dy", dy);
  check_address("sm90.wgrad", "x", x);
  if (dy_lo.has_value()) {
    check_bf16("sm90.wgrad", "dy_lo", *dy_lo);
    check_address("sm90.wgrad", "dy_lo", *dy_lo);
    TORCH_CHECK(dy_lo->sizes() == dy.sizes(), "ws1_sm90.wgrad: dy_lo has shape ", dy_lo->sizes(), ", dy ",
                dy.sizes());
  }
  TORCH_CHECK(dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0), "ws1_sm90.wgrad: dy [T, N], x [T, K]");
  const int64_t n = dy.size(1), k = x.size(1);
  TORCH_CHECK(consumers == 1 || consumers == 2, "ws1_sm90.wgrad: consumers must be 1 or 2, got ", consumers);
  TORCH_CHECK(stage_rows == 32 || stage_rows == 64, "ws1_sm90.wgrad: stage_rows must be 32 or 64, got ", stage_rows);
  TORCH_CHECK(n % ws1::sm90::kWgradTile == 0 && k % (ws1::sm90::kWgradTile * consumers) == 0,
              "ws1_sm90.wgrad: the weight's dims (", n, ", ", k, ") must be multiples of ", ws1::sm90::kWgradTile,
              " and ", ws1::sm90::kWgradTile * consumers, " (other weights take ws1.gemm_wgrad)");
  TORCH_CHECK(table.is_cuda() && table.scalar_type() == at::kInt && table.dim() == 2 &&
                  table.size(1) == ws1::kWgradBlock && table.is_contiguous() && 0 <= n_blocks &&
                  n_blocks <= table.size(0),
              "ws1_sm90.wgrad: table must be contiguous int32 [programs, ", ws1::kWgradBlock, "] with n_blocks rows");
  TORCH_CHECK(main_grad.is_cuda() && main_grad.scalar_type() == at::kFloat && main_grad.is_contiguous() &&
                  main_grad.dim() == 2 && main_grad.size(0) == n && main_grad.size(1) == k,
              "ws1_sm90.wgrad: main_grad must be contiguous fp32 [", n, ", ", k, "]");
  const c10::cuda::CUDAGuard guard(dy.device());
  if (n_blocks == 0) return;
  const int64_t r = ws1::sm90::wgrad_rows(n_blocks, dy_lo.has_value());
  Tensor gathered_dy = at::empty({r, n}, dy.options());
  Tensor gathered_x = at::empty({r, k}, x.options());
  check_launch("sm90.wgrad",
               ws1::sm90::wgrad_blocks(bf(dy), dy_lo.has_value() ? bf(*dy_lo) : nullptr, bf(x),
                                       table.data_ptr<int32_t>(), n_blocks, main_grad.data_ptr<float>(),
                                       bf_mut(gathered_dy), bf_mut(gathered_x), n, k, static_cast<int>(consumers),
                                       static_cast<int>(stage_rows), dy.get_device(),
                                       at::cuda::getCurrentCUDAStream()));
}

void wgrad_meta(const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&, const std::optional<Tensor>&,
                int64_t, int64_t) {}

// ------------------------------------------------------------------------------------------- attention

// Causal GQA attention forward (attention_sm90.cu): (o [T, Hq, D] bf16, lse [T, Hq] fp32). blocks: int32
// [n_blocks, 3] row blocks of at most block_rows / (Hq / Hkv) tokens, or None (one token a CTA: the step path).
// The host tables are the generic attn_fwd_tiled's (cuda/attention.py builds them once per layout).
void check_table32(const char* op, const char* name, const Tensor& t, int64_t rows) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kInt && t.dim() == 1 && t.is_contiguous() && t.size(0) == rows,
              "ws1_sm90.", op, ": ", name, " must be contiguous int32 [", rows, "] on the device");
}

std::tuple<Tensor, Tensor> attn_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_base,
                                    const Tensor& n_keys, const std::optional<Tensor>& blocks, int64_t block_rows,
                                    double scale, int64_t schedule) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    check_bf16("sm90.attn_fwd", name, *t);
    check_address("sm90.attn_fwd", name, *t);
  }
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && k.size(2) == q.size(2),
              "ws1_sm90.attn_fwd: q [T, Hq, D] and k, v [rows, Hkv, D] expected, got ", q.sizes(), ", ", k.sizes(),
              ", ", v.sizes());
  const int64_t hq = q.size(1), hkv = k.size(1), d = q.size(2);
  TORCH_CHECK(ws1::sm90::attn_fwd_supported(static_cast<int>(hq), static_cast<int>(hkv), static_cast<int>(d),
                                            static_cast<int>(block_rows)),
              "ws1_sm90.attn_fwd: head dim 128, block_rows 64 or 128 and a query group dividing it only; got Hq ",
              hq, ", Hkv ", hkv, ", D ", d, ", block_rows ", block_rows);
  TORCH_CHECK(0 <= schedule && schedule < ws1::sm90::kSchedules, "ws1_sm90.attn_fwd: schedule must be in [0, ",
              ws1::sm90::kSchedules, "), got ", schedule);
  TORCH_CHECK(ws1::sm90::attn_fwd_schedule_ok(static_cast<int>(block_rows), static_cast<int>(schedule)),
              "ws1_sm90.attn_fwd: schedule ", schedule, " does not take ", block_rows,
              "-row blocks (3, Q in registers: 64 only; 4, ping-pong: 128 only)");
  check_table32("attn_fwd", "key_base", key_base, q.size(0));
  check_table32("attn_fwd", "n_keys", n_keys, q.size(0));
  int64_t n_blocks = q.size(0);
  if (blocks.has_value()) {
    TORCH_CHECK(blocks->is_cuda() && blocks->scalar_type() == at::kInt && blocks->dim() == 2 &&
                    blocks->size(1) == 3 && blocks->is_contiguous(),
                "ws1_sm90.attn_fwd: blocks must be contiguous int32 [n_blocks, 3] on the device, or None");
    n_blocks = blocks->size(0);
  }
  const c10::cuda::CUDAGuard guard(q.device());
  Tensor o = at::empty_like(q);
  Tensor lse = at::empty({q.size(0), hq}, q.options().dtype(at::kFloat));
  if (q.size(0) == 0 || k.size(0) == 0) {
    o.zero_();
    lse.zero_();
    return {o, lse};
  }
  check_launch("sm90.attn_fwd",
               ws1::sm90::attn_fwd(bf(q), bf(k), bf(v), key_base.data_ptr<int32_t>(), n_keys.data_ptr<int32_t>(),
                                   blocks.has_value() ? blocks->data_ptr<int32_t>() : nullptr, n_blocks, k.size(0),
                                   bf_mut(o), lse.data_ptr<float>(), static_cast<int>(hq), static_cast<int>(hkv),
                                   static_cast<int>(d), static_cast<int>(block_rows), static_cast<float>(scale),
                                   static_cast<int>(schedule), q.get_device(), at::cuda::getCurrentCUDAStream()));
  return {o, lse};
}

std::tuple<Tensor, Tensor> attn_fwd_meta(const Tensor& q, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         const std::optional<Tensor>&, int64_t, double, int64_t) {
  return {at::empty_like(q), at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat))};
}

// Causal GQA attention backward (attention_bwd_sm90.cu): (dq, dk, dv). blocks: the forward's row blocks at 64-row
// blocks; kblocks: int32 [n, 3] (the sample's first row, its length, the key block's index), one per 64 keys of
// every sample (cuda_sm90/attention.py builds both once per layout).
std::tuple<Tensor, Tensor, Tensor> attn_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                            const Tensor& dout, const Tensor& lse, const Tensor& key_base,
                                            const Tensor& n_keys, const Tensor& blocks, const Tensor& kblocks,
                                            double scale, bool fuse_dkv) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o},
                                {"dout", &dout}}) {
    check_bf16("sm90.attn_bwd", name, *t);
    check_address("sm90.attn_bwd", name, *t);
  }
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && o.sizes() == q.sizes() &&
                  dout.sizes() == q.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2),
              "ws1_sm90.attn_bwd: q, o, dout [T, Hq, D] and k, v [T, Hkv, D] expected, got ", q.sizes(), ", ",
              k.sizes());
  const int64_t t = q.size(0), hq = q.size(1), hkv = k.size(1), d = q.size(2);
  TORCH_CHECK(ws1::sm90::attn_fwd_supported(static_cast<int>(hq), static_cast<int>(hkv), static_cast<int>(d), 64),
              "ws1_sm90.attn_bwd: head dim 128 and a query group dividing 64 only; got Hq ", hq, ", Hkv ", hkv,
              ", D ", d);
  TORCH_CHECK(lse.is_cuda() && lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.dim() == 2 &&
                  lse.size(0) == t && lse.size(1) == hq,
              "ws1_sm90.attn_bwd: lse must be contiguous fp32 [T, Hq]");
  check_table32("attn_bwd", "key_base", key_base, t);
  check_table32("attn_bwd", "n_keys", n_keys, t);
  for (const auto& [name, tb] : {std::pair<const char*, const Tensor*>{"blocks", &blocks}, {"kblocks", &kblocks}}) {
    TORCH_CHECK(tb->is_cuda() && tb->scalar_type() == at::kInt && tb->dim() == 2 && tb->size(1) == 3 &&
                    tb->is_contiguous(),
                "ws1_sm90.attn_bwd: ", name, " must be contiguous int32 [n, 3] on the device");
  }
  const c10::cuda::CUDAGuard guard(q.device());
  Tensor dq = at::empty_like(q);
  Tensor dk = at::zeros_like(k);
  Tensor dv = at::zeros_like(v);
  Tensor delta = at::empty({t, hq}, q.options().dtype(at::kFloat));
  check_launch("sm90.attn_bwd",
               ws1::sm90::attn_bwd(bf(q), bf(k), bf(v), bf(o), bf(dout), lse.data_ptr<float>(),
                                   key_base.data_ptr<int32_t>(), n_keys.data_ptr<int32_t>(),
                                   blocks.data_ptr<int32_t>(), blocks.size(0), kblocks.data_ptr<int32_t>(),
                                   kblocks.size(0), delta.data_ptr<float>(), bf_mut(dq), bf_mut(dk), bf_mut(dv), t,
                                   static_cast<int>(hq), static_cast<int>(hkv), static_cast<int>(d),
                                   static_cast<float>(scale), fuse_dkv, at::cuda::getCurrentCUDAStream()));
  return {dq, dk, dv};
}

std::tuple<Tensor, Tensor, Tensor> attn_bwd_meta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
                                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                 const Tensor&, const Tensor&, double, bool) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

std::vector<ws1::binding::AttributeRow> kernel_attributes() {
  constexpr int kCap = 64;
  ws1::KernelInfo infos[kCap];
  int n = ws1::sm90::gemm_kernel_infos(infos, kCap);
  n += ws1::sm90::gemm_f32out_infos(infos + n, kCap - n);
  n += ws1::sm90::logp_kernel_infos(infos + n, kCap - n);
  n += ws1::sm90::linear_logp_infos(infos + n, kCap - n);
  n += ws1::sm90::wgrad_infos(infos + n, kCap - n);
  n += ws1::sm90::attn_fwd_infos(infos + n, kCap - n);
  n += ws1::sm90::attn_bwd_infos(infos + n, kCap - n);
  TORCH_CHECK(n < kCap, "ws1_sm90.kernel_attributes: the table of ", kCap, " kernels is full: raise kCap");
  return ws1::binding::attribute_rows(infos, n);
}

}  // namespace

TORCH_LIBRARY(ws1_sm90, m) {
  m.def("gemm(Tensor a, Tensor b, bool b_trans) -> Tensor");
  m.def("gemm_tile(Tensor a, Tensor b, bool b_trans, int tile) -> Tensor");
  m.def("logp_fwd(Tensor logits, Tensor targets) -> (Tensor, Tensor)");
  m.def("logp_bwd(Tensor logits, Tensor targets, Tensor lse, Tensor g) -> Tensor");
  m.def("gemm_f32(Tensor a, Tensor b, bool b_trans) -> Tensor");
  m.def("linear_logp_fwd(Tensor x, Tensor w, Tensor targets) -> (Tensor, Tensor)");
  m.def(
      "attn_fwd(Tensor q, Tensor k, Tensor v, Tensor key_base, Tensor n_keys, Tensor? blocks, int block_rows, "
      "float scale, int schedule) -> (Tensor, Tensor)");
  m.def(
      "attn_bwd(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse, Tensor key_base, Tensor n_keys, "
      "Tensor blocks, Tensor kblocks, float scale, bool fuse_dkv=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "wgrad(Tensor dy, Tensor x, Tensor table, int n_blocks, Tensor(a!) main_grad, Tensor? dy_lo=None, "
      "int consumers=1, int stage_rows=64) -> ()");
}

TORCH_LIBRARY_IMPL(ws1_sm90, CUDA, m) {
  m.impl("gemm", &gemm);
  m.impl("gemm_tile", &gemm_tile);
  m.impl("logp_fwd", &logp_fwd);
  m.impl("logp_bwd", &logp_bwd);
  m.impl("gemm_f32", &gemm_f32);
  m.impl("linear_logp_fwd", &linear_logp_fwd);
  m.impl("wgrad", &wgrad);
  m.impl("attn_fwd", &attn_fwd);
  m.impl("attn_bwd", &attn_bwd);
}

TORCH_LIBRARY_IMPL(ws1_sm90, Meta, m) {
  m.impl("gemm", &gemm_meta);
  m.impl("gemm_tile", &gemm_tile_meta);
  m.impl("logp_fwd", &logp_fwd_meta);
  m.impl("logp_bwd", &logp_bwd_meta);
  m.impl("gemm_f32", &gemm_f32_meta);
  m.impl("linear_logp_fwd", &linear_logp_fwd_meta);
  m.impl("wgrad", &wgrad_meta);
  m.impl("attn_fwd", &attn_fwd_meta);
  m.impl("attn_bwd", &attn_bwd_meta);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ws1's Hopper kernels (sm_90a); importing this module registers torch.ops.ws1_sm90.*";
  m.def("gemm_bucket", &gemm_bucket, "the GEMM's M bucket for M rows (0 small, 1 mid, 2 large)");
  m.def("gemm_mid_wide_pick", &gemm_mid_wide_pick,
        "whether the mid bucket's wide tile (128 x 192) would take M rows x N columns on sm_count SMs");
  m.attr("mid_wide_wired") = ws1::sm90::kMidWideWired;
  m.def("linear_logp_bucket", &linear_logp_bucket,
        "linear_logp's fused forward's M bucket for M rows (0 small, 1 mid, 2 large; its own table)");
  m.def("logp_vector_path", &logp_vector_path, "whether logp on these logits takes the 16-byte load path");
  m.def("kernel_attributes", &kernel_attributes,
        "per kernel: name, binaryVersion, ptxVersion, numRegs, sharedSizeBytes, localSizeBytes, "
        "maxThreadsPerBlock, error (cudaFuncGetAttributes on the current device)");
}
