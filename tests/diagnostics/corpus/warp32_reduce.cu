// Classic CUDA warp reduction written for 32-lane warps (positives).
#include <cuda_runtime.h>
#include <mma.h>  // expect: wmma
#define WARP_SIZE 32  // expect: warp-size-literal
#define FULL_MASK 0xffffffff  // expect: mask-32bit

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2)  // expect: butterfly-16
    v += __shfl_down_sync(0xffffffff, v, offset);  // expect: mask-32bit
  return v;
}

__device__ float warp_sum_unrolled(float v) {
  v += __shfl_xor_sync(FULL_MASK, v, 16);  // expect: butterfly-16
  v += __shfl_xor_sync(FULL_MASK, v, 8);
  return v;
}

__global__ void reduce(const float* in, float* out, int n) {
  int lane = threadIdx.x % 32;  // expect: warp-size-literal
  int warp = threadIdx.x / 32;  // expect: warp-size-literal
  unsigned active = __ballot_sync(0xffffffffu, lane < n);  // expect: mask-32bit,ballot-truncation
  int votes = __popc(__activemask());  // expect: ballot-truncation
  __syncwarp();  // expect: syncwarp
  if (lane < 32) out[warp] = warp_sum(in[threadIdx.x]);  // expect: warp-size-literal
}

template <int N> __device__ void tile_op();
constexpr int kLanes = warpSize;  // expect: warpsize-constexpr
__global__ void __launch_bounds__(4 * warpSize) bounded() {  // expect: warpsize-constexpr
  __shared__ float partial[warpSize];  // expect: warpsize-constexpr
  tile_op<warpSize>();  // expect: warpsize-constexpr
}
