// `beluga bench router`: the router's added latency per request and its SSE relay rate, against a
// synthetic upstream in the same process (no model runs); a table, and JSON with --out.
#pragma once

namespace beluga::cli {

int bench_router(int argc, char** argv);

}  // namespace beluga::cli
