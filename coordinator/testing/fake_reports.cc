#include "coordinator/testing/fake_reports.h"

#include "proto/convert.h"

namespace shardcoord {
namespace {

WorkerReport Header(const v1::PlanFragment& f, const std::string& worker, int64_t incarnation) {
  WorkerReport r;
  r.plan_id = f.plan_id();
  r.rank = f.rank();
  r.worker = worker;
  r.incarnation = incarnation;
  r.final = true;
  return r;
}

}  // namespace

uint64_t DefaultFakeChecksum(const Chunk& c) {
  return c.box.offset(0) * 131 + (c.box.ndim() > 1 ? c.box.offset(1) : 0) + 7 * c.partial_index;
}

WorkerReport FakeFinalReport(const v1::PlanFragment& f, const std::string& worker,
                             int64_t incarnation, const FakeChecksumFn& checksum) {
  WorkerReport r = Header(f, worker, incarnation);
  r.chunks = *RankChunksFromProto(f.target(), "target");
  for (const Chunk& c : r.chunks.chunks) r.checksums.push_back(checksum(c));
  return r;
}

WorkerReport FakeFusedFinalReport(const v1::PlanFragment& f, const std::string& worker,
                                  int64_t incarnation, const FakeChecksumFn& checksum) {
  WorkerReport r = Header(f, worker, incarnation);
  for (const v1::FragmentShape& shape : f.shapes()) {
    r.shapes.push_back(*RankChunksFromProto(shape.target(), "target"));
  }
  for (const v1::FragmentMember& m : f.members()) {
    WorkerReport::Member& out = r.members.emplace_back();
    out.index = m.index();
    out.shape = m.shape();
    for (const Chunk& c : r.shapes[m.shape()].chunks) out.checksums.push_back(checksum(c));
  }
  v1::StepTiming* round = r.timing.add_steps();
  round->set_op("fused_exchange");
  round->set_index(1);
  return r;
}

}  // namespace shardcoord
