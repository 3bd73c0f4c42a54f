// The server's side of disaggregated serving, without processes: the x-beluga-prefill-cached value
// (format and parse, malformed values refused), which role believes which header, and the prefill
// report's JSON; and the router's reading of that report (router/prefill_call.h).
#include <gtest/gtest.h>

#include "router/prefill_call.h"
#include "server/disaggregation.h"

namespace beluga::server {
namespace {

TEST(PrefillCached, RoundTripsAndRefusesMalformedValues) {
  const std::vector<PdRequest::Cached> c = {{128, 64, 0}, {0, 0, 0}, {192, 0, 192}};
  const std::string s = format_prefill_cached(c);
  EXPECT_EQ(s, "128/64/0,0/0/0,192/0/192");
  std::vector<PdRequest::Cached> back;
  ASSERT_TRUE(parse_prefill_cached(s, &back));
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[2].tokens, 192);
  EXPECT_EQ(back[2].disk, 192);
  for (const char* bad : {"", "1/2", "1/2/3/4", "a/0/0", "-1/0/0", "64/64/1", "64/0/0,", ",64/0/0", "64 /0/0",
                          "99999999999/0/0"})
    EXPECT_FALSE(parse_prefill_cached(bad, &back)) << bad;
}

TEST(PdRequest, OnlyAPrefillEngineWithATransferPrefillsAndOnlyADecodeEngineBelievesCachedCounts) {
  Disaggregation both, decode, prefill_without, prefill;
  decode.role = ServeRole::kDecode;
  prefill_without.role = ServeRole::kPrefill;
  prefill.role = ServeRole::kPrefill;
  prefill.store = reinterpret_cast<kv::TieredStore*>(&prefill);  // only compared with null here
  prefill.transfer = reinterpret_cast<kv::KvTransfer*>(&prefill);
  std::string err;
  EXPECT_TRUE(pd_request(both, "", "64/0/0", &err).cached.empty());  // a client's claim: ignored
  EXPECT_TRUE(pd_request(prefill, "", "64/0/0", &err).cached.empty());
  EXPECT_TRUE(err.empty());
  const PdRequest d = pd_request(decode, "", "64/0/0", &err);
  ASSERT_EQ(d.cached.size(), 1u);
  EXPECT_EQ(d.cached[0].tokens, 64);
  EXPECT_TRUE(pd_request(decode, "", "garbage", &err).cached.empty());
  EXPECT_TRUE(err.empty());
  EXPECT_EQ(pd_request(prefill, "127.0.0.1:9", "", &err).prefill_to, "127.0.0.1:9");
  EXPECT_TRUE(err.empty());
  for (const Disaggregation* refuses : {&both, &decode, &prefill_without}) {
    err.clear();
    EXPECT_TRUE(pd_request(*refuses, "127.0.0.1:9", "", &err).prefill_to.empty());
    EXPECT_NE(err.find("does not prefill"), std::string::npos) << err;
  }
}

TEST(PrefillReport, TheRouterReadsWhatTheEngineWrites) {
  PrefillReport r;
  r.prompts = {{200, {128, 64, 0}, 3, 3, 3}, {70, {0, 0, 0}, 1, 1, 1}};
  r.bytes = 4096;
  r.seconds = 0.01;
  std::string cached, error;
  bool ok = false;
  ASSERT_TRUE(router::prefill_cached_of_report(prefill_report_json(r).dump(), &cached, &error, &ok));
  EXPECT_TRUE(ok);
  EXPECT_EQ(cached, "128/64/0,0/0/0");
  std::vector<PdRequest::Cached> parsed;
  EXPECT_TRUE(parse_prefill_cached(cached, &parsed));
  // A failed transfer: not ok, with its error.
  r.ok = false;
  r.error = "sending the KV blocks to 127.0.0.1:9: connection refused";
  ASSERT_TRUE(router::prefill_cached_of_report(prefill_report_json(r).dump(), &cached, &error, &ok));
  EXPECT_FALSE(ok);
  EXPECT_EQ(error, r.error);
  // The API's own error JSON (a 400 from the engine): not ok, its message.
  ASSERT_TRUE(router::prefill_cached_of_report(R"({"error":{"message":"bad request","type":"x"}})", &cached,
                                               &error, &ok));
  EXPECT_FALSE(ok);
  EXPECT_EQ(error, "bad request");
  // Anything else is malformed.
  for (const char* bad : {"", "[]", "{}", R"({"object":"beluga.prefill","prompts":[]})",
                          R"({"object":"beluga.prefill","prompts":[{"cached_tokens":"1"}]})", "not json"})
    EXPECT_FALSE(router::prefill_cached_of_report(bad, &cached, &error, &ok)) << bad;
}

}  // namespace
}  // namespace beluga::server
