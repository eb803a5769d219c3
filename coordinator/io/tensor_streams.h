#ifndef SHARDCOORD_COORDINATOR_IO_TENSOR_STREAMS_H_
#define SHARDCOORD_COORDINATOR_IO_TENSOR_STREAMS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/io/tensor_io.h"
#include "coordinator/state/tensor_manager.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// The Upload and Download streams of shardcoord.v1.Coordinator as transport-free sessions:
// the gRPC reactors only move messages between the call and a session, and tests drive a
// session through a fake Transport. A session calls its transport with no lock held,
// possibly inline from the call that fed it, and never blocks.

// An Upload stream's header, checked: what to upload and how many data bytes may follow.
struct UploadHeader {
  UploadArgs args;
  // Whole uploads: the tensor's size; rank uploads: the size of the rank's local buffer once
  // the session checked it against the tensor (until then total_bytes, or the tensor's size).
  int64_t limit = 0;
};

// INVALID_ARGUMENT naming the field (header.name, header.shape, ...) and the bad value.
absl::StatusOr<UploadHeader> ParseUploadHeader(const v1::TensorHeader& h);

// Receives the header, then the data. A whole upload goes to the workers band by band
// (TensorIo::UploadStream): the session collects one band, asks for no message while the
// band is handed to the workers' streams, then asks for the next, so it holds at most a band
// and one message beyond it. A rank upload (one rank's local buffer) is collected whole,
// then written.
class UploadSession {
 public:
  class Transport {
   public:
    virtual ~Transport() = default;
    // Read the next message: answer with OnMessage, or OnEnd if the stream ended.
    virtual void ReadNext() = 0;
    // End the call with the uploaded tensor or the error; called once, and last: the
    // session may be destroyed from here on.
    virtual void End(absl::StatusOr<TensorRecord> result) = 0;
  };

  // The transport reads the first message unasked.
  UploadSession(TensorIo* io, Transport* transport) : io_(io), transport_(transport) {}
  // Aborts a whole upload that did not end.
  ~UploadSession();

  UploadSession(const UploadSession&) = delete;
  UploadSession& operator=(const UploadSession&) = delete;

  // A message read (the first or after ReadNext).
  void OnMessage(v1::TensorData message);
  // The client ended its side of the stream (or the call broke) instead of a message.
  void OnEnd();

 private:
  // What Pump does next, decided under the lock.
  struct Step {
    enum Kind { kRead, kWriteBand, kFinish, kFail } kind = kRead;
    int64_t band = 0;
    std::string data;
    absl::Status status;
  };

  void OnHeader(const v1::TensorData& message);
  // Whole upload, with no band write in flight: fills the current band from the message
  // received, hands a full band to the workers, reads on, or finishes at the end.
  void Pump();
  Step NextStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BandWritten(const absl::Status& s);
  void EndOfRankUpload();
  // Ends the call with `s`, aborting a whole upload.
  void Fail(const absl::Status& s);
  void End(absl::StatusOr<TensorRecord> result);

  TensorIo* const io_;
  Transport* const transport_;
  absl::Mutex mu_;
  bool have_header_ ABSL_GUARDED_BY(mu_) = false;
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // End was called (or is about to be).
  UploadHeader header_ ABSL_GUARDED_BY(mu_);
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  std::string data_ ABSL_GUARDED_BY(mu_);  // Rank uploads.
  // Whole uploads.
  std::shared_ptr<TensorIo::UploadStream> stream_ ABSL_GUARDED_BY(mu_);
  std::string inbox_ ABSL_GUARDED_BY(mu_);  // The last message's data, from inbox_pos_.
  size_t inbox_pos_ ABSL_GUARDED_BY(mu_) = 0;
  std::string band_data_ ABSL_GUARDED_BY(mu_);
  int64_t band_ ABSL_GUARDED_BY(mu_) = 0;
  // A band write's callback that runs inline (before WriteBand returns) leaves the pumping
  // to the loop in Pump, so many small bands in one message do not recurse.
  bool in_write_band_ ABSL_GUARDED_BY(mu_) = false;
  bool written_inline_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status inline_status_ ABSL_GUARDED_BY(mu_);
};

// Sends a header, then the tensor band by band (TensorIo::DownloadStream), each band in
// messages of at most `slice` bytes. At most kWindow bands are held: the one being written
// and the next one, fetched while it is written; the fetch after that starts when a band was
// fully written (OnWriteDone: the transport's flow control paces it). The session ends the
// call only when no write and no fetch is in flight, so a fetch callback never meets a
// destroyed session.
class DownloadSession {
 public:
  static constexpr int64_t kWindow = 2;

  class Transport {
   public:
    virtual ~Transport() = default;
    // Write `message`; at most one write is in flight: answer with OnWriteDone.
    virtual void Send(v1::TensorData message) = 0;
    // End the call; called once, and last: the session may be destroyed from here on.
    virtual void End(absl::Status status) = 0;
  };

  DownloadSession(TensorIo* io, Transport* transport, int64_t slice)
      : io_(io), transport_(transport), slice_(static_cast<size_t>(slice > 0 ? slice : 1)) {}

  DownloadSession(const DownloadSession&) = delete;
  DownloadSession& operator=(const DownloadSession&) = delete;

  // Opens the download and sends the header, or ends the call (NOT_FOUND, ...).
  void Start(const std::string& name);
  // The last Send completed; `ok` false: the stream broke.
  void OnWriteDone(bool ok);
  // The client went away: ends the call as CANCELLED once nothing is in flight.
  void OnCancel();

 private:
  // Next bands to fetch: at most kWindow - 1 bands fetched or being fetched ahead of the
  // one being written (band 0 alone at the start, so two fetches never overlap there).
  std::vector<int64_t> ClaimFetchesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fetch(const std::vector<int64_t>& bands);
  void OnFetched(int64_t i, absl::StatusOr<std::string> r);
  // The status to end with, once: on an error or after the last band, when no write and no
  // fetch is in flight.
  std::optional<absl::Status> MaybeEndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next slice of the current band, for the holder of the write claim.
  v1::TensorData NextSliceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TensorIo* const io_;
  Transport* const transport_;
  const size_t slice_;
  absl::Mutex mu_;
  // Set by Start before any fetch or write, then only read.
  std::shared_ptr<TensorIo::DownloadStream> stream_ ABSL_GUARDED_BY(mu_);
  int64_t num_bands_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // A Send is in flight (the write claim).
  std::string current_ ABSL_GUARDED_BY(mu_);   // The band being written.
  size_t offset_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fetching_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_fetch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_write_ ABSL_GUARDED_BY(mu_) = 0;  // The next band to start writing.
  std::map<int64_t, std::string> ready_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_IO_TENSOR_STREAMS_H_
