// snip/formats/hd.h: SNIP_HD marks a function nvcc compiles for the host and
// the device (__host__ __device__); empty for other compilers. The codec's
// functions carry it, so the CPU and the CUDA kernels run the same code
// (docs/gpu.md).
#pragma once

#if defined(__CUDACC__)
#define SNIP_HD __host__ __device__
#else
#define SNIP_HD
#endif
