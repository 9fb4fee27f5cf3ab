// CK / LK for the standalone CUDA benchmarks (no libte inside): a failed CUDA runtime or cuBLASLt
// call prints the call, file and line, and exits 1. (libte itself never exits: it returns status
// codes; these programs have no caller to return to.)
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)
#define LK(x)                                                                          \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
