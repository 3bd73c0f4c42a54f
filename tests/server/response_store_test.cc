// The stored-responses LRU: capacity and recency, tenant isolation, delete, chained conversations
// (also past eviction, and without recursion on long chains), concurrent use.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "server/response_store.h"

namespace beluga::server {
namespace {

using OJson = nlohmann::ordered_json;

// "prefix" + n (spelled so that GCC 12 does not warn: its -Wrestrict misfires on "literal" + string).
std::string id_of(const char* prefix, int n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

// A response `id` of `tenant` whose input is one user message `in` and whose output is one
// assistant message `out`.
std::shared_ptr<StoredResponse> make(const std::string& id, const std::string& tenant = "t",
                                     const std::string& in = "q", const std::string& out = "a",
                                     std::shared_ptr<const StoredResponse> previous = nullptr) {
  auto r = std::make_shared<StoredResponse>();
  r->tenant = tenant;
  r->input = OJson::array({OJson{{"type", "message"}, {"role", "user"}, {"content", in}}});
  r->response = OJson{
      {"id", id},
      {"object", "response"},
      {"instructions", std::string("sys of ").append(id)},
      {"output",
       OJson::array({OJson{{"type", "message"},
                           {"role", "assistant"},
                           {"content", OJson::array({OJson{{"type", "output_text"}, {"text", out}}})}}})}};
  r->previous = std::move(previous);
  return r;
}

TEST(ResponseStore, EvictsTheLeastRecentlyUsed) {
  ResponseStore s(2);
  s.put(make("a"));
  s.put(make("b"));
  ASSERT_TRUE(s.get("a", "t"));  // a is now more recent than b
  s.put(make("c"));
  EXPECT_EQ(s.size(), 2u);
  EXPECT_TRUE(s.get("a", "t"));
  EXPECT_FALSE(s.get("b", "t"));
  EXPECT_TRUE(s.get("c", "t"));
  // Storing an id again replaces the entry without growing the store.
  s.put(make("c", "t", "q2"));
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.get("c", "t")->input[0]["content"], "q2");
  EXPECT_TRUE(s.get("a", "t"));
}

TEST(ResponseStore, CapacityZeroStoresNothing) {
  ResponseStore s(0);
  s.put(make("a"));
  EXPECT_EQ(s.size(), 0u);
  EXPECT_FALSE(s.get("a", "t"));
}

TEST(ResponseStore, TenantsSeeOnlyTheirOwn) {
  ResponseStore s(8);
  s.put(make("a", "alice"));
  EXPECT_TRUE(s.get("a", "alice"));
  EXPECT_FALSE(s.get("a", "bob"));
  EXPECT_FALSE(s.get("a", ""));
  EXPECT_FALSE(s.erase("a", "bob"));  // another tenant cannot delete it either
  EXPECT_TRUE(s.get("a", "alice"));
}

TEST(ResponseStore, Delete) {
  ResponseStore s(8);
  s.put(make("a"));
  EXPECT_FALSE(s.erase("nope", "t"));
  EXPECT_TRUE(s.erase("a", "t"));
  EXPECT_FALSE(s.get("a", "t"));
  EXPECT_FALSE(s.erase("a", "t"));
  EXPECT_EQ(s.size(), 0u);
}

TEST(ResponseStore, ChainConversationAndInput) {
  ResponseStore s(1);
  s.put(make("a", "t", "q1", "a1"));
  auto a = s.get("a", "t");
  s.put(make("b", "t", "q2", "a2", a));  // evicts a, which b still continues
  EXPECT_FALSE(s.get("a", "t"));
  auto b = s.get("b", "t");
  ASSERT_TRUE(b);
  // Input items then output items, turn by turn; no instructions.
  const OJson conv = b->conversation();
  ASSERT_EQ(conv.size(), 4u) << conv.dump();
  EXPECT_EQ(conv[0]["content"], "q1");
  EXPECT_EQ(conv[1]["content"][0]["text"], "a1");
  EXPECT_EQ(conv[2]["content"], "q2");
  EXPECT_EQ(conv[3]["content"][0]["text"], "a2");
  EXPECT_EQ(conv.dump().find("sys of"), std::string::npos);
}

TEST(ResponseStore, LongChainsDoNotRecurse) {
  // Neither conversation() nor releasing a chain may recurse per turn (200000 turns would
  // overflow the stack).
  {
    ResponseStore s(4);
    std::shared_ptr<const StoredResponse> prev;
    for (int i = 0; i < 200000; ++i) {
      auto r = std::make_shared<StoredResponse>();
      r->response = OJson{{"id", id_of("r", i)}};
      r->previous = std::move(prev);
      prev = r;
      s.put(std::move(r));
    }
    EXPECT_EQ(prev->conversation().size(), 0u);
    EXPECT_EQ(s.size(), 4u);
  }
  // A short chain's conversation has every turn.
  std::shared_ptr<const StoredResponse> prev;
  for (int i = 0; i < 50; ++i) prev = make(id_of("r", i), "t", "q", "a", prev);
  EXPECT_EQ(prev->conversation().size(), 100u);
}

TEST(ResponseStore, ConcurrentUse) {
  ResponseStore s(64);
  std::atomic<int> hits{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const std::string id = id_of(id_of("r", t).append("_").c_str(), i);
        s.put(make(id, "t"));
        if (s.get(id, "t")) ++hits;
        if (i % 3 == 0) s.erase(id, "t");
      }
    });
  for (auto& th : ts) th.join();
  EXPECT_LE(s.size(), 64u);
  EXPECT_GT(hits.load(), 0);
}

}  // namespace
}  // namespace beluga::server
