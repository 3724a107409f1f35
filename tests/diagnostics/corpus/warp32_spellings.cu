// Warp-size-32 assumptions as people actually spell them (positives).
#include <cassert>
#include <cuda_runtime.h>

#define WARP_SIZE 32  // expect: warp-size-literal
const int kWarp = 32;
constexpr int WARP = 32;
static constexpr unsigned kLanes{32};

__global__ void guarded(float* out) {
  if (warpSize == 32) out[0] = 1.f;  // expect: warpsize-compare-32
  if (warpSize != 32) return;  // expect: warpsize-compare-32
  assert(warpSize == 32);  // expect: warpsize-assert-32
}

void host_check(const cudaDeviceProp& prop) {
  if (32 != prop.warpSize) return;  // expect: warpsize-compare-32
}

__device__ float lane_loop(const float* row) {
  float acc = 0.f;
  for (int i = 0; i < kWarp; ++i) acc += row[i];  // expect: warp-constant-32
  for (unsigned l = 0; l < kLanes; l++) acc += row[l];  // expect: warp-constant-32
  return acc;
}

__device__ float shuffles(float v) {
  v += __shfl_xor(v, 1, WARP);  // expect: warp-constant-32
  v += __shfl_down_sync(0xffffffffffffffffULL, v, 2, WARP_SIZE);  // expect: warp-constant-32
  v += __shfl(v, 0, 32);  // expect: warp-constant-32
  return v;
}

__device__ unsigned long long lane_mask() {
  unsigned mask = (1u << kWarp) - 1;  // expect: warp-constant-32
  return mask;
}
