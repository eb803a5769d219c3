// Checkpoints through real daemons (issue 13): four Gloo workers write and read safetensors
// files in TEST_TMPDIR. Saves and loads across every layout kind (uneven, flat, replicated,
// cross-mesh, 2-d sharded) with every value checked; balanced writers; a load into a
// replicated layout reading each byte exactly once; no tensor byte through the coordinator;
// corrupted and truncated files refused naming file and entry with nothing created; a worker
// killed in the middle of a save leaving the previous checkpoint as it was.

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/convert.h"
#include "sharding/box.h"
#include "sharding/checkpoint_index.h"
#include "sharding/fill.h"
#include "sharding/safetensors.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"
#include "tests/test_files.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// Every file of `dir` with its bytes.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out[e.path().filename().string()] = ReadFile(e.path().string());
  }
  return out;
}

// Names in `parent` that start with `prefix`.
std::vector<std::string> Entries(const std::string& parent, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(parent)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, prefix)) out.push_back(name);
  }
  return out;
}

// Byte offset in its file of `piece`'s data.
int64_t PieceOffset(const std::string& dir, const CheckpointPiece& piece) {
  const std::string file = ReadFile(dir + "/" + piece.file);
  const int64_t n = *ParseSafetensorsPrefix(file.substr(0, 8));
  const SafetensorsHeader h = *ParseSafetensorsHeader(file.substr(8, n));
  return h.data_start() + h.Find(piece.entry)->begin;
}

struct Source {
  std::string name;
  Shape shape;
  DType dtype;
  std::string mesh;
  std::string spec;
  bool flat = false;
};

class CheckpointTest : public MeshTest {
 protected:
  void CreateAll(const std::vector<Source>& sources) {
    for (const Source& s : sources) {
      absl::StatusOr<v1::TensorInfo> t =
          CreateFilled(client(), s.name, s.shape, s.dtype, s.mesh, s.spec, s.flat);
      ASSERT_TRUE(t.ok()) << s.name << ": " << t.status();
    }
  }

  absl::StatusOr<v1::SaveCheckpointResponse> Save(const std::string& dir,
                                                  const std::vector<Source>& sources,
                                                  bool overwrite = false) {
    v1::SaveCheckpointRequest req;
    req.set_dir(dir);
    for (const Source& s : sources) req.add_tensors(s.name);
    req.set_overwrite(overwrite);
    return client().SaveCheckpoint(req);
  }

  std::set<std::string> TensorNames() {
    std::set<std::string> out;
    absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
    EXPECT_TRUE(list.ok());
    for (const v1::TensorInfo& t : *list) out.insert(t.name());
    return out;
  }

  void DeleteAll(const std::vector<std::string>& names) {
    for (const std::string& n : names) EXPECT_TRUE(client().DeleteTensor(n).ok()) << n;
  }

  // Sum of the coordinator's shardcoord_rpc_message_bytes_total samples.
  double CoordinatorMessageBytes() {
    const std::string& address = cluster_->metrics_address();
    const size_t colon = address.rfind(':');
    httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
    httplib::Result res = http.Get("/metrics");
    EXPECT_TRUE(res) << "no metrics";
    if (!res) return 0;
    double total = 0;
    for (absl::string_view line : absl::StrSplit(res->body, '\n')) {
      if (!absl::StartsWith(line, "shardcoord_rpc_message_bytes_total{")) continue;
      total += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
    }
    return total;
  }
};

// One target spec per tensor: the whole group is loaded with it, then every value checked.
using TargetFn = std::function<v1::ShardingSpec(const Source&)>;

TEST_F(CheckpointTest, EveryLayoutKindSavesAndLoadsIntoEveryOther) {
  const std::vector<Source> sources = {
      {"k_uneven", {10, 7}, DType::kF32, "line", "S(0,[1,4,0,5])"},
      {"k_flat", {9, 5}, DType::kBF16, "line", "0:7;7:20;20:20;20:45", true},
      {"k_rep", {12, 6}, DType::kI32, "grid", "R,R"},
      {"k_grid", {16, 8}, DType::kF64, "grid", "S(0),S(1)"},
      {"k_cross", {11, 3}, DType::kF16, "pair", "S(1)"},
      {"k_vec", {37}, DType::kI64, "trio", "S(0)"},
  };
  ASSERT_NO_FATAL_FAILURE(CreateAll(sources));
  const std::string dir = TmpDir() + "/kinds";
  absl::StatusOr<v1::SaveCheckpointResponse> saved = Save(dir, sources);
  ASSERT_TRUE(saved.ok()) << saved.status();
  int64_t bytes = 0;
  for (const Source& s : sources) bytes += Box::Whole(s.shape).Volume() * ElementSize(s.dtype);
  EXPECT_EQ(saved->bytes(), bytes);
  EXPECT_TRUE(Entries(TmpDir(), "kinds.tmp-").empty());

  const std::vector<std::pair<std::string, TargetFn>> targets = {
      {"uneven on another mesh",
       [](const Source& s) {
         const int64_t n = s.shape[0];
         return SpecFromText("trio", absl::StrCat("S(0,[1,0,", n - 1, "])"));
       }},
      {"flat",
       [](const Source& s) {
         const int64_t n = Box::Whole(s.shape).Volume();
         return SpecFromText("line_rev",
                             absl::StrCat("0:", n / 3, ";", n / 3, ":", n - 2, ";;", n - 2, ":", n),
                             true);
       }},
      {"replicated", [](const Source&) { return SpecFromText("line", "R"); }},
      {"2-d sharded",
       [](const Source& s) {
         return SpecFromText("grid", s.shape.size() == 2 ? "S(1),S(0)" : "S(0),R");
       }},
      {"uneven columns on a pair",
       [](const Source& s) {
         return SpecFromText("pair", s.shape.size() == 2 ? "S(1)" : "S(0,[30,7])");
       }},
  };
  int round = 0;
  for (const auto& [what, target] : targets) {
    SCOPED_TRACE(what);
    v1::LoadCheckpointRequest req;
    req.set_dir(dir);
    const std::string prefix = absl::StrCat("r", round++, "_");
    req.set_prefix(prefix);
    for (const Source& s : sources) {
      v1::LoadTarget* t = req.add_targets();
      t->set_tensor(s.name);
      *t->mutable_target() = target(s);
    }
    absl::StatusOr<v1::LoadCheckpointResponse> loaded = client().LoadCheckpoint(req);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->bytes(), bytes);
    EXPECT_EQ(loaded->bytes_read(), bytes);  // Each byte of the checkpoint read once.
    EXPECT_EQ(loaded->exchange_bytes_moved(), loaded->exchange_lower_bound_bytes());
    std::vector<std::string> made;
    for (const Source& s : sources) {
      const std::string name = prefix + s.name;
      EXPECT_TRUE(DownloadAndCheck(client(), name, s.dtype, s.shape, FillKind::kArange).ok())
          << name;
      absl::StatusOr<v1::TensorInfo> info = client().GetTensor(name);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->mesh(), target(s).mesh());
      made.push_back(name);
    }
    DeleteAll(made);
  }
  // Into existing tensors: each keeps its layout and gets the values as a new version.
  std::vector<Source> dsts;
  for (const Source& s : sources) {
    dsts.push_back({"into_" + s.name, s.shape, s.dtype, "line_rev", "R"});
    ASSERT_TRUE(CreateFilled(client(), dsts.back().name, s.shape, s.dtype, "line_rev", "R", false,
                             v1::ZEROS)
                    .ok());
  }
  v1::LoadCheckpointRequest into;
  into.set_dir(dir);
  into.set_all(true);
  into.set_into(true);
  into.set_prefix("into_");
  absl::StatusOr<v1::LoadCheckpointResponse> loaded = client().LoadCheckpoint(into);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<std::string> names;
  for (const Source& d : dsts) {
    EXPECT_TRUE(DownloadAndCheck(client(), d.name, d.dtype, d.shape, FillKind::kArange).ok())
        << d.name;
    EXPECT_EQ(client().GetTensor(d.name)->spec(), "R");
    names.push_back(d.name);
  }
  DeleteAll(names);
  names.clear();
  for (const Source& s : sources) names.push_back(s.name);
  DeleteAll(names);
}

TEST_F(CheckpointTest, WritersAreBalancedAndAReplicatedLoadReadsEachByteOnce) {
  // Replicated pieces (over dp, over everyone, over a pair) and unique ones.
  const std::vector<Source> sources = {
      {"b_dp", {512, 256}, DType::kF32, "grid", "S(0),R"},
      {"b_all", {256, 256}, DType::kF32, "line", "R"},
      {"b_rows", {1024, 64}, DType::kF32, "line", "S(0)"},
      {"b_pair", {300, 200}, DType::kF32, "pair", "R"},
      {"b_norm", {256}, DType::kF32, "grid", "R,R"},
  };
  ASSERT_NO_FATAL_FAILURE(CreateAll(sources));
  const std::string dir = TmpDir() + "/balanced";
  absl::StatusOr<v1::SaveCheckpointResponse> saved = Save(dir, sources);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->files_size(), 4);
  EXPECT_LE(static_cast<double>(saved->max_writer_bytes()), 1.1 * saved->ideal_writer_bytes())
      << saved->DebugString();
  int64_t written = 0;
  for (const v1::CheckpointFileInfo& f : saved->files()) written += f.bytes();
  EXPECT_EQ(written, saved->bytes());  // Every distinct element once: no replica twice.

  v1::LoadCheckpointRequest req;
  req.set_dir(dir);
  req.set_all(true);
  *req.mutable_spec() = SpecFromText("line", "R");
  req.set_prefix("rep_");
  absl::StatusOr<v1::LoadCheckpointResponse> loaded = client().LoadCheckpoint(req);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // The workers' own count of bytes read from storage: exactly the tensors' bytes.
  EXPECT_EQ(loaded->bytes_read(), loaded->bytes());
  int64_t read = 0;
  for (const v1::CheckpointFileInfo& r : loaded->readers()) read += r.bytes();
  EXPECT_EQ(read, loaded->bytes());
  EXPECT_EQ(loaded->readers_size(), 4);  // Every rank took a share.
  for (const Source& s : sources) {
    EXPECT_TRUE(
        DownloadAndCheck(client(), "rep_" + s.name, s.dtype, s.shape, FillKind::kArange).ok());
    EXPECT_TRUE(client().DeleteTensor("rep_" + s.name).ok());
    EXPECT_TRUE(client().DeleteTensor(s.name).ok());
  }
}

TEST_F(CheckpointTest, NoTensorByteThroughTheCoordinator) {
  const std::vector<Source> sources = {{"big", {2048, 4096}, DType::kF32, "line", "S(0)"}};
  ASSERT_NO_FATAL_FAILURE(CreateAll(sources));
  const int64_t bytes = 2048 * 4096 * 4;  // 32 MiB.
  const double before = CoordinatorMessageBytes();
  ASSERT_TRUE(Save(TmpDir() + "/big", sources).ok());
  v1::LoadCheckpointRequest req;
  req.set_dir(TmpDir() + "/big");
  req.set_all(true);
  *req.mutable_spec() = SpecFromText("grid", "S(1),S(0)");
  req.set_prefix("moved_");
  absl::StatusOr<v1::LoadCheckpointResponse> loaded = client().LoadCheckpoint(req);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const double through = CoordinatorMessageBytes() - before;
  // 64 MiB written and read by the workers; the coordinator saw only control messages.
  EXPECT_LT(through, bytes / 256.0) << through << " bytes of messages for " << bytes;
  EXPECT_TRUE(
      DownloadAndCheck(client(), "moved_big", DType::kF32, {2048, 4096}, FillKind::kArange).ok());
  DeleteAll({"big", "moved_big"});
}

TEST_F(CheckpointTest, CorruptedAndTruncatedFilesAreRefusedAndNothingChanges) {
  const std::vector<Source> sources = {{"c_w", {256, 64}, DType::kF32, "line", "S(0)"}};
  ASSERT_NO_FATAL_FAILURE(CreateAll(sources));
  ASSERT_TRUE(
      CreateFilled(client(), "c_into", {256, 64}, DType::kF32, "grid", "R,S(1)", false, v1::ZEROS)
          .ok());
  const std::string dir = TmpDir() + "/corrupt";
  ASSERT_TRUE(Save(dir, sources).ok());
  absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(ReadFile(dir + "/index.json"));
  ASSERT_TRUE(index.ok()) << index.status();
  const CheckpointPiece piece = index->Find("c_w")->pieces[2];
  const std::string path = dir + "/" + piece.file;
  const std::string good = ReadFile(path);
  const std::string named = absl::StrCat(piece.file, ": entry \"", piece.entry, "\"");
  const std::set<std::string> names = TensorNames();
  const int64_t into_version = client().GetTensor("c_into")->version();

  auto load = [&](bool into) {
    v1::LoadCheckpointRequest req;
    req.set_dir(dir);
    v1::LoadTarget* t = req.add_targets();
    t->set_tensor("c_w");
    if (into) {
      t->set_name("c_into");
      req.set_into(true);
    } else {
      t->set_name("c_new");
      *t->mutable_target() = SpecFromText("grid", "S(1),R");
    }
    return client().LoadCheckpoint(req).status();
  };

  std::string bad = good;
  const int64_t at = PieceOffset(dir, piece) + 4 * 64 * 10 + 7;  // Inside row 10.
  bad[at] = static_cast<char>(bad[at] ^ 0x20);
  WriteFile(path, bad);
  for (bool into : {false, true}) {
    absl::Status s = load(into);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr(named));
    EXPECT_THAT(s.message(), HasSubstr("corrupted"));
  }
  EXPECT_EQ(TensorNames(), names);
  EXPECT_EQ(client().GetTensor("c_into")->version(), into_version);

  WriteFile(path, good.substr(0, good.size() - 100));
  for (bool into : {false, true}) {
    absl::Status s = load(into);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr(named));  // Each writer's file holds one piece here.
    EXPECT_THAT(s.message(), HasSubstr("truncated"));
  }
  EXPECT_EQ(TensorNames(), names);
  EXPECT_EQ(client().GetTensor("c_into")->version(), into_version);

  // Restored, the same loads work.
  WriteFile(path, good);
  ASSERT_TRUE(load(false).ok());
  ASSERT_TRUE(load(true).ok());
  EXPECT_TRUE(DownloadAndCheck(client(), "c_new", DType::kF32, {256, 64}, FillKind::kArange).ok());
  EXPECT_TRUE(DownloadAndCheck(client(), "c_into", DType::kF32, {256, 64}, FillKind::kArange).ok());
  DeleteAll({"c_w", "c_new", "c_into"});
}

TEST_F(CheckpointTest, RefusalsNameTheProblem) {
  v1::SaveCheckpointRequest save;
  save.set_dir("relative/dir");
  save.add_tensors("x");
  EXPECT_EQ(client().SaveCheckpoint(save).status().code(), absl::StatusCode::kInvalidArgument);
  save.set_dir(TmpDir() + "/refused");
  EXPECT_EQ(client().SaveCheckpoint(save).status().code(), absl::StatusCode::kNotFound);
  save.set_dir(TmpDir() + "/no/such/parent/ckpt");
  ASSERT_TRUE(CreateFilled(client(), "ref_t", {4, 4}, DType::kF32, "line", "S(0)").ok());
  save.set_tensors(0, "ref_t");
  absl::Status s = client().SaveCheckpoint(save).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  v1::LoadCheckpointRequest load;
  load.set_dir(TmpDir() + "/no-such-checkpoint");
  load.set_all(true);
  *load.mutable_spec() = SpecFromText("line", "R");
  EXPECT_EQ(client().LoadCheckpoint(load).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client().DeleteTensor("ref_t").ok());
}

// Its own cluster: a worker is killed.
TEST(CheckpointKillTest, AWorkerKilledMidSaveLeavesThePreviousCheckpoint) {
  ClusterOptions options;
  options.num_workers = 4;
  // The held worker must not be declared dead for missed heartbeats before it is killed.
  options.coordinator_flags = {"--heartbeat-timeout=60s"};
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  CoordinatorClient& client = (*cluster)->client();
  ASSERT_TRUE(MakeMesh(client, "m", {4}, (*cluster)->WorkerNames()).ok());
  ASSERT_TRUE(CreateFilled(client, "t", {1024, 256}, DType::kF32, "m", "S(0)").ok());
  const std::string dir = TmpDir() + "/killed";
  v1::SaveCheckpointRequest req;
  req.set_dir(dir);
  req.add_tensors("t");
  ASSERT_TRUE(client.SaveCheckpoint(req).ok());
  const std::map<std::string, std::string> before = Snapshot(dir);
  ASSERT_EQ(before.size(), 5u);  // Four files and index.json.

  // The worker of the last rank (a writer, never the one creating the directory) is held
  // still, so the new save cannot finish before it is killed.
  const int victim = (*cluster)->WorkerIndexOfRank(3);
  ASSERT_GE(victim, 0);
  ASSERT_TRUE((*cluster)->SignalWorker(victim, SIGSTOP).ok());
  req.set_overwrite(true);
  req.set_request_id(NewRequestId());
  absl::StatusOr<v1::SaveCheckpointResponse> result;
  std::thread save([&] { result = client.SaveCheckpoint(req); });
  // Wait (without a timing assumption) until the writes have been sent.
  while (true) {
    absl::StatusOr<v1::CheckpointProgress> p = client.GetCheckpointProgress(req.request_id());
    if (p.ok() && p->phase() == "writing") break;
    ASSERT_TRUE(p.ok() || p.status().code() == absl::StatusCode::kNotFound) << p.status();
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE((*cluster)->KillWorker(victim).ok());
  save.join();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr(Cluster::WorkerName(victim)));
  // The previous checkpoint byte for byte, and no temporary directory left.
  EXPECT_EQ(Snapshot(dir), before);
  EXPECT_TRUE(Entries(TmpDir(), "killed.tmp-").empty());
  // And it still loads, on the three workers left.
  std::vector<std::string> rest;
  for (int i = 0; i < 4; ++i) {
    if (i != victim) rest.push_back(Cluster::WorkerName(i));
  }
  ASSERT_TRUE(MakeMesh(client, "rest", {3}, rest).ok());
  v1::LoadCheckpointRequest load;
  load.set_dir(dir);
  load.set_all(true);
  *load.mutable_spec() = SpecFromText("rest", "R");
  load.set_prefix("again_");
  absl::StatusOr<v1::LoadCheckpointResponse> loaded = client.LoadCheckpoint(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(
      DownloadAndCheck(client, "again_t", DType::kF32, {1024, 256}, FillKind::kArange).ok());
}

// Its own cluster: workers restricted to a checkpoint root.
TEST(CheckpointRootTest, WorkersRefuseCheckpointPathsOutsideTheirRoot) {
  const std::string root = TmpDir() + "/root", outside = TmpDir() + "/outside";
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p '", root, "' '", outside, "'").c_str()), 0);
  ClusterOptions options;
  options.num_workers = 2;
  options.worker_flags = {"--checkpoint-root=" + root};
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  CoordinatorClient& client = (*cluster)->client();
  ASSERT_TRUE(MakeMesh(client, "m", {2}, (*cluster)->WorkerNames()).ok());
  ASSERT_TRUE(CreateFilled(client, "t", {64, 16}, DType::kF32, "m", "S(0)").ok());
  v1::SaveCheckpointRequest save;
  save.add_tensors("t");
  save.set_dir(outside + "/ckpt");
  absl::Status refused = client.SaveCheckpoint(save).status();
  // The worker's PERMISSION_DENIED reaches the client as any file system permission error
  // does: FAILED_PRECONDITION naming the worker (PERMISSION_DENIED is the caller's own).
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("outside the worker's --checkpoint-root"));
  EXPECT_THAT(refused.message(), HasSubstr(outside + "/ckpt"));
  EXPECT_TRUE(Entries(outside, "").empty());  // Nothing was created there.
  // Inside: saved, and loaded back with every value checked.
  save.set_dir(root + "/ckpt");
  ASSERT_TRUE(client.SaveCheckpoint(save).ok());
  v1::LoadCheckpointRequest load;
  load.set_dir(root + "/ckpt");
  load.set_all(true);
  *load.mutable_spec() = SpecFromText("m", "R");
  load.set_prefix("in_");
  ASSERT_TRUE(client.LoadCheckpoint(load).ok());
  EXPECT_TRUE(DownloadAndCheck(client, "in_t", DType::kF32, {64, 16}, FillKind::kArange).ok());
  // A checkpoint outside (copied there by other means) is not read, and nothing is created.
  ASSERT_EQ(std::system(absl::StrCat("cp -r '", root, "/ckpt' '", outside, "/copy'").c_str()), 0);
  load.set_dir(outside + "/copy");
  load.set_prefix("out_");
  absl::Status denied = client.LoadCheckpoint(load).status();
  EXPECT_EQ(denied.code(), absl::StatusCode::kFailedPrecondition) << denied;
  EXPECT_THAT(denied.message(), HasSubstr("outside the worker's --checkpoint-root"));
  EXPECT_FALSE(client.GetTensor("out_t").ok());
}

}  // namespace
}  // namespace shardcoord
