// libFuzzer harness: te_checkpoint_deserialize on fuzzed bytes. Only <te/te.h> and libte.so.
//
// Input: the bytes of a serialised checkpoint, as a file holds them (the seeds, written by
// make_checkpoint_corpus.cpp, are real te_checkpoint_serialize output).
//
// Checks, besides "no crash, no sanitizer report, no leak":
//  - differential: the library accepts exactly what an independent parser written here from
//    docs/checkpoints.md accepts, and refuses with TE_ERROR_UNSUPPORTED exactly the well-framed
//    inputs of another format version (TE_ERROR_INVALID_ARGUMENT for everything else);
//  - a refusal leaves *out untouched and te_last_error() starts "te_checkpoint_deserialize: ";
//  - an accepted input is canonical: te_checkpoint_serialize gives back the input bytes exactly;
//    every record reads back (names in order, byte records by te_checkpoint_get_bytes, tensor
//    records by te_checkpoint_get_tensor with the parsed dtype and shape) with the input's
//    payload bytes; a read with another dtype or kind fails and leaves the destination untouched;
//  - after a put (a new byte record, or a replacement of the first record), the serialised
//    checkpoint parses again with the expected count.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"

FUZZ_SANITIZER_DEFAULTS

namespace {

using fuzz::violation;

// ---- the reference parser ------------------------------------------------------------------

uint32_t crc32_bitwise(const uint8_t *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

uint64_t le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

struct RefRecord {
  std::string name;
  int kind = 0;   // 0 tensor, 1 bytes
  int dtype = 0;  // te_dtype
  std::vector<int64_t> shape;
  const uint8_t *payload = nullptr;
  size_t len = 0;
};

enum class Verdict { Accept, Invalid, Unsupported };

size_t element_size(int dtype) { return dtype == TE_DTYPE_F16 || dtype == TE_DTYPE_BF16 ? 2 : 4; }

Verdict ref_parse(const uint8_t *d, size_t n, std::vector<RefRecord> *out) {
  static const uint8_t magic[8] = {'T', 'E', 'C', 'K', 'P', 'T', 0, 1};
  if (n < 8 || std::memcmp(d, magic, 8) != 0) return Verdict::Invalid;
  if (n < 12) return Verdict::Invalid;
  if (le(d + 8, 4) != 1) return Verdict::Unsupported;
  if (n < 20) return Verdict::Invalid;
  const uint64_t count = le(d + 12, 8);
  size_t pos = 20;
  auto have = [&](uint64_t k) { return k <= n - pos; };
  for (uint64_t i = 0; i < count; ++i) {
    RefRecord r;
    if (!have(4)) return Verdict::Invalid;
    const uint64_t name_len = le(d + pos, 4);
    pos += 4;
    if (name_len < 1 || name_len > 255 || !have(name_len)) return Verdict::Invalid;
    r.name.assign(reinterpret_cast<const char *>(d + pos), name_len);
    pos += name_len;
    if (r.name.find('\0') != std::string::npos) return Verdict::Invalid;
    for (const RefRecord &o : *out)
      if (o.name == r.name) return Verdict::Invalid;
    if (!have(4)) return Verdict::Invalid;
    const uint8_t kind = d[pos], dtype = d[pos + 1], ndim = d[pos + 2], reserved = d[pos + 3];
    pos += 4;
    if (reserved != 0 || kind > 1) return Verdict::Invalid;
    r.kind = kind;
    uint64_t need = 0;
    if (kind == 0) {
      if (dtype != TE_DTYPE_F32 && dtype != TE_DTYPE_F16 && dtype != TE_DTYPE_BF16 && dtype != TE_DTYPE_I32)
        return Verdict::Invalid;
      if (ndim < 1 || ndim > 8 || !have(8ull * ndim)) return Verdict::Invalid;
      r.dtype = dtype;
      unsigned __int128 numel = 1;
      for (int k = 0; k < ndim; ++k) {
        const int64_t dim = static_cast<int64_t>(le(d + pos, 8));
        pos += 8;
        if (dim < 1) return Verdict::Invalid;
        r.shape.push_back(dim);
        numel *= static_cast<uint64_t>(dim);
        if (numel > (static_cast<unsigned __int128>(1) << 60)) return Verdict::Invalid;
      }
      need = static_cast<uint64_t>(numel) * element_size(dtype);
    } else if (dtype != 0 || ndim != 0) {
      return Verdict::Invalid;
    }
    if (!have(8)) return Verdict::Invalid;
    const uint64_t len = le(d + pos, 8);
    pos += 8;
    if ((kind == 0 && len != need) || !have(len)) return Verdict::Invalid;
    r.payload = d + pos;
    r.len = static_cast<size_t>(len);
    pos += r.len;
    out->push_back(std::move(r));
  }
  if (n - pos != 4) return Verdict::Invalid;
  if (crc32_bitwise(d, pos) != static_cast<uint32_t>(le(d + pos, 4))) return Verdict::Invalid;
  return Verdict::Accept;
}

// ---- checks ----------------------------------------------------------------------------------

te_context *g_ctx = nullptr;

void expect_error_from(const char *fn) {
  const std::string prefix = std::string(fn) + ": ";
  if (std::strncmp(te_last_error(), prefix.c_str(), prefix.size()) != 0)
    violation("a failed %s left te_last_error() not starting with \"%s\"", fn, prefix.c_str());
}

std::vector<uint8_t> serialized(const te_checkpoint *ck) {
  size_t n = 0;
  if (te_checkpoint_serialize(ck, nullptr, 0, &n) != TE_SUCCESS) violation("te_checkpoint_serialize size query failed");
  std::vector<uint8_t> b(n);
  size_t n2 = 0;
  if (te_checkpoint_serialize(ck, b.data(), b.size(), &n2) != TE_SUCCESS || n2 != n)
    violation("te_checkpoint_serialize failed");
  return b;
}

void check_records(const te_checkpoint *ck, const std::vector<RefRecord> &ref) {
  size_t count = 0;
  if (te_checkpoint_count(ck, &count) != TE_SUCCESS || count != ref.size())
    violation("te_checkpoint_count gave %zu, the reference parsed %zu records", count, ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const RefRecord &r = ref[i];
    const char *name = nullptr;
    if (te_checkpoint_name(ck, i, &name) != TE_SUCCESS || !name || r.name != name)
      violation("record %zu: te_checkpoint_name differs from the reference's '%s'", i, r.name.c_str());
    size_t size = 0;
    const te_status sb = te_checkpoint_get_bytes(ck, name, nullptr, 0, &size);
    if (r.kind == 1) {
      if (sb != TE_SUCCESS || size != r.len) violation("record '%s': byte record size query failed or differs", name);
      fuzz::Blob buf(r.len);
      if (te_checkpoint_get_bytes(ck, name, buf.data(), r.len, &size) != TE_SUCCESS ||
          (r.len && std::memcmp(buf.data(), r.payload, r.len) != 0))
        violation("record '%s': byte payload differs from the input", name);
      continue;
    }
    if (sb == TE_SUCCESS) violation("record '%s': a tensor record read as bytes", name);
    expect_error_from("te_checkpoint_get_bytes");
    te_tensor t;
    std::memset(&t, 0, sizeof t);
    t.dtype = static_cast<te_dtype>(r.dtype);
    t.ndim = static_cast<int32_t>(r.shape.size());
    for (size_t k = 0; k < r.shape.size(); ++k) t.shape[k] = r.shape[k];
    t.device.type = TE_DEVICE_CPU;
    if (r.len > (size_t{1} << 24)) continue;  // cannot be: the input is smaller
    fuzz::Blob buf(r.len ? r.len : 1);
    t.data = buf.data();
    if (te_checkpoint_get_tensor(ck, g_ctx, name, &t) != TE_SUCCESS)
      violation("record '%s': te_checkpoint_get_tensor with the parsed dtype and shape failed", name);
    if (std::memcmp(buf.data(), r.payload, r.len) != 0) violation("record '%s': tensor payload differs from the input", name);
    // Another dtype of the same shape: refused, buffer untouched.
    fuzz::Blob other(r.len * 2 + 4);
    std::memset(other.data(), 0xA5, other.size());
    t.data = other.data();
    t.dtype = r.dtype == TE_DTYPE_F32 ? TE_DTYPE_I32 : TE_DTYPE_F32;
    if (te_checkpoint_get_tensor(ck, g_ctx, name, &t) == TE_SUCCESS) violation("record '%s': read with another dtype", name);
    expect_error_from("te_checkpoint_get_tensor");
    for (size_t k = 0; k < other.size(); ++k)
      if (other.data()[k] != 0xA5) violation("record '%s': a refused get_tensor wrote its destination", name);
  }
}

void check_put(te_checkpoint *ck, const std::vector<RefRecord> &ref, const uint8_t *data, size_t size) {
  // Replace the first record by a byte record (or add one), then parse the result again.
  const std::string name = ref.empty() ? std::string("fuzz.extra") : ref[0].name;
  if (te_checkpoint_put_bytes(ck, name.c_str(), data, size < 32 ? size : 32) != TE_SUCCESS)
    violation("te_checkpoint_put_bytes of a valid name failed");
  const std::vector<uint8_t> b = serialized(ck);
  std::vector<RefRecord> again;
  if (ref_parse(b.data(), b.size(), &again) != Verdict::Accept) violation("a serialised checkpoint does not parse");
  const size_t want = ref.empty() ? 1 : ref.size();
  if (again.size() != want || again[0].name != name || again[0].kind != 1)
    violation("after a put: %zu records (expected %zu), the first is not the put byte record", again.size(), want);
}

void run_one(const uint8_t *data, size_t size) {
  std::vector<RefRecord> ref;
  const Verdict verdict = ref_parse(data, size, &ref);

  te_checkpoint *const sentinel = reinterpret_cast<te_checkpoint *>(uintptr_t{0x5E47});
  te_checkpoint *ck = sentinel;
  const te_status s = te_checkpoint_deserialize(&ck, data, size);
  if (s != TE_SUCCESS) {
    if (ck != sentinel) violation("a failed te_checkpoint_deserialize wrote *out");
    expect_error_from("te_checkpoint_deserialize");
    const te_status want = verdict == Verdict::Unsupported ? TE_ERROR_UNSUPPORTED : TE_ERROR_INVALID_ARGUMENT;
    if (verdict == Verdict::Accept) violation("te_checkpoint_deserialize refused (%d) what the reference accepts", s);
    if (s != want) violation("te_checkpoint_deserialize returned %d, the reference expects %d", s, want);
    return;
  }
  if (verdict != Verdict::Accept) violation("te_checkpoint_deserialize accepted what the reference refuses");
  if (serialized(ck) != std::vector<uint8_t>(data, data + size))
    violation("an accepted checkpoint does not serialise back to the input bytes");
  check_records(ck, ref);
  check_put(ck, ref, data, size);
  te_checkpoint_destroy(ck);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_ctx) {
    te_context_options o;
    te_context_options_init(&o);
    o.use_default_device = 0;
    o.device.type = TE_DEVICE_CPU;
    if (te_context_create(&g_ctx, &o) != TE_SUCCESS) violation("te_context_create failed");
  }
  static const uint8_t empty = 0;
  if (!data) data = &empty;
  run_one(data, size);
  // A mutation almost never keeps the CRC-32 right, so the input runs a second time with its last
  // 4 bytes replaced by the checksum of the bytes before them: the structural checks behind the
  // checksum see mutated input too.
  if (size >= 4) {
    std::vector<uint8_t> fixed(data, data + size);
    const uint32_t crc = crc32_bitwise(fixed.data(), size - 4);
    for (int i = 0; i < 4; ++i) fixed[size - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
    if (std::memcmp(fixed.data(), data, size) != 0) run_one(fixed.data(), size);
  }
  return 0;
}
