#include "checkpoint/file.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "checkpoint/format.h"

namespace te {

namespace {

[[noreturn]] void os_error(const char *what, const std::string &path, int err) {
  fail(err == ENOMEM ? Status::OutOfMemory : Status::InvalidArgument, "argument 'path': '%s': %s failed: %s", path.c_str(), what,
       std::strerror(err));
}

// Closes the descriptor and removes the temporary file unless released (the rename succeeded).
class TempFile {
 public:
  TempFile(const std::string &path) : path_(path) {
    // A leftover of a crashed writer that had this pid is removed; O_EXCL | O_NOFOLLOW then make
    // sure the file written is a new one, not something (a symlink) put in its place.
    ::unlink(path.c_str());
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) os_error("creating the temporary file", path, errno);
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!kept_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  void close_checked() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) os_error("close", path_, errno);
  }
  void keep() { kept_ = true; }

 private:
  std::string path_;
  int fd_ = -1;
  bool kept_ = false;
};

// Buffered writes to a descriptor (a checkpoint is many small header fields and a few large
// payloads: the buffer keeps the former from becoming one syscall each).
class FdSink : public ByteSink {
 public:
  FdSink(int fd, const std::string &path) : fd_(fd), path_(path) { buf_.reserve(kBuffer); }
  void write(const void *data, size_t size) override {
    const auto *p = static_cast<const uint8_t *>(data);
    if (buf_.size() + size > kBuffer) flush();
    if (size >= kBuffer) {
      write_all(p, size);
    } else {
      buf_.insert(buf_.end(), p, p + size);
    }
  }
  void flush() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  static constexpr size_t kBuffer = size_t{1} << 20;
  void write_all(const uint8_t *p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        os_error("write", path_, errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  int fd_;
  const std::string &path_;
  std::vector<uint8_t> buf_;
};

std::string directory_of(const std::string &path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void write_checkpoint_file(const Checkpoint &ck, const std::string &path) {
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  TempFile file(tmp);
  FdSink sink(file.fd(), tmp);
  serialize_checkpoint(ck, sink);
  sink.flush();
  if (::fsync(file.fd()) != 0) os_error("fsync", tmp, errno);
  file.close_checked();
  if (::rename(tmp.c_str(), path.c_str()) != 0) os_error("rename of the temporary file over it", path, errno);
  file.keep();
  // The rename is durable once the directory is: best effort (some file systems refuse to fsync a
  // directory, and the data itself is already on disk).
  const int dir = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

std::unique_ptr<Checkpoint> read_checkpoint_file(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) os_error("open", path, errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) os_error("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) fail(Status::InvalidArgument, "argument 'path': '%s': not a regular file", path.c_str());
  std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t r = ::read(fd, data.data() + got, data.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      os_error("read", path, errno);
    }
    if (r == 0) break;  // shrank while being read: parsed as the truncated file it now is
    got += static_cast<size_t>(r);
  }
  data.resize(got);
  return parse_checkpoint(data.data(), data.size(), "argument 'path': '" + path + "'", "file");
}

}  // namespace te
