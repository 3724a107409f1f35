// Correct wave-size-agnostic HIP code: must produce NO finding.
#include <hip/hip_runtime.h>
#include <cstdint>

__device__ float wave_sum(float v) {
  for (int offset = warpSize / 2; offset > 0; offset /= 2)
    v += __shfl_down(v, offset);
  return v;
}

__device__ float wave_sum_sync(float v) {
  const uint64_t mask = 0xffffffffffffffffULL;
  for (int offset = warpSize / 2; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(mask, v, offset);
  return v;
}

__global__ void reduce(const float* in, float* out, int n) {
  int lane = threadIdx.x % warpSize;
  int wave = threadIdx.x / warpSize;
  uint64_t active = __ballot(lane < n);
  int votes = __popcll(active);
  int first = __ffsll(static_cast<unsigned long long>(__activemask()));
  __shared__ float partial[1024 / 64];
  float s = wave_sum(lane < n ? in[threadIdx.x] : 0.f);
  if (lane == 0) partial[wave] = s + votes + first;
  __syncthreads();
  float acc = 0.f;
  for (int i = 0; i < 16; ++i) acc += partial[i];
  if (threadIdx.x == 0) atomicAdd(out, acc);  // one atomic per block, outside the loop
}

#if defined(__HIP_DEVICE_COMPILE__) && defined(__gfx942__)
__device__ int arch_path() { return 942; }
#endif

__global__ void sized(int n) {
  int lanes = warpSize;
  int chunks = (n + 31) / 32 * lanes;
  (void)chunks;
}

// Same variable name, different functions: a __half parameter elsewhere does not taint this float.
__device__ float to_float(__half val) { return __half2float(val); }
__device__ float neighbour(float val) { return __shfl_xor(val, 1); }
