#include "coordinator/plans/plan_relay.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "sharding/box_copy.h"

namespace shardcoord {

bool RelayEligible(const Plan& plan, bool target_attached, int64_t max_bytes) {
  max_bytes = std::min(max_bytes, kMaxRelayMaxBytes);
  if (max_bytes <= 0 || target_attached) return false;
  if (plan.source.is_partial() || plan.target.is_partial()) return false;
  if (plan.cast_to.has_value()) return false;  // The relay moves bytes; workers convert.
  return Box::Whole(plan.target.global_shape()).Volume() * ElementSize(plan.dtype) <= max_bytes;
}

absl::StatusOr<std::string> AssembleLocalBuffer(const RankChunks& rc,
                                                const std::vector<BandSource>& sources,
                                                const std::vector<std::string>& data,
                                                int64_t element_size) {
  std::string out(static_cast<size_t>(rc.local_elements * element_size), '\0');
  for (const Chunk& c : rc.chunks) {
    const int64_t want = c.box.Volume();
    int64_t covered = 0;
    char* dst = out.data() + c.local_offset * element_size;
    for (size_t i = 0; i < sources.size() && covered < want; ++i) {
      const Box region = c.box.Intersect(sources[i].box);
      if (region.Empty()) continue;
      // Source chunks of one contribution do not overlap, so intersections add up.
      absl::Status s = CopyBox(region, data[i].data(), sources[i].box, dst, c.box, element_size);
      if (!s.ok()) return absl::InternalError(s.message());
      covered += region.Volume();
    }
    if (covered != want) {
      return absl::InternalError(absl::StrCat("rank ", rc.rank, "'s chunk ", c.box.ToString(),
                                              ": the sources cover ", covered, " of ", want,
                                              " elements"));
    }
  }
  return out;
}

namespace {

struct RelayState {
  WorkerClient* client = nullptr;
  RelayRequest request;
  std::function<void(RelayResult)> done;
  int64_t element_size = 0;
  std::vector<BandSource> sources;
  std::vector<std::string> data;  // Per source.

  absl::Mutex mu;
  size_t pending ABSL_GUARDED_BY(mu) = 0;
  RelayResult result ABSL_GUARDED_BY(mu);
};

void Write(const std::shared_ptr<RelayState>& st);

// Hands the result to the caller once the last call was answered: nothing is written unless
// everything was.
void Finish(const std::shared_ptr<RelayState>& st) {
  RelayResult r;
  {
    absl::MutexLock lock(&st->mu);
    r = std::move(st->result);
  }
  if (!r.status.ok()) r.written.clear();
  st->done(std::move(r));
}

// One holder's ReadBoxes answered; the last answer starts the writes (or ends the relay).
void OnRead(const std::shared_ptr<RelayState>& st, int64_t rank, const std::vector<size_t>& indices,
            absl::StatusOr<v1::ReadBoxesResponse> got) {
  const WorkerEndpoint& from = st->request.workers.at(rank);
  absl::Status s;
  if (!got.ok()) {
    s = absl::UnavailableError(
        absl::StrCat("reading from ", Describe(from), ": ", got.status().ToString()));
  } else if (got->data_size() != static_cast<int>(indices.size())) {
    s = absl::UnavailableError(absl::StrCat("reading from ", Describe(from), ": ", got->data_size(),
                                            " boxes answered, want ", indices.size()));
  }
  for (size_t k = 0; s.ok() && k < indices.size(); ++k) {
    const BandSource& src = st->sources[indices[k]];
    const int64_t want = src.box.Volume() * st->element_size;
    std::string* data = got->mutable_data(static_cast<int>(k));
    if (static_cast<int64_t>(data->size()) != want) {
      s = absl::UnavailableError(absl::StrCat("reading ", src.box.ToString(), " from ",
                                              Describe(from), ": got ", data->size(),
                                              " bytes, want ", want));
      break;
    }
    st->data[indices[k]] = std::move(*data);  // Each slot is written by its holder's answer.
  }
  bool failed = false;
  {
    absl::MutexLock lock(&st->mu);
    if (!s.ok() && st->result.status.ok()) st->result.status = s;
    if (--st->pending > 0) return;
    failed = !st->result.status.ok();
  }
  if (failed) return Finish(st);
  Write(st);
}

void Write(const std::shared_ptr<RelayState>& st) {
  const RelayRequest& q = st->request;
  struct Out {
    const RankChunks* rc;
    std::string bytes;
  };
  std::vector<Out> outs;
  absl::Status error;
  for (const RankChunks& rc : q.target.ranks()) {
    absl::StatusOr<std::string> buf =
        AssembleLocalBuffer(rc, st->sources, st->data, st->element_size);
    if (!buf.ok()) {
      error = buf.status();
      break;
    }
    outs.push_back({&rc, *std::move(buf)});
  }
  {
    absl::MutexLock lock(&st->mu);
    st->result.reads_done = absl::Now();
    if (!error.ok()) st->result.status = error;
    if (error.ok()) {
      st->pending = outs.size();
      for (const Out& o : outs) st->result.attempted.push_back(o.rc->rank);
    }
  }
  st->data.clear();
  if (!error.ok() || outs.empty()) return Finish(st);
  for (Out& o : outs) {
    const RankChunks& rc = *o.rc;
    const WorkerEndpoint& to = q.workers.at(rc.rank);
    v1::ChunkData message;
    message.set_tensor(q.target_tensor);
    message.set_version(q.target_version);
    message.set_dtype(DTypeToProto(q.dtype));
    *message.mutable_chunks() = RankChunksToProto(rc);
    const int64_t bytes = static_cast<int64_t>(o.bytes.size());
    message.set_total_bytes(bytes);
    *message.mutable_data() = std::move(o.bytes);
    const absl::Time start = absl::Now();
    st->client->WriteBuffer(
        to, std::move(message),
        [st, &rc, to, bytes, start](absl::StatusOr<v1::WriteChunkResponse> r) {
          absl::Status s;
          RelayedRank out;
          if (!r.ok()) {
            s = absl::UnavailableError(
                absl::StrCat("writing to ", Describe(to), ": ", r.status().ToString()));
          } else {
            absl::StatusOr<RankChunks> got =
                RankChunksFromProto(r->chunks(), "chunks", &out.checksums);
            if (!got.ok() || got->chunks != rc.chunks) {
              s = absl::InternalError(absl::StrCat(
                  Describe(to), " answered the relayed write with other chunks than it was given"));
            } else {
              out.chunks = *std::move(got);
              out.chunks.rank = rc.rank;
              out.bytes = bytes;
              out.start = start;
              out.end = absl::Now();
            }
          }
          bool last = false;
          {
            absl::MutexLock lock(&st->mu);
            if (!s.ok() && st->result.status.ok()) st->result.status = s;
            if (s.ok()) st->result.written[rc.rank] = std::move(out);
            last = --st->pending == 0;
          }
          if (last) Finish(st);
        });
  }
}

}  // namespace

void RunRelay(WorkerClient* client, RelayRequest request, std::function<void(RelayResult)> done) {
  auto st = std::make_shared<RelayState>();
  st->client = client;
  st->element_size = ElementSize(request.dtype);
  st->request = std::move(request);
  st->done = std::move(done);
  st->sources = ChooseSources(st->request.source, [](int64_t) { return true; });
  st->data.resize(st->sources.size());
  // Every rank read from or written to needs an endpoint.
  std::vector<int64_t> ranks;
  for (const BandSource& src : st->sources) ranks.push_back(src.rank);
  for (const RankChunks& rc : st->request.target.ranks()) ranks.push_back(rc.rank);
  for (int64_t r : ranks) {
    if (st->request.workers.count(r) > 0) continue;
    RelayResult out;
    out.status = absl::InternalError(
        absl::StrCat("plan ", st->request.plan_id, ": no endpoint for rank ", r));
    return st->done(std::move(out));
  }
  if (st->sources.empty()) return Write(st);  // An empty tensor: only (empty) writes.
  // One call per holder, with all of its boxes.
  std::map<int64_t, std::vector<size_t>> by_rank;
  for (size_t i = 0; i < st->sources.size(); ++i) by_rank[st->sources[i].rank].push_back(i);
  {
    absl::MutexLock lock(&st->mu);
    st->pending = by_rank.size();
  }
  for (auto& [rank, indices] : by_rank) {
    v1::ReadBoxesRequest req;
    req.set_tensor(st->request.tensor);
    req.set_version(st->request.source_version);
    for (size_t i : indices) *req.add_boxes() = BoxToProto(st->sources[i].box);
    client->ReadBoxes(
        st->request.workers.at(rank), req,
        [st, rank = rank, indices = indices](absl::StatusOr<v1::ReadBoxesResponse> got) {
          OnRead(st, rank, indices, std::move(got));
        });
  }
}

}  // namespace shardcoord
