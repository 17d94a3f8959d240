// snip/io/safetensors.h: the Hugging Face safetensors file format, read with
// strict validation; written in the reference writer's layout (8-byte
// aligned, space padded) with sorted header keys.
//
// Source: https://github.com/huggingface/safetensors, README "Format":
//
//   bytes [0, 8)        N: u64, little-endian, size of the header
//   bytes [8, 8+N)      header: UTF-8 JSON object, starts with '{', may be
//                       padded at the end with spaces (0x20)
//   bytes [8+N, EOF)    byte buffer: raw little-endian, row-major tensor data
//
//   header = { "<tensor name>": { "dtype": "F32",
//                                 "shape": [d0, d1, ...],          // [] = scalar
//                                 "data_offsets": [begin, end] },  // in buffer
//              ...,
//              "__metadata__": { "<key>": "<string value>", ... } }  // optional
//
// The tensors' [begin, end) ranges must tile the buffer exactly: no overlap,
// no hole, nothing after the last tensor (the reference implementation's
// validation). Byte order of the data is little-endian; snip assumes a
// little-endian host (checked at compile time).
//
// Writer conventions (serialize_safetensors): compact JSON with keys sorted
// (so "__metadata__" sits among the tensor names in byte order), header
// padded with spaces to a multiple of 8 bytes as the reference writer does
// (8-byte aligned data for every dtype), "__metadata__" omitted when empty,
// tensor data laid out in the order of SafeTensors::tensors. (The Rust
// reference writer puts "__metadata__" first and orders entry fields
// dtype, shape, data_offsets; any spec reader accepts both.)
//
// Plain C++17 + nlohmann::json; no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace snip::io {

/// Element types of the safetensors format, named as in the header ("F32",
/// "F8_E8M0", ...). The list, the names and the bits per element are those
/// of the reference implementation (huggingface/safetensors,
/// safetensors/src/tensor.rs: `enum Dtype`, `Dtype::bitsize`, 0.6):
///
///   BOOL 8   U8 8   I8 8   I16 16   U16 16   I32 32   U32 32   I64 64   U64 64
///   F16 16 (IEEE binary16)   BF16 16   F32 32   F64 64
///   F8_E4M3 8, F8_E5M2 8 (OCP FP8; arXiv 2209.05433)
///   F8_E4M3FNUZ 8, F8_E5M2FNUZ 8 (no Inf, no -0, NaN = 0x80; arXiv 2206.02915)
///   F8_E8M0 8 (OCP MX v1.0 scale: 2^(c-127), 0xFF = NaN)
///   F4 4 (OCP MX FP4 = E2M1), F6_E2M3 6, F6_E3M2 6 (OCP MX FP6)
///   C64 64 (complex: real then imaginary part, each an F32)
///
/// Sub-byte types are packed: a tensor of n elements holds n * bits / 8
/// bytes, and the reference refuses a tensor whose n * bits is not a
/// multiple of 8 (tensor.rs `Metadata::validate`, MisalignedSlice). The
/// format does not say how elements sit inside a byte; what snip assumes
/// when it reads values is in snip/io/tensor_values.h.
enum class DType {
  BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
  F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2, C64
};

/// Every DType, in the order of the enum.
const std::vector<DType>& all_dtypes();
/// Bits of one element: 4 (F4), 6 (F6_E2M3, F6_E3M2), 8, 16, 32 or 64.
int dtype_bits(DType dtype);
/// The format's name of `dtype` ("F32", "BF16", "F8_E8M0", ...).
std::string dtype_name(DType dtype);
/// Inverse of dtype_name (exact, case-sensitive). Throws UserError "unknown
/// safetensors dtype 'X' (expected one of BOOL, U8, ...)" for any other string.
DType parse_dtype(const std::string& name);
/// Bytes of a tensor of `shape` and `dtype`: numel * dtype_bits / 8. Throws
/// UserError "<what>: ..." for a negative dim, a size that overflows 64 bits,
/// or a sub-byte tensor whose numel * bits is not a multiple of 8 (e.g. 3
/// F4 elements: 12 bits).
uint64_t tensor_bytes(const std::vector<int64_t>& shape, DType dtype, const std::string& what);

/// One tensor: name, element type, shape (row-major, [] for a scalar) and its
/// raw little-endian bytes (data.size() == numel() * dtype_bits(dtype) / 8).
struct TensorRecord {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // element counts per dim, each >= 0
  std::vector<uint8_t> data;   // [numel * bits / 8] bytes

  /// Product of shape (1 for a scalar, 0 if any dim is 0).
  int64_t numel() const;
  /// numel() * dtype_bits(dtype) / 8, in bytes.
  size_t nbytes() const;
};

/// A whole safetensors file in memory.
struct SafeTensors {
  std::map<std::string, std::string> metadata;  // "__metadata__" (string->string)
  std::vector<TensorRecord> tensors;            // file order (by data offset)

  /// The tensor named `name`, or nullptr.
  const TensorRecord* find(const std::string& name) const;
  /// Appends a tensor, copying tensor_bytes(shape, dtype) bytes from `bytes`
  /// (may be null when that is 0). Throws UserError on a duplicate name, the
  /// reserved name "__metadata__", an empty name, a negative dim or a
  /// sub-byte tensor that does not fill whole bytes.
  TensorRecord& add(const std::string& name, DType dtype,
                    const std::vector<int64_t>& shape, const void* bytes);
};

/// Largest header accepted, in bytes (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// Reads and strictly validates the safetensors file at `path`. Tensor data is
/// read straight from the file into each record (peak memory ~ file size).
/// Throws UserError "<path>: <what is wrong>" for a missing or unreadable
/// file and for every malformation (see parse_safetensors).
SafeTensors read_safetensors(const std::string& path);

/// Parses a whole file image. `what_for_errors` names the source in messages.
/// Throws UserError "<what_for_errors>: <problem>" when: the file is shorter
/// than 8 bytes; the header length exceeds the file or kMaxHeaderBytes; the
/// header does not start with '{', is not valid UTF-8 JSON or not an object;
/// a key appears twice, arrays/objects nest deeper than
/// io::kMaxJsonDepth or a number overflows a double (io::parse_json); "__metadata__" is not an object of strings; a tensor
/// entry is not an object, lacks dtype/shape/data_offsets or has extra keys;
/// the dtype is unknown; a dim is negative or not an integer; data_offsets is
/// not [begin, end] with begin <= end; numel * bits is not a multiple of 8;
/// end - begin != numel * bits / 8; the tensors overlap, leave a hole or do
/// not cover the buffer exactly.
SafeTensors parse_safetensors(std::string_view bytes,
                              const std::string& what_for_errors);

/// The file image of `st` (see the writer conventions above). Throws
/// UserError if a record's data size does not match its shape and dtype, a
/// name repeats, or a name or metadata string is not valid UTF-8.
std::string serialize_safetensors(const SafeTensors& st);

/// Writes serialize_safetensors(st) to `path` atomically (AtomicFileWriter:
/// temp file, fsync, rename), streaming the tensor data without building the
/// whole image in memory. Throws as serialize_safetensors and
/// write_file_atomic do; never leaves a partial file.
void write_safetensors(const std::string& path, const SafeTensors& st);

}  // namespace snip::io
