// The web chat page `beluga serve` answers at `/`: static files from src/server/web, compiled into
// the binary (src/server/web/embed.cmake generates their bytes), so the page needs no network and
// no files beside the binary. The page talks to the server's own OpenAI API (/v1/chat/completions).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace beluga::server {

struct WebAsset {
  std::string_view content_type;
  std::string_view body;
};

// The page's file served at `path` ("/" and "/index.html" are the page itself; "/app.js", ...),
// or nullopt when `path` names none of them.
std::optional<WebAsset> web_asset(std::string_view path);

// Filled in by the generated web_assets.cc: each file of src/server/web by its path ("/app.js").
struct EmbeddedFile {
  std::string_view path;
  std::string_view bytes;
};
extern const EmbeddedFile kWebFiles[];
extern const size_t kNumWebFiles;

}  // namespace beluga::server
