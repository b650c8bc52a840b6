// onnx_value_file.hpp - the value files tests/peers/run_peers.py and sdalloc_peers_onnx exchange:
// one ONNX value per file (a node test's input, or an output a session produced).
//
// run_peers.py reads ONNX's TensorProto / SequenceProto / OptionalProto files with Debian's
// python3-onnx and writes them in this form, which needs no protobuf here; sdalloc_peers_onnx
// makes OrtValues of them, runs the model, and writes each output back the same way, so that
// two allocators' outputs compare byte for byte (file equality) and run_peers.py checks them
// against ONNX's expected outputs.
//
// Format (little-endian, as the machines that run it are):
//   file    := "SDPV" u32(version = 1) value
//   value   := 'T' tensor | 'S' u32(count) tensor{count} | 'N'  (an empty optional)
//   tensor  := i32(element type) u32(rank) i64(dim){rank} elements
//   elements: the raw elements (element count * element size bytes), or for STRING, per
//             element u64(length) and that many bytes.
// The element type is ONNX's TensorProto.DataType, which ORT's ONNXTensorElementDataType
// numbers the same way. An optional that holds a value is written as that value.
//
// Errors: std::runtime_error naming the file and what is wrong (cannot open, truncated, bad
// magic or version, unknown element type or value kind, trailing bytes).
#pragma once

#include <onnxruntime_c_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sdalloc::peers {

struct TensorData {
  std::int32_t element_type = 0;  // ONNXTensorElementDataType
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;   // the raw elements (not for STRING)
  std::vector<std::string> strings;  // STRING elements
};

struct ValueData {
  enum class Kind : char { kTensor = 'T', kSequence = 'S', kNone = 'N' };
  Kind kind = Kind::kNone;
  std::vector<TensorData> tensors;  // one for kTensor, the elements for kSequence
};

// Bytes per element of an ONNX element type; 0 for STRING; throws for a type it does not know.
std::size_t element_size(std::int32_t element_type);

ValueData read_value_file(const std::string& path);
// The file's bytes (what write_value_file writes), for comparing runs in memory.
std::string encode_value(const ValueData& value);
void write_value_file(const std::string& path, const ValueData& value);

// OrtValue <-> ValueData through ORT's C API. to_ort_value allocates the tensors with
// `allocator` (the caller releases the OrtValue); from_ort_value reads a tensor, a sequence of
// tensors, or an optional, and throws for other kinds (maps). kNone has no OrtValue:
// to_ort_value throws for it (the caller leaves such an input out).
OrtValue* to_ort_value(const ValueData& value, OrtAllocator* allocator);
ValueData from_ort_value(const OrtValue* value, OrtAllocator* allocator);

}  // namespace sdalloc::peers
