// Store: the TCP key-value store, its authentication, and the in-process stores.
#include <gtest/gtest.h>

#include <thread>

#include "comm/store/sha256.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/store.h"

using namespace paratrain;
using namespace paratrain::comm;
using namespace std::chrono_literals;

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(store::to_hex(store::sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(store::to_hex(store::sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // RFC 4231 test case 2.
  EXPECT_EQ(store::to_hex(store::hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // RFC 4231 test case 6: key longer than a block.
  EXPECT_EQ(store::to_hex(store::hmac_sha256(std::string(131, '\xaa'),
                                             "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

static void exercise(Store& s) {
  s.set("a", "1");
  EXPECT_EQ(s.get("a"), "1");
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(s.compare_set("c", "", "x"), "x");
  EXPECT_EQ(s.compare_set("c", "y", "z"), "x");
  EXPECT_EQ(s.compare_set("c", "x", "z"), "z");
  EXPECT_TRUE(s.check({"a", "n"}));
  EXPECT_FALSE(s.check({"a", "missing"}));
  EXPECT_THROW(s.wait({"missing"}, 100ms), TimeoutError);
  std::string big(3 << 20, 'q');
  s.set("big", big);
  EXPECT_EQ(s.get("big"), big);
  int64_t n = s.num_keys();
  EXPECT_EQ(n, 4);  // a, n, c, big: a fresh store holds nothing else
  EXPECT_TRUE(s.delete_key("big"));
  EXPECT_FALSE(s.delete_key("big"));
  EXPECT_EQ(s.num_keys(), n - 1);
}

TEST(HashStore, Basics) {
  HashStore s;
  exercise(s);
}

TEST(TcpStore, BasicsAndPrefix) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStore s("127.0.0.1", server.port(), "secret");
  exercise(s);
  auto base = std::make_shared<TcpStore>("127.0.0.1", server.port(), "secret");
  PrefixStore p("g1", base);
  p.set("k", "v");
  EXPECT_EQ(base->get("g1/k"), "v");
  EXPECT_EQ(p.get("k"), "v");
}

TEST(TcpStore, WaitWakesOnSetFromAnotherClient) {
  TcpStoreServer server("127.0.0.1", 0, "t");
  TcpStore waiter("127.0.0.1", server.port(), "t");
  std::thread t([&] {
    TcpStore setter("127.0.0.1", server.port(), "t");
    std::this_thread::sleep_for(50ms);
    setter.set("ready", "yes");
  });
  waiter.wait({"ready"}, 5000ms);
  EXPECT_EQ(waiter.get("ready"), "yes");
  t.join();
}

TEST(TcpStore, GetTimesOut) {
  TcpStoreServer server("127.0.0.1", 0, "t");
  TcpStore s("127.0.0.1", server.port(), "t", 200ms);
  try {
    s.get("never");
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  s.set("after", "ok");  // the connection is still in sync
  EXPECT_EQ(s.get("after"), "ok");
}

TEST(TcpStore, WrongTokenIsRefusedAndServerKeepsServing) {
  TcpStoreServer server("127.0.0.1", 0, "right");
  TcpStore good("127.0.0.1", server.port(), "right");
  good.set("x", "1");
  try {
    TcpStore bad("127.0.0.1", server.port(), "wrong");
    FAIL() << "a client with the wrong token was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("PARATRAIN_TOKEN"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.refused_connections(), 1);
  EXPECT_EQ(good.get("x"), "1");
  TcpStore again("127.0.0.1", server.port(), "right");
  EXPECT_EQ(again.add("x", 1), 2);
}

TEST(TcpStore, ManyConcurrentAdders) {
  TcpStoreServer server("127.0.0.1", 0, "t");
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&] {
      TcpStore c("127.0.0.1", server.port(), "t");
      for (int j = 0; j < 50; ++j) c.add("count", 1);
    });
  for (auto& t : ts) t.join();
  TcpStore c("127.0.0.1", server.port(), "t");
  EXPECT_EQ(c.add("count", 0), 400);
}

TEST(TcpStore, ServerGoneIsACommError) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, "t");
  TcpStore c("127.0.0.1", server->port(), "t");
  c.set("a", "b");
  server.reset();
  EXPECT_THROW(c.get("a"), CommError);
}
