// onnx_value_file.cpp - reading and writing the value files (onnx_value_file.hpp), and turning
// them into OrtValues and back through ORT's C API.
#include "onnx_value_file.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace sdalloc::peers {

namespace {

constexpr char kMagic[4] = {'S', 'D', 'P', 'V'};
constexpr std::uint32_t kVersion = 1;

const OrtApi& api() { return *OrtGetApiBase()->GetApi(ORT_API_VERSION); }

void check(OrtStatus* status, const char* what) {
  if (status == nullptr) return;
  std::string message = std::string(what) + ": " + api().GetErrorMessage(status);
  api().ReleaseStatus(status);
  throw std::runtime_error(message);
}

// A cursor over a file's bytes that names the file in every error.
class Reader {
 public:
  Reader(std::string bytes, std::string path) : bytes_(std::move(bytes)), path_(std::move(path)) {}

  template <typename T>
  T scalar() {
    T value{};
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  const char* take(std::size_t n) {
    if (n > bytes_.size() - at_) fail("truncated (wanted " + std::to_string(n) + " more bytes)");
    const char* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  bool at_end() const { return at_ == bytes_.size(); }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": " + what + " at byte " + std::to_string(at_));
  }

 private:
  std::string bytes_;
  std::string path_;
  std::size_t at_ = 0;
};

std::size_t element_count(const std::vector<std::int64_t>& dims) {
  std::size_t count = 1;
  for (const std::int64_t d : dims) {
    if (d < 0) throw std::runtime_error("negative dimension " + std::to_string(d));
    count *= static_cast<std::size_t>(d);
  }
  return count;
}

TensorData read_tensor(Reader& in) {
  TensorData t;
  t.element_type = in.scalar<std::int32_t>();
  std::size_t size = 0;
  try {
    size = element_size(t.element_type);
  } catch (const std::exception& e) {
    in.fail(e.what());
  }
  const auto rank = in.scalar<std::uint32_t>();
  if (rank > 64) in.fail("rank " + std::to_string(rank) + " is not a tensor's");
  for (std::uint32_t i = 0; i < rank; ++i) t.dims.push_back(in.scalar<std::int64_t>());
  std::size_t count = 0;
  try {
    count = element_count(t.dims);
  } catch (const std::exception& e) {
    in.fail(e.what());
  }
  if (t.element_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
    for (std::size_t i = 0; i < count; ++i) {
      const auto length = in.scalar<std::uint64_t>();
      const char* p = in.take(length);
      t.strings.emplace_back(p, length);
    }
  } else {
    const char* p = in.take(count * size);
    t.bytes.assign(p, p + count * size);
  }
  return t;
}

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void encode_tensor(std::string& out, const TensorData& t) {
  put<std::int32_t>(out, t.element_type);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
  for (const std::int64_t d : t.dims) put<std::int64_t>(out, d);
  if (t.element_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
    for (const std::string& s : t.strings) {
      put<std::uint64_t>(out, s.size());
      out.append(s);
    }
  } else {
    out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
}

OrtValue* tensor_value(const TensorData& t, OrtAllocator* allocator) {
  OrtValue* value = nullptr;
  const auto type = static_cast<ONNXTensorElementDataType>(t.element_type);
  check(api().CreateTensorAsOrtValue(allocator, t.dims.data(), t.dims.size(), type, &value),
        "CreateTensorAsOrtValue");
  try {
    if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
      std::vector<const char*> strings;
      for (const std::string& s : t.strings) strings.push_back(s.c_str());
      check(api().FillStringTensor(value, strings.data(), strings.size()), "FillStringTensor");
    } else if (!t.bytes.empty()) {
      void* data = nullptr;
      check(api().GetTensorMutableData(value, &data), "GetTensorMutableData");
      std::memcpy(data, t.bytes.data(), t.bytes.size());
    }
  } catch (...) {
    api().ReleaseValue(value);
    throw;
  }
  return value;
}

TensorData tensor_data(const OrtValue* value) {
  TensorData t;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api().GetTensorTypeAndShape(value, &info), "GetTensorTypeAndShape");
  ONNXTensorElementDataType type{};
  std::size_t rank = 0;
  OrtStatus* status = api().GetTensorElementType(info, &type);
  if (status == nullptr) status = api().GetDimensionsCount(info, &rank);
  if (status == nullptr) {
    t.dims.resize(rank);
    status = api().GetDimensions(info, t.dims.data(), rank);
  }
  api().ReleaseTensorTypeAndShapeInfo(info);
  check(status, "tensor type and shape");
  t.element_type = type;
  const std::size_t count = element_count(t.dims);
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
    std::size_t total = 0;
    check(api().GetStringTensorDataLength(value, &total), "GetStringTensorDataLength");
    std::string text(total, '\0');
    std::vector<std::size_t> offsets(count);
    if (count != 0) {
      check(api().GetStringTensorContent(value, text.data(), total, offsets.data(), count),
            "GetStringTensorContent");
    }
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t end = i + 1 < count ? offsets[i + 1] : total;
      t.strings.push_back(text.substr(offsets[i], end - offsets[i]));
    }
    return t;
  }
  const std::size_t bytes = count * element_size(type);
  if (bytes != 0) {
    void* data = nullptr;
    check(api().GetTensorMutableData(const_cast<OrtValue*>(value), &data), "GetTensorMutableData");
    const auto* p = static_cast<const std::uint8_t*>(data);
    t.bytes.assign(p, p + bytes);
  }
  return t;
}

}  // namespace

std::size_t element_size(std::int32_t element_type) {
  switch (element_type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
      return 1;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32:
      return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64:
      return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128:
      return 16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING:
      return 0;
    default:
      throw std::runtime_error("unknown element type " + std::to_string(element_type));
  }
}

ValueData read_value_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path);
  Reader in(std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()),
            path);
  if (std::memcmp(in.take(4), kMagic, 4) != 0) in.fail("not a value file (no SDPV magic)");
  if (const auto version = in.scalar<std::uint32_t>(); version != kVersion) {
    in.fail("version " + std::to_string(version) + ", this reader knows 1");
  }
  ValueData value;
  const char kind = in.scalar<char>();
  if (kind == 'T') {
    value.kind = ValueData::Kind::kTensor;
    value.tensors.push_back(read_tensor(in));
  } else if (kind == 'S') {
    value.kind = ValueData::Kind::kSequence;
    const auto count = in.scalar<std::uint32_t>();
    for (std::uint32_t i = 0; i < count; ++i) value.tensors.push_back(read_tensor(in));
  } else if (kind == 'N') {
    value.kind = ValueData::Kind::kNone;
  } else {
    in.fail(std::string("unknown value kind '") + kind + "'");
  }
  if (!in.at_end()) in.fail("trailing bytes");
  return value;
}

std::string encode_value(const ValueData& value) {
  std::string out(kMagic, 4);
  put<std::uint32_t>(out, kVersion);
  put<char>(out, static_cast<char>(value.kind));
  if (value.kind == ValueData::Kind::kSequence) {
    put<std::uint32_t>(out, static_cast<std::uint32_t>(value.tensors.size()));
  }
  for (const TensorData& t : value.tensors) encode_tensor(out, t);
  return out;
}

void write_value_file(const std::string& path, const ValueData& value) {
  const std::string bytes = encode_value(value);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

OrtValue* to_ort_value(const ValueData& value, OrtAllocator* allocator) {
  if (value.kind == ValueData::Kind::kTensor) return tensor_value(value.tensors.at(0), allocator);
  if (value.kind == ValueData::Kind::kNone) {
    throw std::runtime_error("an empty optional has no OrtValue");
  }
  std::vector<OrtValue*> elements;
  try {
    for (const TensorData& t : value.tensors) elements.push_back(tensor_value(t, allocator));
    OrtValue* sequence = nullptr;
    check(api().CreateValue(elements.data(), elements.size(), ONNX_TYPE_SEQUENCE, &sequence),
          "CreateValue(sequence)");
    for (OrtValue* e : elements) api().ReleaseValue(e);  // the sequence holds copies
    return sequence;
  } catch (...) {
    for (OrtValue* e : elements) api().ReleaseValue(e);
    throw;
  }
}

ValueData from_ort_value(const OrtValue* value, OrtAllocator* allocator) {
  ValueData out;
  int has_value = 0;
  check(api().HasValue(value, &has_value), "HasValue");
  if (has_value == 0) return out;  // an empty optional
  ONNXType type{};
  check(api().GetValueType(value, &type), "GetValueType");
  if (type == ONNX_TYPE_TENSOR) {
    out.kind = ValueData::Kind::kTensor;
    out.tensors.push_back(tensor_data(value));
    return out;
  }
  if (type != ONNX_TYPE_SEQUENCE) {
    throw std::runtime_error("output of ONNXType " + std::to_string(type) +
                             " (only tensors, sequences of tensors and optionals are read)");
  }
  out.kind = ValueData::Kind::kSequence;
  std::size_t count = 0;
  check(api().GetValueCount(value, &count), "GetValueCount");
  for (std::size_t i = 0; i < count; ++i) {
    OrtValue* element = nullptr;
    check(api().GetValue(value, static_cast<int>(i), allocator, &element), "GetValue");
    try {
      out.tensors.push_back(tensor_data(element));
    } catch (...) {
      api().ReleaseValue(element);
      throw;
    }
    api().ReleaseValue(element);
  }
  return out;
}

}  // namespace sdalloc::peers
