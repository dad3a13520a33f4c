#include "diffusion/param_table.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "base/error.h"
#include "io/safetensors.h"
#include "io/weight_files.h"
#include "kernels/backend.h"
#include "kernels/fill.h"
#include "kernels/finite.h"
#include "tensor/convert.h"

namespace hyperion::diffusion {

int ParamTable::add(const std::string& name, Shape shape, ParamEntry::Init init) {
  HYP_CHECK(!allocated(), "parameter {} declared after the table was allocated", name);
  HYP_CHECK(!index_.count(name), "parameter {} declared twice", name);
  ParamEntry e;
  e.name = name;
  e.shape = shape;
  e.numel = 1;
  for (int64_t d : shape) e.numel *= d;
  e.offset = size_;
  e.init = init;
  size_ += (e.numel + 15) / 16 * 16;  // 64-byte aligned offsets
  index_[name] = int(entries_.size());
  entries_.push_back(std::move(e));
  return int(entries_.size()) - 1;
}

void ParamTable::keep_bf16(int i) {
  HYP_CHECK(!allocated(), "parameter {} marked bf16 after the table was allocated", entries_[size_t(i)].name);
  ParamEntry& e = entries_[size_t(i)];
  if (e.bf16_offset >= 0) return;
  e.bf16_offset = bf16_size_;
  bf16_size_ += (e.numel + 31) / 32 * 32;  // 64-byte aligned offsets
}

void ParamTable::allocate(bool with_grads) {
  data_.assign(size_t(size_), 0.0f);
  if (with_grads) grads_.assign(size_t(size_), 0.0f);
  ++version_;
}

void ParamTable::require_host(const char* what) const {
  HYP_CHECK(device_ == Device::kHost, "diffusion parameters: {} of a model on the {} (only on the host)", what,
            device_name(device_));
}

void ParamTable::to_device(Device device) {
  HYP_CHECK(allocated(), "ParamTable::to_device before allocate");
  if (device == device_) return;
  HYP_CHECK(grads_.empty(), "diffusion parameters: a model with gradients (training) stays on the host");
  const size_t bytes = size_t(size_) * sizeof(float);
  if (device != Device::kHost) {
    HYP_CHECK(device_ == Device::kHost, "diffusion parameters: from the {} to the {}", device_name(device_),
              device_name(device));
    KernelBackend& be = backend_for(device);
    DeviceBuffer values(be.allocator(), bytes);
    be.upload(data_.data(), values.data(), bytes);
    be.synchronize();  // the host copy goes next
    device_values_ = std::move(values);
    std::vector<float>().swap(data_);
    std::vector<bf16>().swap(bf16_);
  } else {
    KernelBackend& be = backend_for(device_);
    data_.resize(size_t(size_));
    be.download(device_values_.data(), data_.data(), bytes);
    device_values_ = DeviceBuffer();
    device_bf16_ = DeviceBuffer();
    if (bf16_on_) bf16_.assign(size_t(bf16_size_), bf16{});
  }
  device_ = device;
  bf16_version_ = 0;
}

void ParamTable::set_bf16_compute(bool on) {
  bf16_on_ = on;
  if (device_ != Device::kHost) {
    device_bf16_ = on ? DeviceBuffer(backend_for(device_).allocator(), size_t(bf16_size_) * sizeof(bf16))
                      : DeviceBuffer();
  } else if (on) {
    bf16_.assign(size_t(bf16_size_), bf16{});
  } else {
    std::vector<bf16>().swap(bf16_);
  }
  bf16_version_ = 0;
}

const bf16* ParamTable::data_bf16(int i) const {
  const ParamEntry& e = entries_[size_t(i)];
  HYP_CHECK(bf16_on_ && e.bf16_offset >= 0, "parameter {} has no bf16 copy (mixed precision {})", e.name,
            bf16_on_ ? "on, but it is not a matmul weight" : "off");
  const bool host = device_ == Device::kHost;
  if (!host && device_bf16_.empty())
    device_bf16_ = DeviceBuffer(backend_for(device_).allocator(), size_t(bf16_size_) * sizeof(bf16));
  bf16* base = host ? bf16_.data() : device_bf16_.as<bf16>();
  if (bf16_version_ != version_) {
    for (const ParamEntry& t : entries_) {
      if (t.bf16_offset < 0) continue;
      if (host)
        convert_f32_to_bf16(data_.data() + t.offset, base + t.bf16_offset, size_t(t.numel));
      else
        backend_for(device_).convert(values() + t.offset, DType::kF32, base + t.bf16_offset, DType::kBF16,
                                     size_t(t.numel));
    }
    bf16_version_ = version_;
  }
  return base + e.bf16_offset;
}

void ParamTable::set_grads(bool with_grads) {
  HYP_CHECK(allocated(), "ParamTable::set_grads before allocate");
  require_host("gradients");
  if (with_grads) grads_.assign(size_t(size_), 0.0f);
  else std::vector<float>().swap(grads_);
}

int ParamTable::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

void ParamTable::zero_grads() {
  require_host("gradients");
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void ParamTable::init(uint64_t seed) {
  HYP_CHECK(allocated(), "ParamTable::init before allocate");
  mark_written();
  for (size_t i = 0; i < entries_.size(); ++i) {
    const ParamEntry& e = entries_[i];
    float* p = data(int(i));
    switch (e.init) {
      case ParamEntry::Init::kOne:
        std::fill(p, p + e.numel, 1.0f);
        break;
      case ParamEntry::Init::kZero:
        std::fill(p, p + e.numel, 0.0f);
        break;
      case ParamEntry::Init::kWeight: {
        const int64_t fan_in = e.shape.rank() == 0 ? 1 : std::max<int64_t>(1, e.numel / e.shape[0]);
        fill_normal(TensorView(p, DType::kF32, {e.numel}), seed ^ hash_string(e.name.c_str()), 0.0f,
                    float(1.0 / std::sqrt(double(fan_in))));
        break;
      }
    }
  }
}

namespace {

// Shapes equal, or equal once trailing 1s are dropped from both (1x1 conv vs linear).
bool same_shape(const Shape& a, const Shape& b) {
  auto strip = [](const Shape& s) {
    int rank = s.rank();
    while (rank > 1 && s[rank - 1] == 1) --rank;
    return Shape(s.begin(), s.begin() + rank);
  };
  return a == b || strip(a) == strip(b);
}

std::string shape_str(const Shape& s) {
  return s.str();
}

}  // namespace

std::vector<std::string> ParamTable::load(const io::WeightFiles& files, const std::string& origin,
                                          const std::string& prefix,
                                          const std::vector<std::string>& ignored) {
  std::vector<std::string> unused =
      load_mapped(files, origin, [&](const std::string& n) { return prefix + n; }, prefix);
  std::erase_if(unused, [&](const std::string& n) {
    return std::find(ignored.begin(), ignored.end(), n.substr(prefix.size())) != ignored.end();
  });
  return unused;
}

std::vector<std::string> ParamTable::load_mapped(const io::WeightFiles& files, const std::string& origin,
                                                 const std::function<std::string(const std::string&)>& name_of,
                                                 const std::string& unused_prefix) {
  HYP_CHECK(allocated(), "ParamTable::load before allocate");
  mark_written();
  std::set<std::string> used;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const ParamEntry& e = entries_[i];
    const std::string name = name_of(e.name);
    const io::SafetensorsTensor* t = files.find(name);
    HYP_CHECK(t != nullptr, "{}: tensor {} is missing (the config expects it with shape {})", origin, name,
              shape_str(e.shape));
    HYP_CHECK(same_shape(t->shape, e.shape), "{}: tensor {} has shape {} where the config gives {}", origin,
              name, shape_str(t->shape), shape_str(e.shape));
    const TensorView dst(data(int(i)), DType::kF32, t->shape);
    files.file_of(name)->read_into(name, dst);
    const int64_t bad = first_nonfinite(TensorView(data(int(i)), DType::kF32, {e.numel}));
    HYP_CHECK(bad < 0, "{}: tensor {} holds a non-finite value ({}) at element {}", origin, name,
              data(int(i))[bad], bad);
    used.insert(name);
  }
  std::vector<std::string> unused;
  for (const std::string& n : files.names())
    if (!used.count(n) && n.compare(0, unused_prefix.size(), unused_prefix) == 0) unused.push_back(n);
  return unused;
}

void ParamTable::save(const std::string& path, const std::string& prefix) const {
  require_host("saving");
  io::SafetensorsWriter w;
  for (size_t i = 0; i < entries_.size(); ++i)
    w.add(prefix + entries_[i].name, DType::kF32, entries_[i].shape, data(int(i)));
  w.write(path);
}

}  // namespace hyperion::diffusion
