#include "checkpoint/format.h"

#include <cstring>
#include <utility>

#include "base/check.h"

namespace te {

namespace {

// The 256-entry CRC table, computed at compile time (no mutable state anywhere).
struct Crc32Table {
  uint32_t v[256];
  constexpr Crc32Table() : v{} {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      v[i] = c;
    }
  }
};

// Fixed-width little-endian encoding, whatever the host's byte order.
template <class T>
void store_le(uint8_t *p, T value) {
  auto u = static_cast<uint64_t>(value);
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
}
template <class T>
T load_le(const uint8_t *p) {
  uint64_t u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) u |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(u);
}

// Checksums everything it forwards.
class CrcSink {
 public:
  explicit CrcSink(ByteSink &out) : out_(out) {}
  void bytes(const void *data, size_t size) {
    crc_ = crc32_update(crc_, data, size);
    out_.write(data, size);
  }
  template <class T>
  void le(T value) {
    uint8_t b[sizeof(T)];
    store_le(b, value);
    bytes(b, sizeof b);
  }
  uint32_t crc() const { return crc_; }

 private:
  ByteSink &out_;
  uint32_t crc_ = 0;
};

constexpr size_t kHeaderBytes = 8 + 4 + 8;
constexpr size_t kTrailerBytes = 4;
constexpr size_t kRecordFixedBytes = 4 + 4 + 8;  // name_len, kind/dtype/ndim/reserved, length
constexpr size_t kMinRecordBytes = kRecordFixedBytes + 1;

size_t record_header_bytes(const CheckpointRecord &r) {
  return kRecordFixedBytes + r.name.size() + (r.kind == RecordKind::Tensor ? 8 * static_cast<size_t>(r.ndim) : 0);
}

uint64_t checked_add(uint64_t a, uint64_t b) {
  if (b > UINT64_MAX - a) fail(Status::InvalidArgument, "the checkpoint's size exceeds 2^64 bytes");
  return a + b;
}

// A cursor over untrusted bytes: every read checks what remains first.
class Reader {
 public:
  Reader(const uint8_t *data, size_t size, const std::string &source, const char *noun)
      : p_(data), left_(size), source_(source), noun_(noun) {}
  size_t offset() const { return offset_; }
  size_t left() const { return left_; }

  const uint8_t *take(size_t n, const char *what) {
    if (n > left_)
      fail(Status::InvalidArgument, "%s: truncated or corrupted %s: %s at byte %zu needs %zu bytes, only %zu remain",
           source_.c_str(), noun_, what, offset_, n, left_);
    const uint8_t *at = p_;
    p_ += n;
    left_ -= n;
    offset_ += n;
    return at;
  }
  template <class T>
  T le(const char *what) {
    return load_le<T>(take(sizeof(T), what));
  }
  [[noreturn]] void bad(const char *fmt, const char *detail, unsigned long long value) const;

 private:
  const uint8_t *p_;
  size_t left_;
  size_t offset_ = 0;
  const std::string &source_;
  const char *noun_;
};

void Reader::bad(const char *what, const char *detail, unsigned long long value) const {
  fail(Status::InvalidArgument, "%s: truncated or corrupted %s: %s %s (got %llu, before byte %zu)", source_.c_str(), noun_, what,
       detail, value, offset_);
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void *data, size_t size) {
  static constexpr Crc32Table table;
  const auto *p = static_cast<const uint8_t *>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table.v[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint64_t serialized_size(const Checkpoint &ck) {
  uint64_t n = kHeaderBytes + kTrailerBytes;
  for (size_t i = 0; i < ck.count(); ++i) {
    const CheckpointRecord &r = ck.at(i);
    n = checked_add(n, record_header_bytes(r));
    n = checked_add(n, r.payload.size());
  }
  return n;
}

void serialize_checkpoint(const Checkpoint &ck, ByteSink &sink) {
  CrcSink out(sink);
  out.bytes(kCheckpointMagic, sizeof kCheckpointMagic);
  out.le<uint32_t>(kCheckpointFormatVersion);
  out.le<uint64_t>(ck.count());
  for (size_t i = 0; i < ck.count(); ++i) {
    const CheckpointRecord &r = ck.at(i);
    const bool tensor = r.kind == RecordKind::Tensor;
    out.le<uint32_t>(static_cast<uint32_t>(r.name.size()));
    out.bytes(r.name.data(), r.name.size());
    const uint8_t meta[4] = {static_cast<uint8_t>(r.kind), static_cast<uint8_t>(tensor ? static_cast<int>(r.dtype) : 0),
                             static_cast<uint8_t>(tensor ? r.ndim : 0), 0};
    out.bytes(meta, sizeof meta);
    if (tensor)
      for (int d = 0; d < r.ndim; ++d) out.le<int64_t>(r.shape[d]);
    out.le<uint64_t>(r.payload.size());
    out.bytes(r.payload.data(), r.payload.size());
  }
  const uint32_t crc = out.crc();
  uint8_t trailer[4];
  store_le(trailer, crc);
  sink.write(trailer, sizeof trailer);
}

std::unique_ptr<Checkpoint> parse_checkpoint(const uint8_t *data, size_t size, const std::string &source,
                                             const char *noun) {
  const char *src = source.c_str();
  if (size < sizeof kCheckpointMagic || std::memcmp(data, kCheckpointMagic, sizeof kCheckpointMagic) != 0)
    fail(Status::InvalidArgument, "%s: not a libte checkpoint (%s)", src,
         size < sizeof kCheckpointMagic ? "shorter than the 8-byte magic" : "bad magic: expected \"TECKPT\\0\\1\"");
  Reader in(data, size, source, noun);
  in.take(sizeof kCheckpointMagic, "the magic");
  const uint32_t version = in.le<uint32_t>("the format version");
  if (version != kCheckpointFormatVersion)
    fail(Status::Unsupported, "%s: checkpoint format version %u is not supported (this libte reads version %u)", src,
         version, kCheckpointFormatVersion);
  const uint64_t count = in.le<uint64_t>("the record count");
  if (in.left() < kTrailerBytes)
    fail(Status::InvalidArgument, "%s: truncated %s: %zu bytes, shorter than an empty checkpoint", src, noun, size);
  if (count > (in.left() - kTrailerBytes) / kMinRecordBytes)
    in.bad("record count", "is more than the remaining bytes can hold", count);

  auto ck = std::make_unique<Checkpoint>();
  for (uint64_t i = 0; i < count; ++i) {
    CheckpointRecord r;
    const uint32_t name_len = in.le<uint32_t>("a record's name length");
    if (name_len < 1 || name_len > kMaxRecordNameBytes) in.bad("record name length", "is outside 1..255", name_len);
    const uint8_t *name = in.take(name_len, "a record's name");
    r.name.assign(reinterpret_cast<const char *>(name), name_len);
    if (r.name.find('\0') != std::string::npos) in.bad("record name", "contains a NUL byte at index", r.name.find('\0'));
    if (ck->find(r.name))
      fail(Status::InvalidArgument, "%s: corrupted %s: record name '%s' appears twice", src, noun, r.name.c_str());
    const uint8_t *meta = in.take(4, "a record's kind, dtype and ndim");
    if (meta[0] > static_cast<uint8_t>(RecordKind::Bytes)) in.bad("record kind", "is neither 0 (tensor) nor 1 (bytes)", meta[0]);
    if (meta[3] != 0) in.bad("reserved byte", "is not 0", meta[3]);
    r.kind = static_cast<RecordKind>(meta[0]);
    uint64_t expected_len = 0;
    if (r.kind == RecordKind::Tensor) {
      if (meta[1] > static_cast<uint8_t>(DType::I32) || !storable_dtype(static_cast<DType>(meta[1])))
        in.bad("tensor dtype", "is not F32 (0), F16 (1), BF16 (2) or I32 (5)", meta[1]);
      if (meta[2] < 1 || meta[2] > kMaxDims) in.bad("tensor ndim", "is outside 1..8", meta[2]);
      r.dtype = static_cast<DType>(meta[1]);
      r.ndim = meta[2];
      for (int d = 0; d < r.ndim; ++d) {
        r.shape[d] = in.le<int64_t>("a tensor dimension");
        if (r.shape[d] < 1) in.bad("tensor dimension", "is below 1", static_cast<unsigned long long>(r.shape[d]));
      }
      const int64_t numel = shape_numel(r.shape, r.ndim);  // -1 beyond kMaxElements: no overflow below
      if (numel < 0) in.bad("tensor shape", "has more than 2^60 elements", 0);
      expected_len = static_cast<uint64_t>(numel) * dtype_size(r.dtype);
    } else if (meta[1] != 0 || meta[2] != 0) {
      in.bad("byte record's dtype and ndim", "are not 0 (dtype * 256 + ndim)", meta[1] * 256u + meta[2]);
    }
    const uint64_t len = in.le<uint64_t>("a record's payload length");
    if (r.kind == RecordKind::Tensor && len != expected_len)
      fail(Status::InvalidArgument, "%s: corrupted %s: record '%s' holds %llu payload bytes, its dtype and shape need %llu",
           src, noun, r.name.c_str(), static_cast<unsigned long long>(len), static_cast<unsigned long long>(expected_len));
    if (len > in.left())  // before allocating: a hostile length never allocates more than the input holds
      fail(Status::InvalidArgument, "%s: truncated or corrupted %s: record '%s' claims %llu payload bytes, only %zu remain",
           src, noun, r.name.c_str(), static_cast<unsigned long long>(len), in.left());
    const uint8_t *payload = in.take(static_cast<size_t>(len), "a record's payload");
    r.payload.assign(payload, payload + len);
    ck->put(std::move(r));
  }
  if (in.left() != kTrailerBytes)
    fail(Status::InvalidArgument, "%s: %s %s: %zu bytes follow the last record, expected the 4-byte checksum", src,
         in.left() < kTrailerBytes ? "truncated" : "corrupted", noun, in.left());
  const size_t body = in.offset();
  const uint32_t stored = load_le<uint32_t>(in.take(kTrailerBytes, "the checksum"));
  if (crc32_update(0, data, body) != stored)
    fail(Status::InvalidArgument, "%s: checksum mismatch (%s corrupted)", src, noun);
  return ck;
}

}  // namespace te
