// Spellings of the DeepSeek control tokens (U+FF5C `｜`, U+2581 `▁`), shared by encoders and parser.
#pragma once

namespace beluga::recipe::ds {

inline constexpr const char* kBos = "<｜begin▁of▁sentence｜>";
inline constexpr const char* kEos = "<｜end▁of▁sentence｜>";
inline constexpr const char* kUser = "<｜User｜>";
inline constexpr const char* kAssistant = "<｜Assistant｜>";
inline constexpr const char* kSystem = "<｜System｜>";  // V4.1 only
inline constexpr const char* kThinkBegin = "<think>";
inline constexpr const char* kThinkEnd = "</think>";
inline constexpr const char* kCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr const char* kCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr const char* kCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr const char* kCallEnd = "<｜tool▁call▁end｜>";
inline constexpr const char* kToolSep = "<｜tool▁sep｜>";
inline constexpr const char* kOutputsBegin = "<｜tool▁outputs▁begin｜>";
inline constexpr const char* kOutputsEnd = "<｜tool▁outputs▁end｜>";
inline constexpr const char* kOutputBegin = "<｜tool▁output▁begin｜>";
inline constexpr const char* kOutputEnd = "<｜tool▁output▁end｜>";
inline constexpr const char* kDsml = "｜DSML｜";

}  // namespace beluga::recipe::ds
