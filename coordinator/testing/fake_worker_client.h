#ifndef SHARDCOORD_COORDINATOR_TESTING_FAKE_WORKER_CLIENT_H_
#define SHARDCOORD_COORDINATOR_TESTING_FAKE_WORKER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/cluster/worker_client.h"
#include "sharding/transfer_table.h"

namespace shardcoord {

// A WorkerClient for tests that acts as a set of in-memory workers: Fill writes the fill
// formula's real values, WriteChunk stores bytes, ReadChunk packs boxes out of stored
// buffers, FinishPlan and DropTensor drop buffers. Execute only records the fragment (tests
// play the workers' reports). Every call is recorded; failures are injected per method and
// rank. Replies are inline unless held. Thread-safe.
class FakeWorkerClient : public WorkerClient {
 public:
  void Execute(const WorkerEndpoint& worker, v1::PlanFragment fragment,
               StatusCallback done) override;
  void FinishPlan(const WorkerEndpoint& worker, v1::FinishPlanRequest request,
                  StatusCallback done) override;
  void Fill(const WorkerEndpoint& worker, const v1::FillRequest& request,
            Callback<v1::FillResponse> done) override;
  void FillMany(const WorkerEndpoint& worker, const v1::FillManyRequest& request,
                Callback<v1::FillManyResponse> done) override;
  void DropTensor(const WorkerEndpoint& worker, const v1::DropTensorRequest& request,
                  StatusCallback done) override;
  void ReadChunk(const WorkerEndpoint& worker, const v1::ReadChunkRequest& request,
                 Callback<std::string> done) override;
  void WriteChunk(const WorkerEndpoint& worker, const v1::ChunkData& header, std::string data,
                  Callback<v1::WriteChunkResponse> done) override;
  // Checkpoints, on a simulated shared file system (below) with the real file format:
  // safetensors files cut from the simulated buffers, XXH64s of entries and blocks, reads
  // checked against them (DATA_LOSS naming file and entry), directories created, committed
  // (index.json, then renamed over the old one with overwrite) and removed.
  void WriteCheckpoint(const WorkerEndpoint& worker, const v1::WriteCheckpointRequest& request,
                       Callback<v1::WriteCheckpointResponse> done) override;
  void ReadCheckpoint(const WorkerEndpoint& worker, const v1::ReadCheckpointRequest& request,
                      Callback<v1::ReadCheckpointResponse> done) override;
  void ReadCheckpointIndex(const WorkerEndpoint& worker,
                           const v1::ReadCheckpointIndexRequest& request,
                           Callback<v1::ReadCheckpointIndexResponse> done) override;
  void CheckpointDir(const WorkerEndpoint& worker, const v1::CheckpointDirRequest& request,
                     StatusCallback done) override;

  // Prepared transfers (fake_worker_client_transfers.cc), as a worker keeps them: each page
  // is appended to (rank, transfer id)'s table in order, the last one expands the rank's part
  // with ExpandTransfer and answers its totals (total_bytes_moved: the templates it plans
  // first, which add up over ranks); RunTransfer answers with the part's bytes and a digest of
  // (replica key, version), so replicas agree; DropTransfer forgets parts by id and prefix.
  // Failures are injected as for the other methods ("PrepareTransfer", "RunTransfer").
  void PrepareTransfer(const WorkerEndpoint& worker,
                       std::shared_ptr<const v1::PrepareTransferRequest> request,
                       Callback<v1::PrepareTransferResponse> done) override;
  void RunTransfer(const WorkerEndpoint& worker, const v1::RunTransferWorkerRequest& request,
                   absl::Duration timeout, Callback<v1::RunTransferWorkerResponse> done) override;
  void DropTransfer(const WorkerEndpoint& worker, const v1::DropTransferRequest& request,
                    StatusCallback done) override;
  // Workers that answer PrepareTransfer without expanding their parts, for benchmarks of the
  // coordinator at 10^3 ranks: the pages are appended once per transfer id (every rank gets
  // the same ones) and the last page's answers come from SummarizeTransfer (each template
  // planned once, not once per rank); RunTransfer answers as for expanded parts (replica
  // classes agree). Set before any PrepareTransfer.
  void SetSummarizePrepares(bool summarize);
  // While held, RunTransfer answers are queued; ReleaseRuns answers them.
  void HoldRuns(bool hold);
  void ReleaseRuns();
  // `rank`'s RunTransfer answers carry `digest` instead of the right one.
  void SetRunDigest(int64_t rank, uint64_t digest);
  // Transfer ids resident (prepared) on `rank`.
  std::vector<std::string> ResidentTransfers(int64_t rank) const;
  // Every page sent (rank, the request object: the same object goes to every rank).
  std::vector<std::pair<int64_t, std::shared_ptr<const v1::PrepareTransferRequest>>> pages() const;
  std::vector<std::pair<int64_t, v1::RunTransferWorkerRequest>> transfer_runs() const;
  std::vector<std::pair<int64_t, v1::DropTransferRequest>> transfer_drops() const;

  // The simulated file system: files by absolute path, and directories.
  std::string File(const std::string& path) const;
  void SetFile(const std::string& path, std::string bytes);
  void AddDir(const std::string& path);
  bool HasDir(const std::string& path) const;
  // Every directory and file path, sorted.
  std::vector<std::string> Paths() const;

  // Calls of `method` ("Execute", "Fill", ...) to `rank` fail with `status` from now on.
  void Fail(const std::string& method, int64_t rank, absl::Status status);
  // Runs after each Execute has been answered (tests play the worker's reports here).
  void SetExecuteHook(std::function<void(const WorkerEndpoint&, const v1::PlanFragment&)> hook);
  // While held, Execute callbacks are queued; ReleaseExecutes answers them (OK).
  void HoldExecutes(bool hold);
  void ReleaseExecutes();
  // While held, FinishPlan requests are recorded but neither applied nor answered;
  // ReleaseFinishes applies and answers them (OK).
  void HoldFinishes(bool hold);
  void ReleaseFinishes();

  // The fragments sent, in order.
  std::vector<v1::PlanFragment> fragments() const;
  std::vector<std::pair<int64_t, v1::FinishPlanRequest>> finishes() const;
  std::vector<std::pair<int64_t, v1::DropTensorRequest>> drops() const;
  int calls(const std::string& method) const;

  // Simulated buffers by (rank, tensor, version); version -1: any version.
  bool HasBuffer(int64_t rank, absl::string_view tensor, int64_t version) const;
  std::string Buffer(int64_t rank, absl::string_view tensor, int64_t version) const;
  // Buffers of `tensor` on every rank, any version.
  int BufferCount(absl::string_view tensor) const;

  // The fake's checksum of a chunk's bytes (the coordinator only compares checksums).
  static uint64_t Checksum(absl::string_view bytes);

 private:
  using Key = std::tuple<int64_t, std::string, int64_t>;
  struct Buf {
    v1::RankChunks chunks;
    int dtype = 0;
    std::string bytes;
  };
  absl::Status Injected(const std::string& method, int64_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static v1::RankChunks WithChecksums(const v1::RankChunks& chunks, const std::string& bytes,
                                      int64_t element_size);

  struct ResidentTransfer {
    TransferTable table;
    ExpandOptions options;
    int32_t next_page = 0;
    bool planned = false;
    RankTransfer part;
  };

  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, int64_t>, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(const WorkerEndpoint&, const v1::PlanFragment&)> hook_ ABSL_GUARDED_BY(mu_);
  std::vector<StatusCallback> held_ ABSL_GUARDED_BY(mu_);
  bool hold_finishes_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<Key, StatusCallback>> held_finishes_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::PlanFragment> fragments_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, v1::FinishPlanRequest>> finishes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, v1::DropTensorRequest>> drops_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Buf> buffers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
  // SetSummarizePrepares: a transfer id's table and every rank's summary, shared by the ranks.
  struct SummarizedTransfer {
    TransferTable table;
    int32_t pages = 0;  // Appended so far.
    std::vector<RankTransfer> ranks;
  };
  absl::StatusOr<v1::PrepareTransferResponse> SummarizedPrepare(
      int64_t rank, const v1::PrepareTransferRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::map<std::pair<int64_t, std::string>, ResidentTransfer> transfers_ ABSL_GUARDED_BY(mu_);
  bool summarize_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, SummarizedTransfer> summarized_ ABSL_GUARDED_BY(mu_);
  bool hold_runs_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void()>> held_runs_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, uint64_t> run_digests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, std::shared_ptr<const v1::PrepareTransferRequest>>> pages_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, v1::RunTransferWorkerRequest>> transfer_runs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, v1::DropTransferRequest>> transfer_drops_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TESTING_FAKE_WORKER_CLIENT_H_
