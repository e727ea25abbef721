// Requests arrive as bytes and are parsed here, so that text which is not UTF-8 gets the
// API's INVALID_ARGUMENT naming the field. proto3 requires string fields to hold UTF-8 and the
// protobuf runtime refuses to parse a message whose strings do not, before any handler runs
// and with a status that names nothing; so the wire format is scanned first for the request's
// string fields, then parsed.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <string_view>

#include "common/status.h"
#include "deja/v1/text_generation.pb.h"

namespace deja::coordinator {

// INVALID_ARGUMENT naming the first string field of a serialized GenerateRequest that is not
// UTF-8, at any depth (request_id, text, stopping.stop_sequences[i], cache_salt, ...); DataLoss
// when the bytes are not a protobuf message.
Status CheckGenerateRequestUtf8(std::string_view wire);
// The same for a serialized TokenizeRequest (text).
Status CheckTokenizeRequestUtf8(std::string_view wire);

StatusOr<v1::GenerateRequest> ParseGenerateRequest(const grpc::ByteBuffer& buffer);
StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(const grpc::ByteBuffer& buffer);
StatusOr<v1::CancelRequest> ParseCancelRequest(const grpc::ByteBuffer& buffer);
StatusOr<v1::GetModelInfoRequest> ParseGetModelInfoRequest(const grpc::ByteBuffer& buffer);

// Serializes `message` into `buffer` (replacing its contents).
void SerializeTo(const google::protobuf::MessageLite& message, grpc::ByteBuffer* buffer);

}  // namespace deja::coordinator
