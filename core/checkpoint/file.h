// Checkpoint files: atomic replacement on write, whole-file validation on read.
#pragma once

#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"

namespace te {

// Writes `ck` to "<path>.tmp.<pid>", fsyncs it, renames it over `path` and fsyncs the directory:
// a reader sees the old file or the new one, never a partial one. On any failure the temporary
// file is removed and an error naming the path and the OS's reason (strerror) is thrown.
void write_checkpoint_file(const Checkpoint &ck, const std::string &path);

// Reads and validates the whole file (format.h's parse_checkpoint).
std::unique_ptr<Checkpoint> read_checkpoint_file(const std::string &path);

}  // namespace te
