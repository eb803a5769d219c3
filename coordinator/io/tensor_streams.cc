#include "coordinator/io/tensor_streams.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/names.h"

namespace shardcoord {

// ---- Upload ------------------------------------------------------------------------------

absl::StatusOr<UploadHeader> ParseUploadHeader(const v1::TensorHeader& h) {
  UploadHeader out;
  UploadArgs& args = out.args;
  args.name = h.name();
  if (absl::Status s = ValidateName(args.name, "header.name"); !s.ok()) return s;
  absl::StatusOr<Shape> shape = ShapeFromProto(h.shape(), "header.shape");
  if (!shape.ok()) return shape.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(h.dtype(), "header.dtype");
  if (!dtype.ok()) return dtype.status();
  args.shape = *std::move(shape);
  args.dtype = *dtype;
  if (h.has_spec() && h.spec().ByteSizeLong() > 0) {
    absl::StatusOr<Spec> spec = SpecFromProto(h.spec(), "header.spec");
    if (!spec.ok()) return spec.status();
    args.spec = *std::move(spec);
  }
  if (h.has_rank()) {
    if (h.rank() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("header.rank = ", h.rank(), " must be >= 0"));
    }
    args.rank = h.rank();
  }
  absl::StatusOr<int64_t> whole = CheckedBytes(args.shape, ElementSize(args.dtype));
  if (!whole.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("header.shape: ", whole.status().message()));
  }
  if (!args.rank.has_value()) {
    if (h.total_bytes() != 0 && h.total_bytes() != *whole) {
      return absl::InvalidArgumentError(absl::StrCat(
          "header.total_bytes = ", h.total_bytes(), " but a ", ShapeToString(args.shape), " ",
          DTypeName(args.dtype), " tensor has ", *whole));
    }
    out.limit = *whole;
  } else {
    // A rank's local buffer (TensorIo checks its exact size); never more than the tensor.
    if (h.total_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.total_bytes = ", h.total_bytes(), " must be >= 0"));
    }
    out.limit = h.total_bytes() > 0 ? h.total_bytes() : *whole;
  }
  return out;
}

UploadSession::~UploadSession() {
  std::shared_ptr<TensorIo::UploadStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = std::move(stream_);
  }
  if (stream != nullptr) stream->Abort();
}

void UploadSession::OnMessage(v1::TensorData message) {
  bool have_header = false;
  {
    absl::MutexLock lock(&mu_);
    have_header = have_header_;
  }
  if (!have_header) {
    if (!message.has_header()) {
      return Fail(absl::InvalidArgumentError("header: missing in the first message"));
    }
    absl::StatusOr<UploadHeader> header = ParseUploadHeader(message.header());
    if (!header.ok()) return Fail(header.status());
    std::shared_ptr<TensorIo::UploadStream> stream;
    if (header->args.rank.has_value()) {
      // The caller's total_bytes is only a claim: the buffer collected is the rank's real
      // one, checked against the tensor before a byte is taken or reserved.
      absl::StatusOr<int64_t> bytes = io_->RankUploadBytes(header->args);
      if (!bytes.ok()) return Fail(bytes.status());
      if (message.header().total_bytes() != 0 && message.header().total_bytes() != *bytes) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(
            "header.total_bytes = ", message.header().total_bytes(), " but rank ",
            *header->args.rank, "'s local buffer of '", header->args.name, "' holds ", *bytes)));
      }
      header->limit = *bytes;
    } else {
      // Opening takes TensorManager's lock and opens the workers' streams: not under ours.
      absl::StatusOr<std::shared_ptr<TensorIo::UploadStream>> up = io_->StartUpload(header->args);
      if (!up.ok()) return Fail(up.status());
      stream = *std::move(up);
    }
    absl::MutexLock lock(&mu_);
    have_header_ = true;
    header_ = *std::move(header);
    stream_ = std::move(stream);
    if (stream_ == nullptr) data_.reserve(static_cast<size_t>(header_.limit));
  } else if (message.has_header()) {
    return Fail(absl::InvalidArgumentError("header: sent again after the first message"));
  }
  bool whole = false;
  int64_t limit = 0;
  bool over = false;
  {
    absl::MutexLock lock(&mu_);
    received_ += static_cast<int64_t>(message.data().size());
    limit = header_.limit;
    over = received_ > limit;
    whole = stream_ != nullptr;
    if (!over && whole) {
      inbox_ = std::move(*message.mutable_data());
      inbox_pos_ = 0;
    } else if (!over) {
      data_.append(message.data());
    }
  }
  if (over) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("data: more than the ", limit, " bytes the header announced")));
  }
  if (!whole) return transport_->ReadNext();
  Pump();
}

void UploadSession::OnEnd() {
  bool have_header = false, whole = false;
  {
    absl::MutexLock lock(&mu_);
    eof_ = true;
    have_header = have_header_;
    whole = stream_ != nullptr;
  }
  if (!have_header) return Fail(absl::InvalidArgumentError("header: no message received"));
  if (!whole) return EndOfRankUpload();
  Pump();
}

UploadSession::Step UploadSession::NextStepLocked() {
  Step step;
  const int64_t num_bands = stream_->num_bands();
  if (band_ < num_bands) {
    const size_t band_bytes = static_cast<size_t>(stream_->band_bytes(band_));
    const size_t take = std::min(band_bytes - band_data_.size(), inbox_.size() - inbox_pos_);
    band_data_.append(inbox_, inbox_pos_, take);
    inbox_pos_ += take;
    if (band_data_.size() == band_bytes) {
      step.kind = Step::kWriteBand;
      step.band = band_++;
      step.data.swap(band_data_);
      return step;
    }
  }
  if (inbox_pos_ < inbox_.size()) {
    step.kind = Step::kFail;
    step.status = absl::InvalidArgumentError(
        absl::StrCat("data: more than the ", header_.limit, " bytes the header announced"));
    return step;
  }
  std::string().swap(inbox_);
  inbox_pos_ = 0;
  if (!eof_) {
    step.kind = Step::kRead;
    return step;
  }
  if (band_ < num_bands) {
    step.kind = Step::kFail;
    step.status = absl::InvalidArgumentError(
        absl::StrCat("data: ", received_, " bytes for a ", ShapeToString(header_.args.shape), " ",
                     DTypeName(header_.args.dtype), " tensor of ", header_.limit, " bytes"));
    return step;
  }
  step.kind = Step::kFinish;
  return step;
}

void UploadSession::Pump() {
  for (;;) {
    Step step;
    std::shared_ptr<TensorIo::UploadStream> stream;
    {
      absl::MutexLock lock(&mu_);
      step = NextStepLocked();
      stream = stream_;
      if (step.kind == Step::kWriteBand) {
        in_write_band_ = true;
        written_inline_ = false;
      } else if (step.kind == Step::kFinish) {
        stream_.reset();  // Finish ends it; the destructor must not abort it.
      }
    }
    switch (step.kind) {
      case Step::kRead:
        return transport_->ReadNext();
      case Step::kFail:
        return Fail(step.status);
      case Step::kFinish:
        return stream->Finish([this](absl::StatusOr<TensorRecord> t) { End(std::move(t)); });
      case Step::kWriteBand:
        break;
    }
    // Nothing is read or ended until the band is written. A callback on another thread
    // pumps on from there; one that runs inline leaves it to this loop.
    stream->WriteBand(step.band, std::move(step.data), [this](absl::Status s) {
      {
        absl::MutexLock lock(&mu_);
        if (in_write_band_) {
          written_inline_ = true;
          inline_status_ = s;
          return;
        }
      }
      BandWritten(s);
    });
    absl::Status s;
    {
      absl::MutexLock lock(&mu_);
      in_write_band_ = false;
      if (!written_inline_) return;
      s = inline_status_;
    }
    if (!s.ok()) return BandWritten(s);
  }
}

void UploadSession::BandWritten(const absl::Status& s) {
  if (!s.ok()) {
    std::string name;
    {
      absl::MutexLock lock(&mu_);
      name = header_.args.name;
    }
    return Fail(absl::Status(s.code(), absl::StrCat("uploading '", name, "': ", s.message())));
  }
  Pump();
}

void UploadSession::EndOfRankUpload() {
  UploadArgs args;
  std::string data;
  {
    absl::MutexLock lock(&mu_);
    args = header_.args;
    data.swap(data_);
  }
  io_->Upload(args, std::move(data), [this](absl::StatusOr<TensorRecord> t) { End(std::move(t)); });
}

void UploadSession::Fail(const absl::Status& s) {
  std::shared_ptr<TensorIo::UploadStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = std::move(stream_);
  }
  if (stream != nullptr) stream->Abort();
  End(s);
}

void UploadSession::End(absl::StatusOr<TensorRecord> result) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
  }
  transport_->End(std::move(result));
}

// ---- Download ----------------------------------------------------------------------------

void DownloadSession::Start(const std::string& name) {
  absl::StatusOr<std::shared_ptr<TensorIo::DownloadStream>> d = io_->OpenDownload(name);
  if (!d.ok()) {
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
    }
    return transport_->End(d.status());
  }
  v1::TensorData message;
  const TensorRecord& t = (*d)->tensor();
  v1::TensorHeader* h = message.mutable_header();
  h->set_name(t.name);
  ShapeToProto(t.shape, h->mutable_shape());
  h->set_dtype(DTypeToProto(t.dtype));
  h->mutable_spec()->set_mesh(t.mesh);
  h->set_total_bytes(t.bytes());
  h->set_version(t.version);
  std::vector<int64_t> fetch;
  {
    absl::MutexLock lock(&mu_);
    stream_ = *std::move(d);
    num_bands_ = stream_->num_bands();
    writing_ = true;
    fetch = ClaimFetchesLocked();
  }
  transport_->Send(std::move(message));
  Fetch(fetch);
}

void DownloadSession::OnWriteDone(bool ok) {
  std::vector<int64_t> fetch;
  std::optional<v1::TensorData> write;
  std::optional<absl::Status> end;
  {
    absl::MutexLock lock(&mu_);
    if (!ok && status_.ok()) status_ = absl::CancelledError("stream broken");
    if (status_.ok()) {
      if (offset_ >= current_.size()) {
        // The band (or the header) is out: free it and take the next one.
        std::string().swap(current_);
        offset_ = 0;
        auto it = ready_.find(next_write_);
        if (it != ready_.end()) {
          current_ = std::move(it->second);
          ready_.erase(it);
          ++next_write_;
        }
        fetch = ClaimFetchesLocked();
      }
      if (offset_ < current_.size()) write = NextSliceLocked();
    }
    if (!write.has_value()) {
      writing_ = false;
      end = MaybeEndLocked();
    }
  }
  if (write.has_value()) transport_->Send(*std::move(write));
  if (end.has_value()) return transport_->End(*end);
  Fetch(fetch);
}

void DownloadSession::OnCancel() {
  std::optional<absl::Status> end;
  {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = absl::CancelledError("download cancelled");
    end = MaybeEndLocked();
  }
  if (end.has_value()) transport_->End(*end);
}

std::vector<int64_t> DownloadSession::ClaimFetchesLocked() {
  std::vector<int64_t> out;
  if (!status_.ok()) return out;
  while (next_fetch_ < num_bands_ && next_fetch_ - next_write_ < kWindow - 1) {
    out.push_back(next_fetch_++);
    ++fetching_;
  }
  return out;
}

void DownloadSession::Fetch(const std::vector<int64_t>& bands) {
  // With no fetch claimed the session may already be gone (ended from another thread).
  if (bands.empty()) return;
  std::shared_ptr<TensorIo::DownloadStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = stream_;
  }
  for (int64_t i : bands) {
    stream->FetchBand(i, [this, i](absl::StatusOr<std::string> r) { OnFetched(i, std::move(r)); });
  }
}

void DownloadSession::OnFetched(int64_t i, absl::StatusOr<std::string> r) {
  std::optional<v1::TensorData> write;
  std::vector<int64_t> fetch;
  std::optional<absl::Status> end;
  {
    absl::MutexLock lock(&mu_);
    --fetching_;
    if (!r.ok() && status_.ok()) status_ = r.status();
    if (status_.ok()) {
      ready_[i] = *std::move(r);
      if (!writing_ && i == next_write_) {
        current_ = std::move(ready_[i]);
        ready_.erase(i);
        ++next_write_;
        offset_ = 0;
        writing_ = true;
        write = NextSliceLocked();
        fetch = ClaimFetchesLocked();
      }
    } else {
      ready_.clear();
    }
    if (!write.has_value()) end = MaybeEndLocked();
  }
  if (write.has_value()) transport_->Send(*std::move(write));
  if (end.has_value()) return transport_->End(*end);
  Fetch(fetch);
}

std::optional<absl::Status> DownloadSession::MaybeEndLocked() {
  if (ended_ || writing_ || fetching_ > 0) return std::nullopt;
  if (status_.ok() && next_write_ < num_bands_) return std::nullopt;
  ended_ = true;
  return status_;
}

v1::TensorData DownloadSession::NextSliceLocked() {
  const size_t n = std::min(current_.size() - offset_, slice_);
  v1::TensorData message;
  message.set_data(current_.data() + offset_, n);
  offset_ += n;
  return message;
}

}  // namespace shardcoord
