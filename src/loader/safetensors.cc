#include "loader/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace beluga {

namespace {
constexpr uint64_t kMaxHeader = 100ull << 20;  // the format's own limit (100 MB)
}

Tensor TensorInfo::view() const {
  return Tensor::make(const_cast<void*>(data), dtype, shape.data(), int(shape.size()));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path), path_(path) {
  parse(file_.data(), file_.size());
}

SafetensorsFile SafetensorsFile::from_bytes(const std::string& bytes, const std::string& name) {
  SafetensorsFile f;
  f.path_ = name;
  f.parse(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return f;
}

void SafetensorsFile::parse(const unsigned char* data, size_t size) {
  BELUGA_CHECK(size >= 8, path_, ": truncated safetensors file (", size, " bytes)");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | data[i];
  BELUGA_CHECK(hlen <= kMaxHeader, path_, ": safetensors header too long (", hlen, " bytes)");
  BELUGA_CHECK(hlen <= size - 8, path_, ": header length ", hlen, " exceeds the file size ", size);
  const unsigned char* base = data + 8 + hlen;
  const size_t data_size = size - 8 - hlen;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data + 8, data + 8 + hlen);
  } catch (const std::exception& e) {
    fail(path_, ": corrupt safetensors header: ", e.what());
  }
  BELUGA_CHECK(header.is_object(), path_, ": safetensors header is not a JSON object");

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    BELUGA_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                     entry.contains("data_offsets"),
                 path_, ": tensor ", name, ": entry needs dtype, shape and data_offsets");
    const auto& jd = entry["dtype"];
    BELUGA_CHECK(jd.is_string(), path_, ": tensor ", name, ": dtype is not a string");
    TensorInfo info{};
    BELUGA_CHECK(dtype_from_name(jd.get<std::string>(), &info.dtype), path_, ": tensor ", name,
                 ": unsupported dtype ", jd.get<std::string>());
    const auto& js = entry["shape"];
    BELUGA_CHECK(js.is_array() && js.size() <= size_t(Tensor::kMaxDims), path_, ": tensor ", name,
                 ": bad shape");
    uint64_t numel = 1;
    for (const auto& d : js) {
      BELUGA_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), path_,
                   ": tensor ", name, ": bad dimension");
      uint64_t dim = d.get<uint64_t>();
      BELUGA_CHECK(dim < (1ull << 40) && (dim == 0 || numel <= (1ull << 48) / dim), path_, ": tensor ", name,
                   ": shape too large");
      numel *= dim;
      info.shape.push_back(int64_t(dim));
    }
    const auto& jo = entry["data_offsets"];
    BELUGA_CHECK(jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(),
                 path_, ": tensor ", name, ": bad data_offsets");
    uint64_t b = jo[0].get<uint64_t>(), e = jo[1].get<uint64_t>();
    BELUGA_CHECK(b <= e && e <= data_size, path_, ": tensor ", name, ": data_offsets [", b, ", ", e,
                 ") outside the data (", data_size, " bytes): file truncated or corrupt");
    BELUGA_CHECK(e - b == numel * dtype_size(info.dtype), path_, ": tensor ", name, ": ", e - b,
                 " bytes do not match shape and dtype");
    info.data = base + b;
    info.nbytes = size_t(e - b);
    ranges.emplace_back(b, e);
    tensors_.emplace(name, std::move(info));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    BELUGA_CHECK(ranges[i].first >= ranges[i - 1].second, path_, ": overlapping tensor data offsets");
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  BELUGA_CHECK(t, path_, ": missing tensor ", name);
  return *t;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (auto d : t.shape) n *= uint64_t(d);
    header[t.name] = {
        {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');  // keeps tensor data 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  BELUGA_CHECK(out, "cannot write ", path);
  uint64_t hl = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = (hl >> (8 * i)) & 0xff;
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const auto& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (auto d : t.shape) n *= uint64_t(d);
    out.write(static_cast<const char*>(t.data), std::streamsize(n));
  }
  BELUGA_CHECK(out, "write failed: ", path);
}

}  // namespace beluga
