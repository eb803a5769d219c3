#include "coordinator/testing/cluster_fixture.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/placement.h"

namespace shardcoord {

void RegisterTestWorkers(WorkerManager* workers, int n,
                         const std::function<void(WorkerSpec&)>& edit) {
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrCat("w", i);
    WorkerSpec spec{name, "h", "cpu", name + ":1", "gloo"};
    if (edit) edit(spec);
    EXPECT_TRUE(workers->Register(spec).ok()) << name;
  }
}

namespace {

// The record of a test tensor: `placements` on `mesh`, at a new version.
TensorRecord TestRecord(const MeshManager& meshes, TensorManager* tensors, const std::string& name,
                        const std::string& placements, const std::string& mesh, Shape shape,
                        DType dtype) {
  TensorRecord t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.mesh = mesh;
  t.spec = placements;
  t.layout = *Layout::FromPlacements(meshes.Get(mesh)->mesh, t.shape, *ParsePlacements(placements));
  t.version = tensors->NewVersion();
  return t;
}

}  // namespace

void CreateTestTensor(const WorkerManager& workers, const MeshManager& meshes,
                      TensorManager* tensors, const std::string& name,
                      const std::string& placements, const std::string& mesh, Shape shape,
                      DType dtype) {
  TensorRecord t = TestRecord(meshes, tensors, name, placements, mesh, std::move(shape), dtype);
  ASSERT_TRUE(tensors->Reserve(t, "create").ok());
  LayoutChecksums sums;
  absl::flat_hash_map<int64_t, int64_t> inc;
  for (const RankChunks& rc : t.layout.ranks()) {
    sums.emplace_back(rc.chunks.size(), 1000 + rc.chunks[0].box.offset(0));
    inc[rc.rank] = workers.GetByRank(rc.rank)->incarnation;
  }
  ASSERT_TRUE(tensors->FinishCreate(name, "create", sums, inc).ok());
}

Spec TestSpec(const std::string& placements, const std::string& mesh) {
  Spec s;
  s.mesh = mesh;
  s.placements = *ParsePlacements(placements);
  return s;
}

ClusterFixture::ClusterFixture()
    : timer_(&clock_),
      workers_(&clock_, absl::Seconds(5)),
      meshes_(&workers_),
      tensors_(&meshes_) {}

void ClusterFixture::CreateFilled(const std::string& name, const std::string& placements,
                                  const std::string& mesh, Shape shape, DType dtype) {
  TensorRecord t = TestRecord(meshes_, &tensors_, name, placements, mesh, std::move(shape), dtype);
  ASSERT_TRUE(tensors_.Reserve(t, "create").ok());
  LayoutChecksums sums;
  absl::flat_hash_map<int64_t, int64_t> inc;
  for (const RankChunks& rc : t.layout.ranks()) {
    v1::FillRequest fill;
    fill.set_tensor(name);
    fill.set_version(t.version);
    fill.set_dtype(DTypeToProto(dtype));
    *fill.mutable_chunks() = RankChunksToProto(rc);
    ShapeToProto(t.shape, fill.mutable_global_shape());
    fill.set_init(v1::ARANGE);
    const WorkerRecord w = *workers_.GetByRank(rc.rank);
    client_.Fill(w.Endpoint(), fill, [&](absl::StatusOr<v1::FillResponse> r) {
      ASSERT_TRUE(r.ok());
      ChunkChecksums c;
      ASSERT_TRUE(RankChunksFromProto(r->chunks(), "chunks", &c).ok());
      sums.push_back(c);
    });
    inc[rc.rank] = w.incarnation;
  }
  ASSERT_TRUE(tensors_.FinishCreate(name, "create", sums, inc).ok());
}

std::map<int64_t, v1::PlanFragment> ClusterFixture::Fragments(const std::string& plan_id) {
  std::map<int64_t, v1::PlanFragment> out;
  for (const v1::PlanFragment& f : client_.fragments()) {
    if (f.plan_id() == plan_id) out[f.rank()] = f;
  }
  return out;
}

WorkerReport ClusterFixture::FinalReport(const v1::PlanFragment& f,
                                         const FakeChecksumFn& checksum) {
  return FakeFinalReport(f, workers_.GetByRank(f.rank())->spec.name, Incarnation(f.rank()),
                         checksum);
}

void ClusterFixture::AnswerEveryFragment(PlanManager* plans) {
  client_.SetExecuteHook([this, plans](const WorkerEndpoint&, const v1::PlanFragment& f) {
    const std::string worker = workers_.GetByRank(f.rank())->spec.name;
    const int64_t incarnation = workers_.GetByRank(f.rank())->incarnation;
    WorkerReport r = f.members_size() > 0 ? FakeFusedFinalReport(f, worker, incarnation)
                                          : FakeFinalReport(f, worker, incarnation);
    plans->Report(r).IgnoreError();
  });
}

void ClusterFixture::ReportAll(PlanManager* plans, const std::string& plan_id,
                               const FakeChecksumFn& checksum, const std::set<int64_t>& skip) {
  for (const auto& [rank, f] : Fragments(plan_id)) {
    if (skip.count(rank)) continue;
    ASSERT_TRUE(plans->Report(FinalReport(f, checksum)).ok()) << rank;
  }
}

void ClusterFixture::Kill(int64_t rank) {
  clock_.Advance(absl::Seconds(6));
  for (const WorkerRecord& w : workers_.List()) {
    if (w.rank != rank && w.alive) {
      ASSERT_TRUE(workers_.Heartbeat(w.spec.name, w.incarnation).ok());
    }
  }
  workers_.CheckHealth(clock_.Now());
}

}  // namespace shardcoord
