#include "checkpoint/checkpoint.h"

#include <cstring>
#include <utility>

#include "base/check.h"

namespace te {

size_t check_record_name(const char *name, const char *arg) {
  check_not_null(name, arg);
  // strnlen: a name without a terminator in its first 256 bytes is refused without reading on.
  const size_t n = strnlen(name, kMaxRecordNameBytes + 1);
  if (n == 0) fail(Status::InvalidArgument, "argument '%s': expected a record name of 1..%zu bytes, got an empty string", arg, kMaxRecordNameBytes);
  if (n > kMaxRecordNameBytes)
    fail(Status::InvalidArgument, "argument '%s': expected a record name of 1..%zu bytes, got a longer one (\"%.32s...\")",
         arg, kMaxRecordNameBytes, name);
  return n;
}

const CheckpointRecord *Checkpoint::find(const std::string &name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &records_[it->second];
}

void Checkpoint::put(CheckpointRecord &&rec) {
  auto it = index_.find(rec.name);
  if (it != index_.end()) {
    records_[it->second] = std::move(rec);  // moves of strings and vectors do not throw
    return;
  }
  // Reserve first, then index, then append (which cannot throw after the reserve): a failure at
  // either allocation leaves both containers as they were.
  if (records_.size() == records_.capacity()) records_.reserve(records_.size() * 2 + 4);
  index_.emplace(rec.name, records_.size());
  records_.push_back(std::move(rec));
}

}  // namespace te
