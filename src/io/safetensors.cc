#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "base/error.h"
#include "base/threads.h"
#include "tensor/convert.h"

namespace hyperion::io {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // real headers are a few MB at most
constexpr size_t kDataAlignment = 64;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F32", DType::kF32},      {"BF16", DType::kBF16},    {"F16", DType::kF16},
    {"F8_E4M3", DType::kE4M3}, {"F8_E5M2", DType::kE5M2}, {"I8", DType::kI8},
    {"U8", DType::kU8},        {"I32", DType::kI32},
};

bool parse_dtype_name(const std::string& s, DType* out) {
  for (const auto& e : kDTypeNames)
    if (s == e.name) {
      *out = e.dtype;
      return true;
    }
  return false;
}

// a * b with overflow detection.
bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// Reads a non-negative JSON integer; returns false for anything else (negative, float,
// string, ...).
bool json_to_u64(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

void put_u64_le(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t get_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& e : kDTypeNames)
    if (e.dtype == dtype) return e.name;
  fail("safetensors: invalid dtype {}", static_cast<int>(dtype));
}

// ---------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::add(std::string name, DType dtype, Shape shape, const void* data) {
  HYP_CHECK(!name.empty(), "SafetensorsWriter::add: empty tensor name");
  HYP_CHECK(name != kMetadataKey, "SafetensorsWriter::add: '{}' is a reserved name", name);
  HYP_CHECK(index_.count(name) == 0, "SafetensorsWriter::add: duplicate tensor '{}'", name);
  SafetensorsTensor t;
  t.dtype = dtype;
  t.nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  HYP_CHECK(data != nullptr || t.nbytes == 0, "SafetensorsWriter::add: tensor '{}' {} has no data",
            name, shape.str());
  t.shape = shape;
  t.data = data;
  t.name = std::move(name);
  index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

void SafetensorsWriter::write(const std::string& path) const {
  ordered_json header = ordered_json::object();
  if (!metadata_.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    ordered_json entry = ordered_json::object();
    entry["dtype"] = std::string(safetensors_dtype_name(t.dtype));
    ordered_json shape = ordered_json::array();
    for (int64_t d : t.shape) shape.push_back(d);
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = ordered_json::array({offset, offset + t.nbytes});
    offset += t.nbytes;
    header[t.name] = std::move(entry);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // e.g. a tensor name or metadata value that is not valid UTF-8
    fail("safetensors: {}: cannot encode the header: {}", path, e.what());
  }
  // Pad with spaces so that the data region starts at a multiple of kDataAlignment (which
  // also makes the header length a multiple of 8, as the format asks).
  size_t total = 8 + text.size();
  text.append((kDataAlignment - total % kDataAlignment) % kDataAlignment, ' ');

  AtomicFileWriter out(path);
  unsigned char len[8];
  put_u64_le(len, text.size());
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (const auto& t : tensors_) out.write(t.data, t.nbytes);
  out.commit();
}

// ---------------------------------------------------------------------------------------
// Reader

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  try {
    f.map_ = MappedFile::open(path);
  } catch (const Error& e) {
    fail("safetensors: {}", e.what());
  }
  const unsigned char* base = f.map_.data();
  const size_t size = f.map_.size();
  HYP_CHECK(size >= 8, "safetensors: {}: file is {} bytes, too short for the 8-byte header length",
            path, size);
  const uint64_t header_len = get_u64_le(base);
  HYP_CHECK(header_len <= kMaxHeaderBytes,
            "safetensors: {}: header length {} is absurd (limit {} bytes); not a safetensors "
            "file or corrupted",
            path, header_len, kMaxHeaderBytes);
  HYP_CHECK(8 + header_len <= size,
            "safetensors: {}: header length {} runs past the end of the file ({} bytes); "
            "truncated?",
            path, header_len, size);
  const char* text = reinterpret_cast<const char*>(base + 8);
  const unsigned char* data_region = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  // Duplicate top-level names would silently shadow each other in the parsed object.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + header_len, on_event);
  } catch (const json::exception& e) {
    fail("safetensors: {}: invalid JSON header: {}", path, e.what());
  }
  HYP_CHECK(duplicate.empty(), "safetensors: {}: tensor '{}': listed twice in the header", path,
            duplicate);
  HYP_CHECK(header.is_object(), "safetensors: {}: header is a JSON {}, expected an object", path,
            header.type_name());

  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      HYP_CHECK(entry.is_object(), "safetensors: {}: __metadata__ is a JSON {}, expected an object",
                path, entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        HYP_CHECK(v.is_string(),
                  "safetensors: {}: __metadata__ key '{}' is a JSON {}, expected a string", path, k,
                  v.type_name());
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    HYP_CHECK(entry.is_object(),
              "safetensors: {}: tensor '{}': entry is a JSON {}, expected an object", path, name,
              entry.type_name());
    for (const auto& [k, v] : entry.items()) {
      (void)v;
      HYP_CHECK(k == "dtype" || k == "shape" || k == "data_offsets",
                "safetensors: {}: tensor '{}': unknown field '{}' (expected dtype, shape, "
                "data_offsets)",
                path, name, k);
    }
    for (const char* field : {"dtype", "shape", "data_offsets"})
      HYP_CHECK(entry.contains(field), "safetensors: {}: tensor '{}': missing field '{}'", path,
                name, field);

    SafetensorsTensor t;
    t.name = name;
    const json& dt = entry["dtype"];
    HYP_CHECK(dt.is_string(), "safetensors: {}: tensor '{}': dtype is a JSON {}, expected a string",
              path, name, dt.type_name());
    HYP_CHECK(parse_dtype_name(dt.get<std::string>(), &t.dtype),
              "safetensors: {}: tensor '{}': unsupported dtype '{}' (supported: F32, BF16, F16, "
              "F8_E4M3, F8_E5M2, I8, U8, I32)",
              path, name, dt.get<std::string>());

    const json& shape = entry["shape"];
    HYP_CHECK(shape.is_array(),
              "safetensors: {}: tensor '{}': shape is a JSON {}, expected an array", path, name,
              shape.type_name());
    HYP_CHECK(shape.size() <= static_cast<size_t>(kMaxRank),
              "safetensors: {}: tensor '{}': rank {} exceeds the supported maximum of {}", path,
              name, shape.size(), kMaxRank);
    uint64_t numel = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      uint64_t d = 0;
      HYP_CHECK(json_to_u64(shape[i], &d),
                "safetensors: {}: tensor '{}': shape[{}] = {} is not a non-negative integer", path,
                name, i, shape[i].dump());
      HYP_CHECK(d <= uint64_t(std::numeric_limits<int64_t>::max()) && checked_mul(numel, d, &numel),
                "safetensors: {}: tensor '{}': shape {} overflows", path, name, shape.dump());
      t.shape.push_back(static_cast<int64_t>(d));
    }
    uint64_t nbytes = 0;
    HYP_CHECK(checked_mul(numel, dtype_size(t.dtype), &nbytes),
              "safetensors: {}: tensor '{}': shape {} overflows", path, name, shape.dump());

    const json& offsets = entry["data_offsets"];
    uint64_t begin = 0, end = 0;
    HYP_CHECK(offsets.is_array() && offsets.size() == 2 && json_to_u64(offsets[0], &begin) &&
                  json_to_u64(offsets[1], &end),
              "safetensors: {}: tensor '{}': data_offsets {} is not a pair of non-negative "
              "integers",
              path, name, offsets.dump());
    HYP_CHECK(begin <= end, "safetensors: {}: tensor '{}': data_offsets [{}, {}] end before begin",
              path, name, begin, end);
    HYP_CHECK(end <= data_size,
              "safetensors: {}: tensor '{}': data_offsets [{}, {}] past the end of the data "
              "region ({} bytes); truncated?",
              path, name, begin, end, data_size);
    HYP_CHECK(end - begin == nbytes,
              "safetensors: {}: tensor '{}': data_offsets [{}, {}] hold {} bytes but {}{} needs {}",
              path, name, begin, end, end - begin, dtype_name(t.dtype), t.shape.str(), nbytes);
    t.data = data_region + begin;
    t.nbytes = nbytes;
    f.tensors_.push_back(std::move(t));
  }

  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const auto& a, const auto& b) {
    if (a.data != b.data) return a.data < b.data;
    return a.name < b.name;
  });
  // Holes are tolerated; overlapping tensors are not (a write to one would change another).
  const SafetensorsTensor* furthest = nullptr;  // tensor reaching furthest so far
  for (const auto& t : f.tensors_) {
    if (t.nbytes == 0) continue;
    const auto* p = static_cast<const unsigned char*>(t.data);
    if (furthest != nullptr) {
      const auto* fend = static_cast<const unsigned char*>(furthest->data) + furthest->nbytes;
      HYP_CHECK(
          p >= fend, "safetensors: {}: tensor '{}': data [{}, {}) overlaps tensor '{}' [{}, {})",
          path, t.name, p - data_region, p - data_region + t.nbytes, furthest->name,
          static_cast<const unsigned char*>(furthest->data) - data_region, fend - data_region);
    }
    furthest = &t;
  }
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::get(const std::string& name) const {
  if (const auto* t = find(name)) return *t;
  // Suggest the names sharing the longest prefix with the one asked for.
  std::vector<std::pair<size_t, const std::string*>> ranked;
  for (const auto& t : tensors_) {
    size_t common = 0;
    while (common < name.size() && common < t.name.size() && name[common] == t.name[common])
      ++common;
    ranked.emplace_back(common, &t.name);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string names;
  for (size_t i = 0; i < ranked.size() && i < 5; ++i)
    names += (i ? ", '" : "'") + *ranked[i].second + "'";
  if (ranked.size() > 5) names += ", ...";
  fail("safetensors: {}: tensor '{}': not in the file ({} tensors{}{})", path_, name,
       tensors_.size(), names.empty() ? "" : "; similar: ", names);
}

void SafetensorsFile::read_into(const std::string& name, const TensorView& dst) const {
  const SafetensorsTensor& t = get(name);
  HYP_CHECK(dst.shape == t.shape,
            "safetensors: {}: tensor '{}': shape {}{} in the file but the destination is {}", path_,
            name, dtype_name(t.dtype), t.shape.str(), dst.str());
  HYP_CHECK(dst.is_contiguous(), "safetensors: {}: tensor '{}': destination {} is not contiguous",
            path_, name, dst.str());
  const DType s = t.dtype, d = dst.dtype;
  const bool float_src = s == DType::kF32 || s == DType::kBF16 || s == DType::kF16;
  const bool float_dst = d == DType::kF32 || d == DType::kBF16;
  HYP_CHECK(s == d || (float_src && float_dst),
            "safetensors: {}: tensor '{}': cannot convert {}{} to {} (conversions: f32/bf16/f16 "
            "to f32 or bf16, or the same dtype)",
            path_, name, dtype_name(s), t.shape.str(), dst.str());
  const int64_t n = t.shape.numel();
  if (n == 0) return;
  const auto* src = static_cast<const unsigned char*>(t.data);
  auto* out = static_cast<unsigned char*>(dst.data);
  const size_t ssize = dtype_size(s), dsize = dtype_size(d);
  if (s == d) {
    parallel_chunks(int64_t(t.nbytes), int64_t{1} << 20,
                    [&](int64_t b, int64_t e) { std::memcpy(out + b, src + b, size_t(e - b)); });
    return;
  }
  // Converts chunk by chunk through stack buffers. The source may be misaligned for its
  // dtype (tensors are packed back to back), so it is copied to an aligned buffer first
  // when needed.
  const bool aligned = reinterpret_cast<uintptr_t>(src) % ssize == 0;
  parallel_chunks(n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    constexpr int64_t kChunk = 4096;
    alignas(64) float f32_buf[kChunk];
    alignas(64) unsigned char src_buf[kChunk * 4];
    for (int64_t i = begin; i < end; i += kChunk) {
      const int64_t m = std::min(kChunk, end - i);
      const unsigned char* sp = src + i * ssize;
      if (!aligned) {
        std::memcpy(src_buf, sp, size_t(m) * ssize);
        sp = src_buf;
      }
      const float* fin = reinterpret_cast<const float*>(sp);
      if (s != DType::kF32) {
        float* f = d == DType::kF32 ? reinterpret_cast<float*>(out + i * dsize) : f32_buf;
        if (s == DType::kBF16)
          convert_bf16_to_f32(reinterpret_cast<const bf16*>(sp), f, size_t(m));
        else
          convert_f16_to_f32(reinterpret_cast<const f16*>(sp), f, size_t(m));
        fin = f;
      }
      if (d == DType::kBF16)
        convert_f32_to_bf16(fin, reinterpret_cast<bf16*>(out + i * dsize), size_t(m));
    }
  });
}

}  // namespace hyperion::io
