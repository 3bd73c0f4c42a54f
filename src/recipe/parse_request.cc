// Request body text -> ParsedRequest for any of the three APIs.
#include "recipe/json_depth.h"
#include "recipe/request.h"

namespace beluga::recipe {

ParsedRequest parse_request(Api api, std::string_view body, const ParseOptions& opt) {
  const nlohmann::ordered_json j = parse_request_json(api, body);
  switch (api) {
    case Api::kChat:
      return parse_chat_request(j, opt);
    case Api::kResponses:
      return parse_responses_request(j, opt);
    case Api::kMessages:
      return parse_messages_request(j, opt);
  }
  throw ApiError(api, 400, "unknown API");
}

}  // namespace beluga::recipe
