// What both binding files (ws1_ops.cpp, sm90/ws1_sm90_ops.cpp) need: raw-pointer views of bf16 tensors, the
// checks a raw pointer needs, the launch check, and the runtime's attributes of a build's kernels as rows.
#pragma once

#include <torch/extension.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/ws1_kernels.h"

namespace ws1::binding {

using at::Tensor;

inline const ws1::bf16* bf(const Tensor& t) {
  return reinterpret_cast<const ws1::bf16*>(t.data_ptr<at::BFloat16>());
}
inline ws1::bf16* bf_mut(Tensor& t) { return reinterpret_cast<ws1::bf16*>(t.data_ptr<at::BFloat16>()); }

inline void check_bf16(const char* op, const char* name, const Tensor& t) {
  TORCH_CHECK(t.is_cuda(), "ws1.", op, ": ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, "ws1.", op, ": ", name, " must be bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "ws1.", op, ": ", name, " must be contiguous");
}

inline void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "ws1.", op, ": kernel launch failed: ", cudaGetErrorString(err));
}

// name, binaryVersion, ptxVersion, numRegs, sharedSizeBytes, localSizeBytes, maxThreadsPerBlock, error
using AttributeRow = std::tuple<std::string, int, int, int, int64_t, int64_t, int, std::string>;

inline std::vector<AttributeRow> attribute_rows(const ws1::KernelInfo* infos, int n) {
  std::vector<AttributeRow> out;
  for (int i = 0; i < n; ++i) {
    const auto& a = infos[i].attr;
    out.emplace_back(infos[i].name, a.binaryVersion, a.ptxVersion, a.numRegs, static_cast<int64_t>(a.sharedSizeBytes),
                     static_cast<int64_t>(a.localSizeBytes), a.maxThreadsPerBlock,
                     infos[i].err == cudaSuccess ? std::string() : std::string(cudaGetErrorString(infos[i].err)));
  }
  return out;
}

}  // namespace ws1::binding
