// Wave-size-agnostic code next to harmless 32s: must produce NO finding.
#include <hip/hip_runtime.h>
#include <cstdint>

const int kTile = 32;  // a tile edge, not a lane count
constexpr int kWave64 = 64;

__global__ void tiles(float* out, const float* in) {
  for (int i = 0; i < kTile; ++i) out[i] = in[i];  // loop over a tile, not over lanes
  if (warpSize == 64) out[0] += 1.f;
  assert(warpSize == 64 || warpSize == kWave64);
}

__device__ float shuffle_any_width(float v) {
  v += __shfl_xor(v, 1, warpSize);
  v += __shfl_down(v, 2, warpSize / 2);
  return v;
}

__device__ uint64_t full_mask() {
  return warpSize == 64 ? ~0ULL : ((1ULL << warpSize) - 1);
}
