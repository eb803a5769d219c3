#include "common/http_server.h"

#include "gtest/gtest.h"
#include "httplib.h"

namespace shardcoord {
namespace {

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

TEST(HttpServerTest, ServesHandlersOnAFreePort) {
  HttpServer server;
  server.Get("/metrics", [] { return HttpResponse{200, "text/plain; version=0.0.4", "x 1\n"}; });
  absl::StatusOr<std::string> address = server.Start("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(address->rfind("127.0.0.1:", 0), 0u) << *address;
  EXPECT_GT(PortOf(*address), 0);

  httplib::Client client("127.0.0.1", PortOf(*address));
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "x 1\n");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4");

  httplib::Result missing = client.Get("/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  server.Stop();
  server.Stop();  // Idempotent.
}

TEST(HttpServerTest, HandlersSeeQueryAndAuthorizationAndSetHeaders) {
  HttpServer server;
  server.Get("/echo", [](const HttpRequest& req) {
    HttpResponse r{
        200, "text/plain",
        req.path + "|" + req.Param("name") + "|" + req.Param("x") + "|" + req.authorization};
    r.headers["Cache-Control"] = "no-store";
    return r;
  });
  absl::StatusOr<std::string> address = server.Start("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  httplib::Client client("127.0.0.1", PortOf(*address));
  httplib::Result res = client.Get("/echo?name=a%2Fb.c", {{"Authorization", "Bearer t0k"}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->body, "/echo|a/b.c||Bearer t0k");
  EXPECT_EQ(res->get_header_value("Cache-Control"), "no-store");
}

TEST(HttpServerTest, StopRightAfterStartReturns) {
  HttpServer server;
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  server.Stop();
}

TEST(HttpServerTest, ABusyPortIsUnavailable) {
  HttpServer first;
  absl::StatusOr<std::string> address = first.Start("127.0.0.1:0");
  ASSERT_TRUE(address.ok());
  HttpServer second;
  absl::StatusOr<std::string> again = second.Start(*address);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
}

TEST(HttpServerTest, RejectsAMalformedAddress) {
  HttpServer server;
  EXPECT_EQ(server.Start("localhost").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.Start("localhost:http").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcoord
