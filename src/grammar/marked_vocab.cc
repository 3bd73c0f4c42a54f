#include "grammar/marked_vocab.h"

#include "util/error.h"

namespace beluga::grammar {

std::string marker_bytes(size_t k) {
  BELUGA_CHECK(k < 254, "too many marker tokens");
  return std::string{char(0xFF), char(k + 1)};
}

std::shared_ptr<const TokenVocab> marked_vocab(const TokenVocab& base, const std::vector<int>& markers) {
  std::vector<std::string> bytes(base.size());
  std::vector<uint8_t> is_marker(base.size(), 0);
  for (size_t k = 0; k < markers.size(); ++k) {
    BELUGA_CHECK(markers[k] >= 0 && size_t(markers[k]) < base.size(), "marker token ", markers[k],
                 " out of range");
    is_marker[size_t(markers[k])] = 1;
    bytes[size_t(markers[k])] = marker_bytes(k);
  }
  std::vector<int> special;
  for (size_t id = 0; id < base.size(); ++id) {
    if (is_marker[id]) continue;
    bytes[id] = base.bytes(int(id));
    if (!base.allowed(int(id)) || bytes[id].find(char(0xFF)) != std::string::npos) special.push_back(int(id));
  }
  return std::make_shared<const TokenVocab>(std::move(bytes), std::move(special), base.eos());
}

}  // namespace beluga::grammar
