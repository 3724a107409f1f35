// Traps only in comments and strings: must produce NO finding.
// #define WARP_SIZE 32   __syncwarp()   __shfl_sync(0xffffffff, v, 16)   asm("trap;")
/* for (int offset = 16; offset > 0; offset /= 2)
   nvcuda::wmma::fragment   __CUDA_ARCH__ >= 700   tiled_partition<32>(block) */
#include <cstdio>
const char* kHelp = "use __syncwarp() and 0xffffffff masks, asm(\"nop\") or __CUDA_ARCH__";
const char kQuote = '"';
const char* kRaw = R"doc(__ballot_sync(0xffffffff, x); grid.sync(); threadIdx.x % 32)doc";
int main() { std::printf("%s %c %s\n", kHelp, kQuote, kRaw); return 0; }
