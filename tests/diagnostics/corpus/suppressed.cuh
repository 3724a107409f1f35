// Suppression comments: only the un-suppressed line reports.
#define WARP_SIZE 32  // rocmtrain: ignore[warp-size-literal]
// rocmtrain: ignore[syncwarp]
__device__ void a() { __syncwarp(); }
__device__ void b() { __syncwarp(); }  // rocmtrain: ignore
__device__ void c() { __syncwarp(); }  // rocmtrain: ignore[mask-32bit]  expect: syncwarp
