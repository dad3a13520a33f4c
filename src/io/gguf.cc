// GGUF writer and reader. Q8_0 blocks are (de)quantised by tensor/quantize_q8_0.h; Q4_0 and
// the K types are quantised through the writer's block quantiser (kernels' quantize_blocks)
// and decoded here.
#include "io/gguf.h"
#include "tensor/block_formats.h"
#include "tensor/convert.h"
#include "tensor/quantize_q8_0.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_set>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion::io {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

namespace {

constexpr int64_t kQK8_0 = 32;
constexpr size_t kQ8_0Bytes = 34;

bool known_ggml_type(uint32_t t) {
  return t == 0 || t == 1 || t == 2 || t == 3 || t == 6 || t == 7 || t == 8 || t == 12 || t == 13 ||
         t == 14 || t == 30;
}

// Names of the ggml types we do not support, for clearer errors.
std::string ggml_type_label(uint32_t t) {
  static const char* const kNames[] = {"f32",  "f16",  "q4_0", "q4_1", "q4_2", "q4_3",
                                       "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K",
                                       "q4_K", "q5_K", "q6_K", "q8_K"};
  if (t < std::size(kNames)) return fmt::format("{} ({})", t, kNames[t]);
  if (t == 30) return "30 (bf16)";
  return std::to_string(t);
}

size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

bool known_gguf_type(uint32_t t) {
  return t <= 12;
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

bool is_pow2(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

// n values (whole blocks) of a block type to f32 (tensor/block_formats.h's reference),
// blocks in parallel.
void decode_blocks(GgmlType type, const unsigned char* src, float* y, int64_t n) {
  const BlockFormat* f = block_format_of_ggml(static_cast<uint32_t>(type));
  HYP_CHECK(f != nullptr, "gguf: type {} is not a block type", static_cast<uint32_t>(type));
  const int64_t per = f->values;
  parallel_chunks(n / per, 256, [&](int64_t b0, int64_t b1) {
    dequantize_blocks_reference(f->type, src + size_t(b0) * f->bytes, y + b0 * per, (b1 - b0) * per);
  });
}

}  // namespace

std::string_view ggml_type_name(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return "f32";
    case GgmlType::kF16:
      return "f16";
    case GgmlType::kQ4_0:
      return "q4_0";
    case GgmlType::kQ4_1:
      return "q4_1";
    case GgmlType::kQ5_0:
      return "q5_0";
    case GgmlType::kQ5_1:
      return "q5_1";
    case GgmlType::kQ8_0:
      return "q8_0";
    case GgmlType::kQ4_K:
      return "q4_K";
    case GgmlType::kQ5_K:
      return "q5_K";
    case GgmlType::kQ6_K:
      return "q6_K";
    case GgmlType::kBF16:
      return "bf16";
  }
  return "invalid";
}

int64_t ggml_block_size(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
      return kQK8_0;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return 256;
    default:
      return 1;
  }
}

bool ggml_needs_block_quantizer(GgmlType type) {
  return type != GgmlType::kQ8_0 && block_format_of_ggml(static_cast<uint32_t>(type)) != nullptr;
}

size_t ggml_block_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 4;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 2;
    case GgmlType::kQ4_0:
      return 18;
    case GgmlType::kQ4_1:
      return 20;
    case GgmlType::kQ5_0:
      return 22;
    case GgmlType::kQ5_1:
      return 24;
    case GgmlType::kQ8_0:
      return kQ8_0Bytes;
    case GgmlType::kQ4_K:
      return 144;
    case GgmlType::kQ5_K:
      return 176;
    case GgmlType::kQ6_K:
      return 210;
  }
  fail("ggml: invalid type {}", static_cast<uint32_t>(type));
}

size_t ggml_nbytes(GgmlType type, int64_t n) {
  const int64_t bs = ggml_block_size(type);
  HYP_CHECK(n >= 0 && n % bs == 0, "ggml_nbytes: {} values are not a whole number of {} blocks", n,
            ggml_type_name(type));
  return static_cast<size_t>(n / bs) * ggml_block_bytes(type);
}

std::string_view gguf_type_name(GgufType type) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto t = static_cast<uint32_t>(type);
  return t < std::size(kNames) ? kNames[t] : "invalid";
}

// ---------------------------------------------------------------------------------------
// Writer

void GgufWriter::set_raw(const std::string& key, GgufType type, std::string payload) {
  HYP_CHECK(!key.empty(), "GgufWriter: empty key");
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kvs_[it->second].type = type;
    kvs_[it->second].payload = std::move(payload);
    return;
  }
  kv_index_.emplace(key, kvs_.size());
  kvs_.push_back(KV{key, type, std::move(payload)});
}

void GgufWriter::add_checked(PendingTensor t) {
  const std::string& name = t.name;
  HYP_CHECK(!name.empty() && name.size() <= kGgufMaxNameLength,
            "GgufWriter::add_tensor: tensor name '{}' must have 1 to {} bytes", name,
            kGgufMaxNameLength);
  HYP_CHECK(tensor_index_.count(name) == 0, "GgufWriter::add_tensor: duplicate tensor '{}'", name);
  HYP_CHECK(t.shape.rank() >= 1 && t.shape.rank() <= kGgufMaxDims,
            "GgufWriter::add_tensor: tensor '{}' {} must have rank 1 to {}", name, t.shape.str(),
            kGgufMaxDims);
  HYP_CHECK(known_ggml_type(static_cast<uint32_t>(t.type)),
            "GgufWriter::add_tensor: tensor '{}': unsupported ggml type {}", name,
            static_cast<uint32_t>(t.type));
  HYP_CHECK(t.shape.dim(-1) % ggml_block_size(t.type) == 0,
            "GgufWriter::add_tensor: tensor '{}' {}: {} needs the row length to be a multiple "
            "of {}",
            name, t.shape.str(), ggml_type_name(t.type), ggml_block_size(t.type));
  HYP_CHECK(t.data != nullptr || t.fill || t.fill_blocks || t.shape.numel() == 0,
            "GgufWriter::add_tensor: tensor '{}' has no data", name);
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(std::string name, Shape shape, const float* data, GgmlType type) {
  HYP_CHECK(!ggml_needs_block_quantizer(type) || block_quantizer_ != nullptr,
            "GgufWriter::add_tensor: tensor '{}': {} blocks are quantised through "
            "set_block_quantizer, which was not called",
            name, ggml_type_name(type));
  add_checked(PendingTensor{std::move(name), shape, type, data, nullptr});
}

void GgufWriter::add_tensor(std::string name, Shape shape, Producer fill, GgmlType type) {
  HYP_CHECK(fill != nullptr, "GgufWriter::add_tensor: tensor '{}' has no producer", name);
  HYP_CHECK(!ggml_needs_block_quantizer(type) || block_quantizer_ != nullptr,
            "GgufWriter::add_tensor: tensor '{}': {} blocks are quantised through "
            "set_block_quantizer, which was not called",
            name, ggml_type_name(type));
  add_checked(PendingTensor{std::move(name), shape, type, nullptr, std::move(fill)});
}

void GgufWriter::add_encoded_tensor(std::string name, Shape shape, BlockProducer fill,
                                    GgmlType type) {
  HYP_CHECK(fill != nullptr, "GgufWriter::add_encoded_tensor: tensor '{}' has no producer", name);
  add_checked(PendingTensor{std::move(name), shape, type, nullptr, nullptr, std::move(fill)});
}

void GgufWriter::write_block_rows(AtomicFileWriter& out, const std::string& path,
                                  const std::string& name, GgmlType type, const Shape& shape,
                                  const float* src) const {
  HYP_CHECK(block_quantizer_ != nullptr,
            "gguf: {}: tensor '{}': {} blocks need set_block_quantizer", path, name,
            ggml_type_name(type));
  const int64_t cols = shape.dim(-1);
  const int64_t rows = cols > 0 ? shape.numel() / cols : 0;
  if (rows == 0) return;
  const size_t row_bytes = ggml_nbytes(type, cols);
  // Rows of about a million values at a time, quantised in parallel, one row per call.
  const int64_t chunk_rows = std::max<int64_t>(1, (int64_t{1} << 20) / cols);
  AlignedBuffer<unsigned char> buf(row_bytes * size_t(std::min(chunk_rows, rows)));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t nr = std::min(chunk_rows, rows - r0);
    // An exception must not leave the parallel region: the first failing row (the lowest,
    // whatever the thread count) is reported after it.
    std::mutex mu;
    int64_t bad_row = -1;
    std::string bad_message;
    parallel_chunks(nr, std::max<int64_t>(1, 16384 / cols), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        try {
          block_quantizer_(type, src + (r0 + r) * cols, buf.data() + size_t(r) * row_bytes, cols);
        } catch (const std::exception& ex) {
          const std::lock_guard<std::mutex> lock(mu);
          if (bad_row < 0 || r0 + r < bad_row) {
            bad_row = r0 + r;
            bad_message = ex.what();
          }
          return;
        }
      }
    });
    if (bad_row >= 0)
      fail("gguf: {}: tensor '{}' {} ({}): row {}: {}", path, name, shape.str(),
           ggml_type_name(type), bad_row, bad_message);
    out.write(buf.data(), row_bytes * size_t(nr));
  }
}

void GgufWriter::write(const std::string& path) const {
  uint32_t alignment = kGgufDefaultAlignment;
  if (auto it = kv_index_.find("general.alignment"); it != kv_index_.end()) {
    const KV& kv = kvs_[it->second];
    HYP_CHECK(kv.type == GgufType::kU32, "gguf: {}: key 'general.alignment' must be u32, not {}",
              path, gguf_type_name(kv.type));
    std::memcpy(&alignment, kv.payload.data(), 4);
    HYP_CHECK(is_pow2(alignment), "gguf: {}: key 'general.alignment' = {} is not a power of two",
              path, alignment);
  }

  std::string head;
  auto put_u32 = [&](uint32_t v) { gguf_detail::append(head, v); };
  auto put_u64 = [&](uint64_t v) { gguf_detail::append(head, v); };
  head.append("GGUF", 4);
  put_u32(kGgufVersion);
  put_u64(tensors_.size());
  put_u64(kvs_.size());
  for (const KV& kv : kvs_) {
    gguf_detail::append(head, kv.key);
    put_u32(static_cast<uint32_t>(kv.type));
    head.append(kv.payload);
  }
  uint64_t offset = 0;
  std::vector<size_t> nbytes(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    gguf_detail::append(head, t.name);
    put_u32(static_cast<uint32_t>(t.shape.rank()));
    for (int d = t.shape.rank() - 1; d >= 0; --d) put_u64(static_cast<uint64_t>(t.shape[d]));
    put_u32(static_cast<uint32_t>(t.type));
    put_u64(offset);
    nbytes[i] = ggml_nbytes(t.type, t.shape.numel());
    offset += align_up(nbytes[i], alignment);
  }
  head.append(align_up(head.size(), alignment) - head.size(), '\0');

  AtomicFileWriter out(path);
  out.write(head);
  const std::string zeros(alignment, '\0');
  // Converts in chunks of whole blocks (rows are whole blocks, so a block never straddles
  // two rows) so that at most one chunk of output is buffered.
  constexpr int64_t kChunk = int64_t{1} << 20;
  AlignedBuffer<unsigned char> chunk(static_cast<size_t>(kChunk) * 4);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    const int64_t n = t.shape.numel();
    if (t.fill_blocks) {
      AlignedBuffer<unsigned char> encoded(nbytes[i]);
      try {
        t.fill_blocks(encoded.data());
      } catch (const UsageError& e) {  // bad input stays bad input (exit status 2)
        throw_usage_error(fmt::format("gguf: {}: tensor '{}': {}", path, t.name, e.what()));
      } catch (const Error& e) {
        fail("gguf: {}: tensor '{}': {}", path, t.name, e.what());
      }
      out.write(encoded.data(), nbytes[i]);
      out.write(zeros.data(), align_up(nbytes[i], alignment) - nbytes[i]);
      continue;
    }
    const float* src = t.data;
    AlignedBuffer<float> produced;
    if (!src && n > 0) {
      produced = AlignedBuffer<float>(static_cast<size_t>(n));
      try {
        t.fill(produced.data());
      } catch (const UsageError& e) {  // bad input stays bad input (exit status 2)
        throw_usage_error(fmt::format("gguf: {}: tensor '{}': {}", path, t.name, e.what()));
      } catch (const Error& e) {
        fail("gguf: {}: tensor '{}': {}", path, t.name, e.what());
      }
      src = produced.data();
    }
    if (ggml_needs_block_quantizer(t.type)) {
      write_block_rows(out, path, t.name, t.type, t.shape, src);
      out.write(zeros.data(), align_up(nbytes[i], alignment) - nbytes[i]);
      continue;
    }
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t m = std::min(kChunk, n - b);
      const float* x = src + b;
      switch (t.type) {
        case GgmlType::kF32:
          out.write(x, static_cast<size_t>(m) * 4);
          continue;
        case GgmlType::kF16:
          parallel_chunks(m, 1 << 16, [&](int64_t s, int64_t e) {
            convert_f32_to_f16(x + s, reinterpret_cast<f16*>(chunk.data()) + s, size_t(e - s));
          });
          break;
        case GgmlType::kBF16:
          parallel_chunks(m, 1 << 16, [&](int64_t s, int64_t e) {
            convert_f32_to_bf16(x + s, reinterpret_cast<bf16*>(chunk.data()) + s, size_t(e - s));
          });
          break;
        case GgmlType::kQ8_0:
          quantize_row_q8_0(x, chunk.data(), m);
          break;
        default:  // the block types, written above
          fail("gguf: {}: tensor '{}': unexpected type {}", path, t.name, ggml_type_name(t.type));
      }
      out.write(chunk.data(), ggml_nbytes(t.type, m));
    }
    out.write(zeros.data(), align_up(nbytes[i], alignment) - nbytes[i]);
  }
  out.commit();
}

// ---------------------------------------------------------------------------------------
// Reader

namespace {

// Bounds-checked little-endian cursor over the mapped file. `context` names the key or
// tensor being parsed, for error messages.
class Cursor {
 public:
  Cursor(const std::string& path, const unsigned char* data, size_t size)
      : path_(path), data_(data), size_(size) {}

  std::string context = "header";

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  const unsigned char* here() const { return data_ + pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail("gguf: {}: {}: truncated at byte {} while reading {} ({} bytes needed, {} left)", path_,
           context, pos_, what, n, remaining());
  }
  void skip(uint64_t n, const char* what) {
    need(n, what);
    pos_ += n;
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const std::string& path_;
  const unsigned char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  try {
    f.map_ = MappedFile::open(path);
  } catch (const Error& e) {
    fail("gguf: {}", e.what());
  }
  Cursor c(path, f.map_.data(), f.map_.size());

  HYP_CHECK(f.map_.size() >= 4 && std::memcmp(f.map_.data(), "GGUF", 4) == 0,
            "gguf: {}: bad magic (the file does not start with \"GGUF\"; not a GGUF file)", path);
  c.skip(4, "magic");
  f.version_ = c.read<uint32_t>("version");
  // v2 and v3 share this layout (v3 only added big-endian files, which announce
  // themselves with a byte-swapped version and are rejected here).
  HYP_CHECK(f.version_ == 2 || f.version_ == 3,
            "gguf: {}: unsupported GGUF version {} (expected 3){}", path, f.version_,
            f.version_ == 0x03000000u ? " - a big-endian file?" : "");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("key/value count");

  // Key/value pairs. Every entry consumes at least 13 bytes, so corrupted counts end in a
  // truncation error quickly; no allocation is sized from a count before it is checked.
  for (uint64_t i = 0; i < n_kv; ++i) {
    c.context = fmt::format("key/value pair {}", i);
    std::string key = c.read_string("key");
    c.context = fmt::format("key '{}'", key);
    HYP_CHECK(f.kv_index_.count(key) == 0, "gguf: {}: key '{}': duplicate key", path, key);
    Value v;
    const uint32_t t = c.read<uint32_t>("value type");
    HYP_CHECK(known_gguf_type(t), "gguf: {}: key '{}': unknown value type {}", path, key, t);
    v.type = static_cast<GgufType>(t);
    if (v.type == GgufType::kString) {
      v.strings.push_back(c.read_string("string value"));
    } else if (v.type == GgufType::kArray) {
      const uint32_t et = c.read<uint32_t>("array element type");
      HYP_CHECK(known_gguf_type(et), "gguf: {}: key '{}': unknown array element type {}", path, key,
                et);
      v.elem = static_cast<GgufType>(et);
      HYP_CHECK(v.elem != GgufType::kArray, "gguf: {}: key '{}': nested arrays are not supported",
                path, key);
      v.count = c.read<uint64_t>("array length");
      if (v.elem == GgufType::kString) {
        // Each element takes at least its 8-byte length.
        HYP_CHECK(v.count <= c.remaining() / 8,
                  "gguf: {}: key '{}': array of {} strings does not fit in the {} bytes left; "
                  "truncated or corrupted",
                  path, key, v.count, c.remaining());
        v.strings.reserve(v.count);
        for (uint64_t k = 0; k < v.count; ++k) v.strings.push_back(c.read_string("string array"));
      } else {
        const size_t es = gguf_scalar_size(v.elem);
        HYP_CHECK(v.count <= c.remaining() / es,
                  "gguf: {}: key '{}': array of {} {} values does not fit in the {} bytes left; "
                  "truncated or corrupted",
                  path, key, v.count, gguf_type_name(v.elem), c.remaining());
        v.raw = c.here();
        c.skip(v.count * es, "array values");
      }
    } else {
      const size_t es = gguf_scalar_size(v.type);
      c.need(es, "value");
      v.raw = c.here();
      c.skip(es, "value");
    }
    f.kv_index_.emplace(key, f.values_.size());
    f.keys_.push_back(std::move(key));
    f.values_.push_back(std::move(v));
  }

  if (f.has("general.alignment")) {
    const Value& a = f.value("general.alignment");
    HYP_CHECK(a.type == GgufType::kU32, "gguf: {}: key 'general.alignment' is {}, expected u32",
              path, gguf_type_name(a.type));
    std::memcpy(&f.alignment_, a.raw, 4);
    HYP_CHECK(is_pow2(f.alignment_), "gguf: {}: key 'general.alignment' = {} is not a power of two",
              path, f.alignment_);
  }

  // Tensor infos.
  for (uint64_t i = 0; i < n_tensors; ++i) {
    c.context = fmt::format("tensor info {}", i);
    GgufTensor t;
    t.name = c.read_string("tensor name");
    c.context = fmt::format("tensor '{}'", t.name);
    HYP_CHECK(!t.name.empty() && t.name.size() <= kGgufMaxNameLength,
              "gguf: {}: tensor '{}': name must have 1 to {} bytes", path, t.name,
              kGgufMaxNameLength);
    HYP_CHECK(f.tensor_index_.count(t.name) == 0, "gguf: {}: tensor '{}': duplicate tensor name",
              path, t.name);
    const uint32_t n_dims = c.read<uint32_t>("n_dims");
    HYP_CHECK(n_dims >= 1 && n_dims <= uint32_t(kGgufMaxDims),
              "gguf: {}: tensor '{}': n_dims = {} (expected 1 to {})", path, t.name, n_dims,
              kGgufMaxDims);
    uint64_t ne[kGgufMaxDims];
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ne[d] = c.read<uint64_t>("dims");
      HYP_CHECK(ne[d] <= uint64_t(std::numeric_limits<int64_t>::max()) &&
                    !__builtin_mul_overflow(numel, ne[d], &numel) &&
                    numel <= uint64_t(std::numeric_limits<int64_t>::max()),
                "gguf: {}: tensor '{}': dims overflow", path, t.name);
    }
    for (int d = int(n_dims) - 1; d >= 0; --d) t.shape.push_back(static_cast<int64_t>(ne[d]));
    const uint32_t type = c.read<uint32_t>("ggml type");
    HYP_CHECK(known_ggml_type(type),
              "gguf: {}: tensor '{}': unsupported ggml type {} (supported: f32, f16, bf16, {})",
              path, t.name, ggml_type_label(type), block_format_names());
    t.type = static_cast<GgmlType>(type);
    HYP_CHECK(ne[0] % uint64_t(ggml_block_size(t.type)) == 0,
              "gguf: {}: tensor '{}': row length {} is not a multiple of the {} block size {}",
              path, t.name, ne[0], ggml_type_name(t.type), ggml_block_size(t.type));
    t.nbytes = ggml_nbytes(t.type, static_cast<int64_t>(numel));
    t.offset = c.read<uint64_t>("tensor data offset");
    HYP_CHECK(t.offset % f.alignment_ == 0,
              "gguf: {}: tensor '{}': data offset {} is not a multiple of the alignment {}", path,
              t.name, t.offset, f.alignment_);
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  f.data_offset_ = align_up(c.pos(), f.alignment_);
  const uint64_t size = f.map_.size();
  const uint64_t data_size = f.data_offset_ <= size ? size - f.data_offset_ : 0;
  std::vector<const GgufTensor*> by_offset;
  for (auto& t : f.tensors_) {
    HYP_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset,
              "gguf: {}: tensor '{}': data [{}, {}) runs past the end of the file (data section "
              "holds {} bytes); truncated?",
              path, t.name, t.offset, t.offset + t.nbytes, data_size);
    t.data = f.map_.data() + f.data_offset_ + t.offset;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  const GgufTensor* furthest = nullptr;
  for (const GgufTensor* t : by_offset) {
    if (t->nbytes == 0) continue;
    HYP_CHECK(furthest == nullptr || t->offset >= furthest->offset + furthest->nbytes,
              "gguf: {}: tensor '{}': data at offset {} overlaps tensor '{}' [{}, {})", path,
              t->name, t->offset, furthest->name, furthest->offset,
              furthest->offset + furthest->nbytes);
    furthest = t;
  }
  return f;
}

const GgufFile::Value& GgufFile::value(const std::string& key) const {
  auto it = kv_index_.find(key);
  HYP_CHECK(it != kv_index_.end(), "gguf: {}: key '{}' not found", path_, key);
  return values_[it->second];
}

void GgufFile::wrong_type(const std::string& key, const Value& v, GgufType want, bool array) const {
  const std::string have = v.type == GgufType::kArray
                               ? fmt::format("array of {}", gguf_type_name(v.elem))
                               : std::string(gguf_type_name(v.type));
  fail("gguf: {}: key '{}' is {}, expected {}{}", path_, key, have, array ? "array of " : "",
       gguf_type_name(want));
}

GgufType GgufFile::type(const std::string& key) const {
  return value(key).type;
}

GgufType GgufFile::array_type(const std::string& key) const {
  const Value& v = value(key);
  HYP_CHECK(v.type == GgufType::kArray, "gguf: {}: key '{}' is {}, not an array", path_, key,
            gguf_type_name(v.type));
  return v.elem;
}

uint64_t GgufFile::array_size(const std::string& key) const {
  array_type(key);
  return value(key).count;
}

template <typename T>
T GgufFile::get(const std::string& key) const {
  const Value& v = value(key);
  constexpr GgufType want = GgufTypeOf<T>::value;
  if (v.type != want) wrong_type(key, v, want, false);
  if constexpr (std::is_same_v<T, std::string>) {
    return v.strings[0];
  } else if constexpr (std::is_same_v<T, bool>) {
    return v.raw[0] != 0;
  } else {
    T out;
    std::memcpy(&out, v.raw, sizeof(T));
    return out;
  }
}

template <typename T>
std::vector<T> GgufFile::get_array(const std::string& key) const {
  const Value& v = value(key);
  constexpr GgufType want = GgufTypeOf<T>::value;
  if (v.type != GgufType::kArray || v.elem != want) wrong_type(key, v, want, true);
  if constexpr (std::is_same_v<T, std::string>) {
    return v.strings;
  } else {
    std::vector<T> out(v.count);
    for (uint64_t i = 0; i < v.count; ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        out[i] = v.raw[i] != 0;
      } else {
        std::memcpy(&out[i], v.raw + i * sizeof(T), sizeof(T));
      }
    }
    return out;
  }
}

#define HYP_GGUF_INSTANTIATE(T)                          \
  template T GgufFile::get<T>(const std::string&) const; \
  template std::vector<T> GgufFile::get_array<T>(const std::string&) const;
HYP_GGUF_INSTANTIATE(uint8_t)
HYP_GGUF_INSTANTIATE(int8_t)
HYP_GGUF_INSTANTIATE(uint16_t)
HYP_GGUF_INSTANTIATE(int16_t)
HYP_GGUF_INSTANTIATE(uint32_t)
HYP_GGUF_INSTANTIATE(int32_t)
HYP_GGUF_INSTANTIATE(uint64_t)
HYP_GGUF_INSTANTIATE(int64_t)
HYP_GGUF_INSTANTIATE(float)
HYP_GGUF_INSTANTIATE(double)
HYP_GGUF_INSTANTIATE(bool)
HYP_GGUF_INSTANTIATE(std::string)
#undef HYP_GGUF_INSTANTIATE

const GgufTensor* GgufFile::find(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find(name);
  HYP_CHECK(t != nullptr, "gguf: {}: tensor '{}' not found ({} tensors)", path_, name,
            tensors_.size());
  return *t;
}

std::vector<float> GgufFile::dequantize(const std::string& name) const {
  const GgufTensor& t = tensor(name);
  const int64_t n = t.shape.numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (t.type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(out.data(), t.data, t.nbytes);
      break;
    case GgmlType::kF16:  // the data section and offsets are aligned, so this is aligned
      convert_f16_to_f32(static_cast<const f16*>(t.data), out.data(), size_t(n));
      break;
    case GgmlType::kBF16:
      convert_bf16_to_f32(static_cast<const bf16*>(t.data), out.data(), size_t(n));
      break;
    case GgmlType::kQ8_0:
      dequantize_row_q8_0(t.data, out.data(), n);
      break;
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      decode_blocks(t.type, static_cast<const unsigned char*>(t.data), out.data(), n);
      break;
  }
  return out;
}

}  // namespace hyperion::io
