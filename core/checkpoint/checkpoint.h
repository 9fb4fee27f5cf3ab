// A checkpoint: an in-memory set of named records (tensors and byte strings) behind a
// te_checkpoint handle. Records keep their insertion order (te_checkpoint_name lists them so, and
// the file stores them so); replacing a record keeps its place. The file format is format.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/handle.h"
#include "base/types.h"

namespace te {

enum class RecordKind : uint8_t { Tensor = 0, Bytes = 1 };

constexpr size_t kMaxRecordNameBytes = 255;

struct CheckpointRecord {
  std::string name;
  RecordKind kind = RecordKind::Bytes;
  DType dtype = DType::F32;  // tensors only
  int ndim = 0;              // tensors only: 1..kMaxDims
  int64_t shape[kMaxDims] = {};
  std::vector<uint8_t> payload;
};

// Only the dtypes a checkpoint stores: FP8 data is refused (its high-precision source is saved).
inline bool storable_dtype(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::I32; }

// A record name of 1..kMaxRecordNameBytes bytes (NUL-terminated as given); `arg` names the
// argument in the message. Returns its length.
size_t check_record_name(const char *name, const char *arg);

class Checkpoint : public Handle {
 public:
  Checkpoint() : Handle(HandleKind::Checkpoint) {}

  size_t count() const { return records_.size(); }
  const CheckpointRecord &at(size_t i) const { return records_[i]; }
  const CheckpointRecord *find(const std::string &name) const;

  // Adds `rec`, or replaces the record of the same name in place. Strong guarantee: on an
  // exception (out of memory) the checkpoint is unchanged.
  void put(CheckpointRecord &&rec);

 private:
  std::vector<CheckpointRecord> records_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in records_
};

}  // namespace te
