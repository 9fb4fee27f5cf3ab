// The CPU backend's plumbing: caching allocator, stream rules, copies, fills, and the fused
// scaling-state maintenance (gather + update over many states).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_allocator.h"
#include "backends/cpu/cpu_backend.h"

namespace {

TEST(CpuAllocator, AlignedAndSameBlockBackAfterFree) {
  te::CpuCachingAllocator alloc;
  void *p = alloc.alloc(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 0xAB, 1000);
  alloc.free(p, 1000);
  EXPECT_EQ(alloc.alloc(1000), p);
  alloc.free(p, 1000);
  EXPECT_EQ(alloc.alloc(990), p) << "same size class";
  alloc.free(p, 990);
  EXPECT_EQ(alloc.system_allocations(), 1u);
  EXPECT_EQ(alloc.alloc(0), nullptr);
  alloc.free(nullptr, 0);
}

TEST(CpuAllocator, NoSystemAllocationAfterWarmUp) {
  te::CpuCachingAllocator alloc;
  const size_t sizes[] = {1, 64, 65, 300, 4096, 100000, 3 << 20};
  for (int step = 0; step < 5; ++step) {
    std::vector<void *> live;
    for (size_t s : sizes) live.push_back(alloc.alloc(s));
    for (size_t s : sizes) live.push_back(alloc.alloc(s));  // two of each at once
    for (size_t i = 0; i < live.size(); ++i) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(live[i]) % 64, 0u);
      alloc.free(live[i], sizes[i % 7]);
    }
    if (step == 0) {
      EXPECT_EQ(alloc.system_allocations(), 14u);
    }
  }
  EXPECT_EQ(alloc.system_allocations(), 14u);
}

TEST(CpuAllocator, SizeClassesWasteAtMostAQuarter) {
  for (size_t bytes = 1; bytes < (1u << 22); bytes = bytes * 3 / 2 + 1) {
    const size_t cls = te::CpuCachingAllocator::size_class(bytes);
    EXPECT_GE(cls, bytes);
    EXPECT_EQ(cls % 64, 0u);
    if (bytes > 256) {
      EXPECT_LE(cls, bytes + bytes / 4 + 64) << bytes;
    }
    EXPECT_EQ(te::CpuCachingAllocator::size_class(cls), cls) << "classes are fixed points";
  }
}

TEST(CpuBackend, AllocThroughTheInterfaceReusesBlocks) {
  auto be = te::make_cpu_backend();
  void *p = be->alloc(12345);
  be->free(p, 12345);
  EXPECT_EQ(be->alloc(12345), p);
  be->free(p, 12345);
  { te::Buffer b(be.get(), 12345); EXPECT_EQ(b.get(), p); }
  EXPECT_EQ(static_cast<te::CpuBackend *>(be.get())->allocator().system_allocations(), 1u);
}

TEST(CpuBackend, DeviceAndStream) {
  auto be = te::make_cpu_backend();
  EXPECT_EQ(be->device().type, te::DeviceType::CPU);
  EXPECT_EQ(be->device().index, 0);
  EXPECT_EQ(be->stream(), nullptr);
  be->set_stream(nullptr);
  be->synchronize();
  int dummy = 0;
  try {
    be->set_stream(&dummy);
    FAIL() << "a non-NULL stream must be rejected";
  } catch (const te::Error &e) {
    EXPECT_EQ(e.status(), te::Status::InvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("argument 'stream': a CPU context takes no stream (NULL), got 0x"), std::string::npos) << msg;
  }
  EXPECT_EQ(be->stream(), nullptr);
}

TEST(CpuBackend, CopiesAndFill) {
  auto be = te::make_cpu_backend();
  float src[4] = {1, 2, 3, 4}, dst[4] = {};
  be->copy(dst, src, sizeof src);
  EXPECT_EQ(dst[3], 4.0f);
  be->fill_floats(dst, 7.5f, 3);
  EXPECT_EQ(dst[0], 7.5f);
  EXPECT_EQ(dst[2], 7.5f);
  EXPECT_EQ(dst[3], 4.0f);
  be->copy_to_host(dst, src, sizeof(float));
  EXPECT_EQ(dst[0], 1.0f);
  be->copy_from_host(dst + 1, src + 3, sizeof(float));
  EXPECT_EQ(dst[1], 4.0f);
  be->copy(nullptr, nullptr, 0);
}

TEST(CpuBackend, GatherAmaxAndFusedScaleUpdate) {
  auto be = te::make_cpu_backend();
  std::vector<float> h1 = {2.0f, 1.0f, 4.0f}, h2 = {3.0f};
  float s1 = 1.0f, si1 = 1.0f, s2 = 1.0f, si2 = 1.0f;
  // Item 0 keeps its current amax in history[0], item 1 in a slot of its own (as AmaxSlots).
  float slot2 = 3.0f;
  te::ScaleUpdateItem items[2] = {
      {h1.data(), h1.data(), &s1, &si1, 3, 0, te::AmaxAlgo::Max, 448.0f},
      {h2.data(), &slot2, &s2, &si2, 1, 1, te::AmaxAlgo::MostRecent, 57344.0f},
  };
  float packed[2] = {};
  be->gather_amax(items, 2, packed);
  EXPECT_EQ(packed[0], 2.0f);
  EXPECT_EQ(packed[1], 3.0f);
  // As if a group all-reduce had raised the amaxes.
  const float reduced[2] = {8.0f, 7.0f};
  be->scale_update(items, 2, reduced);
  EXPECT_EQ(s1, 56.0f);     // 448 / max(8, 1, 4)
  EXPECT_EQ(si1, 1.0f / 56.0f);
  EXPECT_EQ(s2, 4096.0f);   // (57344 / 7) / 2
  EXPECT_EQ(h1, (std::vector<float>{0.0f, 4.0f, 8.0f}));
  EXPECT_EQ(h2, (std::vector<float>{0.0f}));
  EXPECT_EQ(slot2, 0.0f);  // consumed: the next step accumulates from zero
  be->scale_update(items, 2, nullptr);  // all-zero windows except h1: keep / recompute
  EXPECT_EQ(s1, 56.0f);     // max(0, 4, 8) = 8
  EXPECT_EQ(s2, 4096.0f);   // amax 0: previous scale kept
}

}  // namespace
