#include "recipe/encode_request.h"

namespace beluga::recipe {

Prompt encode_request(const ChatEncoder& encoder, const ParsedRequest& request) {
  try {
    return encoder.encode(request.conversation);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    // Encoders only throw on conversations the format cannot express: the client's to fix.
    throw ApiError(request.api, 400, e.what());
  }
}

}  // namespace beluga::recipe
