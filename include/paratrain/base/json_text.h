// Writing JSON text by hand where a document is streamed (flight-recorder dumps, trace files):
// a string as a JSON string literal, quotes included ('"' and '\' escaped, control characters
// as \u00XX; other bytes, UTF-8 included, unchanged).
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace paratrain {

// Appends "s" (quoted and escaped) to `out`.
void append_json_string(std::string& out, std::string_view s);
// "s", quoted and escaped.
std::string json_string(std::string_view s);

}  // namespace paratrain
