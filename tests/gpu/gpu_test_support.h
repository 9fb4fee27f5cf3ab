// Shared pieces of the GPU tests: a fixture holding the CPU reference backend and the CUDA
// backend (skipping when there is no usable GPU), and device buffers filled from / read back to
// host vectors through the Backend interface itself.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backends/backend.h"

namespace te::gpu_test {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no usable CUDA GPU or no CUDA backend in this build";
    cpu = make_cpu_backend();
    gpu = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> cpu, gpu;
};

// Device memory holding a copy of host data (or zeros), freed through the backend.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend &be, size_t bytes) : be_(&be), buf_(&be, bytes ? bytes : 1), bytes_(bytes) {
    std::vector<unsigned char> zeros(bytes_ ? bytes_ : 1, 0);
    be.copy_from_host(buf_.get(), zeros.data(), bytes_ ? bytes_ : 1);
  }
  template <class T>
  DeviceBuffer(Backend &be, const std::vector<T> &host) : DeviceBuffer(be, host.size() * sizeof(T)) {
    if (!host.empty()) be.copy_from_host(buf_.get(), host.data(), bytes_);
  }
  void *get() const { return buf_.get(); }
  float *floats() const { return buf_.floats(); }
  template <class T>
  std::vector<T> read() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (!out.empty()) be_->copy_to_host(out.data(), buf_.get(), out.size() * sizeof(T));
    return out;
  }

 private:
  Backend *be_;
  Buffer buf_;
  size_t bytes_;
};

}  // namespace te::gpu_test
