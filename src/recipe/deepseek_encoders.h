// DeepSeek prompt encoders: Conversation -> Prompt segments, written after each version's reference
// encoder (official chat templates for V3/R1/V3.1, the reference Python encoders for V4/V4.1).
// All of them put user-controlled text in text segments only. Errors (an image for these text-only
// formats, an unknown tool result order) throw beluga::Error.
#pragma once

#include "recipe/conversation.h"
#include "recipe/prompt.h"

namespace beluga::recipe {

// V3 (`r1=false`) and R1 (`r1=true`: generation opens `<think>\n`, history reasoning is dropped).
Prompt encode_deepseek_v3(const Conversation& conv, bool r1);
// V3.1 hybrid: `<｜Assistant｜><think>` when conv.thinking, `<｜Assistant｜></think>` otherwise.
Prompt encode_deepseek_v31(const Conversation& conv);
// V4 (`v41=false`) and V4.1 (`<｜System｜>`, numeric effort, ` calls`/` invoke`/` parameter` DSML tags).
Prompt encode_deepseek_v4(const Conversation& conv, bool v41);

}  // namespace beluga::recipe
