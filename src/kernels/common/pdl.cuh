// Programmatic dependent launch (PDL), shared by the expert kernels and the EP transport kernels.
// A kernel launched with programmatic stream serialization may have its CTAs resident while the
// previous kernel of the stream still runs; it calls pdl_wait before it reads anything that
// kernel (or an earlier one) wrote, and before any early exit, so every grid completes after its
// predecessor and the chain of waits orders the whole forward as plain launches would.
#pragma once

#include <cuda_runtime.h>

namespace moe_ep {

// Waits until the previous kernel in the stream has finished and its writes are visible (a
// no-op without programmatic dependent launch).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Lets the next kernel of the stream start launching its CTAs (they wait in pdl_wait).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Host side: launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization when `programmatic` is set (a plain launch otherwise).
template <class... KernelArgs, class... Args>
cudaError_t launch_kernel(bool programmatic, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                          size_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// launch_kernel with programmatic stream serialization: the kernel calls pdl_wait before reading
// what the previous kernel of the stream wrote.
template <class... KernelArgs, class... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args... args) {
  return launch_kernel(true, kernel, grid, block, smem, stream, args...);
}

}  // namespace moe_ep
