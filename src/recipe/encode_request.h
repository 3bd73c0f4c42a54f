// The server's one call from a parsed request to a prompt: encoding failures the client caused
// (an image for a text-only model, a template's raise_exception) become ApiError 400 in the
// request's API shape; anything else propagates.
#pragma once

#include "recipe/chat_format.h"
#include "recipe/prompt.h"
#include "recipe/request.h"

namespace beluga::recipe {

Prompt encode_request(const ChatEncoder& encoder, const ParsedRequest& request);

}  // namespace beluga::recipe
