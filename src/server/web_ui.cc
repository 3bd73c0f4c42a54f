#include "server/web_ui.h"

namespace beluga::server {

namespace {

std::string_view content_type_of(std::string_view path) {
  if (path.ends_with(".html")) return "text/html; charset=utf-8";
  if (path.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (path.ends_with(".css")) return "text/css; charset=utf-8";
  if (path.ends_with(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

}  // namespace

std::optional<WebAsset> web_asset(std::string_view path) {
  if (path == "/") path = "/index.html";
  for (size_t i = 0; i < kNumWebFiles; ++i)
    if (kWebFiles[i].path == path) return WebAsset{content_type_of(path), kWebFiles[i].bytes};
  return std::nullopt;
}

}  // namespace beluga::server
