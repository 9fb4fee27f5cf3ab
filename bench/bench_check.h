// CHECK for the benchmark programs that end at their first error (te_bench_gpu,
// te_bench_gpu_host): the call, libte's status and message on stderr, exit status 2.
// (te_bench_modules throws instead, to report a failed case and go on with the next.)
#pragma once

#include <te/te.h>

#include <cstdio>
#include <cstdlib>

namespace bench {

inline void check_or_exit(te_status s, const char *what) {
  if (s != TE_SUCCESS) {
    std::fprintf(stderr, "%s: %s: %s\n", what, te_status_string(s), te_last_error());
    std::exit(2);
  }
}

}  // namespace bench

#define CHECK(call) ::bench::check_or_exit((call), #call)
