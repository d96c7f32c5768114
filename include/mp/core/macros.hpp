#pragma once

/// MP_HD marks functions usable from both host code and CUDA device code.
#if defined(__CUDACC__)
#define MP_HD __host__ __device__
#define MP_DEVICE_CODE 1
#else
#define MP_HD
#endif

/// MP_FORCE_INLINE asks the compiler to inline hot scalar helpers.
#if defined(__CUDACC__)
#define MP_FORCE_INLINE __forceinline__
#elif defined(__GNUC__)
#define MP_FORCE_INLINE inline __attribute__((always_inline))
#else
#define MP_FORCE_INLINE inline
#endif
