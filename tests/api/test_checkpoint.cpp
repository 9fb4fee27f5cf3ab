// te_checkpoint_*: record round trips (bit-exact), the file format against an independent
// encoder written here from docs/checkpoints.md, atomic file writes, and hostile input: every
// single-byte corruption and every truncation of a small checkpoint is refused, never read back
// as different data.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <string>
#include <vector>

#include "api_test_util.h"

namespace {

using te_test::HostTensor;

struct CheckpointDeleter {
  void operator()(te_checkpoint *c) const { te_checkpoint_destroy(c); }
};
using CheckpointPtr = std::unique_ptr<te_checkpoint, CheckpointDeleter>;

CheckpointPtr make_checkpoint() {
  te_checkpoint *c = nullptr;
  EXPECT_TE_OK(te_checkpoint_create(&c));
  return CheckpointPtr(c);
}

std::vector<uint8_t> serialize(const te_checkpoint *ck) {
  size_t n = 0;
  EXPECT_TE_OK(te_checkpoint_serialize(ck, nullptr, 0, &n));
  std::vector<uint8_t> b(n);
  size_t n2 = 0;
  EXPECT_TE_OK(te_checkpoint_serialize(ck, b.data(), b.size(), &n2));
  EXPECT_EQ(n2, n);
  return b;
}

std::vector<uint8_t> get_bytes(const te_checkpoint *ck, const char *name) {
  size_t n = 0;
  EXPECT_TE_OK(te_checkpoint_get_bytes(ck, name, nullptr, 0, &n));
  std::vector<uint8_t> b(n);
  EXPECT_TE_OK(te_checkpoint_get_bytes(ck, name, b.data(), b.size(), &n));
  return b;
}

// CRC-32 bit by bit (no table): the reference for the library's table-driven one.
uint32_t crc32_ref(const uint8_t *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// An independent encoder of the documented format.
struct Encoder {
  std::vector<uint8_t> b;
  void u(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void raw(const void *p, size_t n) {
    const auto *c = static_cast<const uint8_t *>(p);
    b.insert(b.end(), c, c + n);
  }
  void header(uint64_t count, uint32_t version = 1) {
    const uint8_t magic[8] = {'T', 'E', 'C', 'K', 'P', 'T', 0, 1};
    raw(magic, 8);
    u(version, 4);
    u(count, 8);
  }
  void tensor(const std::string &name, int dtype, const std::vector<int64_t> &shape, const void *data, size_t n) {
    u(name.size(), 4);
    raw(name.data(), name.size());
    u(0, 1);
    u(static_cast<uint64_t>(dtype), 1);
    u(shape.size(), 1);
    u(0, 1);
    for (int64_t d : shape) u(static_cast<uint64_t>(d), 8);
    u(n, 8);
    raw(data, n);
  }
  void bytes(const std::string &name, const void *data, size_t n) {
    u(name.size(), 4);
    raw(name.data(), name.size());
    u(1, 1);
    u(0, 3);
    u(n, 8);
    raw(data, n);
  }
  std::vector<uint8_t> finish() {
    std::vector<uint8_t> out = b;
    const uint32_t c = crc32_ref(out.data(), out.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(c >> (8 * i)));
    return out;
  }
};

class Checkpoint : public te_test::CpuContextTest {
 protected:
  void SetUp() override {
    te_test::CpuContextTest::SetUp();
    char tmpl[] = "/tmp/te_ckpt_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (DIR *d = opendir(dir_.c_str())) {
      while (dirent *e = readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") std::remove((dir_ + "/" + n).c_str());
      }
      closedir(d);
    }
    rmdir(dir_.c_str());
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR *d = opendir(dir_.c_str())) {
      while (dirent *e = readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      closedir(d);
    }
    return out;
  }
  // A small checkpoint: one tensor of each storable dtype and a byte record.
  CheckpointPtr small(HostTensor *f32 = nullptr) {
    CheckpointPtr ck = make_checkpoint();
    HostTensor a = te_test::random_tensor(TE_DTYPE_F32, {3, 2}, -2.0f, 2.0f, 1);
    HostTensor h = te_test::random_tensor(TE_DTYPE_BF16, {4}, -2.0f, 2.0f, 2);
    EXPECT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, "w", a.get()));
    EXPECT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, "m", h.get()));
    const uint8_t step[3] = {7, 0, 9};
    EXPECT_TE_OK(te_checkpoint_put_bytes(ck.get(), "step", step, sizeof step));
    if (f32) *f32 = a;
    return ck;
  }
  std::string dir_;
};

TEST_F(Checkpoint, TensorsRoundTripBitExactForEveryStorableDtype) {
  CheckpointPtr ck = make_checkpoint();
  const te_dtype dtypes[] = {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16, TE_DTYPE_I32};
  std::vector<HostTensor> src;
  for (int i = 0; i < 4; ++i) {
    HostTensor t = te_test::make_tensor(dtypes[i], {2, 3, 5});
    for (size_t k = 0; k < t.bytes.size(); ++k) t.bytes[k] = static_cast<unsigned char>(k * 37 + i * 11 + 1);
    src.push_back(t);
    ASSERT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, ("t" + std::to_string(i)).c_str(), src.back().get()));
  }
  // Through the in-memory format and back.
  const std::vector<uint8_t> buf = serialize(ck.get());
  te_checkpoint *raw = nullptr;
  ASSERT_TE_OK(te_checkpoint_deserialize(&raw, buf.data(), buf.size()));
  CheckpointPtr back(raw);
  for (const te_checkpoint *c : {static_cast<const te_checkpoint *>(ck.get()), static_cast<const te_checkpoint *>(back.get())}) {
    for (int i = 0; i < 4; ++i) {
      HostTensor out = te_test::make_tensor(dtypes[i], {2, 3, 5});
      ASSERT_TE_OK(te_checkpoint_get_tensor(c, ctx_, ("t" + std::to_string(i)).c_str(), out.get()));
      EXPECT_EQ(out.bytes, src[i].bytes) << "dtype " << dtypes[i];
    }
  }
  // The put copied: changing the source afterwards does not change the record.
  std::vector<unsigned char> before = src[0].bytes;
  src[0].bytes[0] ^= 0xFF;
  HostTensor out = te_test::make_tensor(TE_DTYPE_F32, {2, 3, 5});
  ASSERT_TE_OK(te_checkpoint_get_tensor(ck.get(), ctx_, "t0", out.get()));
  EXPECT_EQ(out.bytes, before);
}

TEST_F(Checkpoint, RecordInfoTellsKindDtypeShapeAndSize) {
  CheckpointPtr ck = small();
  int32_t is_tensor = -1;
  size_t size = 0;
  te_tensor shape;
  std::memset(&shape, 0x5A, sizeof shape);
  ASSERT_TE_OK(te_checkpoint_record_info(ck.get(), "w", &is_tensor, &shape, &size));
  EXPECT_EQ(is_tensor, 1);
  EXPECT_EQ(size, 6u * 4u);
  EXPECT_EQ(shape.dtype, TE_DTYPE_F32);
  ASSERT_EQ(shape.ndim, 2);
  EXPECT_EQ(shape.shape[0], 3);
  EXPECT_EQ(shape.shape[1], 2);
  EXPECT_EQ(shape.data, nullptr);
  EXPECT_EQ(shape.scale_inv, nullptr);
  EXPECT_EQ(shape.device.type, TE_DEVICE_CPU);
  ASSERT_TE_OK(te_checkpoint_record_info(ck.get(), "m", &is_tensor, nullptr, &size));
  EXPECT_EQ(is_tensor, 1);
  EXPECT_EQ(size, 4u * 2u);
  te_tensor untouched;
  std::memset(&untouched, 0x5A, sizeof untouched);
  ASSERT_TE_OK(te_checkpoint_record_info(ck.get(), "step", &is_tensor, &untouched, &size));
  EXPECT_EQ(is_tensor, 0);
  EXPECT_EQ(size, 3u);
  EXPECT_EQ(untouched.ndim, 0x5A5A5A5A);
  // Errors leave the outputs alone.
  is_tensor = 7;
  size = 99;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_record_info", "name",
                 te_checkpoint_record_info(ck.get(), "absent", &is_tensor, &shape, &size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_record_info", "name",
                 te_checkpoint_record_info(ck.get(), nullptr, &is_tensor, &shape, &size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_record_info", "is_tensor",
                 te_checkpoint_record_info(ck.get(), "w", nullptr, &shape, &size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_record_info", "size",
                 te_checkpoint_record_info(ck.get(), "w", &is_tensor, &shape, nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_record_info", "ck",
                 te_checkpoint_record_info(nullptr, "w", &is_tensor, &shape, &size));
  EXPECT_EQ(is_tensor, 7);
  EXPECT_EQ(size, 99u);
}

TEST_F(Checkpoint, SerializedBytesAreExactlyTheDocumentedFormat) {
  CheckpointPtr ck = make_checkpoint();
  HostTensor a = te_test::random_tensor(TE_DTYPE_F32, {3, 2}, -2.0f, 2.0f, 1);
  HostTensor i32 = te_test::make_tensor(TE_DTYPE_I32, {5});
  for (size_t k = 0; k < i32.bytes.size(); ++k) i32.bytes[k] = static_cast<unsigned char>(250 - k);
  const char text[] = "opaque module state";
  ASSERT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, "layer0.weight", a.get()));
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "layer0.state", text, sizeof text));
  ASSERT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, "data.position", i32.get()));
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "empty", nullptr, 0));
  Encoder e;
  e.header(4);
  e.tensor("layer0.weight", 0, {3, 2}, a.bytes.data(), a.bytes.size());
  e.bytes("layer0.state", text, sizeof text);
  e.tensor("data.position", 5, {5}, i32.bytes.data(), i32.bytes.size());
  e.bytes("empty", nullptr, 0);
  EXPECT_EQ(serialize(ck.get()), e.finish());
  // The checksum of a known string (zlib's crc32 of "123456789"), as a check of the reference.
  EXPECT_EQ(crc32_ref(reinterpret_cast<const uint8_t *>("123456789"), 9), 0xCBF43926u);
  // An empty checkpoint: header and checksum only.
  CheckpointPtr empty = make_checkpoint();
  Encoder e0;
  e0.header(0);
  EXPECT_EQ(serialize(empty.get()), e0.finish());
}

TEST_F(Checkpoint, BytesReplaceNamesAndCount) {
  CheckpointPtr ck = make_checkpoint();
  size_t n = 99;
  ASSERT_TE_OK(te_checkpoint_count(ck.get(), &n));
  EXPECT_EQ(n, 0u);
  const uint8_t a[5] = {1, 2, 3, 4, 5}, b[2] = {9, 8};
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "a", a, sizeof a));
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "b", b, sizeof b));
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "c", nullptr, 0));
  EXPECT_EQ(get_bytes(ck.get(), "a"), std::vector<uint8_t>(a, a + 5));
  EXPECT_EQ(get_bytes(ck.get(), "c"), std::vector<uint8_t>());
  // Replacing keeps the record's place in the listing, and its kind may change.
  HostTensor t = te_test::random_tensor(TE_DTYPE_F16, {2, 2}, -1.0f, 1.0f, 3);
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "a", b, sizeof b));
  ASSERT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, "b", t.get()));
  ASSERT_TE_OK(te_checkpoint_count(ck.get(), &n));
  EXPECT_EQ(n, 3u);
  const char *names[3] = {};
  for (size_t i = 0; i < 3; ++i) ASSERT_TE_OK(te_checkpoint_name(ck.get(), i, &names[i]));
  EXPECT_STREQ(names[0], "a");
  EXPECT_STREQ(names[1], "b");
  EXPECT_STREQ(names[2], "c");
  EXPECT_EQ(get_bytes(ck.get(), "a"), std::vector<uint8_t>(b, b + 2));
  HostTensor out = te_test::make_tensor(TE_DTYPE_F16, {2, 2});
  ASSERT_TE_OK(te_checkpoint_get_tensor(ck.get(), ctx_, "b", out.get()));
  EXPECT_EQ(out.bytes, t.bytes);
  size_t sz = 0;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_bytes", "name", te_checkpoint_get_bytes(ck.get(), "b", nullptr, 0, &sz));
  const char *nm = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_name", "index", te_checkpoint_name(ck.get(), 3, &nm));
  EXPECT_EQ(nm, nullptr);
}

TEST_F(Checkpoint, GetBytesWithTooSmallCapacitySetsSizeAndWritesNothing) {
  CheckpointPtr ck = make_checkpoint();
  const uint8_t a[5] = {1, 2, 3, 4, 5};
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "a", a, sizeof a));
  uint8_t buf[4] = {0xEE, 0xEE, 0xEE, 0xEE};
  size_t size = 0;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_bytes", "capacity", te_checkpoint_get_bytes(ck.get(), "a", buf, sizeof buf, &size));
  EXPECT_EQ(size, 5u);
  for (uint8_t v : buf) EXPECT_EQ(v, 0xEE);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_bytes", "buf", te_checkpoint_get_bytes(ck.get(), "a", nullptr, 8, &size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_bytes", "size", te_checkpoint_get_bytes(ck.get(), "a", buf, 4, nullptr));
  // The same rule for serialize.
  std::vector<uint8_t> full = serialize(ck.get());
  std::vector<uint8_t> shorter(full.size() - 1, 0xEE);
  size = 0;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_serialize", "capacity",
                 te_checkpoint_serialize(ck.get(), shorter.data(), shorter.size(), &size));
  EXPECT_EQ(size, full.size());
  for (uint8_t v : shorter) EXPECT_EQ(v, 0xEE);
}

TEST_F(Checkpoint, WrongDtypeShapeOrMissingRecordLeavesTheTensorUnchanged) {
  CheckpointPtr ck = make_checkpoint();
  HostTensor a = te_test::random_tensor(TE_DTYPE_F32, {4, 3}, -2.0f, 2.0f, 5);
  ASSERT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, "w", a.get()));
  struct Case {
    te_dtype dtype;
    std::vector<int64_t> shape;
    const char *name;
  } cases[] = {{TE_DTYPE_BF16, {4, 3}, "w"}, {TE_DTYPE_F32, {3, 4}, "w"}, {TE_DTYPE_F32, {12}, "w"},
               {TE_DTYPE_F32, {4, 3, 1}, "w"}, {TE_DTYPE_I32, {4, 3}, "w"}, {TE_DTYPE_F32, {4, 3}, "missing"}};
  for (const Case &c : cases) {
    HostTensor out(c.dtype, c.shape, TE_SCALING_PER_TENSOR, 0x5A);
    const std::vector<unsigned char> before = out.bytes;
    const bool missing = std::string(c.name) == "missing";
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_tensor", missing ? "name" : "t",
                   te_checkpoint_get_tensor(ck.get(), ctx_, c.name, out.get()));
    EXPECT_EQ(out.bytes, before);
    if (!missing) EXPECT_NE(te_test::last_error().find("'w'"), std::string::npos) << te_test::last_error();
  }
  // A shape message names both shapes.
  HostTensor out(TE_DTYPE_F32, {3, 4});
  EXPECT_NE(te_checkpoint_get_tensor(ck.get(), ctx_, "w", out.get()), TE_SUCCESS);
  EXPECT_NE(te_test::last_error().find("[4, 3]"), std::string::npos) << te_test::last_error();
  EXPECT_NE(te_test::last_error().find("[3, 4]"), std::string::npos) << te_test::last_error();
  // A byte record is not a tensor.
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "bytes", "xy", 2));
  HostTensor two(TE_DTYPE_F32, {1});
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_tensor", "name", te_checkpoint_get_tensor(ck.get(), ctx_, "bytes", two.get()));
}

TEST_F(Checkpoint, NamesMustBeOneTo255BytesAndFp8IsRefused) {
  CheckpointPtr ck = make_checkpoint();
  const std::string n255(255, 'x'), n256(256, 'y');
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), n255.c_str(), "a", 1));
  EXPECT_EQ(get_bytes(ck.get(), n255.c_str()), std::vector<uint8_t>{'a'});
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_bytes", "name", te_checkpoint_put_bytes(ck.get(), n256.c_str(), "a", 1));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_bytes", "name", te_checkpoint_put_bytes(ck.get(), "", "a", 1));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_bytes", "name", te_checkpoint_put_bytes(ck.get(), nullptr, "a", 1));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_bytes", "data", te_checkpoint_put_bytes(ck.get(), "z", nullptr, 1));
  HostTensor f8(TE_DTYPE_E4M3, {16, 16});
  HostTensor f8b(TE_DTYPE_E5M2, {16, 16});
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_tensor", "t", te_checkpoint_put_tensor(ck.get(), ctx_, "f8", f8.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_tensor", "t", te_checkpoint_put_tensor(ck.get(), ctx_, "f8", f8b.get()));
  size_t n = 0;
  ASSERT_TE_OK(te_checkpoint_count(ck.get(), &n));
  EXPECT_EQ(n, 1u);
  // A failed put of an existing name leaves the old record.
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "keep", "old", 3));
  EXPECT_NE(te_checkpoint_put_tensor(ck.get(), ctx_, "keep", f8.get()), TE_SUCCESS);
  EXPECT_EQ(get_bytes(ck.get(), "keep"), (std::vector<uint8_t>{'o', 'l', 'd'}));
  // Duplicate names in a buffer are refused (the writer can never produce one).
  Encoder e;
  e.header(2);
  e.bytes("dup", "a", 1);
  e.bytes("dup", "b", 1);
  const std::vector<uint8_t> dup = e.finish();
  te_checkpoint *out = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_deserialize", nullptr, te_checkpoint_deserialize(&out, dup.data(), dup.size()));
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(te_test::last_error().find("twice"), std::string::npos) << te_test::last_error();
}

TEST_F(Checkpoint, BadHandlesAndNullArguments) {
  CheckpointPtr ck = make_checkpoint();
  HostTensor a = te_test::random_tensor(TE_DTYPE_F32, {2}, -1.0f, 1.0f, 4);
  size_t n = 0;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_create", "out", te_checkpoint_create(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_count", "ck", te_checkpoint_count(nullptr, &n));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_count", "count", te_checkpoint_count(ck.get(), nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_tensor", "ctx", te_checkpoint_put_tensor(ck.get(), nullptr, "a", a.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_tensor", "t", te_checkpoint_put_tensor(ck.get(), ctx_, "a", nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_tensor", "t", te_checkpoint_get_tensor(ck.get(), ctx_, "a", nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_write", "path", te_checkpoint_write(ck.get(), nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_write", "path", te_checkpoint_write(ck.get(), ""));
  te_checkpoint *out = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_read", "path", te_checkpoint_read(&out, nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_read", "out", te_checkpoint_read(nullptr, "x"));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_deserialize", "buf", te_checkpoint_deserialize(&out, nullptr, 0));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_serialize", "size", te_checkpoint_serialize(ck.get(), nullptr, 0, nullptr));
  // A context handle is not a checkpoint handle, and a destroyed checkpoint is refused.
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_count", "ck",
                 te_checkpoint_count(reinterpret_cast<const te_checkpoint *>(ctx_), &n));
  EXPECT_NE(te_test::last_error().find("te_context"), std::string::npos) << te_test::last_error();
  te_checkpoint *dead = nullptr;
  ASSERT_TE_OK(te_checkpoint_create(&dead));
  te_checkpoint_destroy(dead);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_bytes", "ck", te_checkpoint_put_bytes(dead, "a", "x", 1));
  EXPECT_NE(te_test::last_error().find("destroyed"), std::string::npos) << te_test::last_error();
  te_checkpoint_destroy(dead);     // a second destroy: no-op
  te_checkpoint_destroy(nullptr);  // no-op
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_count", "ck",
                 te_checkpoint_count(reinterpret_cast<const te_checkpoint *>(uintptr_t{0x1234}), &n));
}

TEST_F(Checkpoint, FileRoundTripAndAtomicReplace) {
  HostTensor a;
  CheckpointPtr ck = small(&a);
  const std::string path = dir_ + "/model.ckpt";
  ASSERT_TE_OK(te_checkpoint_write(ck.get(), path.c_str()));
  // The file holds exactly the serialised bytes, and no temporary file is left.
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(disk, serialize(ck.get()));
  EXPECT_EQ(files(), std::vector<std::string>{"model.ckpt"});
  te_checkpoint *raw = nullptr;
  ASSERT_TE_OK(te_checkpoint_read(&raw, path.c_str()));
  CheckpointPtr back(raw);
  EXPECT_EQ(serialize(back.get()), disk);
  HostTensor out = te_test::make_tensor(TE_DTYPE_F32, {3, 2});
  ASSERT_TE_OK(te_checkpoint_get_tensor(back.get(), ctx_, "w", out.get()));
  EXPECT_EQ(out.bytes, a.bytes);
  EXPECT_EQ(get_bytes(back.get(), "step"), (std::vector<uint8_t>{7, 0, 9}));
  // Writing again replaces the file.
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "step", "\x08", 1));
  ASSERT_TE_OK(te_checkpoint_write(ck.get(), path.c_str()));
  ASSERT_TE_OK(te_checkpoint_read(&raw, path.c_str()));
  CheckpointPtr again(raw);
  EXPECT_EQ(get_bytes(again.get(), "step"), (std::vector<uint8_t>{8}));
  EXPECT_EQ(files(), std::vector<std::string>{"model.ckpt"});
}

TEST_F(Checkpoint, UnwritableOrMissingPathsFailCleanly) {
  CheckpointPtr ck = small();
  const std::string missing_dir = dir_ + "/no/such/dir/x.ckpt";
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_write", nullptr, te_checkpoint_write(ck.get(), missing_dir.c_str()));
  EXPECT_NE(te_test::last_error().find(missing_dir), std::string::npos) << te_test::last_error();
  EXPECT_NE(te_test::last_error().find("No such file"), std::string::npos) << te_test::last_error();
  // A read-only directory (unless running as root, who may write anyway).
  const std::string ro = dir_ + "/ro";
  ASSERT_EQ(mkdir(ro.c_str(), 0500), 0);
  if (geteuid() != 0) {
    EXPECT_NE(te_checkpoint_write(ck.get(), (ro + "/x.ckpt").c_str()), TE_SUCCESS);
    EXPECT_NE(te_test::last_error().find("Permission denied"), std::string::npos) << te_test::last_error();
  }
  // The target is a directory: the temporary file is written, the rename fails, and the
  // temporary file is removed.
  const std::string target = dir_ + "/isdir";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_write", nullptr, te_checkpoint_write(ck.get(), target.c_str()));
  EXPECT_NE(te_test::last_error().find("rename"), std::string::npos) << te_test::last_error();
  std::vector<std::string> left = files();
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"isdir", "ro"}));
  rmdir(ro.c_str());
  rmdir(target.c_str());
  te_checkpoint *out = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_read", nullptr, te_checkpoint_read(&out, (dir_ + "/absent").c_str()));
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(te_test::last_error().find("absent"), std::string::npos) << te_test::last_error();
}

// Every single-byte corruption (each bit pattern flip of each byte) and every truncation of a
// small checkpoint is refused: never a success with other data, never a crash.
TEST_F(Checkpoint, EveryByteFlipAndEveryTruncationIsRefused) {
  CheckpointPtr ck = small();
  const std::vector<uint8_t> good = serialize(ck.get());
  const std::string path = dir_ + "/c.ckpt";
  ASSERT_GT(good.size(), 40u);
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= flip;
      te_checkpoint *out = nullptr;
      const te_status s = te_checkpoint_deserialize(&out, bad.data(), bad.size());
      EXPECT_TRUE(s == TE_ERROR_INVALID_ARGUMENT || s == TE_ERROR_UNSUPPORTED) << "byte " << i << " ^ " << int(flip) << ": " << s;
      EXPECT_EQ(out, nullptr);
      EXPECT_EQ(te_test::last_error().rfind("te_checkpoint_deserialize: ", 0), 0u) << te_test::last_error();
    }
  }
  for (size_t n = 0; n < good.size(); ++n) {
    te_checkpoint *out = nullptr;
    const te_status s = te_checkpoint_deserialize(&out, good.data(), n);
    EXPECT_EQ(s, TE_ERROR_INVALID_ARGUMENT) << "length " << n;
    EXPECT_EQ(out, nullptr);
  }
  // A byte appended is refused too.
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  te_checkpoint *out = nullptr;
  EXPECT_EQ(te_checkpoint_deserialize(&out, longer.data(), longer.size()), TE_ERROR_INVALID_ARGUMENT);
  // Through a file: the message names the path and says what is wrong.
  std::vector<uint8_t> bad = good;
  bad[good.size() - 6] ^= 0x10;  // inside the last payload: only the checksum catches it
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char *>(bad.data()), static_cast<std::streamsize>(bad.size()));
  }
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_read", nullptr, te_checkpoint_read(&out, path.c_str()));
  EXPECT_EQ(te_test::last_error(), "te_checkpoint_read: argument 'path': '" + path + "': checksum mismatch (file corrupted)");
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(good.data()), 30);
  }
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_read", nullptr, te_checkpoint_read(&out, path.c_str()));
  EXPECT_NE(te_test::last_error().find("truncated"), std::string::npos) << te_test::last_error();
  EXPECT_EQ(out, nullptr);
}

TEST_F(Checkpoint, HostileHeadersAreRefusedWithoutHugeAllocations) {
  te_checkpoint *out = nullptr;
  // Another format version: UNSUPPORTED naming both versions.
  Encoder v2;
  v2.header(0, 2);
  std::vector<uint8_t> b = v2.finish();
  EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_checkpoint_deserialize", nullptr, te_checkpoint_deserialize(&out, b.data(), b.size()));
  EXPECT_NE(te_test::last_error().find("version 2"), std::string::npos) << te_test::last_error();
  EXPECT_NE(te_test::last_error().find("version 1"), std::string::npos) << te_test::last_error();
  // Bad magic.
  b[0] = 'X';
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_deserialize", nullptr, te_checkpoint_deserialize(&out, b.data(), b.size()));
  EXPECT_NE(te_test::last_error().find("magic"), std::string::npos) << te_test::last_error();
  // A huge record count, payload length or shape, each with a correct checksum.
  Encoder many;
  many.header(UINT64_MAX);
  b = many.finish();
  EXPECT_EQ(te_checkpoint_deserialize(&out, b.data(), b.size()), TE_ERROR_INVALID_ARGUMENT);
  Encoder huge_payload;
  huge_payload.header(1);
  huge_payload.u(1, 4);
  huge_payload.raw("h", 1);
  huge_payload.u(1, 1);
  huge_payload.u(0, 3);
  huge_payload.u(UINT64_MAX - 3, 8);
  b = huge_payload.finish();
  EXPECT_EQ(te_checkpoint_deserialize(&out, b.data(), b.size()), TE_ERROR_INVALID_ARGUMENT);
  // Shapes whose product overflows or wraps to the payload's size.
  const std::vector<std::vector<int64_t>> shapes = {
      {INT64_MAX, INT64_MAX}, {int64_t{1} << 32, int64_t{1} << 32}, {int64_t{1} << 62, 4}, {0, 1}, {-1, -4}, {1, 1, 1, 1, 1, 1, 1, 1, 1}};
  for (const auto &shape : shapes) {
    Encoder e;
    e.header(1);
    const float v = 1.0f;
    e.tensor("t", 0, shape, &v, 4);
    b = e.finish();
    EXPECT_EQ(te_checkpoint_deserialize(&out, b.data(), b.size()), TE_ERROR_INVALID_ARGUMENT) << shape.size();
  }
  // FP8 dtypes and unknown dtypes and kinds.
  for (int dtype : {3, 4, 6, 255}) {
    Encoder e;
    e.header(1);
    const uint8_t v = 1;
    e.tensor("t", dtype, {1}, &v, 1);
    b = e.finish();
    EXPECT_EQ(te_checkpoint_deserialize(&out, b.data(), b.size()), TE_ERROR_INVALID_ARGUMENT) << dtype;
  }
  // A name with a NUL byte, of length 0 and of length 256.
  for (const std::string &name : {std::string("a\0b", 3), std::string(), std::string(256, 'n')}) {
    Encoder e;
    e.header(1);
    e.bytes(name, "x", 1);
    b = e.finish();
    EXPECT_EQ(te_checkpoint_deserialize(&out, b.data(), b.size()), TE_ERROR_INVALID_ARGUMENT) << name.size();
  }
  EXPECT_EQ(out, nullptr);
}

// A module's state (te_linear_state_save's bytes) as a byte record: written, read, loaded into a
// fresh module, which then saves the same bytes.
TEST_F(Checkpoint, LinearStateRoundTripsThroughAFile) {
  te_test::LinearPtr lin = te_test::make_linear(ctx_, 32, 16, 1, TE_DTYPE_BF16);
  HostTensor w = te_test::random_tensor(TE_DTYPE_BF16, {16, 32}, -0.5f, 0.5f, 9);
  HostTensor bias = te_test::random_tensor(TE_DTYPE_BF16, {16}, -0.5f, 0.5f, 10);
  {  // two FP8 steps, so that the state (amax history, scales) is not a fresh layer's
    te_test::RecipePtr recipe = te_test::make_recipe(TE_RECIPE_DELAYED_SCALING, 4);
    for (int step = 0; step < 2; ++step) {
      te_test::AutocastScope scope(ctx_, recipe.get());
      HostTensor x = te_test::random_tensor(TE_DTYPE_BF16, {16, 32}, -3.0f, 3.0f, 20 + step);
      HostTensor y(TE_DTYPE_BF16, {16, 16});
      te_linear_forward_args fa;
      ASSERT_TE_OK(te_linear_forward_args_init(&fa));
      fa.input = x.get();
      fa.weight = w.get();
      fa.bias = bias.get();
      te_linear_backward_ctx *bwd = nullptr;
      ASSERT_TE_OK(te_linear_forward(ctx_, lin.get(), &fa, y.get(), &bwd));
      te_linear_backward_ctx_destroy(bwd);
    }
  }
  size_t n = 0;
  ASSERT_TE_OK(te_linear_state_save(ctx_, lin.get(), nullptr, 0, &n));
  std::vector<uint8_t> state(n);
  ASSERT_TE_OK(te_linear_state_save(ctx_, lin.get(), state.data(), n, &n));
  CheckpointPtr ck = make_checkpoint();
  ASSERT_TE_OK(te_checkpoint_put_bytes(ck.get(), "layer.state", state.data(), state.size()));
  ASSERT_TE_OK(te_checkpoint_put_tensor(ck.get(), ctx_, "layer.weight", w.get()));
  const std::string path = dir_ + "/train.ckpt";
  ASSERT_TE_OK(te_checkpoint_write(ck.get(), path.c_str()));
  ck.reset();

  te_checkpoint *raw = nullptr;
  ASSERT_TE_OK(te_checkpoint_read(&raw, path.c_str()));
  CheckpointPtr back(raw);
  te_test::LinearPtr fresh = te_test::make_linear(ctx_, 32, 16, 1, TE_DTYPE_BF16);
  size_t fresh_n = 0;
  ASSERT_TE_OK(te_linear_state_save(ctx_, fresh.get(), nullptr, 0, &fresh_n));
  std::vector<uint8_t> fresh_state(fresh_n);
  ASSERT_TE_OK(te_linear_state_save(ctx_, fresh.get(), fresh_state.data(), fresh_n, &fresh_n));
  ASSERT_NE(fresh_state, state) << "the trained state should differ from a fresh layer's";
  const std::vector<uint8_t> loaded = get_bytes(back.get(), "layer.state");
  EXPECT_EQ(loaded, state);
  ASSERT_TE_OK(te_linear_state_load(ctx_, fresh.get(), loaded.data(), loaded.size()));
  size_t again_n = 0;
  ASSERT_TE_OK(te_linear_state_save(ctx_, fresh.get(), nullptr, 0, &again_n));
  std::vector<uint8_t> again(again_n);
  ASSERT_TE_OK(te_linear_state_save(ctx_, fresh.get(), again.data(), again_n, &again_n));
  EXPECT_EQ(again, state);
  HostTensor w2 = te_test::make_tensor(TE_DTYPE_BF16, {16, 32});
  ASSERT_TE_OK(te_checkpoint_get_tensor(back.get(), ctx_, "layer.weight", w2.get()));
  EXPECT_EQ(w2.bytes, w.bytes);
}

// On a CUDA context (skipped without a usable GPU): put copies device memory to the host and get
// copies back, bit-exact, and the bytes equal a CPU context's checkpoint of the same data; a
// tensor on another device is refused.
TEST_F(Checkpoint, CudaContextRoundTripMatchesTheCpuOne) {
  te_context_options o;
  ASSERT_TE_OK(te_context_options_init(&o));
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CUDA;
  o.device.index = 0;
  te_context *raw_ctx = nullptr;
  if (te_context_create(&raw_ctx, &o) != TE_SUCCESS) GTEST_SKIP() << "no CUDA context: " << te_test::last_error();
  te_test::ContextPtr gpu(raw_ctx);
  HostTensor host = te_test::random_tensor(TE_DTYPE_BF16, {8, 24}, -3.0f, 3.0f, 77);
  void *dev = nullptr, *dev_out = nullptr;
  ASSERT_TE_OK(te_context_malloc(gpu.get(), host.bytes.size(), &dev));
  ASSERT_TE_OK(te_context_malloc(gpu.get(), host.bytes.size(), &dev_out));
  ASSERT_TE_OK(te_context_copy(gpu.get(), dev, host.bytes.data(), host.bytes.size(), TE_COPY_HOST_TO_DEVICE));
  const std::vector<unsigned char> junk(host.bytes.size(), 0x3C);
  ASSERT_TE_OK(te_context_copy(gpu.get(), dev_out, junk.data(), junk.size(), TE_COPY_HOST_TO_DEVICE));
  te_tensor td = host.t, tout = host.t;
  td.data = dev;
  td.device.type = TE_DEVICE_CUDA;
  tout.data = dev_out;
  tout.device.type = TE_DEVICE_CUDA;

  CheckpointPtr on_gpu = make_checkpoint(), on_cpu = make_checkpoint();
  ASSERT_TE_OK(te_checkpoint_put_tensor(on_gpu.get(), gpu.get(), "w", &td));
  ASSERT_TE_OK(te_checkpoint_put_tensor(on_cpu.get(), ctx_, "w", host.get()));
  EXPECT_EQ(serialize(on_gpu.get()), serialize(on_cpu.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_put_tensor", "t", te_checkpoint_put_tensor(on_gpu.get(), gpu.get(), "h", host.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_checkpoint_get_tensor", "t", te_checkpoint_get_tensor(on_cpu.get(), ctx_, "w", &tout));

  ASSERT_TE_OK(te_checkpoint_get_tensor(on_cpu.get(), gpu.get(), "w", &tout));
  std::vector<unsigned char> back(host.bytes.size());
  ASSERT_TE_OK(te_context_copy(gpu.get(), back.data(), dev_out, back.size(), TE_COPY_DEVICE_TO_HOST));
  EXPECT_EQ(back, host.bytes);
  EXPECT_TE_OK(te_context_free(gpu.get(), dev));
  EXPECT_TE_OK(te_context_free(gpu.get(), dev_out));
}

}  // namespace
