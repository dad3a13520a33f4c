// GGUF v3, the llama.cpp model file format (little-endian):
//   "GGUF" | u32 version=3 | u64 tensor_count | u64 kv_count
//   kv_count x { gguf_string key | u32 value_type | value }
//   tensor_count x { gguf_string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type |
//                    u64 offset }
//   zero padding to `general.alignment` (default 32) | data section
// gguf_string = u64 length + bytes (no terminator); array = u32 elem_type + u64 count +
// elems. ne[] is in ggml order, innermost dimension first, i.e. the REVERSE of the
// row-major shape; tensor offsets are relative to the data section and aligned, and each
// tensor's data is padded to the alignment.
//
// Tensor types supported here: F32, F16, BF16, Q8_0 (blocks of 32 values along a row:
// { f16 d; int8 qs[32]; }, 34 bytes, x ~= d * qs), and llama.cpp's Q4_0 (32 values, 18
// bytes), Q4_K (256, 144), Q5_K (256, 176) and Q6_K (256, 210) blocks, laid out as
// kernels/block_quant.h describes. The reader decodes all of them. The writer converts f32
// to F16/BF16/Q8_0 itself; Q4_0 and the K types it quantises through the function given to
// set_block_quantizer (kernels' quantize_blocks: the kernels layer sits beside io, not
// below it, so io cannot call it), or takes them already encoded (add_encoded_tensor).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "io/atomic_file.h"
#include "tensor/tensor.h"

namespace hyperion::io {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// ggml's spelling: "f32", "f16", "q4_0", "q8_0", "q4_K", "q5_K", "q6_K", "bf16".
std::string_view ggml_type_name(GgmlType type);
int64_t ggml_block_size(GgmlType type);  // values per block: 1, 32 (q4_0, q8_0) or 256 (K)
size_t ggml_block_bytes(GgmlType type);  // bytes per block: 4, 2, 2, 18, 34, 144, 176, 210
// True for the types the writer quantises through set_block_quantizer's function (q4_0,
// q4_K, q5_K, q6_K).
bool ggml_needs_block_quantizer(GgmlType type);
// Bytes taken by `n` values (n must be a multiple of the block size).
size_t ggml_nbytes(GgmlType type, int64_t n);

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string_view gguf_type_name(GgufType type);  // "u32", "string", "array", ...

inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr size_t kGgufMaxNameLength = 63;  // llama.cpp's GGML_MAX_NAME - 1
inline constexpr int kGgufMaxDims = 4;            // GGML_MAX_DIMS

// C++ type <-> GGUF value type.
template <typename T>
struct GgufTypeOf;
#define HYP_GGUF_TYPE(T, V)                        \
  template <>                                      \
  struct GgufTypeOf<T> {                           \
    static constexpr GgufType value = GgufType::V; \
  };
HYP_GGUF_TYPE(uint8_t, kU8)
HYP_GGUF_TYPE(int8_t, kI8)
HYP_GGUF_TYPE(uint16_t, kU16)
HYP_GGUF_TYPE(int16_t, kI16)
HYP_GGUF_TYPE(uint32_t, kU32)
HYP_GGUF_TYPE(int32_t, kI32)
HYP_GGUF_TYPE(float, kF32)
HYP_GGUF_TYPE(bool, kBool)
HYP_GGUF_TYPE(std::string, kString)
HYP_GGUF_TYPE(uint64_t, kU64)
HYP_GGUF_TYPE(int64_t, kI64)
HYP_GGUF_TYPE(double, kF64)
#undef HYP_GGUF_TYPE

namespace gguf_detail {
// Appends the little-endian encoding of one value (what follows the type field).
template <typename T>
void append(std::string& out, const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    const uint64_t n = v.size();
    out.append(reinterpret_cast<const char*>(&n), 8);
    out.append(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    out.push_back(v ? 1 : 0);
  } else {
    static_assert(std::is_arithmetic_v<T>);
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
}
}  // namespace gguf_detail

class GgufWriter {
 public:
  // Setting a key again replaces its value (keeping its position). Keys are written in
  // the order first set. "general.alignment" (u32, a power of two) sets the alignment.
  template <typename T>
  void set(const std::string& key, const T& value) {
    std::string payload;
    gguf_detail::append(payload, value);
    set_raw(key, GgufTypeOf<T>::value, std::move(payload));
  }
  template <typename T>
  void set_array(const std::string& key, const std::vector<T>& values) {
    std::string payload;
    const uint32_t elem = static_cast<uint32_t>(GgufTypeOf<T>::value);
    const uint64_t n = values.size();
    payload.append(reinterpret_cast<const char*>(&elem), 4);
    payload.append(reinterpret_cast<const char*>(&n), 8);
    for (const auto& v : values) gguf_detail::append(payload, static_cast<T>(v));
    set_raw(key, GgufType::kArray, std::move(payload));
  }

  void set_u32(const std::string& key, uint32_t v) { set(key, v); }
  void set_i32(const std::string& key, int32_t v) { set(key, v); }
  void set_u64(const std::string& key, uint64_t v) { set(key, v); }
  void set_f32(const std::string& key, float v) { set(key, v); }
  void set_bool(const std::string& key, bool v) { set(key, v); }
  void set_string(const std::string& key, const std::string& v) { set(key, v); }
  void set_string_array(const std::string& key, const std::vector<std::string>& v) {
    set_array(key, v);
  }
  void set_f32_array(const std::string& key, const std::vector<float>& v) { set_array(key, v); }
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v) { set_array(key, v); }

  // The quantiser for Q4_0, Q4_K, Q5_K and Q6_K tensors added from f32 (kernels'
  // quantize_blocks, wrapped by a layer that may call it): fn(type, src, dst, n) writes
  // ggml_nbytes(type, n) bytes of blocks for the n values src (one row; n a multiple of
  // the block size) and may throw hyperion::Error. Called from several threads at once,
  // one row each, in write(). Must be set before such a tensor is added.
  using BlockQuantizer =
      std::function<void(GgmlType type, const float* src, unsigned char* dst, int64_t n)>;
  void set_block_quantizer(BlockQuantizer fn) { block_quantizer_ = std::move(fn); }

  // Adds a tensor from f32 data of row-major `shape` (rank 1..4), stored as `type`
  // (converted or quantised at write time, chunk by chunk; the block types row by row, rows
  // in parallel). `data` must stay valid until write(). The block types need the row length
  // (last dimension) to be a multiple of their block size (32 or 256).
  void add_tensor(std::string name, Shape shape, const float* data, GgmlType type);
  // Same, but the f32 values are produced on demand by `fill(dst)` (dst holds
  // shape.numel() floats) when write() reaches the tensor, so only one tensor at a time
  // is held in f32 (used by the checkpoint converter).
  using Producer = std::function<void(float* dst)>;
  void add_tensor(std::string name, Shape shape, Producer fill, GgmlType type);
  // Already-encoded data: `fill(dst)` writes the tensor's ggml_nbytes(type, numel) bytes
  // in `type`'s block format (for blocks built from other quantised weights).
  using BlockProducer = std::function<void(unsigned char* dst)>;
  void add_encoded_tensor(std::string name, Shape shape, BlockProducer fill, GgmlType type);

  // Atomic (temp file + fsync + rename).
  void write(const std::string& path) const;

  size_t tensor_count() const { return tensors_.size(); }
  size_t kv_count() const { return kvs_.size(); }

 private:
  struct KV {
    std::string key;
    GgufType type;
    std::string payload;
  };
  struct PendingTensor {
    std::string name;
    Shape shape;
    GgmlType type;
    const float* data;
    Producer fill;
    BlockProducer fill_blocks = nullptr;
  };
  void set_raw(const std::string& key, GgufType type, std::string payload);
  void add_checked(PendingTensor t);
  // Quantises the f32 tensor src through block_quantizer_, rows in parallel, into out.
  void write_block_rows(AtomicFileWriter& out, const std::string& path, const std::string& name,
                        GgmlType type, const Shape& shape, const float* src) const;

  std::vector<KV> kvs_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<PendingTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  BlockQuantizer block_quantizer_;
};

struct GgufTensor {
  std::string name;
  Shape shape;  // row-major (the reverse of the file's ne[])
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;  // into the mapped file; aligned to the file's alignment
  size_t nbytes = 0;
  uint64_t offset = 0;  // relative to the data section
};

// Read-only, memory-mapped GGUF file, validated completely on open (magic, version,
// truncation anywhere, value and tensor types, dims, alignment, offsets past the end,
// overlapping tensors, duplicate keys/names). Errors name the file and the key/tensor.
class GgufFile {
 public:
  static GgufFile open(const std::string& path);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }  // file offset of the data section

  // ---- key/value metadata. Accessors throw naming the key if it is missing or has
  // another type; get<T> for T in {u8, i8, u16, i16, u32, i32, u64, i64, float, double,
  // bool, std::string}, get_array<T> likewise for arrays with that element type.
  const std::vector<std::string>& keys() const { return keys_; }  // file order
  bool has(const std::string& key) const { return kv_index_.count(key) != 0; }
  GgufType type(const std::string& key) const;
  GgufType array_type(const std::string& key) const;  // element type of an array
  uint64_t array_size(const std::string& key) const;
  template <typename T>
  T get(const std::string& key) const;
  template <typename T>
  std::vector<T> get_array(const std::string& key) const;

  uint32_t get_u32(const std::string& key) const { return get<uint32_t>(key); }
  int32_t get_i32(const std::string& key) const { return get<int32_t>(key); }
  uint64_t get_u64(const std::string& key) const { return get<uint64_t>(key); }
  float get_f32(const std::string& key) const { return get<float>(key); }
  bool get_bool(const std::string& key) const { return get<bool>(key); }
  std::string get_string(const std::string& key) const { return get<std::string>(key); }
  std::vector<std::string> get_string_array(const std::string& key) const {
    return get_array<std::string>(key);
  }
  std::vector<float> get_f32_array(const std::string& key) const { return get_array<float>(key); }
  std::vector<int32_t> get_i32_array(const std::string& key) const {
    return get_array<int32_t>(key);
  }

  // ---- tensors, in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(const std::string& name) const;
  const GgufTensor& tensor(const std::string& name) const;  // throws naming the tensor
  // The tensor's values as f32, row-major (block types decoded as llama.cpp's
  // dequantize_row_* does).
  std::vector<float> dequantize(const std::string& name) const;

 private:
  struct Value {
    GgufType type = GgufType::kU8;
    GgufType elem = GgufType::kU8;       // arrays
    uint64_t count = 0;                  // arrays
    const unsigned char* raw = nullptr;  // numeric scalar, or first element of an array
    std::vector<std::string> strings;    // string value (one) or string array
  };
  GgufFile() = default;
  const Value& value(const std::string& key) const;
  [[noreturn]] void wrong_type(const std::string& key, const Value& v, GgufType want,
                               bool array) const;

  std::string path_;
  MappedFile map_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  size_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::vector<Value> values_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace hyperion::io
