// The shared-memory attributes of a Hopper kernel, set once per device rather than on every launch.
//
// Why: the attributes belong to the device's context, so setting them again changes nothing, yet each
// cudaFuncSetAttribute is host time on the launching thread. The attention forward runs 36 times a decode step
// on the step path, and its backward and the weight gradient 36 times a training step. The set is a bit per
// device below 32, per kernel (the kernel's address is the template argument, so each instantiation has its own
// bits). A race sets the attributes twice, which is harmless.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace ws1::sm90 {

// The kernel's largest dynamic shared memory (`bytes`) and, with `max_carveout`, the most shared memory per SM
// (the carveout at 100%: without it the driver may leave room for one CTA an SM where two fit). `device`: the
// current device where the caller knows it, else -1 (asked of the runtime).
template <auto kKernel>
cudaError_t configure_smem_once(int bytes, bool max_carveout, int device = -1) {
  static std::atomic<uint32_t> configured{0};
  if (device < 0) {
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  }
  const uint32_t bit = device < 32 ? (1u << device) : 0u;
  if (bit != 0 && (configured.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  if (const cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess)
    return e;
  if (max_carveout) {
    if (const cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
        e != cudaSuccess)
      return e;
  }
  configured.fetch_or(bit, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace ws1::sm90
