// The one binding file: registers ws1's CUDA kernels as torch ops (torch.ops.ws1.*), each with a schema, a CUDA
// implementation and a Meta (fake) implementation, so torch.compile and CUDA graphs see ordinary ops. Autograd
// is layered on top in Python (ws1_kernels/cuda/). The checks here are the ones a raw pointer needs (dtype,
// device, contiguity, sizes); the Python side checks a call's layout once per plan. Every launch is checked.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <optional>
#include <string>
#include <vector>

#include "_build_info.h"
#include "binding.h"
#include "kernels/ws1_kernels.h"

namespace {

using at::Tensor;

using ws1::binding::bf;
using ws1::binding::bf_mut;
using ws1::binding::check_bf16;
using ws1::binding::check_launch;

// ------------------------------------------------------------------------------------------- pointwise

Tensor silu_fwd(const Tensor& x) {
  check_bf16("silu_fwd", "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check_launch("silu_fwd", ws1::silu_fwd(bf(x), bf_mut(y), x.numel(), at::cuda::getCurrentCUDAStream()));
  return y;
}

Tensor silu_bwd(const Tensor& x, const Tensor& dy) {
  check_bf16("silu_bwd", "x", x);
  check_bf16("silu_bwd", "dy", dy);
  TORCH_CHECK(x.sizes() == dy.sizes(), "ws1.silu_bwd: dy has shape ", dy.sizes(), ", x ", x.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  Tensor dx = at::empty_like(x);
  check_launch("silu_bwd", ws1::silu_bwd(bf(x), bf(dy), bf_mut(dx), x.numel(), at::cuda::getCurrentCUDAStream()));
  return dx;
}

Tensor swiglu_fwd(const Tensor& gate, const Tensor& up) {
  check_bf16("swiglu_fwd", "gate", gate);
  check_bf16("swiglu_fwd", "up", up);
  TORCH_CHECK(gate.sizes() == up.sizes(), "ws1.swiglu_fwd: up has shape ", up.sizes(), ", gate ", gate.sizes());
  const c10::cuda::CUDAGuard guard(gate.device());
  Tensor y = at::empty_like(gate);
  check_launch("swiglu_fwd",
               ws1::swiglu_fwd(bf(gate), bf(up), bf_mut(y), gate.numel(), at::cuda::getCurrentCUDAStream()));
  return y;
}

std::tuple<Tensor, Tensor> swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dy) {
  check_bf16("swiglu_bwd", "gate", gate);
  check_bf16("swiglu_bwd", "up", up);
  check_bf16("swiglu_bwd", "dy", dy);
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.sizes() == dy.sizes(), "ws1.swiglu_bwd: shapes differ");
  const c10::cuda::CUDAGuard guard(gate.device());
  Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
  check_launch("swiglu_bwd", ws1::swiglu_bwd(bf(gate), bf(up), bf(dy), bf_mut(dgate), bf_mut(dup), gate.numel(),
                                             at::cuda::getCurrentCUDAStream()));
  return {dgate, dup};
}

// ------------------------------------------------------------------------------------------- norms

// x: [T, D] (rms_norm) or [T, NH, D] (qk_norm)
std::pair<int64_t, int64_t> heads_and_width(const char* op, const Tensor& x) {
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "ws1.", op, ": x must be [T, D] or [T, NH, D], got ", x.sizes());
  return x.dim() == 2 ? std::pair<int64_t, int64_t>(1, x.size(1)) : std::pair<int64_t, int64_t>(x.size(1), x.size(2));
}

Tensor norm_fwd(const Tensor& x, const Tensor& w, double eps) {
  check_bf16("norm_fwd", "x", x);
  check_bf16("norm_fwd", "w", w);
  auto [nh, d] = heads_and_width("norm_fwd", x);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == d, "ws1.norm_fwd: w must be [", d, "], got ", w.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check_launch("norm_fwd", ws1::norm_fwd(bf(x), bf(w), bf_mut(y), x.size(0), static_cast<int>(nh),
                                         static_cast<int>(d), static_cast<float>(eps),
                                         at::cuda::getCurrentCUDAStream()));
  return y;
}

// returns (dx, bsum): dx empty when not do_dx, bsum [max(n_blocks, 1), D] fp32 (empty when not do_dw)
std::tuple<Tensor, Tensor> norm_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& table,
                                    int64_t n_blocks, double eps, bool do_dx, bool do_dw) {
  check_bf16("norm_bwd", "x", x);
  check_bf16("norm_bwd", "w", w);
  check_bf16("norm_bwd", "dy", dy);
  auto [nh, d] = heads_and_width("norm_bwd", x);
  TORCH_CHECK(dy.sizes() == x.sizes(), "ws1.norm_bwd: dy has shape ", dy.sizes(), ", x ", x.sizes());
  TORCH_CHECK(table.is_cuda() && table.scalar_type() == at::kInt && table.dim() == 2 &&
                  table.size(1) == ws1::kWgradBlock && table.is_contiguous(),
              "ws1.norm_bwd: table must be contiguous int32 [programs, ", ws1::kWgradBlock, "] on the device");
  TORCH_CHECK(0 <= n_blocks && n_blocks <= table.size(0), "ws1.norm_bwd: n_blocks out of range");
  const c10::cuda::CUDAGuard guard(x.device());
  Tensor dx = do_dx ? at::empty_like(x) : at::empty({0}, x.options());
  Tensor bsum = do_dw ? at::empty({std::max<int64_t>(n_blocks, 1), d}, x.options().dtype(at::kFloat))
                      : at::empty({0}, x.options().dtype(at::kFloat));
  const int64_t programs = do_dx ? table.size(0) : n_blocks;
  check_launch("norm_bwd",
               ws1::norm_bwd_blocks(bf(x), bf(w), bf(dy), do_dx ? bf_mut(dx) : nullptr,
                                    do_dw ? bsum.data_ptr<float>() : nullptr, table.data_ptr<int32_t>(),
                                    static_cast<int>(programs), static_cast<int>(n_blocks), static_cast<int>(nh),
                                    static_cast<int>(d), static_cast<float>(eps), at::cuda::getCurrentCUDAStream()));
  return {dx, bsum};
}

void wgrad_accumulate(const Tensor& bsum, const Tensor& main_grad, int64_t n_blocks) {
  TORCH_CHECK(bsum.is_cuda() && bsum.scalar_type() == at::kFloat && bsum.is_contiguous() && bsum.dim() == 2,
              "ws1.wgrad_accumulate: bsum must be contiguous fp32 [blocks, D] on the device");
  TORCH_CHECK(main_grad.is_cuda() && main_grad.scalar_type() == at::kFloat && main_grad.is_contiguous() &&
                  main_grad.numel() == bsum.size(1),
              "ws1.wgrad_accumulate: main_grad must be contiguous fp32 of ", bsum.size(1), " elements");
  TORCH_CHECK(0 <= n_blocks && n_blocks <= bsum.size(0), "ws1.wgrad_accumulate: n_blocks out of range");
  const c10::cuda::CUDAGuard guard(bsum.device());
  check_launch("wgrad_accumulate",
               ws1::wgrad_accumulate(bsum.data_ptr<float>(), main_grad.data_ptr<float>(), static_cast<int>(n_blocks),
                                     static_cast<int>(bsum.size(1)), at::cuda::getCurrentCUDAStream()));
}

// ------------------------------------------------------------------------------------------- rope

Tensor rope(const Tensor& x, const Tensor& positions, double theta, bool backward) {
  check_bf16("rope", "x", x);
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0, "ws1.rope: x must be [T, NH, D] with D even, got ", x.sizes());
  TORCH_CHECK(positions.is_cuda() && positions.scalar_type() == at::kLong && positions.dim() == 1 &&
                  positions.size(0) == x.size(0) && positions.is_contiguous(),
              "ws1.rope: positions must be contiguous int64 [", x.size(0), "] on the device");
  const c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check_launch("rope", ws1::rope(bf(x), positions.data_ptr<int64_t>(), bf_mut(y), x.size(0),
                                 static_cast<int>(x.size(1)), static_cast<int>(x.size(2)), theta, backward,
                                 at::cuda::getCurrentCUDAStream()));
  return y;
}

// ------------------------------------------------------------------------------------------- embedding

void check_ids(const char* op, const char* name, const Tensor& t) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(), "ws1.", op, ": ",
              name, " must be contiguous int64 [n] on the device");
}

Tensor embedding_fwd(const Tensor& ids, const Tensor& w) {
  check_ids("embedding_fwd", "ids", ids);
  check_bf16("embedding_fwd", "w", w);
  TORCH_CHECK(w.dim() == 2, "ws1.embedding_fwd: w must be [V, H], got ", w.sizes());
  const c10::cuda::CUDAGuard guard(w.device());
  Tensor y = at::empty({ids.size(0), w.size(1)}, w.options());
  check_launch("embedding_fwd", ws1::embedding_fwd(ids.data_ptr<int64_t>(), bf(w), bf_mut(y), ids.size(0), w.size(0),
                                                   static_cast<int>(w.size(1)), at::cuda::getCurrentCUDAStream()));
  return y;
}

void embedding_bwd(const Tensor& ids_sorted, const Tensor& rows, const Tensor& dy, const Tensor& main_grad) {
  check_ids("embedding_bwd", "ids_sorted", ids_sorted);
  check_ids("embedding_bwd", "rows", rows);
  check_bf16("embedding_bwd", "dy", dy);
  TORCH_CHECK(ids_sorted.size(0) == rows.size(0), "ws1.embedding_bwd: ids_sorted and rows differ in length");
  TORCH_CHECK(main_grad.is_cuda() && main_grad.scalar_type() == at::kFloat && main_grad.is_contiguous() &&
                  main_grad.dim() == 2 && dy.dim() == 2 && main_grad.size(1) == dy.size(1),
              "ws1.embedding_bwd: main_grad must be contiguous fp32 [V, ", dy.size(1), "]");
  const c10::cuda::CUDAGuard guard(dy.device());
  check_launch("embedding_bwd",
               ws1::embedding_bwd(ids_sorted.data_ptr<int64_t>(), rows.data_ptr<int64_t>(), bf(dy),
                                  main_grad.data_ptr<float>(), ids_sorted.size(0), main_grad.size(0),
                                  static_cast<int>(dy.size(1)), at::cuda::getCurrentCUDAStream()));
}

// ------------------------------------------------------------------------------------------- logp

std::tuple<Tensor, Tensor> logp_fwd(const Tensor& logits, const Tensor& targets) {
  check_bf16("logp_fwd", "logits", logits);
  check_ids("logp_fwd", "targets", targets);
  TORCH_CHECK(logits.dim() == 2 && targets.size(0) == logits.size(0), "ws1.logp_fwd: logits [T, V] and targets [T]");
  const c10::cuda::CUDAGuard guard(logits.device());
  Tensor out = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  Tensor lse = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  check_launch("logp_fwd", ws1::logp_fwd(bf(logits), targets.data_ptr<int64_t>(), out.data_ptr<float>(),
                                         lse.data_ptr<float>(), logits.size(0), logits.size(1),
                                         at::cuda::getCurrentCUDAStream()));
  return {out, lse};
}

Tensor logp_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g) {
  check_bf16("logp_bwd", "logits", logits);
  check_ids("logp_bwd", "targets", targets);
  for (const Tensor* t : {&lse, &g}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 1 &&
                    t->size(0) == logits.size(0),
                "ws1.logp_bwd: lse and g must be contiguous fp32 [T] on the device");
  }
  const c10::cuda::CUDAGuard guard(logits.device());
  Tensor dlogits = at::empty_like(logits);
  check_launch("logp_bwd", ws1::logp_bwd(bf(logits), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                         g.data_ptr<float>(), bf_mut(dlogits), logits.size(0), logits.size(1),
                                         at::cuda::getCurrentCUDAStream()));
  return dlogits;
}

// ------------------------------------------------------------------------------------------- gemm

// b_trans: a [M, R], b [Nc, R] -> [M, Nc] (y = x W^T); else a [M, R], b [R, Nc] -> [M, Nc] (dx = dy W);
// a_lo: the low half of an fp32 A split as hi + lo (a second MMA per step)
Tensor gemm(const Tensor& a, const Tensor& b, bool b_trans, const std::optional<Tensor>& a_lo) {
  check_bf16("gemm", "a", a);
  if (a_lo.has_value()) {
    check_bf16("gemm", "a_lo", *a_lo);
    TORCH_CHECK(a_lo->sizes() == a.sizes(), "ws1.gemm: a_lo has shape ", a_lo->sizes(), ", a ", a.sizes());
  }
  check_bf16("gemm", "b", b);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "ws1.gemm: a and b must be 2-D");
  const int64_t r = a.size(1);
  const int64_t nc = b_trans ? b.size(0) : b.size(1);
  TORCH_CHECK((b_trans ? b.size(1) : b.size(0)) == r, "ws1.gemm: inner sizes differ: a ", a.sizes(), ", b ",
              b.sizes());
  const c10::cuda::CUDAGuard guard(a.device());
  Tensor c = at::empty({a.size(0), nc}, a.options());
  check_launch("gemm", ws1::gemm(bf(a), a_lo.has_value() ? bf(*a_lo) : nullptr, bf(b), bf_mut(c), a.size(0), nc, r,
                                 b_trans, at::cuda::getCurrentCUDAStream()));
  return c;
}

void gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& table, int64_t n_blocks, const Tensor& main_grad,
                const std::optional<Tensor>& dy_lo) {
  check_bf16("gemm_wgrad", "dy", dy);
  if (dy_lo.has_value()) {
    check_bf16("gemm_wgrad", "dy_lo", *dy_lo);
    TORCH_CHECK(dy_lo->sizes() == dy.sizes(), "ws1.gemm_wgrad: dy_lo has shape ", dy_lo->sizes(), ", dy ", dy.sizes());
  }
  check_bf16("gemm_wgrad", "x", x);
  TORCH_CHECK(dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0), "ws1.gemm_wgrad: dy [T, N], x [T, K]");
  TORCH_CHECK(table.is_cuda() && table.scalar_type() == at::kInt && table.dim() == 2 &&
                  table.size(1) == ws1::kWgradBlock && table.is_contiguous() && 0 <= n_blocks &&
                  n_blocks <= table.size(0),
              "ws1.gemm_wgrad: table must be contiguous int32 [programs, ", ws1::kWgradBlock, "] with n_blocks rows");
  TORCH_CHECK(main_grad.is_cuda() && main_grad.scalar_type() == at::kFloat && main_grad.is_contiguous() &&
                  main_grad.dim() == 2 && main_grad.size(0) == dy.size(1) && main_grad.size(1) == x.size(1),
              "ws1.gemm_wgrad: main_grad must be contiguous fp32 [", dy.size(1), ", ", x.size(1), "]");
  const c10::cuda::CUDAGuard guard(dy.device());
  check_launch("gemm_wgrad", ws1::gemm_wgrad_blocks(bf(dy), dy_lo.has_value() ? bf(*dy_lo) : nullptr, bf(x),
                                                    table.data_ptr<int32_t>(), static_cast<int>(n_blocks),
                                                    main_grad.data_ptr<float>(), dy.size(1), x.size(1),
                                                    at::cuda::getCurrentCUDAStream()));
}

// ------------------------------------------------------------------------------------------- linear_logp pieces

// fp32 logits: a [M, R] . b[Nc, R]^T
Tensor gemm_f32_out(const Tensor& a, const Tensor& b) {
  check_bf16("gemm_f32_out", "a", a);
  check_bf16("gemm_f32_out", "b", b);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "ws1.gemm_f32_out: a [M, R], b [Nc, R]");
  const c10::cuda::CUDAGuard guard(a.device());
  Tensor c = at::empty({a.size(0), b.size(0)}, a.options().dtype(at::kFloat));
  check_launch("gemm_f32_out", ws1::gemm_f32_out(bf(a), bf(b), c.data_ptr<float>(), a.size(0), b.size(0), a.size(1),
                                                 true, at::cuda::getCurrentCUDAStream()));
  return c;
}

void check_f32_logits(const char* op, const Tensor& logits) {
  TORCH_CHECK(logits.is_cuda() && logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.is_contiguous(),
              "ws1.", op, ": logits must be contiguous fp32 [T, V] on the device");
}

std::tuple<Tensor, Tensor> logp_fwd_f32(const Tensor& logits, const Tensor& targets) {
  check_f32_logits("logp_fwd_f32", logits);
  check_ids("logp_fwd_f32", "targets", targets);
  TORCH_CHECK(targets.size(0) == logits.size(0), "ws1.logp_fwd_f32: targets [T]");
  const c10::cuda::CUDAGuard guard(logits.device());
  Tensor out = at::empty({logits.size(0)}, logits.options());
  Tensor lse = at::empty({logits.size(0)}, logits.options());
  check_launch("logp_fwd_f32", ws1::logp_fwd_f32(logits.data_ptr<float>(), targets.data_ptr<int64_t>(),
                                                 out.data_ptr<float>(), lse.data_ptr<float>(), logits.size(0),
                                                 logits.size(1), at::cuda::getCurrentCUDAStream()));
  return {out, lse};
}

std::tuple<Tensor, Tensor> logp_bwd_f32(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                        const Tensor& g) {
  check_f32_logits("logp_bwd_f32", logits);
  check_ids("logp_bwd_f32", "targets", targets);
  for (const Tensor* t : {&lse, &g}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 1 &&
                    t->size(0) == logits.size(0),
                "ws1.logp_bwd_f32: lse and g must be contiguous fp32 [T] on the device");
  }
  const c10::cuda::CUDAGuard guard(logits.device());
  Tensor dlogits = at::empty(logits.sizes(), logits.options().dtype(at::kBFloat16));
  Tensor dlogits_lo = at::empty(logits.sizes(), logits.options().dtype(at::kBFloat16));
  check_launch("logp_bwd_f32", ws1::logp_bwd_f32(logits.data_ptr<float>(), targets.data_ptr<int64_t>(),
                                                 lse.data_ptr<float>(), g.data_ptr<float>(), bf_mut(dlogits),
                                                 bf_mut(dlogits_lo), logits.size(0), logits.size(1),
                                                 at::cuda::getCurrentCUDAStream()));
  return {dlogits, dlogits_lo};
}

// ------------------------------------------------------------------------------------------- attention

void check_table(const char* op, const char* name, const Tensor& t, int64_t rows) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kInt && t.dim() == 1 && t.size(0) == rows && t.is_contiguous(),
              "ws1.", op, ": ", name, " must be contiguous int32 [", rows, "] on the device");
}

// The forward's inputs, checked the same way for either kernel: q [T, Hq, D]; k, v [keys, Hkv, D] (per sample
// contiguous from position 0); key_base, n_keys int32 [T]
void check_attn_fwd(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_base,
                    const Tensor& n_keys) {
  check_bf16(op, "q", q);
  check_bf16(op, "k", k);
  check_bf16(op, "v", v);
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes() && k.size(2) == q.size(2), "ws1.", op,
              ": q [T, Hq, D], k and v [keys, Hkv, D]");
  check_table(op, "key_base", key_base, q.size(0));
  check_table(op, "n_keys", n_keys, q.size(0));
}

// The forward's outputs (o like q, lse fp32 [T, Hq]); the Meta kernels of both forwards return the same
std::tuple<Tensor, Tensor> attn_fwd_outputs(const Tensor& q) {
  return {at::empty_like(q), at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat))};
}

std::tuple<Tensor, Tensor> attn_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_base,
                                    const Tensor& n_keys, double scale) {
  check_attn_fwd("attn_fwd", q, k, v, key_base, n_keys);
  const c10::cuda::CUDAGuard guard(q.device());
  auto [o, lse] = attn_fwd_outputs(q);
  check_launch("attn_fwd", ws1::attn_fwd(bf(q), bf(k), bf(v), key_base.data_ptr<int32_t>(), n_keys.data_ptr<int32_t>(),
                                         bf_mut(o), lse.data_ptr<float>(), q.size(0), static_cast<int>(q.size(1)),
                                         static_cast<int>(k.size(1)), static_cast<int>(q.size(2)),
                                         static_cast<float>(scale), at::cuda::getCurrentCUDAStream()));
  return {o, lse};
}

// A view whose start is not 16-byte aligned, copied (the same values) so the tiled kernel's 16-byte loads are legal;
// a tensor of its own (the allocator aligns to 512 bytes) is passed as it is.
Tensor aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 ? t.clone() : t; }

// The forward on tensor cores (attention_tiled.cu): blocks int32 [n_blocks, 3] = (first row, rows, key count), or
// None: one block per row (the step path: device tables only, capturable)
std::tuple<Tensor, Tensor> attn_fwd_tiled(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_base,
                                          const Tensor& n_keys, const std::optional<Tensor>& blocks,
                                          double scale) {
  check_attn_fwd("attn_fwd_tiled", q, k, v, key_base, n_keys);
  TORCH_CHECK(ws1::attn_fwd_tiled_supported(static_cast<int>(q.size(1)), static_cast<int>(k.size(1)),
                                            static_cast<int>(q.size(2))),
              "ws1.attn_fwd_tiled: head dim 128 and a query group dividing 64 only, got Hq ", q.size(1), ", Hkv ",
              k.size(1), ", D ", q.size(2));
  TORCH_CHECK(!blocks || (blocks->is_cuda() && blocks->scalar_type() == at::kInt && blocks->dim() == 2 &&
                            blocks->size(1) == 3 && blocks->is_contiguous()),
              "ws1.attn_fwd_tiled: blocks must be contiguous int32 [n_blocks, 3] on the device, or None");
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor ka = aligned16(k), va = aligned16(v), qa = aligned16(q);
  auto [o, lse] = attn_fwd_outputs(q);
  check_launch("attn_fwd_tiled",
               ws1::attn_fwd_tiled(bf(qa), bf(ka), bf(va), key_base.data_ptr<int32_t>(), n_keys.data_ptr<int32_t>(),
                                   blocks ? blocks->data_ptr<int32_t>() : nullptr,
                                   static_cast<int>(blocks ? blocks->size(0) : q.size(0)), bf_mut(o),
                                   lse.data_ptr<float>(), static_cast<int>(q.size(1)), static_cast<int>(k.size(1)),
                                   static_cast<int>(q.size(2)), static_cast<float>(scale),
                                   at::cuda::getCurrentCUDAStream()));
  return {o, lse};
}

std::tuple<Tensor, Tensor, Tensor> attn_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                            const Tensor& dout, const Tensor& lse, const Tensor& key_base,
                                            const Tensor& n_keys, const Tensor& q_end, double scale) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o},
                                {"dout", &dout}}) {
    check_bf16("attn_bwd", name, *t);
  }
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.size(0) == q.size(0) && k.sizes() == v.sizes() &&
                  o.sizes() == q.sizes() && dout.sizes() == q.sizes(),
              "ws1.attn_bwd: q, o, dout [T, Hq, D] and k, v [T, Hkv, D]");
  TORCH_CHECK(lse.is_cuda() && lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.dim() == 2 &&
                  lse.size(0) == q.size(0) && lse.size(1) == q.size(1),
              "ws1.attn_bwd: lse must be contiguous fp32 [T, Hq]");
  check_table("attn_bwd", "key_base", key_base, q.size(0));
  check_table("attn_bwd", "n_keys", n_keys, q.size(0));
  check_table("attn_bwd", "q_end", q_end, q.size(0));
  const c10::cuda::CUDAGuard guard(q.device());
  Tensor delta = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  check_launch("attn_bwd", ws1::attn_bwd(bf(q), bf(k), bf(v), bf(o), bf(dout), lse.data_ptr<float>(),
                                         delta.data_ptr<float>(), key_base.data_ptr<int32_t>(),
                                         n_keys.data_ptr<int32_t>(), q_end.data_ptr<int32_t>(), bf_mut(dq), bf_mut(dk),
                                         bf_mut(dv), q.size(0), static_cast<int>(q.size(1)),
                                         static_cast<int>(k.size(1)), static_cast<int>(q.size(2)),
                                         static_cast<float>(scale), at::cuda::getCurrentCUDAStream()));
  return {dq, dk, dv};
}

// ------------------------------------------------------------------------------------------- fakes (Meta)

Tensor like_meta(const Tensor& x) { return at::empty_like(x); }
Tensor silu_bwd_meta(const Tensor& x, const Tensor&) { return at::empty_like(x); }
Tensor swiglu_fwd_meta(const Tensor& gate, const Tensor&) { return at::empty_like(gate); }
std::tuple<Tensor, Tensor> swiglu_bwd_meta(const Tensor& gate, const Tensor& up, const Tensor&) {
  return {at::empty_like(gate), at::empty_like(up)};
}
Tensor norm_fwd_meta(const Tensor& x, const Tensor&, double) { return at::empty_like(x); }
std::tuple<Tensor, Tensor> norm_bwd_meta(const Tensor& x, const Tensor&, const Tensor&, const Tensor&,
                                         int64_t n_blocks, double, bool do_dx, bool do_dw) {
  const int64_t d = x.size(x.dim() - 1);
  return {do_dx ? at::empty_like(x) : at::empty({0}, x.options()),
          do_dw ? at::empty({std::max<int64_t>(n_blocks, 1), d}, x.options().dtype(at::kFloat))
                : at::empty({0}, x.options().dtype(at::kFloat))};
}
void wgrad_accumulate_meta(const Tensor&, const Tensor&, int64_t) {}
Tensor rope_meta(const Tensor& x, const Tensor&, double, bool) { return at::empty_like(x); }
Tensor embedding_fwd_meta(const Tensor& ids, const Tensor& w) { return at::empty({ids.size(0), w.size(1)}, w.options()); }
void embedding_bwd_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {}
std::tuple<Tensor, Tensor> logp_fwd_meta(const Tensor& logits, const Tensor&) {
  return {at::empty({logits.size(0)}, logits.options().dtype(at::kFloat)),
          at::empty({logits.size(0)}, logits.options().dtype(at::kFloat))};
}
Tensor logp_bwd_meta(const Tensor& logits, const Tensor&, const Tensor&, const Tensor&) { return at::empty_like(logits); }
Tensor gemm_meta(const Tensor& a, const Tensor& b, bool b_trans, const std::optional<Tensor>&) {
  return at::empty({a.size(0), b_trans ? b.size(0) : b.size(1)}, a.options());
}
void gemm_wgrad_meta(const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&, const std::optional<Tensor>&) {}
Tensor gemm_f32_out_meta(const Tensor& a, const Tensor& b) {
  return at::empty({a.size(0), b.size(0)}, a.options().dtype(at::kFloat));
}
std::tuple<Tensor, Tensor> logp_fwd_f32_meta(const Tensor& logits, const Tensor&) {
  return {at::empty({logits.size(0)}, logits.options()), at::empty({logits.size(0)}, logits.options())};
}
std::tuple<Tensor, Tensor> logp_bwd_f32_meta(const Tensor& logits, const Tensor&, const Tensor&, const Tensor&) {
  return {at::empty(logits.sizes(), logits.options().dtype(at::kBFloat16)),
          at::empty(logits.sizes(), logits.options().dtype(at::kBFloat16))};
}
std::tuple<Tensor, Tensor> attn_fwd_meta(const Tensor& q, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         double) {
  return attn_fwd_outputs(q);
}
std::tuple<Tensor, Tensor> attn_fwd_tiled_meta(const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const std::optional<Tensor>&, double) {
  return attn_fwd_outputs(q);
}
std::tuple<Tensor, Tensor, Tensor> attn_bwd_meta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
                                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                 const Tensor&, double) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

// ------------------------------------------------------------------------------------------- build record

std::string built_targets() { return WS1_BUILT_TARGETS; }

std::vector<ws1::binding::AttributeRow> kernel_attributes() {
  ws1::KernelInfo infos[64];
  int n = ws1::pointwise_kernel_infos(infos, 64);
  n += ws1::norm_kernel_infos(infos + n, 64 - n);
  n += ws1::rope_kernel_infos(infos + n, 64 - n);
  n += ws1::embedding_kernel_infos(infos + n, 64 - n);
  n += ws1::logprob_kernel_infos(infos + n, 64 - n);
  n += ws1::gemm_kernel_infos(infos + n, 64 - n);
  n += ws1::attention_kernel_infos(infos + n, 64 - n);
  n += ws1::attention_tiled_kernel_infos(infos + n, 64 - n);
  return ws1::binding::attribute_rows(infos, n);
}

}  // namespace

TORCH_LIBRARY(ws1, m) {
  m.def("silu_fwd(Tensor x) -> Tensor");
  m.def("silu_bwd(Tensor x, Tensor dy) -> Tensor");
  m.def("swiglu_fwd(Tensor gate, Tensor up) -> Tensor");
  m.def("swiglu_bwd(Tensor gate, Tensor up, Tensor dy) -> (Tensor, Tensor)");
  m.def("norm_fwd(Tensor x, Tensor w, float eps) -> Tensor");
  m.def(
      "norm_bwd(Tensor x, Tensor w, Tensor dy, Tensor table, int n_blocks, float eps, bool do_dx, bool do_dw) -> "
      "(Tensor, Tensor)");
  m.def("wgrad_accumulate(Tensor bsum, Tensor(a!) main_grad, int n_blocks) -> ()");
  m.def("rope(Tensor x, Tensor positions, float theta, bool backward) -> Tensor");
  m.def("embedding_fwd(Tensor ids, Tensor w) -> Tensor");
  m.def("embedding_bwd(Tensor ids_sorted, Tensor rows, Tensor dy, Tensor(a!) main_grad) -> ()");
  m.def("logp_fwd(Tensor logits, Tensor targets) -> (Tensor, Tensor)");
  m.def("logp_bwd(Tensor logits, Tensor targets, Tensor lse, Tensor g) -> Tensor");
  m.def("gemm(Tensor a, Tensor b, bool b_trans, Tensor? a_lo=None) -> Tensor");
  m.def("gemm_wgrad(Tensor dy, Tensor x, Tensor table, int n_blocks, Tensor(a!) main_grad, Tensor? dy_lo=None) -> ()");
  m.def("gemm_f32_out(Tensor a, Tensor b) -> Tensor");
  m.def("logp_fwd_f32(Tensor logits, Tensor targets) -> (Tensor, Tensor)");
  m.def("logp_bwd_f32(Tensor logits, Tensor targets, Tensor lse, Tensor g) -> (Tensor, Tensor)");
  m.def("attn_fwd(Tensor q, Tensor k, Tensor v, Tensor key_base, Tensor n_keys, float scale) -> (Tensor, Tensor)");
  m.def(
      "attn_fwd_tiled(Tensor q, Tensor k, Tensor v, Tensor key_base, Tensor n_keys, Tensor? blocks, float scale) -> "
      "(Tensor, Tensor)");
  m.def(
      "attn_bwd(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse, Tensor key_base, Tensor n_keys, "
      "Tensor q_end, float scale) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ws1, CUDA, m) {
  m.impl("silu_fwd", &silu_fwd);
  m.impl("silu_bwd", &silu_bwd);
  m.impl("swiglu_fwd", &swiglu_fwd);
  m.impl("swiglu_bwd", &swiglu_bwd);
  m.impl("norm_fwd", &norm_fwd);
  m.impl("norm_bwd", &norm_bwd);
  m.impl("wgrad_accumulate", &wgrad_accumulate);
  m.impl("rope", &rope);
  m.impl("embedding_fwd", &embedding_fwd);
  m.impl("embedding_bwd", &embedding_bwd);
  m.impl("logp_fwd", &logp_fwd);
  m.impl("logp_bwd", &logp_bwd);
  m.impl("gemm", &gemm);
  m.impl("gemm_wgrad", &gemm_wgrad);
  m.impl("gemm_f32_out", &gemm_f32_out);
  m.impl("logp_fwd_f32", &logp_fwd_f32);
  m.impl("logp_bwd_f32", &logp_bwd_f32);
  m.impl("attn_fwd", &attn_fwd);
  m.impl("attn_fwd_tiled", &attn_fwd_tiled);
  m.impl("attn_bwd", &attn_bwd);
}

TORCH_LIBRARY_IMPL(ws1, Meta, m) {
  m.impl("silu_fwd", &like_meta);
  m.impl("silu_bwd", &silu_bwd_meta);
  m.impl("swiglu_fwd", &swiglu_fwd_meta);
  m.impl("swiglu_bwd", &swiglu_bwd_meta);
  m.impl("norm_fwd", &norm_fwd_meta);
  m.impl("norm_bwd", &norm_bwd_meta);
  m.impl("wgrad_accumulate", &wgrad_accumulate_meta);
  m.impl("rope", &rope_meta);
  m.impl("embedding_fwd", &embedding_fwd_meta);
  m.impl("embedding_bwd", &embedding_bwd_meta);
  m.impl("logp_fwd", &logp_fwd_meta);
  m.impl("logp_bwd", &logp_bwd_meta);
  m.impl("gemm", &gemm_meta);
  m.impl("gemm_wgrad", &gemm_wgrad_meta);
  m.impl("gemm_f32_out", &gemm_f32_out_meta);
  m.impl("logp_fwd_f32", &logp_fwd_f32_meta);
  m.impl("logp_bwd_f32", &logp_bwd_f32_meta);
  m.impl("attn_fwd", &attn_fwd_meta);
  m.impl("attn_fwd_tiled", &attn_fwd_tiled_meta);
  m.impl("attn_bwd", &attn_bwd_meta);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ws1's CUDA kernels; importing this module registers torch.ops.ws1.*";
  m.def("built_targets", &built_targets, "the TORCH_CUDA_ARCH_LIST this module was built for");
  m.def("kernel_attributes", &kernel_attributes,
        "per kernel: name, binaryVersion, ptxVersion, numRegs, sharedSizeBytes, localSizeBytes, "
        "maxThreadsPerBlock, error (cudaFuncGetAttributes on the current device)");
}
