#include "common/http_server.h"

#include <sys/socket.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace shardcoord {

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) {
  // A handful of threads is plenty for scrapes; httplib's default is one per core, at least 8.
  server_->new_task_queue = [] { return new httplib::ThreadPool(4); };
  // Idle keep-alive connections hold a thread and delay Stop for at most this long.
  server_->set_keep_alive_timeout(1);
  // httplib's default also sets SO_REUSEPORT, which lets a second daemon bind the same port
  // and silently share it; a clash must fail instead.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& path, Handler handler) {
  server_->Get(path,
               [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
                 HttpRequest request;
                 request.path = req.path;
                 for (const auto& [key, value] : req.params) request.params.emplace(key, value);
                 request.authorization = req.get_header_value("Authorization");
                 HttpResponse r = handler(request);
                 res.status = r.status;
                 for (const auto& [key, value] : r.headers) res.set_header(key.c_str(), value);
                 res.set_content(r.body, r.content_type.c_str());
               });
}

void HttpServer::Get(const std::string& path, std::function<HttpResponse()> handler) {
  Get(path, Handler([handler = std::move(handler)](const HttpRequest&) { return handler(); }));
}

absl::StatusOr<std::string> HttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http listen address '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (port == 0) {
    port = server_->bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!server_->bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) return absl::UnavailableError(absl::StrCat("cannot listen on http://", listen));
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
  }
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    absl::MutexLock lock(&mu_);
    listen_returned_ = true;
  });
  // Stop only reaches a server whose loop runs (httplib 0.11 has no wait_until_ready).
  while (!server_->is_running()) {
    absl::MutexLock lock(&mu_);
    if (listen_returned_) break;
    mu_.AwaitWithTimeout(absl::Condition(&listen_returned_), absl::Milliseconds(1));
  }
  return absl::StrCat(listen.substr(0, colon), ":", port);
}

void HttpServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return;
    started_ = false;
  }
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace shardcoord
