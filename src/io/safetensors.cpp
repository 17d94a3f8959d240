// safetensors reader/writer (see snip/io/safetensors.h for the format).
#include "snip/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/core/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "snip::io assumes a little-endian host (safetensors data is little-endian)");

namespace snip::io {
namespace {

using json = nlohmann::json;

struct DTypeInfo {
  DType dtype;
  const char* name;
  int bits;
};

// The format's dtype names and bits per element (safetensors/src/tensor.rs,
// `Dtype` and `Dtype::bitsize`), in the order of the DType enum.
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 8},
    {DType::U8, "U8", 8},
    {DType::I8, "I8", 8},
    {DType::I16, "I16", 16},
    {DType::U16, "U16", 16},
    {DType::F16, "F16", 16},
    {DType::BF16, "BF16", 16},
    {DType::I32, "I32", 32},
    {DType::U32, "U32", 32},
    {DType::F32, "F32", 32},
    {DType::F64, "F64", 64},
    {DType::I64, "I64", 64},
    {DType::U64, "U64", 64},
    {DType::F8_E4M3, "F8_E4M3", 8},
    {DType::F8_E5M2, "F8_E5M2", 8},
    {DType::F8_E8M0, "F8_E8M0", 8},
    {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {DType::F4, "F4", 4},
    {DType::F6_E2M3, "F6_E2M3", 6},
    {DType::F6_E3M2, "F6_E3M2", 6},
    {DType::C64, "C64", 64},
};

const DTypeInfo& info(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i;
  SNIP_CHECK(false, "unhandled DType ", static_cast<int>(d));
  return kDTypes[0];  // unreachable
}

/// Shape as "[2, 3]" for messages.
std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Why a tensor of `shape` and `dtype` has no byte size ("" when it has
/// one, then stored in *out): a negative dim, a size past 64 bits, or a
/// sub-byte tensor that does not end on a byte boundary (the reference's
/// rule: numel * bits must be a multiple of 8).
std::string byte_size(const std::vector<int64_t>& shape, DType dtype, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return str_cat("negative dim ", d, " in shape ", shape_str(shape));
    const uint64_t ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > UINT64_MAX / ud)
      return str_cat("shape ", shape_str(shape), " of ", dtype_name(dtype), " overflows 64 bits");
    n *= ud;
  }
  const uint64_t bits = static_cast<uint64_t>(dtype_bits(dtype));
  if (n > UINT64_MAX / bits)
    return str_cat("shape ", shape_str(shape), " of ", dtype_name(dtype), " overflows 64 bits");
  if ((n * bits) % 8 != 0)
    return str_cat("shape ", shape_str(shape), " of ", dtype_name(dtype), " holds ", n, " elements of ", bits,
                   " bits = ", n * bits, " bits, not a whole number of bytes (the format needs numel x ", bits,
                   " bits to be a multiple of 8)");
  *out = n * bits / 8;
  return "";
}

/// One parsed header entry.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;  // sorted by (begin, end): file order
};

const char* json_type(const json& j) { return j.type_name(); }

uint64_t load_u64_le(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian host (static_assert above)
  return v;
}

/// Checks the header length N against the limit and the file size (bytes).
void check_header_len(uint64_t n, uint64_t file_size, const std::string& what) {
  if (n > kMaxHeaderBytes)
    fail(what, ": header length ", n, " bytes exceeds the limit of ", kMaxHeaderBytes,
         " bytes (corrupt file?)");
  if (n > file_size - 8)
    fail(what, ": header length ", n, " bytes is larger than the file (", file_size,
         " bytes, ", file_size - 8, " after the 8-byte length)");
}

/// Parses and validates the JSON header; `buffer_size` is the byte-buffer
/// size (file size - 8 - N).
Header parse_header(std::string_view text, uint64_t buffer_size, const std::string& what) {
  if (text.empty()) fail(what, ": header is empty (expected a JSON object starting with '{')");
  if (text[0] != '{') {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[0]));
    fail(what, ": header does not start with '{' (first byte is ", hex, ")");
  }
  // nlohmann stops at a NUL byte as if the input ended; a raw NUL is never
  // valid JSON (it must be escaped inside strings), so reject it here.
  if (text.find('\0') != std::string_view::npos)
    fail(what, ": header is not valid UTF-8 JSON: raw NUL byte at offset ",
         text.find('\0'), " (zero padding? the spec pads with spaces)");
  // Syntax, duplicate keys (nlohmann keeps the last silently), nesting
  // depth and numbers past a double's range, named by their JSON path.
  const json h = parse_json(text, what + ": header");
  if (!h.is_object()) fail(what, ": header is not a JSON object (got ", json_type(h), ")");

  Header out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        fail(what, ": \"__metadata__\" must be an object of strings, got ", json_type(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(what, ": \"__metadata__\" value for key \"", m.key(),
               "\" must be a string, got ", json_type(m.value()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string t = str_cat(what, ": tensor \"", name, "\": ");
    if (!v.is_object())
      fail(t, "expected an object with dtype, shape, data_offsets, got ", json_type(v));
    for (const char* k : {"dtype", "shape", "data_offsets"})
      if (!v.contains(k)) fail(t, "missing key \"", k, "\"");
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        fail(t, "unexpected key \"", k.key(), "\" (expected only dtype, shape, data_offsets)");

    Entry e;
    e.name = name;
    const json& jd = v["dtype"];
    if (!jd.is_string()) fail(t, "dtype must be a string, got ", json_type(jd));
    try {
      e.dtype = parse_dtype(jd.get<std::string>());
    } catch (const UserError& err) {
      fail(t, err.what());
    }
    const json& js = v["shape"];
    if (!js.is_array()) fail(t, "shape must be an array of integers, got ", json_type(js));
    for (const json& d : js) {
      if (d.is_number_unsigned()) {
        if (d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
          fail(t, "dim ", json_excerpt(d), " in shape is too large");
        e.shape.push_back(d.get<int64_t>());
      } else if (d.is_number_integer()) {
        fail(t, "negative dim ", json_excerpt(d), " in shape ", json_excerpt(js));
      } else {
        fail(t, "shape must be an array of integers, found ", json_excerpt(d));
      }
    }
    const json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() ||
        !jo[1].is_number_unsigned() || jo[0].get<uint64_t>() > jo[1].get<uint64_t>())
      fail(t, "data_offsets must be [begin, end] with 0 <= begin <= end, got ", json_excerpt(jo));
    e.begin = jo[0].get<uint64_t>();
    e.end = jo[1].get<uint64_t>();
    uint64_t need = 0;
    if (const std::string why = byte_size(e.shape, e.dtype, &need); !why.empty()) fail(t, why);
    if (e.end - e.begin != need)
      fail(t, "data_offsets ", json_excerpt(jo), " span ", e.end - e.begin, " bytes but shape ",
           shape_str(e.shape), " of ", dtype_name(e.dtype), " needs ", need, " bytes");
    out.entries.push_back(std::move(e));
  }

  // The ranges must tile [0, buffer_size) exactly.
  std::sort(out.entries.begin(), out.entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : out.entries) {
    if (e.begin < pos)
      fail(what, ": tensor \"", e.name, "\" (bytes [", e.begin, ", ", e.end,
           ")) overlaps tensor \"", prev->name, "\" (bytes [", prev->begin, ", ", prev->end,
           "))");
    if (e.begin > pos)
      fail(what, ": hole in the data buffer: bytes [", pos, ", ", e.begin,
           ") are not covered by any tensor (before tensor \"", e.name, "\")");
    pos = e.end;
    prev = &e;
  }
  if (pos > buffer_size)
    fail(what, ": tensor \"", prev->name, "\" ends at byte ", pos,
         " past the end of the data buffer (", buffer_size, " bytes; truncated file?)");
  if (pos < buffer_size)
    fail(what, ": data buffer has ", buffer_size - pos,
         " trailing bytes not covered by any tensor (buffer ", buffer_size,
         " bytes, tensors cover ", pos, ")");
  return out;
}

TensorRecord make_record(Entry&& e) {
  TensorRecord r;
  r.name = std::move(e.name);
  r.dtype = e.dtype;
  r.shape = std::move(e.shape);
  r.data.resize(e.end - e.begin);
  return r;
}

/// The padded header JSON for `st` (length a multiple of 8).
std::string build_header(const SafeTensors& st) {
  json h = json::object();
  std::set<std::string> seen;
  uint64_t pos = 0;
  for (const TensorRecord& r : st.tensors) {
    if (r.name.empty()) fail("safetensors writer: empty tensor name");
    if (r.name == "__metadata__")
      fail("safetensors writer: tensor name \"__metadata__\" is reserved");
    if (!seen.insert(r.name).second)
      fail("safetensors writer: duplicate tensor name \"", r.name, "\"");
    uint64_t need = 0;
    if (const std::string why = byte_size(r.shape, r.dtype, &need); !why.empty())
      fail("safetensors writer: tensor \"", r.name, "\": ", why);
    if (need != r.data.size())
      fail("safetensors writer: tensor \"", r.name, "\": has ", r.data.size(),
           " bytes but shape ", shape_str(r.shape), " of ", dtype_name(r.dtype), " needs ",
           need);
    h[r.name] = json{{"dtype", dtype_name(r.dtype)},
                     {"shape", r.shape},
                     {"data_offsets", {pos, pos + need}}};
    pos += need;
  }
  if (!st.metadata.empty()) h["__metadata__"] = st.metadata;
  std::string s;
  try {
    s = h.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception& e) {
    fail("safetensors writer: a tensor name or metadata string is not valid UTF-8: ",
         e.what());
  }
  s.append((8 - s.size() % 8) % 8, ' ');  // the reference writer's alignment
  return s;
}

std::string u64_le(uint64_t v) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &v, 8);  // little-endian host
  return out;
}

/// Minimal RAII reader over a POSIX fd; errors name `path`.
class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      const int err = errno;
      fail(path, ": cannot open: ", std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      fail(path, ": cannot stat: ", std::strerror(err));
    }
    if (S_ISDIR(st.st_mode)) fail(path, ": is a directory, expected a safetensors file");
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const { return size_; }

  /// Reads exactly n bytes into dst (UserError on error or early EOF).
  void read_exact(void* dst, uint64_t n) {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
      const ssize_t got = ::read(fd_, p, chunk);
      if (got < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        fail(path_, ": read error: ", std::strerror(err));
      }
      if (got == 0) fail(path_, ": unexpected end of file (file shrank while reading?)");
      p += got;
      n -= static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace

// ------------------------------------------------------------------ dtypes ---

const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> all = [] {
    std::vector<DType> v;
    for (const auto& i : kDTypes) v.push_back(i.dtype);
    return v;
  }();
  return all;
}

int dtype_bits(DType dtype) { return info(dtype).bits; }

std::string dtype_name(DType dtype) { return info(dtype).name; }

DType parse_dtype(const std::string& name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.dtype;
  std::string all;
  for (const auto& i : kDTypes) all += (all.empty() ? "" : ", ") + std::string(i.name);
  fail("unknown safetensors dtype '", name, "' (expected one of ", all, ")");
}

uint64_t tensor_bytes(const std::vector<int64_t>& shape, DType dtype, const std::string& what) {
  uint64_t n = 0;
  if (const std::string why = byte_size(shape, dtype, &n); !why.empty()) fail(what, ": ", why);
  return n;
}

// ----------------------------------------------------------------- records ---

int64_t TensorRecord::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t TensorRecord::nbytes() const {
  return static_cast<size_t>(numel()) * static_cast<size_t>(dtype_bits(dtype)) / 8;
}

const TensorRecord* SafeTensors::find(const std::string& name) const {
  for (const TensorRecord& r : tensors)
    if (r.name == name) return &r;
  return nullptr;
}

TensorRecord& SafeTensors::add(const std::string& name, DType dtype,
                               const std::vector<int64_t>& shape, const void* bytes) {
  if (name.empty()) fail("safetensors: cannot add a tensor with an empty name");
  if (name == "__metadata__") fail("safetensors: tensor name \"__metadata__\" is reserved");
  if (find(name)) fail("safetensors: duplicate tensor name \"", name, "\"");
  const uint64_t n = tensor_bytes(shape, dtype, str_cat("safetensors: tensor \"", name, "\""));
  SNIP_CHECK(n == 0 || bytes != nullptr, "null data for non-empty tensor ", name);
  TensorRecord r;
  r.name = name;
  r.dtype = dtype;
  r.shape = shape;
  r.data.resize(static_cast<size_t>(n));
  if (n) std::memcpy(r.data.data(), bytes, static_cast<size_t>(n));
  tensors.push_back(std::move(r));
  return tensors.back();
}

// ------------------------------------------------------------------ reader ---

SafeTensors parse_safetensors(std::string_view bytes, const std::string& what) {
  if (bytes.size() < 8)
    fail(what, ": file is ", bytes.size(),
         " bytes, shorter than the 8-byte header length (not a safetensors file)");
  const uint64_t n = load_u64_le(bytes.data());
  check_header_len(n, bytes.size(), what);
  const uint64_t buffer_size = bytes.size() - 8 - n;
  Header h = parse_header(bytes.substr(8, n), buffer_size, what);
  SafeTensors st;
  st.metadata = std::move(h.metadata);
  st.tensors.reserve(h.entries.size());
  const char* buf = bytes.data() + 8 + n;
  for (Entry& e : h.entries) {
    const uint64_t begin = e.begin;
    TensorRecord r = make_record(std::move(e));
    if (!r.data.empty()) std::memcpy(r.data.data(), buf + begin, r.data.size());
    st.tensors.push_back(std::move(r));
  }
  return st;
}

SafeTensors read_safetensors(const std::string& path) {
  FileReader f(path);
  const uint64_t size = f.size();
  if (size < 8)
    fail(path, ": file is ", size,
         " bytes, shorter than the 8-byte header length (not a safetensors file)");
  char len[8];
  f.read_exact(len, 8);
  const uint64_t n = load_u64_le(len);
  check_header_len(n, size, path);
  std::string text(static_cast<size_t>(n), '\0');
  f.read_exact(text.data(), n);
  Header h = parse_header(text, size - 8 - n, path);
  SafeTensors st;
  st.metadata = std::move(h.metadata);
  st.tensors.reserve(h.entries.size());
  // Entries tile the buffer in order, so the data is read sequentially.
  for (Entry& e : h.entries) {
    TensorRecord r = make_record(std::move(e));
    f.read_exact(r.data.data(), r.data.size());
    st.tensors.push_back(std::move(r));
  }
  return st;
}

// ------------------------------------------------------------------ writer ---

std::string serialize_safetensors(const SafeTensors& st) {
  const std::string header = build_header(st);
  size_t total = 8 + header.size();
  for (const TensorRecord& r : st.tensors) total += r.data.size();
  std::string out;
  out.reserve(total);
  out += u64_le(header.size());
  out += header;
  for (const TensorRecord& r : st.tensors)
    out.append(reinterpret_cast<const char*>(r.data.data()), r.data.size());
  return out;
}

void write_safetensors(const std::string& path, const SafeTensors& st) {
  const std::string header = build_header(st);  // validates before any file exists
  AtomicFileWriter w(path);
  w.write(u64_le(header.size()));
  w.write(header);
  for (const TensorRecord& r : st.tensors)
    w.write(std::string_view(reinterpret_cast<const char*>(r.data.data()), r.data.size()));
  w.commit();
}

}  // namespace snip::io
