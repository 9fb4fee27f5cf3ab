// What the multi-GPU programs (tests/dist, bench/nccl_overhead.cpp) share: one process per rank
// forked from a parent that never touches CUDA, checks that end the rank with a message naming it, a count of failed expectations, and
// small files in a per-run directory for what the ranks exchange out of band (NCCL ids, dumps).
#pragma once

#include <te/te.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace multi_rank {

inline int g_rank = -1;     // -1 in the parent
inline int g_failures = 0;  // failed EXPECTs of this rank

// Waits for a child; its exit code, or 1 when it died of a signal.
inline int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  std::fprintf(stderr, "child %d killed by signal %d\n", int(pid), WIFSIGNALED(status) ? WTERMSIG(status) : -1);
  return 1;
}

// Rank 0 writes `bytes` to dir/name atomically (write, then rename); the other ranks wait up to
// 60 s for the file and read it.
inline void share_bytes(const std::string &dir, const char *name, void *data, size_t bytes) {
  const std::string path = dir + "/" + name;
  if (g_rank == 0) {
    const std::string tmp = path + ".tmp";
    FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(data, bytes, 1, f) != 1 || std::fclose(f) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::fprintf(stderr, "[rank 0] cannot write %s\n", path.c_str());
      std::_Exit(1);
    }
    return;
  }
  FILE *f = nullptr;
  for (int i = 0; i < 6000 && !(f = std::fopen(path.c_str(), "rb")); ++i) usleep(10000);
  if (!f || std::fread(data, bytes, 1, f) != 1) {
    std::fprintf(stderr, "[rank %d] no %s from rank 0\n", g_rank, name);
    std::_Exit(1);
  }
  std::fclose(f);
}

}  // namespace multi_rank

// A failed te_* call ends the rank: 77 (skip) when unsupported here, else 1.
#define CHECK_TE(call)                                                                                    \
  do {                                                                                                    \
    te_status s_ = (call);                                                                                \
    if (s_ != TE_SUCCESS) {                                                                               \
      std::fprintf(stderr, "[rank %d] %s:%d %s failed: %s: %s\n", multi_rank::g_rank, __FILE__, __LINE__, \
                   #call, te_status_string(s_), te_last_error());                                         \
      std::_Exit(s_ == TE_ERROR_UNSUPPORTED ? 77 : 1);                                                    \
    }                                                                                                     \
  } while (0)

// The same for CUDA and NCCL calls (for programs that include their headers).
#define CHECK_CUDA(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "[rank %d] %s:%d %s failed: %s\n", multi_rank::g_rank, __FILE__, __LINE__, #call, \
                   cudaGetErrorString(e_));                                                               \
      std::_Exit(1);                                                                                      \
    }                                                                                                     \
  } while (0)
#define CHECK_NCCL(call)                                                                                  \
  do {                                                                                                    \
    ncclResult_t r_ = (call);                                                                             \
    if (r_ != ncclSuccess) {                                                                              \
      std::fprintf(stderr, "[rank %d] %s:%d %s failed: %s\n", multi_rank::g_rank, __FILE__, __LINE__, #call, \
                   ncclGetErrorString(r_));                                                               \
      std::_Exit(1);                                                                                      \
    }                                                                                                     \
  } while (0)

// A failed expectation is reported and counted; the rank goes on.
#define EXPECT(cond, ...)                                                       \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "[rank %d] FAILED %s: ", multi_rank::g_rank, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fprintf(stderr, "\n");                                               \
      ++multi_rank::g_failures;                                                 \
    }                                                                           \
  } while (0)
