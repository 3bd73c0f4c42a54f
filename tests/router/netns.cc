#include "netns.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "../common/http_client.h"

namespace beluga::router::testing {
namespace {

constexpr uint32_t kRange = 0xC6120000;  // 198.18.0.0/15 (RFC 2544: for testing, not routed)
constexpr uint32_t kBlocks = 4096;       // /27 blocks in it, 8 hosts (a /30 each) per block
constexpr int kMaxHosts = 8;
constexpr const char* kNsPrefix = "beluga-t";  // beluga-t<pid>-<i>
constexpr const char* kLinkPrefix = "blt";     // blt<pid>h<i> here, blt<pid>n<i> inside (<= 15 chars)

std::string dotted(uint32_t host_order) {
  in_addr a{htonl(host_order)};
  char s[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, s, sizeof(s));
  return s;
}

// Host i's /30 in `block`: end 1 is its veth end here, end 2 the one inside its namespace.
std::string veth_address(uint32_t block, int i, uint32_t end) {
  return dotted(block + 4 * uint32_t(i) + end);
}

std::string ns_name(int i) {
  return kNsPrefix + std::to_string(getpid()) + "-" + std::to_string(i);
}
std::string link_name(char side, int i) {
  return kLinkPrefix + std::to_string(getpid()) + side + std::to_string(i);
}

// The `ip` binary: on PATH, or where root's tools live (a CI user's PATH may lack sbin).
std::string find_ip() {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream ss(dirs);
  for (std::string d; std::getline(ss, d, ':');)
    if (!d.empty() && access((d + "/ip").c_str(), X_OK) == 0) return d + "/ip";
  return "";
}

struct Ran {
  int rc = -1;
  std::string out;  // stdout and stderr
};

// Runs `args` (no shell) and waits for it.
Ran run(std::vector<std::string> args) {
  Ran r;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return r;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(p[1]);
  char buf[512];
  for (ssize_t n; (n = read(p[0], buf, sizeof(buf))) > 0;) r.out.append(buf, size_t(n));
  close(p[0]);
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)) r.rc = WEXITSTATUS(status);
  return r;
}

// "<pid>" + `sep` at the start of `s` (after a prefix) names a process that no longer exists.
bool of_dead_process(const std::string& s, char sep) {
  size_t end = 0;
  while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
  if (end == 0 || end == s.size() || s[end] != sep) return false;
  return kill(static_cast<pid_t>(std::atol(s.c_str())), 0) != 0 && errno == ESRCH;
}

// SIGKILLs what runs in namespace `ns`: a namespace lives on, unnamed, while a process runs in it.
void kill_inside(const std::string& ip, const std::string& ns) {
  std::stringstream pids(run({ip, "netns", "pids", ns}).out);
  for (long pid; pids >> pid;)
    if (pid > 0) kill(static_cast<pid_t>(pid), SIGKILL);
}

// Deletes what test processes that died before their destructors ran left behind (and ends the
// replicas they left running in it).
void sweep_stale(const std::string& ip) {
  if (DIR* d = opendir("/run/netns")) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind(kNsPrefix, 0) == 0 && of_dead_process(n.substr(std::strlen(kNsPrefix)), '-')) {
        kill_inside(ip, n);
        run({ip, "netns", "del", n});
      }
    }
    closedir(d);
  }
  if (struct if_nameindex* ifs = if_nameindex()) {
    std::vector<std::string> stale;
    for (struct if_nameindex* i = ifs; i->if_index != 0; ++i) {
      const std::string n = i->if_name;
      if (n.rfind(kLinkPrefix, 0) == 0 && of_dead_process(n.substr(std::strlen(kLinkPrefix)), 'h'))
        stale.push_back(n);
    }
    if_freenameindex(ifs);
    for (const auto& n : stale) run({ip, "link", "del", n});
  }
}

// A /27 block of the range that no interface here has an address in, starting from one picked by pid
// (parallel test processes start at different blocks). 0: none.
uint32_t free_block() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return 0;
  std::vector<uint32_t> used;
  for (ifaddrs* a = ifs; a; a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET)
      used.push_back(ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr));
  freeifaddrs(ifs);
  for (uint32_t k = 0; k < kBlocks; ++k) {
    const uint32_t block = kRange + 32 * ((uint32_t(getpid()) + k) % kBlocks);
    bool taken = false;
    for (uint32_t u : used) taken = taken || (u & ~31u) == block;
    if (!taken) return block;
  }
  return 0;
}

// The inode of a network namespace file (/run/netns/NS, /proc/PID/ns/net); 0 when unreadable.
ino_t ns_inode(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// Connects to 127.0.0.1:`port` here: 0 if it connected, else errno.
int connect_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

// Whether a TCP connection from here reaches `address` listening inside namespace `ns`: a socket is
// opened there (this thread joins `ns` for that, then comes back), and connected to from here.
std::string reach_inside(const std::string& ns, const std::string& address) {
  const int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  const int there = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (home < 0 || there < 0 || setns(there, CLONE_NEWNET) != 0) {
    const std::string why = std::string("cannot join namespace ") + ns + ": " + std::strerror(errno);
    if (home >= 0) close(home);
    if (there >= 0) close(there);
    return why;
  }
  const int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (setns(home, CLONE_NEWNET) != 0) std::abort();  // this thread cannot stay in the test namespace
  close(home);
  close(there);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  socklen_t len = sizeof(a);
  std::string why;
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    why = "cannot listen on " + address + " inside " + ns + ": " + std::strerror(errno);
  } else {
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect()
    if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      why = "cannot connect from here to " + address + " inside " + ns + ": " + std::strerror(errno);
    close(c);
  }
  close(ls);
  return why;
}

}  // namespace

ReplicaHosts::ReplicaHosts(int count) {
  const char* off = std::getenv("BELUGA_TEST_NO_NETNS");
  const bool told = off && *off && std::string(off) != "0";
  std::string why;
  if (count < 1 || count > kMaxHosts) {
    why = "asked for " + std::to_string(count) + " hosts, at most " + std::to_string(kMaxHosts);
  } else if (told) {
    why = "BELUGA_TEST_NO_NETNS is set";
  } else if ((ip_ = find_ip()).empty()) {
    why = "no `ip` binary";
  } else {
    sweep_stale(ip_);
    block_ = free_block();
    if (block_ == 0) why = "every 198.18.0.0/15 block is in use here";
  }
  // Each step is a probe: the first that fails says why not, and undoes the others.
  auto step = [&](std::vector<std::string> args) {
    if (!why.empty()) return false;
    args.insert(args.begin(), ip_);
    const Ran r = run(args);
    if (r.rc == 0) return true;
    std::string cmd;
    for (size_t k = 1; k < args.size(); ++k) cmd += (k > 1 ? " " : "") + args[k];
    const std::string first_line = r.out.substr(0, r.out.find('\n'));
    why = "`ip " + cmd + "`: " + (first_line.empty() ? "exit " + std::to_string(r.rc) : first_line);
    return false;
  };
  for (int i = 0; i < count && why.empty(); ++i) {
    const std::string ns = ns_name(i), here = link_name('h', i), inside = link_name('n', i);
    if (step({"netns", "add", ns})) namespaces_.push_back(ns);
    if (step({"link", "add", here, "type", "veth", "peer", "name", inside})) links_.push_back(here);
    step({"link", "set", inside, "netns", ns});
    step({"addr", "add", veth_address(block_, i, 1) + "/30", "dev", here});
    step({"link", "set", here, "up"});
    step({"-n", ns, "addr", "add", veth_address(block_, i, 2) + "/30", "dev", inside});
    step({"-n", ns, "link", "set", inside, "up"});
    step({"netns", "exec", ns, ip_, "link", "set", "lo", "up"});  // what the replicas are started with
    if (why.empty()) why = reach_inside(ns, veth_address(block_, i, 2));
  }
  if (why.empty()) {
    mode_ = "[ netns ] " + std::to_string(count) + " replicas in network namespaces (" + dotted(block_) +
            "/27, a veth pair each)";
  } else {
    tear_down();
    mode_ = "[ loopback ] " + std::to_string(count) + " replicas on 127.0.0.1 (" +
            (told ? "" : "ip netns not permitted: ") + why + ")";
  }
  std::printf("%s\n", mode_.c_str());
  std::fflush(stdout);
}

ReplicaHosts::~ReplicaHosts() {
  tear_down();
}

void ReplicaHosts::tear_down() {
  // What still runs inside first: the namespace (and its veth) would outlive its name otherwise.
  for (const auto& ns : namespaces_) kill_inside(ip_, ns);
  for (const auto& l : links_) run({ip_, "link", "del", l});  // takes its peer inside along
  for (const auto& ns : namespaces_) run({ip_, "netns", "del", ns});
  links_.clear();
  namespaces_.clear();
}

std::string ReplicaHosts::address(int i) const {
  return in_namespaces() ? veth_address(block_, i, 2) : "127.0.0.1";
}

std::unique_ptr<ChildProcess> ReplicaHosts::start_replica(int i, int port,
                                                          std::vector<std::string> extra) const {
  if (!in_namespaces()) return beluga::router::testing::start_replica(port, std::move(extra));
  extra.insert(extra.end(), {"--host", address(i)});
  std::vector<std::string> args = {ip_, "netns", "exec", namespaces_.at(size_t(i))};
  const std::vector<std::string> serve = replica_args(port, std::move(extra));
  args.insert(args.end(), serve.begin(), serve.end());
  return std::make_unique<ChildProcess>(args, child_options("beluga serve: serving "));
}

std::string ReplicaHosts::not_its_own_host(ChildProcess& replica, int i) const {
  if (!in_namespaces()) return "";
  const std::string ns = namespaces_.at(size_t(i));
  const ino_t want = ns_inode("/run/netns/" + ns);
  const ino_t got = ns_inode("/proc/" + std::to_string(replica.pid()) + "/ns/net");
  if (want == 0 || got != want)
    return "pid " + std::to_string(replica.pid()) + " is not in network namespace " + ns;
  if (replica.host() != address(i)) return "it says it listens on " + replica.host() + ", not " + address(i);
  const int status = beluga::server::testing::http_get(address(i), replica.port(), "/health").status;
  if (status != 200) return "GET /health at " + replica.url() + ": " + std::to_string(status);
  if (const int e = connect_loopback(replica.port()); e != ECONNREFUSED)
    return "127.0.0.1:" + std::to_string(replica.port()) + " here does not refuse (" +
           (e == 0 ? std::string("connected") : std::strerror(e)) + ")";
  return "";
}

}  // namespace beluga::router::testing
