// Header rules the router's proxying shares: which headers describe one hop and are never forwarded
// (RFC 9110 §7.6.1, plus the framing ones each side sets itself), and which are Beluga's own
// (`x-beluga-*`, the prefill/decode protocol between router and engines: never taken from a client).
#pragma once

#include <string_view>

namespace beluga::router {

inline bool header_iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if ((a[i] | 0x20) != (b[i] | 0x20)) return false;  // header names: ASCII letters, digits, '-'
  return true;
}

inline bool hop_by_hop(std::string_view name) {
  for (std::string_view h :
       {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
        "host", "content-length", "expect", "proxy-authorization"})
    if (header_iequals(name, h)) return true;
  return false;
}

inline bool internal_header(std::string_view name) {
  return name.size() >= 9 && header_iequals(name.substr(0, 9), "x-beluga-");
}

}  // namespace beluga::router
