#ifndef SHARDCOORD_COMMON_HTTP_SERVER_H_
#define SHARDCOORD_COMMON_HTTP_SERVER_H_

// A small HTTP server for a daemon's read-only pages (/metrics): GET handlers on fixed
// paths, served by cpp-httplib on a few threads of its own.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace httplib {
class Server;
}

namespace shardcoord {

struct HttpRequest {
  std::string path;
  std::map<std::string, std::string> params;  // Query parameters, decoded.
  std::string authorization;                  // The Authorization header, if any.

  // The parameter's value, or "" when absent.
  std::string Param(const std::string& key) const {
    auto it = params.find(key);
    return it == params.end() ? "" : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::map<std::string, std::string> headers;  // Extra response headers.
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer();
  // Stops serving.
  ~HttpServer();

  // Serves GET `path` with `handler` (called on the server's threads, concurrently). Add
  // every handler before Start.
  void Get(const std::string& path, Handler handler);
  // The same for handlers that need nothing of the request.
  void Get(const std::string& path, std::function<HttpResponse()> handler);

  // Binds `listen` ("HOST:PORT"; port 0 picks a free one) and serves in the background.
  // Returns the bound address ("127.0.0.1:41234"). INVALID_ARGUMENT a malformed address;
  // UNAVAILABLE when it cannot bind.
  absl::StatusOr<std::string> Start(const std::string& listen);

  // Stops serving and waits for the server's threads. Idempotent.
  void Stop();

 private:
  std::unique_ptr<httplib::Server> server_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool listen_returned_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COMMON_HTTP_SERVER_H_
