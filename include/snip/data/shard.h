// snip/data/shard.h: token shards, flat files of token ids, memory-mapped.
//
// Layout (version 1), all integers little-endian:
//
//   offset size  field
//   0      8     magic       "SNIPTOK\0"  (53 4E 49 50 54 4F 4B 00)
//   8      4     version     u32 = 1
//   12     4     dtype       u32: 1 = uint16, 2 = uint32 (token width 2 / 4 bytes)
//   16     8     count       u64: number of tokens
//   24     4     vocab_size  u32: tokens are in [0, vocab_size)
//   28     36    reserved    zero (readers refuse a non-zero byte: corrupt)
//   64     ...   tokens      count * width bytes
//
// File size is exactly 64 + count * width. uint16 is used when
// vocab_size <= 65536 (ids fit in 16 bits), uint32 otherwise. The 64-byte
// header keeps the token array 64-byte aligned in the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace snip::data {

inline constexpr char kShardMagic[8] = {'S', 'N', 'I', 'P', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

/// On-disk token width code (header field `dtype`).
enum class ShardDtype : uint32_t { kUint16 = 1, kUint32 = 2 };

/// Bytes per token of `dtype` (2 or 4).
size_t dtype_width(ShardDtype dtype);
/// kUint16 if vocab_size <= 65536, else kUint32.
ShardDtype dtype_for_vocab(uint32_t vocab_size);
/// "uint16" / "uint32".
const char* dtype_name(ShardDtype dtype);

/// Streams tokens into a shard. Writes `<path>.tmp.<pid>` in the target's
/// folder; commit() fills in the header count, fsyncs and renames it over
/// `path` (snip::io::rename_atomic), so readers never see a partial shard.
/// Destroying the writer without commit() removes the temp file.
class ShardWriter {
 public:
  /// Throws UserError if vocab_size is 0 or the temp file cannot be created
  /// ("cannot write token shard <path>: <reason>").
  ShardWriter(std::string path, uint32_t vocab_size);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Appends n token ids. Throws UserError "token shard <path>: token id X
  /// out of range [0, vocab_size)" (nothing of this call is appended then).
  void append(const int32_t* tokens, size_t n);
  void append(const std::vector<int32_t>& tokens) { append(tokens.data(), tokens.size()); }

  /// Tokens appended so far.
  uint64_t count() const { return count_; }
  ShardDtype dtype() const { return dtype_; }
  const std::string& path() const { return path_; }

  /// Flushes, writes the header, fsyncs and atomically renames into place.
  /// The writer is finished afterwards. Throws UserError on I/O errors (the
  /// temp file is removed then).
  void commit();

 private:
  void flush();
  void write_all(const void* data, size_t n, uint64_t offset);
  [[noreturn]] void fail_io(const char* step, int err);
  void cleanup() noexcept;

  std::string path_;
  std::string tmp_;
  uint32_t vocab_size_;
  ShardDtype dtype_;
  int fd_ = -1;
  uint64_t count_ = 0;
  uint64_t offset_ = kShardHeaderBytes;
  std::vector<unsigned char> buf_;
  bool done_ = false;
};

/// Read-only memory-mapped view of a shard, validated on open.
class ShardReader {
 public:
  /// Maps `path` and checks size >= 64, magic, version == 1, dtype code,
  /// vocab_size > 0 (and <= 65536 for uint16), reserved bytes 28..63 all
  /// zero, and file size ==
  /// 64 + count * width. Throws UserError "token shard <path>: <problem>"
  /// (e.g. "bad magic ...", "truncated: file is B bytes, header promises
  /// E bytes (64 + count * width)") otherwise.
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  /// Number of tokens.
  uint64_t size() const { return count_; }
  uint32_t vocab_size() const { return vocab_size_; }
  ShardDtype dtype() const { return dtype_; }
  const std::string& path() const { return path_; }

  /// Token i, unchecked (0 <= i < size()).
  uint32_t operator[](uint64_t i) const {
    if (dtype_ == ShardDtype::kUint16) {
      const unsigned char* p = data_ + 2 * i;
      return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
    }
    const unsigned char* p = data_ + 4 * i;
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
           static_cast<uint32_t>(p[3]) << 24;
  }

  /// Copies tokens [begin, begin + n) to out[0..n) as int32. Checked:
  /// SNIP_CHECK (internal error) if the range exceeds size().
  void read(uint64_t begin, uint64_t n, int32_t* out) const;

  /// Index of the first token >= vocab_size(), or size() if all are valid.
  /// O(size()) scan.
  uint64_t find_out_of_range() const;

 private:
  void unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // first token
  uint64_t count_ = 0;
  uint32_t vocab_size_ = 0;
  ShardDtype dtype_ = ShardDtype::kUint16;
};

}  // namespace snip::data
