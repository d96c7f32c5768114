// Atomic file replacement (temporary file + fsync + rename + folder fsync).
#include "mp/core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <streambuf>
#include <vector>

#include "mp/core/error.hpp"

namespace mp {
namespace {

std::string errno_str(int err) { return std::strerror(err); }

/// The folder holding `path` ("." for a bare file name).
std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

/// An output stream buffer over a POSIX file descriptor that remembers the first write error (errno).
class FdStreamBuf : public std::streambuf {
 public:
  explicit FdStreamBuf(int fd) : fd_(fd), buf_(1 << 20) { setp(buf_.data(), buf_.data() + buf_.size()); }
  /// errno of the first failed write (0 when none).
  int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!flush_buffer()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n >= static_cast<std::streamsize>(buf_.size())) {  // large block: bypass the buffer
      if (!flush_buffer() || !write_all(s, static_cast<size_t>(n))) return 0;
      return n;
    }
    return std::streambuf::xsputn(s, n);
  }
  int sync() override { return flush_buffer() ? 0 : -1; }

 private:
  bool write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (error_ == 0) error_ = errno;
        return false;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  bool flush_buffer() {
    if (error_ != 0) return false;
    const size_t n = static_cast<size_t>(pptr() - pbase());
    const bool ok = write_all(pbase(), n);
    setp(buf_.data(), buf_.data() + buf_.size());
    return ok;
  }

  int fd_;
  std::vector<char> buf_;
  int error_ = 0;
};

/// The temporary file: removed on destruction unless committed.
struct TempFile {
  std::string path;
  int fd = -1;
  bool committed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

TempFile open_temp(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  TempFile t;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ counter.fetch_add(1);
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(r));
    const std::string tmp = path + suffix;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      t.path = tmp;
      t.fd = fd;
      return t;
    }
    const int err = errno;
    if (err != EEXIST)
      MP_FAIL("atomic_write_file: cannot create the temporary file '", tmp, "' for '", path, "': ", errno_str(err),
              "; check that the folder exists and is writable");
  }
  MP_FAIL("atomic_write_file: could not find a free temporary name next to '", path, "'; remove stale '", path,
          ".tmp.*' files");
}

/// fsync + close the temporary, rename it over `path`, fsync the folder.
void commit(TempFile& t, const std::string& path) {
  if (::fsync(t.fd) != 0) {
    const int err = errno;
    MP_FAIL("atomic_write_file: fsync of '", t.path, "' (for '", path, "') failed: ", errno_str(err),
            "; the old file is untouched");
  }
  const int fd = t.fd;
  t.fd = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    MP_FAIL("atomic_write_file: close of '", t.path, "' (for '", path, "') failed: ", errno_str(err),
            "; the old file is untouched");
  }
  if (::rename(t.path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    MP_FAIL("atomic_write_file: rename of '", t.path, "' to '", path, "' failed: ", errno_str(err),
            "; the old file is untouched");
  }
  t.committed = true;
  const std::string dir = parent_dir(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    const int err = errno;
    MP_FAIL("atomic_write_file: '", path, "' was replaced but its folder '", dir,
            "' cannot be opened to sync it: ", errno_str(err));
  }
  // Some file systems cannot fsync a folder (EINVAL): the rename is then as durable as they make it.
  if (::fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    const int err = errno;
    ::close(dfd);
    MP_FAIL("atomic_write_file: '", path, "' was replaced but syncing its folder '", dir, "' failed: ", errno_str(err));
  }
  ::close(dfd);
}

}  // namespace

void atomic_write_file(const std::string& path, std::string_view bytes) {
  atomic_write_file(path,
                    [&](std::ostream& os) { os.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

void atomic_write_file(const std::string& path, const std::function<void(std::ostream&)>& write) {
  MP_CHECK(!path.empty(), "atomic_write_file: expected a file path, got an empty string");
  TempFile t = open_temp(path);
  {
    FdStreamBuf buf(t.fd);
    std::ostream os(&buf);
    write(os);  // an exception leaves through TempFile's destructor, which removes the temporary
    os.flush();
    if (buf.error() != 0)
      MP_FAIL("atomic_write_file: writing '", t.path, "' (for '", path, "') failed: ", errno_str(buf.error()),
              "; the old file is untouched");
    MP_CHECK(os.good(), "atomic_write_file: the writer for '", path,
             "' left its stream in a failed state; the old file is untouched");
  }
  commit(t, path);
}

}  // namespace mp
