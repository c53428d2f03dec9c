// The ports tests give their ranks' stores (support/free_port.h): outside the kernel's
// ephemeral range, held from every other reservation while this process lives, and usable
// by a store.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "paratrain/comm/store.h"
#include "support/free_port.h"

namespace paratrain {
namespace {

namespace d = test::free_port_detail;

TEST(TestPorts, ReservedRunsAreDistinctOutsideTheEphemeralRangeAndHeld) {
  const auto [first, last] = d::usable_range();
  std::set<int> seen;
  for (int i = 0; i < 5; ++i) {
    const int p = test::free_port(2);
    ASSERT_GE(p, first);
    ASSERT_LE(p + 1, last);
    // Neither port of the run can be reserved again, by this process or another.
    EXPECT_EQ(d::lock_port(p), -1) << p;
    EXPECT_EQ(d::lock_port(p + 1), -1) << p + 1;
    EXPECT_TRUE(seen.insert(p).second) << p;
    EXPECT_TRUE(seen.insert(p + 1).second) << p + 1;
  }
  // The kernel's ephemeral range, where connect() picks local ports, is not among them.
  int low = 0, high = 0;
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  ASSERT_TRUE(f >> low >> high);
  for (int p : seen) EXPECT_TRUE(p < low || p > high) << p << " is in " << low << "-" << high;
}

TEST(TestPorts, AStoreListensOnAReservedPort) {
  const int p = test::free_port();
  ASSERT_GT(p, 0);
  comm::TcpStoreServer server("", p, "tok");
  comm::TcpStore client("127.0.0.1", p, "tok", std::chrono::milliseconds(5000), std::chrono::milliseconds(5000));
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
}

}  // namespace
}  // namespace paratrain
