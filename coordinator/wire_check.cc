#include "coordinator/wire_check.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <map>
#include <vector>

#include "common/utf8.h"

namespace deja::coordinator {
namespace {

using google::protobuf::internal::WireFormatLite;

// A message's string fields to check (number -> name) and message fields to descend into.
struct Shape {
  std::map<int, std::string> strings;
  std::map<int, std::pair<std::string, const Shape*>> messages;
  std::map<int, bool> repeated;  // string fields whose name gets an index
};

Status Scan(std::string_view wire, const Shape& shape, const std::string& prefix) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()),
                                            static_cast<int>(wire.size()));
  std::map<int, int> seen;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      return in.CurrentPosition() == static_cast<int>(wire.size())
                 ? Status::Ok()
                 : DataLoss("the request is not a valid protobuf message");
    }
    const int field = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    auto s = shape.strings.find(field);
    auto m = shape.messages.find(field);
    if (!delimited || (s == shape.strings.end() && m == shape.messages.end())) {
      if (!WireFormatLite::SkipField(&in, tag)) {
        return DataLoss("the request is not a valid protobuf message");
      }
      continue;
    }
    std::string bytes;
    uint32_t length = 0;
    if (!in.ReadVarint32(&length) || !in.ReadString(&bytes, static_cast<int>(length))) {
      return DataLoss("the request is not a valid protobuf message");
    }
    if (s != shape.strings.end()) {
      std::string name = prefix + s->second;
      if (shape.repeated.count(field)) name += "[" + std::to_string(seen[field]++) + "]";
      if (size_t bad = FindInvalidUtf8(bytes); bad != kUtf8Valid) {
        return InvalidArgument(name + " is not valid UTF-8 (bad byte at offset " +
                               std::to_string(bad) + ")");
      }
    } else {
      DEJA_RETURN_IF_ERROR(Scan(bytes, *m->second.second, prefix + m->second.first + "."));
    }
  }
}

const Shape& GenerateShape() {
  static const Shape* stopping = new Shape{{{2, "stop_sequences"}}, {}, {{2, true}}};
  static const Shape* sparsity = new Shape{{{2, "schedule"}}, {}, {}};
  static const Shape* request =
      new Shape{{{1, "request_id"}, {2, "text"}},
                {{5, {"stopping", stopping}}, {8, {"sparsity", sparsity}}},
                {}};
  return *request;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

template <typename T>
StatusOr<T> Parse(const grpc::ByteBuffer& buffer, Status (*check)(std::string_view)) {
  const std::string wire = Flatten(buffer);
  Status s = check(wire);
  if (!s.ok()) {
    return s.code() == StatusCode::kDataLoss ? InvalidArgument("request: " + s.message()) : s;
  }
  T message;
  if (!message.ParseFromString(wire)) {
    return InvalidArgument("request: not a valid " + message.GetTypeName() + " message");
  }
  return message;
}

}  // namespace

Status CheckGenerateRequestUtf8(std::string_view wire) { return Scan(wire, GenerateShape(), ""); }

Status CheckTokenizeRequestUtf8(std::string_view wire) {
  static const Shape* tokenize = new Shape{{{1, "text"}}, {}, {}};
  return Scan(wire, *tokenize, "");
}

StatusOr<v1::GenerateRequest> ParseGenerateRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::GenerateRequest>(buffer, &CheckGenerateRequestUtf8);
}

StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::TokenizeRequest>(buffer, &CheckTokenizeRequestUtf8);
}

StatusOr<v1::CancelRequest> ParseCancelRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::CancelRequest>(buffer, [](std::string_view wire) {
    static const Shape* cancel = new Shape{{{1, "request_id"}}, {}, {}};
    return Scan(wire, *cancel, "");
  });
}

StatusOr<v1::GetModelInfoRequest> ParseGetModelInfoRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::GetModelInfoRequest>(buffer, [](std::string_view wire) {
    static const Shape* none = new Shape{{}, {}, {}};
    return Scan(wire, *none, "");
  });
}

void SerializeTo(const google::protobuf::MessageLite& message, grpc::ByteBuffer* buffer) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  *buffer = grpc::ByteBuffer(&slice, 1);
}

}  // namespace deja::coordinator
