#include "server/internal_error.h"

#include "server/sse.h"
#include "util/log.h"

namespace beluga::server {

std::string report_internal_error(std::string_view where, std::string_view what) {
  const std::string id = random_id("err_", 16);
  log::error("serve", "internal error ", id, " in ", where, ": ", what);
  return "internal error " + id + "; the request failed (the server log has the details under this id)";
}

}  // namespace beluga::server
