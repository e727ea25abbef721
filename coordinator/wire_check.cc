#include "coordinator/wire_check.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <map>
#include <string>
#include <vector>

#include "common/utf8.h"

namespace deja::coordinator {
namespace {

using google::protobuf::internal::WireFormatLite;

// Every string field of `d` on the wire (at any depth, by the message's descriptor, so a field
// added later is checked too), named with its path; repeated ones with their index.
Status Scan(std::string_view wire, const google::protobuf::Descriptor& d, const std::string& prefix) {
  using google::protobuf::FieldDescriptor;
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
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const FieldDescriptor* f = d.FindFieldByNumber(number);
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    const bool text = f != nullptr && f->type() == FieldDescriptor::TYPE_STRING;
    const bool message = f != nullptr && f->type() == FieldDescriptor::TYPE_MESSAGE;
    if (!delimited || !(text || message)) {
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
    std::string name = prefix + f->name();
    if (f->is_repeated()) name += "[" + std::to_string(seen[number]++) + "]";
    if (text) {
      if (size_t bad = FindInvalidUtf8(bytes); bad != kUtf8Valid) {
        return InvalidArgument(name + " is not valid UTF-8 (bad byte at offset " +
                               std::to_string(bad) + ")");
      }
    } else {
      DEJA_RETURN_IF_ERROR(Scan(bytes, *f->message_type(), name + "."));
    }
  }
}

template <typename T>
Status ScanAs(std::string_view wire) {
  return Scan(wire, *T::descriptor(), "");
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

Status CheckGenerateRequestUtf8(std::string_view wire) {
  return ScanAs<v1::GenerateRequest>(wire);
}

Status CheckTokenizeRequestUtf8(std::string_view wire) { return ScanAs<v1::TokenizeRequest>(wire); }

StatusOr<v1::GenerateRequest> ParseGenerateRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::GenerateRequest>(buffer, &CheckGenerateRequestUtf8);
}

StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::TokenizeRequest>(buffer, &CheckTokenizeRequestUtf8);
}

StatusOr<v1::CancelRequest> ParseCancelRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::CancelRequest>(buffer, &ScanAs<v1::CancelRequest>);
}

StatusOr<v1::GetModelInfoRequest> ParseGetModelInfoRequest(const grpc::ByteBuffer& buffer) {
  return Parse<v1::GetModelInfoRequest>(buffer, &ScanAs<v1::GetModelInfoRequest>);
}

void SerializeTo(const google::protobuf::MessageLite& message, grpc::ByteBuffer* buffer) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  *buffer = grpc::ByteBuffer(&slice, 1);
}

}  // namespace deja::coordinator
