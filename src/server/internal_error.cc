#include "server/internal_error.h"

#include <cstdio>

#include "server/sse.h"

namespace beluga::server {

std::string report_internal_error(std::string_view where, std::string_view what) {
  const std::string id = random_id("err_", 16);
  std::fprintf(stderr, "beluga serve: internal error %s in %.*s: %.*s\n", id.c_str(), int(where.size()),
               where.data(), int(what.size()), what.data());
  return "internal error " + id + "; the request failed (the server log has the details under this id)";
}

}  // namespace beluga::server
