// Errors the router itself answers (no replica available, every attempt failed, a stream broken
// off), in the shape of the API the request's path belongs to, as `beluga serve` answers them.
#pragma once

#include <string>
#include <string_view>

namespace beluga::router {

// The JSON body of an error response.
std::string error_body(std::string_view path, int status, const std::string& message);
// The SSE events that end a stream the router cannot finish: Chat Completions / Completions an
// `error` object then [DONE]; Responses and Anthropic Messages an `error` event.
std::string stream_error_events(std::string_view path, const std::string& message);

}  // namespace beluga::router
