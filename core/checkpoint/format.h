// The checkpoint file format (docs/checkpoints.md describes it byte by byte). Little-endian:
//
//   magic        8 bytes  "TECKPT" 0x00 0x01
//   version      u32      kCheckpointFormatVersion
//   count        u64      number of records
//   count records, each:
//     name_len   u32      1..255
//     name       name_len bytes (no terminator; unique in the file)
//     kind       u8       0 tensor, 1 bytes
//     dtype      u8       tensor: te_dtype F32/F16/BF16/I32 (0, 1, 2, 5); bytes: 0
//     ndim       u8       tensor: 1..8; bytes: 0
//     reserved   u8       0
//     shape      ndim x i64, each >= 1
//     length     u64      payload bytes: tensor: product(shape) x dtype size exactly
//     payload    length bytes
//   crc32        u32      CRC-32 (IEEE 802.3, as zlib's crc32) of every byte before it
//
// Parsing trusts nothing: every length is checked against what remains before it is used, size
// arithmetic cannot overflow, and nothing is allocated beyond what the input itself holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"

namespace te {

constexpr uint8_t kCheckpointMagic[8] = {'T', 'E', 'C', 'K', 'P', 'T', 0x00, 0x01};
constexpr uint32_t kCheckpointFormatVersion = 1;

// CRC-32 (reflected polynomial 0xEDB88320, initial and final XOR 0xFFFFFFFF). Chain calls by
// passing the previous result as `crc` (0 to start).
uint32_t crc32_update(uint32_t crc, const void *data, size_t size);

// Where serialised bytes go (a caller's buffer, a file).
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void *data, size_t size) = 0;
};

// The exact number of bytes serialize_checkpoint writes.
uint64_t serialized_size(const Checkpoint &ck);
void serialize_checkpoint(const Checkpoint &ck, ByteSink &sink);

// Parses a whole serialised checkpoint. `source` names it in messages ("'ckpt.bin'", "argument
// 'buf'"), `noun` says what it is ("file", "buffer"). Throws InvalidArgument (bad magic,
// truncation, a malformed record, checksum mismatch) or Unsupported (another format version).
std::unique_ptr<Checkpoint> parse_checkpoint(const uint8_t *data, size_t size, const std::string &source,
                                             const char *noun);

}  // namespace te
