// netns.h's replica hosts: in namespaces, the check that a replica is its own host fails for one on
// loopback and holds for one in its namespace, and nothing is left once the hosts go away;
// BELUGA_TEST_NO_NETNS=1 puts every host on loopback.
#include "netns.h"

#include <dirent.h>
#include <net/if.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace beluga::router::testing {
namespace {

// This process's namespaces (/run/netns/beluga-t<pid>-*) and veth ends (blt<pid>h*) here.
int leftovers() {
  int n = 0;
  const std::string ns = "beluga-t" + std::to_string(getpid()) + "-",
                    link = "blt" + std::to_string(getpid()) + "h";
  if (DIR* d = opendir("/run/netns")) {
    while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind(ns, 0) == 0;
    closedir(d);
  }
  if (struct if_nameindex* ifs = if_nameindex()) {
    for (struct if_nameindex* i = ifs; i->if_index != 0; ++i)
      n += std::string(i->if_name).rfind(link, 0) == 0;
    if_freenameindex(ifs);
  }
  return n;
}

TEST(RouterReplicaHosts, AReplicaOnLoopbackIsNotItsOwnHostAndNothingIsLeft) {
  std::unique_ptr<ChildProcess> own;  // outlives the hosts: their destructor ends it with its namespace
  {
    const ReplicaHosts hosts(2);
    if (!hosts.in_namespaces()) GTEST_SKIP() << hosts.mode();
    EXPECT_EQ(leftovers(), 4);  // two namespaces, two veth ends here
    EXPECT_NE(hosts.address(0), hosts.address(1));
    own = hosts.start_replica(1);
    ASSERT_GT(own->port(), 0) << own->log();
    EXPECT_EQ(hosts.not_its_own_host(*own, 1), "");
    EXPECT_NE(hosts.not_its_own_host(*own, 0), "");  // host 1's, not host 0's
    auto pretender = start_replica();                // here, on 127.0.0.1
    ASSERT_GT(pretender->port(), 0) << pretender->log();
    EXPECT_NE(hosts.not_its_own_host(*pretender, 0), "");
  }
  EXPECT_EQ(leftovers(), 0);
  EXPECT_TRUE(wait_for([&] { return !own->alive(); }, 10));
}

TEST(RouterReplicaHosts, LoopbackWhenToldTo) {
  const char* before = std::getenv("BELUGA_TEST_NO_NETNS");
  const std::optional<std::string> saved = before ? std::optional<std::string>(before) : std::nullopt;
  setenv("BELUGA_TEST_NO_NETNS", "1", 1);
  {
    const ReplicaHosts hosts(2);
    EXPECT_FALSE(hosts.in_namespaces());
    EXPECT_NE(hosts.mode().find("BELUGA_TEST_NO_NETNS"), std::string::npos) << hosts.mode();
    EXPECT_EQ(hosts.url(1, 80), "http://127.0.0.1:80");
    EXPECT_EQ(leftovers(), 0);
  }
  if (saved)
    setenv("BELUGA_TEST_NO_NETNS", saved->c_str(), 1);
  else
    unsetenv("BELUGA_TEST_NO_NETNS");
}

}  // namespace
}  // namespace beluga::router::testing
