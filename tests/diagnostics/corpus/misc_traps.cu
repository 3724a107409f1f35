// Other porting traps (positives).
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
using namespace nvcuda;  // expect: wmma

__global__ void half_stuff(__half* acc, const __half* x, float* total, int n) {
  __half h = x[threadIdx.x];
  __half s = __shfl_sync(0xffffffffffffffffULL, h, 0);  // HIP has __half shuffles: no finding
  atomicAdd(&acc[0], s);  // expect: half-atomic
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    atomicAdd(total, __half2float(x[i]));  // expect: atomic-in-loop
  }
}

__global__ void coop(float* data) {
  cg::thread_block block = cg::this_thread_block();
  auto tile = cg::tiled_partition<32>(block);  // expect: cg-tile-32
  cg::grid_group grid = cg::this_grid();
  data[0] = 1.f;
  grid.sync();  // expect: grid-sync
  unsigned lane_id;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane_id));  // expect: inline-ptx
}

#if __CUDA_ARCH__ >= 700  // expect: cuda-arch-check
__device__ int new_path() { return 1; }
#endif
#if CUDA_VERSION < 11000  // expect: cuda-arch-check
#error "too old"
#endif

__global__ void transpose(float* out, const float* in) {
  __shared__ float tile[32][33];  // expect: smem-bank-padding
  tile[threadIdx.y][threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = tile[threadIdx.x][threadIdx.y];
}

#define WARPSZ 32U  // expect: warp-size-literal

// a pre-ROCm-7 shim: ROCm >= 7.0 declares __syncwarp itself
#define __syncwarp() __syncthreads()  // expect: syncwarp-shim
__device__ inline void __syncwarp(unsigned long long mask) {}  // expect: syncwarp-shim
