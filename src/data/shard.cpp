// Token shard writer (temp + fsync + rename) and mmap reader; format in
// include/snip/data/shard.h.
#include "snip/data/shard.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snip/io/atomic_file.h"
#include "snip/core/error.h"

namespace snip::data {
namespace {

constexpr size_t kFlushBytes = 1 << 20;

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

size_t dtype_width(ShardDtype dtype) { return dtype == ShardDtype::kUint16 ? 2 : 4; }
ShardDtype dtype_for_vocab(uint32_t vocab_size) {
  return vocab_size <= 65536u ? ShardDtype::kUint16 : ShardDtype::kUint32;
}
const char* dtype_name(ShardDtype dtype) { return dtype == ShardDtype::kUint16 ? "uint16" : "uint32"; }

// ---------------------------------------------------------------- writer

ShardWriter::ShardWriter(std::string path, uint32_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size), dtype_(dtype_for_vocab(vocab_size)) {
  if (vocab_size == 0) fail("token shard ", path_, ": vocab_size must be positive, got 0");
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot write token shard ", path_, ": create ", tmp_, ": ", std::strerror(errno));
  buf_.reserve(kFlushBytes + 4096);
}

ShardWriter::~ShardWriter() {
  if (!done_) cleanup();
}

void ShardWriter::cleanup() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  done_ = true;
}

void ShardWriter::fail_io(const char* step, int err) {
  cleanup();
  fail("cannot write token shard ", path_, ": ", step, ": ", std::strerror(err));
}

void ShardWriter::write_all(const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_io("write", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

void ShardWriter::flush() {
  if (buf_.empty()) return;
  write_all(buf_.data(), buf_.size(), offset_);
  offset_ += buf_.size();
  buf_.clear();
}

void ShardWriter::append(const int32_t* tokens, size_t n) {
  SNIP_CHECK(!done_, "append after commit on ", path_);
  for (size_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= vocab_size_)
      fail("token shard ", path_, ": token id ", tokens[i], " out of range [0, ", vocab_size_, ")");
  const size_t width = dtype_width(dtype_);
  for (size_t i = 0; i < n; ++i) {
    const auto v = static_cast<uint32_t>(tokens[i]);
    buf_.push_back(static_cast<unsigned char>(v));
    buf_.push_back(static_cast<unsigned char>(v >> 8));
    if (width == 4) {
      buf_.push_back(static_cast<unsigned char>(v >> 16));
      buf_.push_back(static_cast<unsigned char>(v >> 24));
    }
    if (buf_.size() >= kFlushBytes) flush();
  }
  count_ += n;
}

void ShardWriter::commit() {
  SNIP_CHECK(!done_, "commit twice on ", path_);
  flush();
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 8);
  put_u32(header + 8, kShardVersion);
  put_u32(header + 12, static_cast<uint32_t>(dtype_));
  put_u64(header + 16, count_);
  put_u32(header + 24, vocab_size_);
  write_all(header, sizeof header, 0);
  if (::fsync(fd_) != 0) fail_io("fsync", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail_io("close", errno);
  }
  fd_ = -1;
  try {
    io::rename_atomic(tmp_, path_);
  } catch (...) {
    cleanup();
    throw;
  }
  done_ = true;
}

// ---------------------------------------------------------------- reader

ShardReader::ShardReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open token shard ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot open token shard ", path, ": ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("token shard ", path, ": not a regular file");
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    fail("token shard ", path, ": truncated: file is ", file_bytes, " bytes, smaller than the ", kShardHeaderBytes,
         "-byte header");
  }
  map_bytes_ = static_cast<size_t>(file_bytes);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("cannot map token shard ", path, ": ", std::strerror(map_err));
  }
  const auto* h = static_cast<const unsigned char*>(map_);
  try {
    if (std::memcmp(h, kShardMagic, 8) != 0)
      fail("token shard ", path, ": bad magic (expected \"SNIPTOK\\0\"): not a snip token shard");
    const uint32_t version = get_u32(h + 8);
    if (version != kShardVersion)
      fail("token shard ", path, ": unsupported version ", version, " (this build reads version ", kShardVersion, ")");
    const uint32_t dtype = get_u32(h + 12);
    if (dtype != static_cast<uint32_t>(ShardDtype::kUint16) && dtype != static_cast<uint32_t>(ShardDtype::kUint32))
      fail("token shard ", path, ": unknown dtype code ", dtype, " (expected 1 = uint16 or 2 = uint32)");
    dtype_ = static_cast<ShardDtype>(dtype);
    count_ = get_u64(h + 16);
    vocab_size_ = get_u32(h + 24);
    if (vocab_size_ == 0) fail("token shard ", path, ": vocab_size is 0 in the header");
    if (vocab_size_ > 0x7FFFFFFFu)
      fail("token shard ", path, ": vocab_size ", vocab_size_, " exceeds 2^31 - 1 (ids are read as int32)");
    if (dtype_ == ShardDtype::kUint16 && vocab_size_ > 65536u)
      fail("token shard ", path, ": vocab_size ", vocab_size_, " does not fit dtype uint16 (max 65536)");
    for (size_t i = 28; i < kShardHeaderBytes; ++i)
      if (h[i] != 0)
        fail("token shard ", path, ": reserved header byte ", i, " is ", unsigned(h[i]),
             ", expected 0 (a corrupt header, or a newer shard format)");
    const uint64_t width = dtype_width(dtype_);
    const uint64_t data_bytes = file_bytes - kShardHeaderBytes;
    if (count_ > data_bytes / width || count_ * width != data_bytes) {
      const bool truncated = count_ > data_bytes / width;
      fail("token shard ", path, ": ", truncated ? "truncated" : "trailing bytes", ": file is ", file_bytes,
           " bytes, header promises ", count_, " ", dtype_name(dtype_), " tokens = ", kShardHeaderBytes, " + ",
           count_, " * ", width, " bytes");
    }
  } catch (...) {
    unmap();
    throw;
  }
  data_ = h + kShardHeaderBytes;
}

ShardReader::~ShardReader() { unmap(); }

void ShardReader::unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  data_ = nullptr;
}

ShardReader::ShardReader(ShardReader&& o) noexcept { *this = std::move(o); }

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    data_ = o.data_;
    count_ = o.count_;
    vocab_size_ = o.vocab_size_;
    dtype_ = o.dtype_;
    o.map_ = nullptr;
    o.data_ = nullptr;
    o.count_ = 0;
  }
  return *this;
}

void ShardReader::read(uint64_t begin, uint64_t n, int32_t* out) const {
  SNIP_CHECK(begin <= count_ && n <= count_ - begin, "read [", begin, ", ", begin + n, ") beyond ", count_,
             " tokens of ", path_);
  if (dtype_ == ShardDtype::kUint16) {
    const unsigned char* p = data_ + 2 * begin;
    for (uint64_t i = 0; i < n; ++i, p += 2) out[i] = static_cast<int32_t>(p[0] | p[1] << 8);
  } else {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>((*this)[begin + i]);
  }
}

uint64_t ShardReader::find_out_of_range() const {
  for (uint64_t i = 0; i < count_; ++i)
    if ((*this)[i] >= vocab_size_) return i;
  return count_;
}

}  // namespace snip::data
